"""Stand-in for the SGLang fork's package (see ../../README.md)."""

__version__ = "0.4.9.post2+roce.3"
