"""The Docker implementation of :class:`unibake.engine.Engine`, over docker-py's low-level API."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO


class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module whose import is put off until one of its names is used."""

    def __getattr__(self, name: str):
        real = self.__dict__.get("_deferred_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            self.__dict__["_deferred_real"] = real
        return getattr(real, name)


def _defer_paramiko() -> None:
    """docker-py imports paramiko (and with it cryptography: 152 modules, about 0.08 s), only for an ssh:// engine's own SSH
    client, which is never made here: an ssh:// engine goes through the system's ssh client (use_ssh_client
    below), and docker-py uses paramiko's names only inside the methods that would make its own. So paramiko
    is imported on the first use of one of its names, i.e. never, and every command starts sooner (a
    `--from` release or a hotfix takes 3-4 s in all). By hand: the standard library's LazyLoader cannot do it
    on Python 3.11, whose import statement reads the module's __spec__ and so loads it at once."""
    if "paramiko" in sys.modules:
        return
    spec = importlib.util.find_spec("paramiko")
    if spec is None:
        return  # not installed: docker-py's own try/except leaves its SSH adapter out
    stub = _Deferred("paramiko")
    stub.__spec__ = spec
    sys.modules["paramiko"] = stub


_defer_paramiko()

import docker  # noqa: E402 (after the deferral above)
import docker.errors  # noqa: E402
import docker.transport.sshconn  # noqa: E402
import requests.exceptions  # noqa: E402
import urllib3.exceptions  # noqa: E402

from .console import one_line
from .engine import (BuildOutcome, BuildStep, ContainerStatus, Engine, ImageInfo, ImageSummary, LoadOutcome,
                     RunOutcome)
from .errors import BuildFailed, BuildInterrupted, EngineError, HandoffAborted, InputError, NameInUse, RunTimedOut
from .files import bounded_body, no_auth, read_small_file, strip_auth

STEP_RE = re.compile(r"^Step ([0-9]+)/([0-9]+) : (.*)$")
STEP_IMAGE_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
# a step that runs a container (RUN; ENV, LABEL ... commit through one too): its output, which the engine sends
# in the same "stream" events as its own lines, lies between these two lines naming the container
RUNNING_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
REMOVING_RE = re.compile(r"^Removing intermediate container ([0-9a-f]{12,64})$")
# a container the engine could not remove (its storage busy): the build goes on, the container stays on the
# engine's list, and the engine tries it again, first or among the others, after every later step
FAILED_REMOVAL_RE = re.compile(r"^Error removing intermediate container ([0-9a-f]{12,64}): ")
# what ends a line of the build's stream: "\n" (and a progress bar's "\r"), not U+2028 or U+0085, which
# str.splitlines() also takes: a Step line echoing a value that holds one was cut, and its rest read as output
# (a kernel's RUN echoed that way was named as the failing kernel '%s')
STREAM_LINE_END_RE = re.compile(r"\r\n|\r|\n")
# the classic builder's colour around what a RUN step writes to stderr (a compiler's errors, a failed
# check's "error:" line): the engine's own framing, dropped rather than shown escaped as "\x1b[91m"
STDERR_COLOUR_RE = re.compile("\x1b\\[(?:91|0)m")
DEFAULT_ADDRESS = "unix:///var/run/docker.sock"
# Long steps (a compile, a big COPY) may print nothing for minutes.
TIMEOUT = 3600
# an answer the client reads whole (an image's or a container's inspect, the image list, a diff, the last lines of a
# log): 128 MiB is hundreds of times the biggest a real engine gives; an engine that sends without end (a hostile one
# in a deploy's hosts file, or whatever answers at its address) filled the client's memory, never timing out
MAX_ANSWER = 128 << 20
# a load's streamed answer: each event at most this (the engine's are a few hundred bytes), its messages kept to the
# last LOAD_MESSAGES (what an error quotes), and the images it names at most LOAD_NAMES
LOAD_EVENT_LIMIT = 1 << 20
LOAD_MESSAGES = 20
LOAD_NAMES = 1000
# an error's answer to a streamed request (a pull, a load, an archive read): its body read at most this far
ERROR_LIMIT = 1 << 20
# The first request, the engine's API version: an address that takes the connection and never answers
# (a wrong port, a hung daemon, a proxy) is said within this, not after TIMEOUT.
CONNECT_TIMEOUT = 60


# What the engine's save stream is handed on in. urllib3 yields one piece per HTTP chunk of the
# engine's chunked response (32 KiB from Engine 20.10), whatever size is asked for: 80,000 pieces
# for a 2.5 GB image, each paying the Python work of every consumer (the tar walker, the hashing
# and compression hand-offs). Joined into pieces of 256 KiB, the archive stage spends about 4 fewer
# CPU-seconds on that image (measured: benchmarks/NOTES.md); pieces of 1 MiB save no more CPU and
# raise peak memory by about 30 MiB (zstd's workers queue more at once).
SAVE_PIECE = 256 << 10
BLOCK_READ = 4096  # folder_header: what is read of a folder's archive (its first header, and an extended one)
# What is kept of a container run to its end (a self-check): its start and its last lines (the engine's
# log holds a line in pieces of at most 16 KiB, so the lines asked for are bounded too).
RUN_OUTPUT_HEAD = 64 << 10
RUN_OUTPUT_TAIL = 64 << 10
RUN_OUTPUT_TAIL_LINES = 64
RUN_OUTPUT_SKIM = 4 << 20  # read past the start kept before the end is asked for by lines: more than they hold


def coalesced(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``pieces`` joined into pieces of at least ``size`` bytes (the last may be shorter)."""
    held: list[bytes] = []
    count = 0
    for piece in pieces:
        if not held and len(piece) >= size:
            yield piece
            continue
        held.append(piece)
        count += len(piece)
        if count >= size:
            yield b"".join(held)
            held, count = [], 0
    if held:
        yield b"".join(held)


def parse_address(address: str) -> str | None:
    """What is wrong with an engine address as docker-py would read it (a port out of range, a
    broken IPv6 host), or None; docker-py raises a bare ValueError for these. ``unix://`` with no socket and
    ``ssh://`` with no host (a variable left unset: ``--engine "unix://$SOCK"``) are refused too: docker-py read the
    first as an empty socket path or the default one, and gave the second to ssh as the host ''. (``tcp://:2375`` is
    localhost's port 2375, to docker as to docker-py: taken.)"""
    scheme, sep, rest = address.partition("://")
    if sep and scheme.lower() == "unix" and not rest.strip("/"):
        return "it names no socket (nothing after unix://: a variable left unset?)"
    if sep and scheme.lower() == "ssh" and not rest.rpartition("@")[2].split(":", 1)[0].strip("/"):
        return "it names no host (nothing after ssh://USER@: a variable left unset?)"
    try:
        docker.utils.parse_host(address, False, False)
    except (ValueError, docker.errors.DockerException) as exc:
        return str(exc)[:200]
    return None


def in_the_clear(address: str, tls: object) -> bool:
    """Whether an engine at ``address`` is reached over the network without TLS (``tcp://`` or ``http://`` to
    another host, no DOCKER_TLS_VERIFY): what it is sent, a registry's credentials for a pull, anyone between reads."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme.lower() not in ("tcp", "http") or tls:
        return False
    host = rest.split("/", 1)[0].rpartition("@")[2]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0] if host.count(":") == 1 \
        else host
    if host in ("", "localhost"):  # (tcp://:2375 is this host's port 2375)
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # (a host name: another machine, as far as can be told)


class _EngineClient(docker.APIClient):
    """docker-py's client without requests' ``~/.netrc``: a tcp:// engine was sent the netrc's login for its host
    (a ``default`` entry's for any host), from the first request on (docker-py asks the version as it is made,
    before an auth could be set on it); the docker CLI sends none. Proxies and TLS settings still count."""

    @property
    def auth(self):
        return no_auth

    @auth.setter
    def auth(self, value) -> None:  # (requests' Session sets None as it is made)
        pass

    def rebuild_auth(self, prepared, response) -> None:
        strip_auth(self, prepared, response)


class _TimedSSHSocket(docker.transport.sshconn.SSHSocket):
    """docker-py's ssh:// socket (the pipes of the ssh client it runs), each read and write held to the
    socket's timeout as a TCP socket's is: a pipe has none, so an engine that stopped answering over ssh
    was waited for without end (``deploy --engine-timeout`` did not apply, nor the first request's
    :data:`CONNECT_TIMEOUT`). Past it, the ssh client is ended (the engine sees its client go) and the
    read or write raises TimeoutError, which urllib3 reports as the timeout it is."""

    TICK = 0.25

    def __init__(self, host):
        super().__init__(host)
        self._since: float | None = None  # when the read or write under way began
        self._expired = False

    def connect(self, **kwargs):
        super().connect(**kwargs)
        threading.Thread(target=_TimedSSHSocket._watch, args=(weakref.ref(self), self.proc), daemon=True,
                         name="unibake-ssh-watch").start()

    @staticmethod
    def _watch(held: "weakref.ref[_TimedSSHSocket]", proc) -> None:
        """Ends ``proc`` (ssh) once a read or write has waited past the timeout. It holds the socket weakly:
        a socket docker-py lets go of ends its ssh client by closing its stdin, as it did before."""
        while proc.poll() is None:
            time.sleep(_TimedSSHSocket.TICK)
            sock = held()
            if sock is None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
                return
            since, limit = sock._since, sock.gettimeout()
            if since is not None and limit is not None and time.monotonic() - since > limit:
                sock._expired = True
                proc.kill()  # (the read or write blocked on its pipes returns)
                proc.wait()
                return
            del sock

    def _timed(self, call, *args):
        if self._expired:
            raise TimeoutError("timed out")
        self._since = time.monotonic()
        try:
            result = call(*args)
        except OSError:
            if self._expired:
                raise TimeoutError("timed out") from None
            raise
        finally:
            self._since = None
        if self._expired:  # (the pipe's end, not the engine's answer)
            raise TimeoutError("timed out")
        return result

    def _write(self, data):
        return self._timed(super()._write, data)

    def recv(self, n):
        return self._timed(super().recv, n)

    def makefile(self, mode):
        return _TimedPipe(super().makefile(mode), self)

    def close(self):
        try:  # (ssh already ended: its stdin is a broken pipe)
            super().close()
        except OSError:
            pass


class _TimedPipe:
    """The ssh client's stdout as http.client reads it, each read held to the socket's timeout."""

    def __init__(self, pipe, sock: _TimedSSHSocket) -> None:
        self._pipe, self._sock = pipe, sock

    def read(self, *args):
        return self._sock._timed(self._pipe.read, *args)

    def read1(self, *args):
        return self._sock._timed(self._pipe.read1, *args)

    def readinto(self, buffer):
        return self._sock._timed(self._pipe.readinto, buffer)

    def readline(self, *args):
        return self._sock._timed(self._pipe.readline, *args)

    def peek(self, *args):
        return self._sock._timed(self._pipe.peek, *args)

    def __getattr__(self, name):
        return getattr(self._pipe, name)


# docker-py makes its ssh:// sockets by this module-level name (in SSHConnection.connect): every ssh
# engine unibake reaches gets the timed one
docker.transport.sshconn.SSHSocket = _TimedSSHSocket


def _first_folder(head: bytes) -> tuple[int, int, int] | None:
    """(permission bits, uid, gid) of the first entry of a tar stream's start ``head`` when it is a folder
    (a PAX header before it may give its uid and gid); None otherwise."""
    import tarfile

    from .errors import ArchiveError
    from .imagetar import pax_records

    pax: dict[str, str] = {}
    at = 0
    while at + 512 <= len(head):
        try:
            info = tarfile.TarInfo.frombuf(head[at:at + 512], "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return None
        size = -(-info.size // 512) * 512
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
            if info.type == tarfile.XHDTYPE:
                if at + 512 + size > len(head):
                    return None
                try:
                    pax = pax_records(head[at + 512:at + 512 + info.size], "a folder's header")
                except ArchiveError:
                    return None
            at += 512 + size
            continue
        if info.type != tarfile.DIRTYPE:
            return None
        try:
            return info.mode & 0o7777, int(pax.get("uid", info.uid)), int(pax.get("gid", info.gid))
        except ValueError:
            return None
    return None


def _shown(ref: str) -> str:
    """A container or network as an error names it: an ID by its first 12 digits, as docker ps shows
    it; a name whole (a multi-node gate's rank, cut short, named none the adopter could remove)."""
    return ref[:12] if re.fullmatch(r"[0-9a-f]{64}", ref) else ref


# the docker CLI's config file is small; one bigger is not read for its current context
CONFIG_LIMIT = 1 << 20


def docker_context(env: Mapping[str, str]) -> str | None:
    """The docker context the docker CLI reaches its engine by when ``DOCKER_HOST`` is unset, said as
    where it is chosen (``DOCKER_CONTEXT=gpu1``, or the config's current one, set by ``docker context
    use``), or None for the default context (the local socket, as here). unibake reads no contexts: a
    command that went to the local socket while ``docker`` goes to the context's engine would prune,
    pull or load on another engine than the adopter's ``docker`` shows."""
    name = env.get("DOCKER_CONTEXT") or ""
    if name:
        return None if name == "default" else f"DOCKER_CONTEXT={name}"
    config = Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG") else \
        Path(env["HOME"]) / ".docker" / "config.json" if env.get("HOME") else None
    if config is None or not config.is_file():
        return None
    try:
        current = json.loads(read_small_file(config, InputError, limit=CONFIG_LIMIT)).get("currentContext")
    except (InputError, ValueError, AttributeError, RecursionError):
        return None  # (a config docker would not read either)
    if not isinstance(current, str) or current in ("", "default"):
        return None
    return f"the docker context {current!r} ({config}'s currentContext, set by docker context use)"


def refuse_docker_context(address: str | None, env: Mapping[str, str]) -> None:
    """An engine neither ``address`` nor ``DOCKER_HOST`` names, where docker would use a context: refused
    (a command calls this before its other work, as :class:`DockerEngine` does)."""
    chosen = None if address or env.get("DOCKER_HOST") else docker_context(env)
    if chosen:
        raise InputError(f"{chosen}: unibake reads no docker contexts, so it would reach {DEFAULT_ADDRESS}, not the "
                         "engine docker reaches; give --engine URL or DOCKER_HOST (docker context inspect shows the "
                         "context's address)")


class DockerEngine(Engine):
    """A Docker engine at ``address`` (``unix:///path``, ``tcp://host:port``, ``ssh://user@host``);
    without one, ``DOCKER_HOST`` (with its TLS settings) from ``env``, else the local socket (refused
    when the docker CLI would use a context: :func:`docker_context`)."""

    def __init__(self, address: str | None = None, env: Mapping[str, str] | None = None, *,
                 timeout: int = TIMEOUT, timeout_option: str | None = None):
        """``timeout``: how long any one request after the first waits on an engine that says nothing
        (its answer, or the next piece of a load's or a pull's stream); ``timeout_option``: the command
        line option that sets it, named when it runs out."""
        env = os.environ if env is None else env
        self.timeout, self.timeout_option = timeout, timeout_option
        refuse_docker_context(address, env)
        self.address = address or env.get("DOCKER_HOST") or DEFAULT_ADDRESS
        problem = parse_address(self.address)
        if problem:
            where = "--engine" if address else "DOCKER_HOST"
            raise InputError(f"{where} {self.address[:100]!r} is not an engine address: {problem}")
        try:
            # ssh://: docker-py runs the system's ssh client (its config, agent and known hosts), as the CLI does
            ssh = self.address.startswith("ssh://")
            probe = min(timeout, CONNECT_TIMEOUT)
            if address:
                # a tcp:// engine takes DOCKER_TLS_VERIFY and DOCKER_CERT_PATH as `docker -H` does: without them an
                # engine behind TLS (port 2376), which every --engine of a deploy may be, could not be reached at all
                tls = _tls_from_env(env) if address.startswith("tcp://") else None
                self.api = _EngineClient(base_url=address, version="auto", timeout=probe, use_ssh_client=ssh,
                                            **({"tls": tls} if tls else {}))
            else:
                tls = _tls_from_env(env)
                self.api = _EngineClient(base_url=self.address, version="auto", timeout=probe, use_ssh_client=ssh,
                                            **({"tls": tls} if tls else {}))
            self.in_the_clear = in_the_clear(self.address, tls)
            self.api.timeout = timeout  # every request after the version's
            self.api.hooks["response"].append(_bounded_answer)
        except docker.errors.DockerException as exc:
            raise EngineError(f"cannot reach the Docker engine at {self.address}: {_unreachable(self.address, exc)}") \
                from None

    def _fail(self, what: str, exc: Exception) -> EngineError:
        if _read_timed_out(exc):  # (its own words name a pool and a port, not the engine or what to do)
            option = f" ({self.timeout_option})" if self.timeout_option else ""
            return EngineError(f"{what}: the engine stopped answering: nothing from it in {self.timeout} s{option} "
                               f"(engine at {self.address})")
        if _write_timed_out(exc):
            option = f" ({self.timeout_option})" if self.timeout_option else ""
            return EngineError(f"{what}: the engine stopped taking what was sent: nothing of it taken in "
                               f"{self.timeout} s{option} (engine at {self.address})")
        return EngineError(f"{what}: {_reason(exc)} (engine at {self.address})")

    def version(self) -> str:
        try:
            return self.api.version()["Version"]
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail("the Docker engine does not answer", exc) from None

    def storage(self) -> tuple[str, str] | str:
        """(data root, storage driver) as the engine reports them (``docker info``), for
        :mod:`unibake.layerstore`; why not, for an engine on the containerd image store (its images are
        not in the graph driver's folders) or one that does not say."""
        if not self.address.startswith("unix://"):  # (its data root, if this host has one, is another engine's)
            return f"the engine is reached over the network ({self.address}), not on this host"
        try:
            info = self.api.info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail("the Docker engine does not answer", exc) from None
        status = info.get("DriverStatus") if isinstance(info, dict) else None
        if any(isinstance(pair, list) and pair[:1] == ["driver-type"] and "containerd" in str(pair[1:])
               for pair in status or ()):
            return "the engine keeps its images in containerd's store"
        root, driver = (info.get("DockerRootDir"), info.get("Driver")) if isinstance(info, dict) else (None, None)
        if not isinstance(root, str) or not root.startswith("/") or not isinstance(driver, str):
            return "the engine does not say where it keeps its images"
        return root, driver

    def platform(self) -> str:
        from .platforms import recorded

        try:
            found = self.api.version()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail("the Docker engine does not answer", exc) from None
        return recorded(str(found.get("Arch") or ""), str(found.get("Os") or ""))

    def build(self, context: BinaryIO, *, tag: str, buildargs: dict[str, str], nocache: bool,
              on_line: Callable[[str], None], platform: str | None = None) -> BuildOutcome:
        steps: list[BuildStep] = []
        current: tuple[int, str] | None = None
        cached = False
        tail: deque[str] = deque(maxlen=40)
        image_id = ""
        last_image = ""  # the image of the last step that finished
        step_image = False  # whether the current step has printed its image
        stage_images: list[str] = []
        # A RUN's output comes in the same events as the engine's lines, so it could print "Step 4/9 : ..." or
        # " ---> <id>" and be read as the engine's. The engine's lines are read only outside a container's
        # output (" ---> Running in C" to "Removing intermediate container C"), and a step only as the next
        # number of the total the first step gave (before any container ran). A RUN that printed its own
        # container's "Removing ..." line is found when the engine's comes (or an engine line out of order).
        total = 0
        running = ""  # the container whose output the lines are, if any
        seen: set[str] = set()  # every container that ran
        unremoved: set[str] = set()  # the containers the engine failed to remove, tried again after each step
        forged = ""  # the first line found imitating the engine's
        # whether no line has come since the step's own: the engine says " ---> Using cache" there and only there
        # (a FROM's ONBUILD triggers say it later, each for a trigger); a RUN that printed a failed removal of an
        # earlier container, which ends its output for the parser, could then print it to be counted as reused
        fresh = False

        def close_step() -> None:
            if current:
                steps.append(BuildStep(number=current[0], instruction=current[1], cached=cached,
                                       image=last_image if step_image else ""))

        def where() -> str:
            return f"Step {current[0]}: {current[1]}" if current else "before the first step"

        try:
            # platform: only when asked; Engine 20.10's classic builder takes a local FROM image as it is
            # (an amd64 one too) and copies its platform into the config, so the caller checks the base
            events = self.api.build(fileobj=context, custom_context=True, tag=tag, buildargs=buildargs,
                                    nocache=nocache, rm=True, forcerm=True, pull=False, decode=True,
                                    **({"platform": platform} if platform else {}))
            for event in events:
                if not isinstance(event, dict):  # (a number, a list: was a TypeError's traceback)
                    raise EngineError(f"the engine answered the build of {tag} with something that is not its "
                                      f"progress (JSON events) (engine at {self.address})")
                message = _event_error(event)
                if message is not None:
                    raise BuildFailed(f"the build failed at {where()}: {message.strip()}",
                                      step=where(), output=tuple(tail), last_image=last_image,
                                      stage_images=tuple(stage_images))
                aux = event.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                    image_id = aux["ID"]
                text = event.get("stream")
                text = STDERR_COLOUR_RE.sub("", text) if isinstance(text, str) else ""
                for line in STREAM_LINE_END_RE.split(text):
                    match = None if running else STEP_RE.match(line)
                    removing = REMOVING_RE.match(line)
                    failed = FAILED_REMOVAL_RE.match(line)
                    at_start, fresh = fresh, fresh and not line.strip()
                    if running:
                        if removing and removing.group(1) == running:
                            running = ""
                        elif failed and (failed.group(1) == running or failed.group(1) in unremoved):
                            # this container not removed, or not tried: the engine stopped at the first it could not
                            unremoved.add(running)
                            running = ""
                            tail.append(line)
                        elif removing and removing.group(1) in unremoved:  # an earlier one, removed at last
                            unremoved.discard(removing.group(1))
                        elif line.strip():
                            tail.append(line)
                    elif match and ((not total and match.group(1) == "1")
                                    or (int(match.group(1)), int(match.group(2))) == ((current or (0,))[0] + 1, total)):
                        close_step()
                        total = total or int(match.group(2))
                        current, cached, step_image = (int(match.group(1)), match.group(3)), False, False
                        fresh = True
                        tail.clear()
                        if current[1].upper().startswith("FROM ") and last_image:
                            stage_images.append(last_image)  # the stage before this one is complete
                    elif removing and removing.group(1) in unremoved:  # removed at last, after a later step
                        unremoved.discard(removing.group(1))
                    elif failed and failed.group(1) in unremoved:  # not yet
                        tail.append(line)
                    elif match or removing or failed:  # the engine's lines never come out of order, nor twice
                        forged = forged or line
                    elif RUNNING_RE.match(line):
                        running = RUNNING_RE.match(line).group(1)
                        if running in seen:
                            forged = forged or line
                        seen.add(running)
                    elif STEP_IMAGE_RE.match(line):
                        last_image, step_image = STEP_IMAGE_RE.match(line).group(1), True
                    elif line.strip() == "---> Using cache":
                        if at_start or (current and current[1].upper().startswith("FROM ")):
                            cached = True
                        else:  # not the step's first line: a RUN's own, after a failed removal it printed
                            forged = forged or line
                    elif line.strip():
                        tail.append(line)
                    if line.strip():
                        on_line(line)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail("the build could not run", exc) from None
        except (docker.errors.StreamParseError, RecursionError):  # (docker-py's decoder: a cut or too deep event)
            raise EngineError(f"the engine's answer to the build of {tag} ended in the middle of an event, or held "
                              f"one nested too deep to read (engine at {self.address})") from None
        except KeyboardInterrupt:
            raise BuildInterrupted(last_image=last_image, stage_images=tuple(stage_images)) from None
        close_step()
        if running:  # the engine ends every container it ran: a RUN opened one it never will, to hide the rest
            forged = forged or f" ---> Running in {running}"
        if forged:
            raise EngineError(f"the build of {tag} finished, but a step's output imitated the engine's own lines "
                              f"({forged[:120]!r}): which step made which image cannot be told, so nothing is "
                              "released from it; a RUN must not print the engine's 'Step N/M :', ' ---> ...' or "
                              "'Removing intermediate container' lines")
        if not image_id:
            info = self.inspect_image(tag)
            if info is None:
                raise EngineError(f"the build reported no image and {tag} does not exist")
            image_id = info.id
        return BuildOutcome(image_id=image_id, steps=tuple(steps), stage_images=tuple(stage_images))

    def inspect_image(self, ref: str) -> ImageInfo | None:
        try:
            raw = self.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot inspect {ref}", exc) from None
        config = raw.get("Config") or {}
        return ImageInfo(id=raw["Id"], tags=tuple(raw.get("RepoTags") or ()),
                         diff_ids=tuple(raw.get("RootFS", {}).get("Layers") or ()),
                         labels=dict(config.get("Labels") or {}), size=int(raw.get("Size") or 0),
                         created=raw.get("Created", ""), env=tuple(config.get("Env") or ()),
                         architecture=raw.get("Architecture") or "", os=raw.get("Os") or "",
                         variant=raw.get("Variant") or "", onbuild=tuple(config.get("OnBuild") or ()),
                         repo_digests=tuple(d for d in raw.get("RepoDigests") or () if isinstance(d, str)))

    def history(self, ref: str) -> list[str]:
        try:
            return [h.get("CreatedBy") or "" for h in reversed(self.api.history(ref))]
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot read the history of {ref}", exc) from None

    def save(self, ref: str) -> Iterator[bytes]:
        try:
            yield from coalesced(self.api.get_image(ref, chunk_size=SAVE_PIECE), SAVE_PIECE)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"saving {ref} failed", exc) from None

    def load(self, chunks: Iterable[bytes], stop: threading.Event | None = None) -> LoadOutcome:
        """docker-py's load, read here: its answer's events each at most :data:`LOAD_EVENT_LIMIT` bytes and its
        messages kept to the last :data:`LOAD_MESSAGES` (an engine whose answer never ended, its events each
        60 kB, filled the client's memory: 7 GB in 15 s, --engine-timeout never reached as the engine kept
        talking), and ``stop`` set breaks it off, while it is sent and while the engine stores what it was sent
        (its connection shut), raising :class:`HandoffAborted`."""
        ids: list[str] = []
        tags: list[str] = []
        messages: deque[str] = deque(maxlen=LOAD_MESSAGES)
        response = None
        try:
            # quiet=False: the engine's progress while it stores the layers (its default, quiet, says nothing
            # until the end, minutes for a large image, which --engine-timeout took for an engine that stopped)
            # (requests streams an iterator, not a list)
            response = _answer_unless_stopped(stop, lambda: self.api._post(
                self.api._url("/images/load"), data=iter(chunks), params={"quiet": False}, stream=True))
            _raise_for_status(self.api, response, self.address)
            with _Breaker(stop, response):
                for event in _answer_lines(response, LOAD_EVENT_LIMIT, self.address):
                    event = self._load_event(event)
                    message = _event_error(event)
                    if message is not None:
                        raise EngineError(f"the engine refused the image: {message} (engine at {self.address})")
                    text = event.get("stream")
                    text = text.strip() if isinstance(text, str) else ""
                    if not text:
                        continue
                    messages.append(text[:1000])
                    if text.startswith("Loaded image ID: "):
                        ids.append(text.removeprefix("Loaded image ID: "))
                    elif text.startswith("Loaded image: "):
                        tags.append(text.removeprefix("Loaded image: "))
                    if len(ids) + len(tags) > LOAD_NAMES:
                        raise EngineError(f"the engine's answer to the load names more than {LOAD_NAMES} images; a "
                                          f"release holds one (engine at {self.address})")
        except (docker.errors.DockerException, requests.exceptions.RequestException,
                urllib3.exceptions.HTTPError) as exc:  # (a read of the answer's stream raises urllib3's own)
            if stop is not None and stop.is_set():
                raise HandoffAborted("interrupted") from None
            raise self._fail("loading the image failed", exc) from None
        except OSError:  # (the connection shut by the interrupt; else what the stream's reader raised, as it is)
            if stop is not None and stop.is_set():
                raise HandoffAborted("interrupted") from None
            raise
        finally:
            if response is not None:
                response.close()
        if stop is not None and stop.is_set():  # (the answer ended as the interrupt came)
            raise HandoffAborted("interrupted")
        return LoadOutcome(image_ids=tuple(ids), tags=tuple(tags), messages=tuple(messages))

    def _load_event(self, event) -> dict:
        """One event of a load's answer as a JSON object; anything else (text that is no JSON, a list, a
        number) is one error naming the engine, not a traceback from deep in the parse."""
        if isinstance(event, (bytes, str)):
            try:
                event = json.loads(event)
            except (ValueError, RecursionError):  # (RecursionError: nested deeper than the stack)
                event = None
        if not isinstance(event, dict):
            raise EngineError(f"the engine answered the load with something that is not its progress (JSON "
                              f"events) (engine at {self.address})")
        return event

    def run(self, image: str, args: list[str], *, env: dict[str, str] | None = None,
            timeout: int = 120, entrypoint: list[str] | None = None, changes: bool = False) -> RunOutcome:
        try:
            with self._container(image, args, kind="run", env=env, entrypoint=entrypoint) as container:
                self.api.start(container)
                try:
                    result = self.api.wait(container, timeout=timeout)
                except requests.exceptions.RequestException as exc:
                    if not _read_timed_out(exc):
                        raise
                    try:
                        self.api.kill(container)
                    except docker.errors.APIError as refused:
                        if refused.status_code != 409:
                            raise
                        # (409, not running: it ended by itself as the wait gave up; that end is its outcome, not
                        # the engine error "Cannot kill container: ... is not running")
                        result = self.api.wait(container, timeout=RUN_ENDED_WAIT)
                    else:
                        output = self._bounded_logs(container)
                        raise RunTimedOut(f"{image} {' '.join(args)} did not finish within {timeout} s",
                                          output=output) from None
                output = self._bounded_logs(container)
                changed = self._changes(container) if changes else ()
                return RunOutcome(exit_code=int(result.get("StatusCode", -1)), output=output, changes=changed)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"running {image} failed", exc) from None

    def _changes(self, container: dict) -> tuple[str, ...]:
        """What a stopped container changed in its image's files, as ``docker diff`` says it ("C /tmp", "A /x",
        "D /y"), or, where the engine's diff says nothing but the container's upper folder holds something (a
        folder whose entry was made and removed again: a build records that folder as a layer all the same),
        that folder's entries as changed."""
        upper = self._upper_folder(container)
        if upper == ():
            return ()  # nothing written: the engine's diff, about a second for a 1.3 GB image, is not asked
        kinds = {0: "C", 1: "A", 2: "D"}
        said = tuple(f"{kinds.get(c.get('Kind'), '?')} {c.get('Path')}" for c in self.api.diff(container) or ())
        return said or tuple(f"C {path}" for path in upper or ())

    def _upper_folder(self, container: dict) -> tuple[str, ...] | None:
        """The paths in a stopped container's upper folder, when its engine is overlay2 on this host: where
        overlayfs puts every write, removal and change of mode, and what the engine's own diff walks (Engine
        20.10's diff took about a second for a 1.3 GB image even so: it walks the whole tree). None when it
        cannot be seen as the engine's own (another storage driver, an engine elsewhere, a folder that is
        not this container's)."""
        try:
            driver = self.api.inspect_container(container).get("GraphDriver") or {}
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return None
        data = driver.get("Data") or {}
        if driver.get("Name") != "overlay2" or not isinstance(data.get("UpperDir"), str) \
                or not isinstance(data.get("LowerDir"), str):
            return None
        upper = Path(data["UpperDir"])
        layer = upper.parent
        init = Path(data["LowerDir"].split(":")[0]).parent
        # the engine's own folder, not one of the same name elsewhere: its layer ID is 64 random hex digits and its
        # init layer, named after it, is the first of its lower folders (another engine's store holds neither)
        if not (upper.is_absolute() and upper.name == "diff" and re.fullmatch(r"[0-9a-f]{64}", layer.name)
                and init.name == f"{layer.name}-init" and init.parent == layer.parent):
            return None
        try:
            if not (init / "diff").is_dir() or not (layer / "link").is_file() or not upper.is_dir():
                return None
            found: list[str] = []
            for folder, dirs, files in os.walk(upper, onerror=_raise):
                dirs.sort()
                rel = "/" + os.path.relpath(folder, upper).removeprefix(".").lstrip("/")
                found += [os.path.join(rel, name) for name in (*dirs, *sorted(files))]
                if len(found) >= UPPER_SHOWN:
                    break
            return tuple(found[:UPPER_SHOWN])
        except OSError:
            return None

    @contextlib.contextmanager
    def _container(self, image: str, command: list[str], *, kind: str, env: dict[str, str] | None = None,
                   entrypoint: list[str] | None = None) -> Iterator[dict]:
        """A created container of `image`, with no network, removed (forced) as the block ends however it
        ends. It has a name of its own: one the engine created as an interrupt came (its ID never
        answered) is removed too, by that name (else it stays, "Created", in docker ps -a)."""
        name = f"unibake-{kind}-{secrets.token_hex(6)}"
        container = None
        try:
            try:
                container = self.api.create_container(image, command=command, environment=env or {},
                                                      entrypoint=entrypoint, name=name,
                                                      host_config=self.api.create_host_config(network_mode="none"))
            except BaseException as exc:
                # an interrupt, not the engine's answer (which says no container was made)
                if not isinstance(exc, (docker.errors.DockerException, requests.exceptions.RequestException)):
                    container = {"Id": name}  # removed below by its name, if the engine made it
                raise
            yield container
        finally:
            if container is not None:
                try:
                    self.api.remove_container(container, force=True, v=True)
                except docker.errors.NotFound:
                    pass
                except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                    # (not raised: what the block found, or the failure that ended it, is the one passed on)
                    ref = _shown(str(container.get("Id") or ""))
                    print(f"warning: {one_line(str(self._fail(f'cannot remove container {ref}', exc)))}; it is left "
                          f"in the engine: remove it with docker rm -f {ref}", file=sys.stderr)

    def image_config(self, ref: str) -> dict | None:
        try:
            raw = self.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot inspect {ref}", exc) from None
        found = {"config": raw.get("Config") or {}, "architecture": raw.get("Architecture") or "",
                 "os": raw.get("Os") or ""}
        for key, name in (("Author", "author"), ("Variant", "variant"), ("OsVersion", "os.version")):
            if raw.get(key):
                found[name] = raw[key]
        return found

    def folder_header(self, image: str, path: str) -> tuple[int, int, int] | str | None:
        # the first header of the engine's archive of the folder (a created container's, never started):
        # the folder itself; the rest of the stream (the folder's whole tree) is never read. By docker-py's
        # request helpers, not its get_archive: that one gives no handle to close the answer once its first
        # blocks are read (the connection would stay busy until the engine had sent the whole tree), and
        # lifts the socket's timeout
        try:
            with self._container(image, ["true"], kind="stat", entrypoint=[]) as container:
                try:
                    response = self.api._get(self.api._url("/containers/{0}/archive", container["Id"]),
                                             params={"path": path}, stream=True)
                except requests.exceptions.RequestException as exc:
                    raise self._fail(f"cannot read {path} in {image}", exc) from None
                try:
                    if response.status_code == 404:
                        return None
                    _raise_for_status(self.api, response, self.address)
                    head = b""
                    for piece in response.iter_content(BLOCK_READ):
                        head += piece
                        if len(head) >= 3 * 512:
                            break
                finally:
                    response.close()
            found = _first_folder(head)
            return found if found is not None else "not a folder (a link, a file, or a header not read)"
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot read {path} in {image}", exc) from None

    def _bounded_logs(self, container) -> str:
        """What a container run to its end printed (stdout and stderr), kept to RUN_OUTPUT_HEAD bytes of
        its start and RUN_OUTPUT_TAIL of its end, the cut said between them: a check that prints
        without end until its bound (gigabytes in the engine's log) is never read whole. Read in order
        up to RUN_OUTPUT_SKIM bytes; past that, its end is the engine's last lines, which then lie far
        after the start kept (none is shown twice)."""
        head, tail, size, cut, more = [], deque(), 0, 0, False
        stream = self.api.logs(container, stdout=True, stderr=True, stream=True, follow=False)
        try:
            for frame in stream:
                if size < RUN_OUTPUT_HEAD:
                    head.append(frame[:RUN_OUTPUT_HEAD - size])
                    frame = frame[RUN_OUTPUT_HEAD - size:]
                    size += len(head[-1])
                    if not frame:
                        continue
                tail.append(frame)
                cut += len(frame)
                while cut - len(tail[0]) >= RUN_OUTPUT_TAIL:
                    cut -= len(tail.popleft())
                size += len(frame)
                if size > RUN_OUTPUT_HEAD + RUN_OUTPUT_SKIM:
                    more = True
                    break
        finally:
            stream.close()
        if more:
            tail = deque([self.api.logs(container, stdout=True, stderr=True, tail=RUN_OUTPUT_TAIL_LINES)])
        kept, end = b"".join(head), b"".join(tail)
        if not more and len(kept) + len(end) == size and size <= RUN_OUTPUT_HEAD + RUN_OUTPUT_TAIL:
            return (kept + end).decode("utf-8", "replace")
        return (kept.decode("utf-8", "replace") + ("" if kept.endswith(b"\n") else "\n")
                + f"[... unibake: output cut here: only its first {RUN_OUTPUT_HEAD >> 10} KiB and its last "
                  f"{RUN_OUTPUT_TAIL >> 10} KiB are kept ...]\n" + end[-RUN_OUTPUT_TAIL:].decode("utf-8", "replace"))

    def start(self, image: str, args: list[str], *, env: dict[str, str] | None = None, restarts: int = 0,
              network: str | None = None, name: str | None = None, hosts: dict[str, str] | None = None,
              ipc: str | None = None, shm_size: int | None = None) -> str:
        policy = {"Name": "on-failure", "MaximumRetryCount": restarts} if restarts else None
        container = None
        try:
            host_config = self.api.create_host_config(restart_policy=policy, network_mode=network,
                                                      extra_hosts=dict(hosts) if hosts else None, ipc_mode=ipc,
                                                      shm_size=shm_size)
            networking = (self.api.create_networking_config({network: self.api.create_endpoint_config(
                aliases=[name] if name else None)}) if network else None)
            container = self.api.create_container(image, command=args or None, environment=env or {}, name=name,
                                                  hostname=name, host_config=host_config,
                                                  networking_config=networking)
            self.api.start(container)
            return container["Id"]
        except BaseException as exc:
            if container is not None:  # created, never started (its command cannot run, an interrupt): not left
                try:
                    self.api.remove_container(container, force=True, v=True)
                except (docker.errors.DockerException, requests.exceptions.RequestException):
                    pass
            if container is None and isinstance(exc, docker.errors.APIError) and exc.status_code == 409:
                raise NameInUse(str(self._fail(f"starting {image} failed", exc))) from None  # (its name is taken)
            if isinstance(exc, (docker.errors.DockerException, requests.exceptions.RequestException)):
                raise self._fail(f"starting {image} failed", exc) from None
            raise

    def container_status(self, container: str) -> ContainerStatus:
        try:
            info = self.api.inspect_container(container)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot inspect container {_shown(container)}", exc) from None
        state = info.get("State") or {}
        return ContainerStatus(running=bool(state.get("Running")), restarting=bool(state.get("Restarting")),
                               restart_count=int(info.get("RestartCount") or 0),
                               oom_killed=bool(state.get("OOMKilled")), exit_code=int(state.get("ExitCode") or 0),
                               pid=int(state.get("Pid") or 0), id=str(info.get("Id") or ""))

    def container_state(self, container: str) -> tuple[bool, str, str]:
        try:
            info = self.api.inspect_container(container)
            # its last lines (what a failed gate says), not a log the server may have filled for minutes
            logs = self.api.logs(container, stdout=True, stderr=True, tail=RUN_OUTPUT_TAIL_LINES).decode("utf-8",
                                                                                                       "replace")
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot inspect container {_shown(container)}", exc) from None
        settings = info.get("NetworkSettings") or {}
        # on the default bridge its IPAddress; on a network of its own (a multi-node gate's) that one is
        # empty and the address is the network's; on an IPv6-only network, its global IPv6 address (a
        # link-local one needs its interface, which a client outside the container cannot name)
        networks = [n for n in (settings.get("Networks") or {}).values() if isinstance(n, dict)]
        address = next((a for a in [settings.get("IPAddress")] + [n.get("IPAddress") for n in networks]
                        + [settings.get("GlobalIPv6Address")] + [n.get("GlobalIPv6Address") for n in networks]
                        if isinstance(a, str) and a), "")
        return bool(info["State"]["Running"]), address, logs

    def remove_container(self, container: str) -> None:
        try:  # with its anonymous volumes (an image's VOLUME): left, each run would add some to the engine
            self.api.remove_container(container, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot remove container {_shown(container)}", exc) from None

    def create_network(self, name: str) -> str:
        try:
            return self.api.create_network(name, driver="bridge", check_duplicate=True)["Id"]
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # a network of that name exists: another's
                raise NameInUse(str(self._fail(f"cannot create network {name}", exc))) from None
            raise self._fail(f"cannot create network {name}", exc) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot create network {name}", exc) from None

    def remove_network(self, network: str) -> None:
        try:
            self.api.remove_network(network)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot remove network {_shown(network)}", exc) from None

    def tag(self, image: str, ref: str) -> None:
        repository, _, tag = ref.rpartition(":")
        try:
            self.api.tag(image, repository, tag, force=True)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot tag {image} as {ref}", exc) from None

    def remove_image(self, ref: str) -> None:
        try:
            self.api.remove_image(ref, force=True)
        except docker.errors.ImageNotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot remove {ref}", exc) from None

    def untag(self, ref: str) -> bool:
        try:
            self.api.remove_image(ref, force=False)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # a container uses it; or the tag went and a child image keeps the image
                return self.inspect_image(ref) is None
            raise self._fail(f"cannot remove {ref}", exc) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot remove {ref}", exc) from None
        return True

    def remove_if_unused(self, image_id: str) -> bool:
        info = self.inspect_image(image_id)
        if info is None:
            return True
        if info.tags:
            return False
        try:
            self.api.remove_image(image_id, force=False)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # a child image or a container still uses it
                return False
            raise self._fail(f"cannot remove {image_id}", exc) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail(f"cannot remove {image_id}", exc) from None
        return True

    def list_images(self, *, dangling: bool = False) -> list[ImageSummary]:
        try:
            found = self.api.images(filters={"dangling": True} if dangling else None)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._fail("cannot list images", exc) from None
        return [ImageSummary(id=i["Id"], tags=tuple(t for t in i.get("RepoTags") or () if t != "<none>:<none>"),
                             labels=dict(i.get("Labels") or {}), created=int(i.get("Created") or 0))
                for i in found]

    def pull(self, repository: str, digest: str, auth: dict[str, str] | None,
             stop: threading.Event | None = None, progress: Callable[[int], None] | None = None,
             sizes: Mapping[str, int] | None = None) -> None:
        """docker-py's pull, with two changes: the stream waits ``timeout`` for the engine's next word (docker-py
        waits without end), and ``stop`` set breaks it off at once (its connection shut: the engine ends the
        pull), raising :class:`HandoffAborted`. ``progress`` is told each layer's bytes as the engine
        downloads them (its events' progressDetail), and a layer's size from ``sizes`` when the engine says
        it holds it already (else the total it is shown against is never reached)."""
        downloaded: dict[str, tuple[int, int]] = {}  # a layer's ID: (bytes said so far, its total)
        # the engine names a layer by its digest's first 12 hex digits
        held = {d.removeprefix("sha256:")[:12]: n for d, n in (sizes or {}).items()}

        def count(event: dict) -> None:
            layer, detail, status = event.get("id"), event.get("progressDetail"), event.get("status")
            if progress is None or not isinstance(layer, str):
                return
            done, total = downloaded.get(layer, (0, 0))
            if status == "Downloading" and isinstance(detail, dict):
                now, whole = detail.get("current"), detail.get("total")
                total = whole if isinstance(whole, int) and whole > 0 else total
                if isinstance(now, int) and now > done:
                    progress(now - done)
                    done = now
            elif status == "Download complete" and total > done:
                progress(total - done)
                done = total
            elif status == "Already exists" and held.get(layer, 0) > done:
                progress(held[layer] - done)
                done = held[layer]
            downloaded[layer] = (done, total)
        # the credentials resolved by the caller (--auth-file, else the Docker config, its helpers run without
        # the environment's secrets), or none: docker-py's pull sent what this process's own Docker config
        # held for the registry, whatever --auth-file said, to every engine of a deploy
        header = docker.auth.encode_header(auth) if auth is not None else None
        response = None
        try:
            response = _answer_unless_stopped(stop, lambda: self.api._post(
                self.api._url("/images/create"), params={"fromImage": repository, "tag": digest},
                headers={"X-Registry-Auth": header} if header else {}, stream=True, timeout=self.timeout))
            _raise_for_status(self.api, response, self.address)
            with _Breaker(stop, response):
                for line in _answer_lines(response, LOAD_EVENT_LIMIT, self.address):
                    # (by hand, as a load's: docker-py's decoder kept all it read until it parsed, without bound)
                    try:
                        event = json.loads(line)
                    except (ValueError, RecursionError):  # (RecursionError: nested deeper than the stack)
                        event = None
                    if not isinstance(event, dict):  # (a number was a TypeError's traceback)
                        raise EngineError(f"the engine answered the pull of {repository}@{digest} with something "
                                          f"that is not its progress (JSON events) (engine at {self.address})")
                    message = _event_error(event)
                    if message is not None:
                        raise EngineError(f"the engine could not pull {repository}@{digest}: {_pull_hint(message)} "
                                          f"(engine at {self.address})")
                    count(event)
        except (docker.errors.DockerException, requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
                OSError, ValueError) as exc:  # (a shut stream: urllib3's errors, or a half JSON document)
            if stop is not None and stop.is_set():
                raise HandoffAborted("interrupted") from None
            if _read_timed_out(exc):
                raise self._fail(f"pulling {repository}@{digest} failed", exc) from None
            raise EngineError(f"pulling {repository}@{digest} failed: {_pull_hint(_reason(exc))} "
                              f"(engine at {self.address})") from None
        finally:
            if response is not None:
                response.close()
        if stop is not None and stop.is_set():  # (the stream ended as the interrupt came)
            raise HandoffAborted("interrupted")


def _tls_from_env(env: Mapping[str, str]):
    """The TLS settings the docker CLI takes from the environment: TLS, the engine's certificate verified against
    ``$DOCKER_CERT_PATH/ca.pem`` (default ``~/.docker``), only when DOCKER_TLS_VERIFY is set and not empty; else
    none. (docker-py's ``kwargs_from_env`` turns TLS on WITHOUT verifying for DOCKER_CERT_PATH alone: the
    registry's credentials a pull hands the engine went over a connection anyone between could read.)"""
    if not env.get("DOCKER_TLS_VERIFY"):
        return None
    tls = docker.utils.kwargs_from_env(environment=dict(env)).get("tls")
    if tls is None or tls.verify is not True:  # (docker-py's rules changed under us: refused, never unverified)
        raise InputError("DOCKER_TLS_VERIFY is set, but docker-py gave TLS settings that do not verify the engine")
    return tls


def _raise_for_status(api, response, address: str) -> None:
    """docker-py's check of a streamed answer's status, its error's body read first up to :data:`ERROR_LIMIT`
    (docker-py reads it whole to build the error: an engine that answered an error without end filled the
    client's memory)."""
    if response.status_code >= 400 and bounded_body(response, ERROR_LIMIT)[1]:
        raise EngineError(f"the engine answered {response.status_code} with an error longer than "
                          f"{ERROR_LIMIT >> 20} MiB, which no engine sends: not read further (engine at {address})")
    api._raise_for_status(response)


def _event_error(event: dict) -> str | None:
    """What an engine's progress event (a build's, a load's, a pull's) says went wrong, or None when it says nothing
    did; ``no reason given`` for an error with no text (an errorDetail that is no object, or an error that is no text,
    was a traceback)."""
    if "error" not in event and "errorDetail" not in event:
        return None
    detail = event.get("errorDetail")
    return str((detail.get("message") if isinstance(detail, dict) else None) or event.get("error") or "no reason given")


def _answer_lines(response, limit: int, address: str) -> Iterator[bytes]:
    """A streamed answer's events, one a line (the engine ends each with CRLF), each at most ``limit`` bytes: read
    by hand because docker-py's decoder keeps what it has read until it parses as JSON, without bound (an engine
    that never closed its object filled the client's memory). A last event without its line end is given too."""
    buffered = b""
    for piece in response.iter_content(1 << 16):
        buffered += piece
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
        if len(buffered) > limit:
            raise EngineError(f"the engine's answer holds an event longer than {limit >> 20} MiB, which no engine "
                              f"sends (engine at {address})")
    if buffered.strip():
        yield buffered


def _answer_unless_stopped(stop: threading.Event | None, post: Callable[[], requests.Response]) -> requests.Response:
    """``post()``'s answer; ``stop`` set before it comes raises :class:`HandoffAborted` at once: an engine
    sends not even its answer's headers until it has reached the registry (up to a minute for a slow
    one), and only an answer's connection can be shut. One that comes after is closed unread (the
    engine then ends the pull)."""
    if stop is None:
        return post()
    got: list = []
    lock, came = threading.Lock(), threading.Event()

    def run() -> None:
        try:
            answer = post()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, or dropped once it has gone
            answer = exc
        with lock:
            got.append(answer)
            late = stop.is_set() and came.is_set()
            came.set()
        if late and isinstance(answer, requests.Response):
            answer.close()

    threading.Thread(target=run, daemon=True, name="unibake-pull-request").start()
    while not came.wait(_Breaker.TICK):
        if stop.is_set():
            with lock:
                if not got:
                    came.set()  # (the answer, when it comes, is closed by its thread)
                    raise HandoffAborted("interrupted")
    answer = got[0]
    if isinstance(answer, BaseException):
        raise answer
    return answer


class _Breaker:
    """While a streamed answer is read, a thread that shuts its connection once ``stop`` is set: the
    read blocked on it returns at once (a socket's shutdown; an ssh:// engine's ssh client is ended)."""

    TICK = 0.1

    def __init__(self, stop: threading.Event | None, response) -> None:
        self.stop, self.response, self.done = stop, response, threading.Event()

    def _run(self) -> None:
        while not self.done.wait(self.TICK):
            if self.stop.is_set():
                sock = getattr(getattr(self.response.raw, "_connection", None), "sock", None)
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except (OSError, TypeError):  # (not a connected socket: docker-py's ssh one, or gone)
                    close = getattr(sock, "close", None)
                    if close is not None and not self.done.is_set():
                        try:  # (docker-py's ssh socket ends its ssh client; a pipe already broken raises)
                            close()
                        except OSError:
                            pass
                return

    def __enter__(self) -> "_Breaker":
        if self.stop is not None:
            threading.Thread(target=self._run, daemon=True, name="unibake-pull-breaker").start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()


RUN_ENDED_WAIT = 60  # s for the engine to give the exit code of a run's container that has ended
UPPER_SHOWN = 20  # paths of a container's upper folder said, at most, when the engine's diff says none


def _raise(error: OSError) -> None:
    raise error


def _read_timed_out(exc: Exception) -> bool:
    """A wait that ran past its timeout: requests says ReadTimeout over TCP, but over the engine's unix
    socket (docker-py's own adapter) a ConnectionError wrapping urllib3's ReadTimeoutError; a streamed
    answer's read (a load's, a pull's) raises urllib3's own."""
    return isinstance(exc, (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError)) or \
        any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


def _write_timed_out(exc: Exception) -> bool:
    """A send (a load's stream) that the engine took nothing of for the timeout: requests says the
    connection was aborted, with the socket's TimeoutError inside urllib3's ProtocolError."""
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ProtocolError) and any(isinstance(a, TimeoutError) for a in arg.args)
        for arg in exc.args)


class AnswerTooLong(requests.exceptions.RequestException):
    """An engine's answer longer than :data:`MAX_ANSWER`, which the client stopped reading."""


def _bounded_answer(response, *args, stream: bool = False, **kwargs):
    """The body of an answer the client reads whole (not streamed: an export, a load's or a build's events are read
    piece by piece by their readers), read here up to :data:`MAX_ANSWER` (requests would read it whole, and an
    endless one without end)."""
    if stream:
        return response
    if bounded_body(response, MAX_ANSWER)[1]:
        path = one_line(response.request.path_url.split("?", 1)[0])[:100] if response.request else "a request"
        raise AnswerTooLong(f"its answer to {path} is longer than {MAX_ANSWER >> 20} MiB, more than any engine "
                            "gives there: not read further")
    return response


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("FileNotFoundError", "ConnectionRefusedError", "Connection refused", "No such file"):
        if marker in text:
            return "no engine listens there"
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return text.splitlines()[0] if text else type(exc).__name__


def _unreachable(address: str, exc: Exception) -> str:
    """Why an engine could not be reached, and what to do: the local socket is started by
    scripts/setup.sh; an engine elsewhere is for its owner to start or for the network to reach."""
    reason = _reason(exc)
    if address.startswith("ssh://"):
        # docker-py runs the ssh client, whose own message (refused, unknown host, denied) is printed above;
        # a missing client is the FileNotFoundError of starting it, not an engine that does not listen
        reason = ("no ssh client is installed here (docker-py runs ssh)" if shutil.which("ssh") is None else
                  "ssh did not connect, or no engine answered through it (ssh's own message, if any, is above)")
    if address == DEFAULT_ADDRESS:
        return f"{reason}; start it (scripts/setup.sh does) or name one with --engine"
    if address.startswith("unix://"):
        return f"{reason}; start the engine that serves that socket, or name another with --engine"
    return f"{reason}; check that the engine runs there and that this machine reaches it"


def _pull_hint(message: str) -> str:
    """An engine's pull error, with what to do when it is the registry's certificate."""
    if "x509" in message or "certificate" in message:
        host = message.split("https://", 1)[-1].split("/", 1)[0] if "https://" in message else "HOST:PORT"
        return (f"{message}; the engine does not trust the registry's certificate: put its CA certificate in "
                f"/etc/docker/certs.d/{host}/ca.crt on the engine's host")
    return message
