"""The container engine behind one small interface: build, save, load, inspect, run, remove.

Only this module and :mod:`unibake.docker_engine` know about Docker. Unit tests use a fake
(``tests/fake_engine.py``); engine tests and the CLI use :class:`unibake.docker_engine.DockerEngine`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO


@dataclass(frozen=True, kw_only=True)
class BuildStep:
    number: int
    instruction: str
    cached: bool
    image: str = ""  # the image the engine committed for this step (short ID, as it printed it)


@dataclass(frozen=True, kw_only=True)
class BuildOutcome:
    image_id: str
    steps: tuple[BuildStep, ...]
    stage_images: tuple[str, ...] = ()  # the last image of every stage before the final one (build cache)


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """What the engine reports about an image."""

    id: str  # sha256:<hex> of the config
    tags: tuple[str, ...]
    diff_ids: tuple[str, ...]
    labels: dict[str, str]
    size: int
    created: str
    env: tuple[str, ...] = ()
    architecture: str = ""
    os: str = ""
    variant: str = ""
    onbuild: tuple[str, ...] = ()  # the ONBUILD triggers its config holds: they run in a child's FROM step
    repo_digests: tuple[str, ...] = ()  # its RepoDigests: NAME@sha256:..., one per repository pulled or pushed by


@dataclass(frozen=True, kw_only=True)
class ImageSummary:
    """One line of the engine's image list."""

    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    created: int  # seconds since the epoch


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    exit_code: int
    output: str
    changes: tuple[str, ...] = ()  # with ``run(changes=True)``: what the container changed (``docker diff``)


@dataclass(frozen=True, kw_only=True)
class ContainerStatus:
    """What the engine says of a started container's health: is it up, did it restart, was it OOM-killed."""

    running: bool
    restarting: bool  # waiting to be restarted by its restart policy
    restart_count: int
    oom_killed: bool
    exit_code: int
    pid: int = 0  # its main process, as the engine's host numbers it (0: not running)
    id: str = ""  # its whole ID


@dataclass(frozen=True, kw_only=True)
class LoadOutcome:
    image_ids: tuple[str, ...]
    tags: tuple[str, ...]
    messages: tuple[str, ...]


