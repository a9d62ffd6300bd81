"""One error hierarchy; each class carries the exit code the CLI returns for it.

Only ``unibake.cli.main`` catches these. Messages name the file, key or artifact and, where there
is one, the fix.
"""

from __future__ import annotations


class UnibakeError(Exception):
    """Base class: anything else (engine unreachable, disk, a tool that failed) exits 1."""

    exit_code = 1


class InputError(UnibakeError):
    """Bad input: CLI, YAML, lock mismatch, unsafe value. Nothing was built or written."""

    exit_code = 2


class VerificationError(UnibakeError):
    """A check failed: checksum, structure, image ID, self-check, smoke gate."""

    exit_code = 3


class EngineError(UnibakeError):
    """The container engine is unreachable or an engine operation failed."""

    exit_code = 1


class BuildFailed(EngineError):
    """A Dockerfile step failed; carries the failing step and the tail of its output."""

    def __init__(self, message: str, *, step: str = "", output: tuple[str, ...] = ()):
        super().__init__(message)
        self.step = step
        self.output = output


class CheckFailed(VerificationError):
    """An in-image fail-closed check failed during the build; no tag was created."""

    def __init__(self, message: str, *, output: tuple[str, ...] = ()):
        super().__init__(message)
        self.output = output
