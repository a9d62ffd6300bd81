"""unibake: declarative profile YAMLs to one unified, verified, released inference image."""

# (no ``from __future__ import annotations`` here, nor a newer import at the top: ``python -m unibake`` imports this
# first, and a python3 before 3.11 must reach __main__'s version check, not a SyntaxError or an ImportError)


def _version(pyproject=None) -> str:
    """The package version: ``pyproject.toml``'s in a source checkout, the installed one otherwise."""
    from pathlib import Path

    try:
        from importlib import metadata
    except ImportError:  # (Python 3.7 and before)
        return "0+unknown"

    try:
        import tomllib
    except ModuleNotFoundError:  # (a Python before 3.11: python -m unibake says so, not this import's traceback)
        tomllib = None
    pyproject = pyproject or Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}) if tomllib else {}
        if project.get("name") == "unibake":
            return str(project["version"])
    except (OSError, ValueError, KeyError):  # (tomllib.TOMLDecodeError is a ValueError)
        pass
    try:
        return metadata.version("unibake")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