class Engine(ABC):
    """A container engine. Errors are :class:`unibake.errors.EngineError` (or its subclasses)."""

    address: str
    in_the_clear: bool = False  # reached over the network without TLS (docker_engine.in_the_clear)

    @abstractmethod
    def version(self) -> str:
        """The engine's server version; raises EngineError when it does not answer."""

    def platform(self) -> str:
        """The engine's own os/architecture (``linux/amd64``); "" when it does not say."""
        return ""

    def storage(self) -> tuple[str, str] | str:
        """(data root, storage driver) where the engine keeps its images on this host's file system, for
        :mod:`unibake.layerstore`; else why not (an engine that does not say)."""
        return "the engine does not say where it keeps its images"

    @abstractmethod
    def build(self, context: BinaryIO, *, tag: str, buildargs: dict[str, str], nocache: bool,
              on_line: Callable[[str], None], platform: str | None = None) -> BuildOutcome:
        """Build from a tar context; tags only on success. Raises BuildFailed with the failing step.
        ``platform`` (``linux/arm64``): the target, passed to the engine when given."""

    @abstractmethod
    def inspect_image(self, ref: str) -> ImageInfo | None:
        """The image, or None when the engine does not have it."""

    @abstractmethod
    def history(self, ref: str) -> list[str]:
        """The ``created_by`` of every history entry of an image, oldest first."""

    @abstractmethod
    def save(self, ref: str) -> Iterator[bytes]:
        """The ``docker save`` tar stream of one image, in chunks."""

    @abstractmethod
    def load(self, chunks: Iterable[bytes], stop: threading.Event | None = None) -> LoadOutcome:
        """Load a ``docker save`` tar stream; raises EngineError on any error the engine reports, and
        HandoffAborted once ``stop`` is set (the load broken off, its answer too)."""

    @abstractmethod
    def run(self, image: str, args: list[str], *, env: dict[str, str] | None = None,
            timeout: int = 120, entrypoint: list[str] | None = None, changes: bool = False) -> RunOutcome:
        """Run a container to completion and remove it (one the engine cannot remove is named in a
        warning); returns its exit code and output. ``entrypoint``: run instead of the image's own
        ENTRYPOINT (``args`` after it). ``changes``: what it changed in its file system is read too
        (``docker diff``: ``C /tmp``, ``A /tmp/x``)."""

    def image_config(self, ref: str) -> dict | None:
        """An image's own settings as the engine keeps them: ``config`` (Env, Labels, Cmd, Shell, ...),
        ``author``, ``architecture``, ``os``, ``variant``; None when the engine cannot say (an engine
        that does not offer it: callers then do without)."""
        return None

    def folder_header(self, image: str, path: str) -> tuple[int, int, int] | str | None:
        """(permission bits, uid, gid) of the folder ``path`` in ``image``'s file system, as a layer's
        tar header would give them; None when it is not there; why it cannot tell, when it is no folder
        or the engine cannot say."""
        return "this engine does not tell"

    @abstractmethod
    def start(self, image: str, args: list[str], *, env: dict[str, str] | None = None, restarts: int = 0,
              network: str | None = None, name: str | None = None, hosts: dict[str, str] | None = None,
              ipc: str | None = None, shm_size: int | None = None) -> str:
        """Start a container in the background on the engine's default bridge (or on ``network``, one
        :meth:`create_network` made); returns its ID. With ``restarts`` the engine restarts it on
        failure up to that many times (and counts them). ``name``: the container's name, its host
        name and its alias on ``network``; ``hosts``: more ``/etc/hosts`` lines (name: address);
        ``ipc``: its IPC mode (host, private, shareable; None: the engine's default); ``shm_size``: the
        size of its ``/dev/shm`` in bytes (None: the engine's default, 64 MiB)."""

    @abstractmethod
    def create_network(self, name: str) -> str:
        """Create a private bridge network of that name for containers to reach each other by name;
        returns its ID."""

    @abstractmethod
    def remove_network(self, network: str) -> None:
        """Remove a network :meth:`create_network` made; missing is fine."""

    @abstractmethod
    def container_status(self, container: str) -> ContainerStatus:
        """A started container's restart count, OOM-killed flag, state and exit code."""

    @abstractmethod
    def container_state(self, container: str) -> tuple[bool, str, str]:
        """(running, IP address on its bridge or network, log output so far) of a started container: its
        IPv4 address, else (an IPv6-only network) its global IPv6 address, unbracketed."""

    @abstractmethod
    def remove_container(self, container: str) -> None:
        """Stop and remove a container; missing is fine."""

    @abstractmethod
    def tag(self, image: str, ref: str) -> None:
        """Point the tag ``ref`` (name:tag) at ``image``."""

    @abstractmethod
    def remove_image(self, ref: str) -> None:
        """Remove an image (untag, then delete if nothing else refers to it); missing is fine."""

    @abstractmethod
    def untag(self, ref: str) -> bool:
        """Remove the tag ``ref`` as ``docker rmi`` without --force does: its image goes too once no
        other tag, image or container needs it; missing is fine. False (nothing changed) when a
        container uses the image and ``ref`` is its last tag."""

    @abstractmethod
    def remove_if_unused(self, image_id: str) -> bool:
        """Delete an untagged image that no image or container needs; False when something does."""

    @abstractmethod
    def list_images(self, *, dangling: bool = False) -> list[ImageSummary]:
        """The engine's top-level images (``docker images``), or only the dangling ones."""

    @abstractmethod
    def pull(self, repository: str, digest: str, auth: dict[str, str] | None,
             stop: threading.Event | None = None, progress: Callable[[int], None] | None = None,
             sizes: Mapping[str, int] | None = None) -> None:
        """Pull ``repository@digest`` from its registry (``auth``: user name and password, or None);
        ``stop`` set breaks it off (raising :class:`unibake.errors.HandoffAborted`); ``progress`` is told
        the bytes downloaded as they come, and, by ``sizes`` (the layers' blob sizes by digest, as the
        manifest gives them), the size of each layer the engine already holds."""
