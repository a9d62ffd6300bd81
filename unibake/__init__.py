"""unibake: declarative profile YAMLs to one unified, verified, released inference image."""

__version__ = "0.1.0"
