"""Every error class of the package, in one hierarchy; each carries the exit code the CLI returns.

Only ``unibake.cli.main`` catches these. Messages name the file, key or artifact and, where there
is one, the fix. Nothing else in the package defines an exception a command can end with: the few
private ones elsewhere (registry.py's ``_HelperTrouble``, ``_BadLocation`` and ``_TooSlow``;
``plan._NotStrictJSON``, ``regexsafe._Refused``, ``docker_engine.AnswerTooLong``,
``sha256state.StateError``) are caught where they are raised, or turned into one of these.
"""

from __future__ import annotations


class UnibakeError(Exception):
    """Base class: anything else (engine unreachable, disk, a tool that failed) exits 1."""

    exit_code = 1


class InputError(UnibakeError):
    """Bad input: CLI, YAML, lock mismatch, unsafe value. Nothing was built or written."""

    exit_code = 2


class DocumentPlaceRefused(InputError):
    """``--metadata-file`` names a file the run must not replace (found once the plan or the release is known):
    the failure's document is not written there either."""


class VerificationError(UnibakeError):
    """A check failed: checksum, structure, image ID, self-check, smoke gate."""

    exit_code = 3


class EngineError(UnibakeError):
    """The container engine is unreachable or an engine operation failed."""

    exit_code = 1


class RunTimedOut(EngineError):
    """A container run to completion did not finish in time (it was killed and removed); carries its
    output so far. Where the container is the image under test (a self-check), a failed check."""

    def __init__(self, message: str, *, output: str = ""):
        super().__init__(message)
        self.output = output


class NameInUse(EngineError):
    """A container or network was not made: its name is already another's (so nothing of that name
    is this run's to remove)."""


class BuildFailed(EngineError):
    """A Dockerfile step failed; carries the failing step and the tail of its output."""

    def __init__(self, message: str, *, step: str = "", output: tuple[str, ...] = (), last_image: str = "",
                 stage_images: tuple[str, ...] = ()):
        super().__init__(message)
        self.step = step
        self.output = output
        self.last_image = last_image  # the last step that succeeded: build cache worth keeping
        self.stage_images = stage_images  # earlier stages that completed (the kernels' builder stage)


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, SIGHUP) during a build: what had finished, to keep as build cache, as a
    failed build's is (else the classic builder leaves the last finished step a dangling image)."""

    def __init__(self, *, last_image: str = "", stage_images: tuple[str, ...] = ()):
        super().__init__()
        self.last_image = last_image
        self.stage_images = stage_images


class CheckFailed(VerificationError):
    """An in-image fail-closed check failed during the build; no tag was created."""

    def __init__(self, message: str, *, output: tuple[str, ...] = ()):
        super().__init__(message)
        self.output = output


class ArchiveError(VerificationError):
    """An archive or save stream is not a well-formed image archive, or not what it claims to be."""


class ZstdDecodeError(ArchiveError):
    """The archive's zstd frames cannot be decoded (corrupted, truncated, or asking too much memory)."""


class LayerFormatError(UnibakeError):
    """A layer the normalise stage rewrites is not a tar it understands."""


class DiskFull(UnibakeError):
    """The output folder ran out of space; partial files are removed."""


class NoLocks(UnibakeError):
    """A lock file on a file system that takes no locks (ENOLCK): said as that, never as a run holding it."""


class RoundTripUnavailable(EngineError):
    """No engine that has never seen the image can be had here."""


class RegistryError(UnibakeError):
    """A registry refused or failed a request, or did not answer after the retries; nothing was recorded."""


class RegistryAuthError(RegistryError):
    """A registry refused the credentials (or gave none the right to the repository)."""


class DigestMismatch(VerificationError):
    """What a registry or an engine holds is not what the release recorded: another digest or image ID."""


class PipelineError(UnibakeError):
    """The stages of a command are wired wrongly: a bug in unibake, never the user's input."""


class HandoffAborted(Exception):
    """Ends a thread's items when the side that produced them failed (``unibake.threads``); it is
    caught there and never reaches the user."""


class StoreMismatch(UnibakeError):
    """The engine's storage did not give an image's own bytes (:mod:`unibake.layerstore`): the archive is
    written from the engine's save instead; never the end of a run by itself."""
