"""Stand-in for the DAS vLLM fork's package (see ../../README.md)."""

__version__ = "0.8.5+das.opt1.dtk2504"
