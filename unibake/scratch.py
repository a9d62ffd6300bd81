"""A scratch ``dockerd``: an engine that has never seen the image, for the round trip.

It runs in its own network namespace (``unshare --net``: its bridge can never touch the host
engine's ``docker0``), with its own data root, exec root, pidfile and socket, and is stopped by its
PID when the context ends (also on Ctrl-C and SIGTERM). One left behind by a killed run is
stopped and removed by the next run that uses the same scratch folder.

:class:`SeededEngine` is the one-pass export's verify engine: a scratch engine whose data folder
is kept between runs and holds ONE image, the base image the product is built FROM (checked at
every start: that image and nothing else, no container; anything else and it is wiped and seeded
again). A run that finds it to seed (``defer``) has it start empty instead: its round trip loads the
whole image, and the base image is made there from the layers it loaded as the run stops (its config
alone loaded), so the first release on a base costs no more than one in an empty scratch engine. Later
runs' round trips load only the layers the release adds and its config: the engine never saw the
release's image, and the base layers it holds carry the same diffIDs the archive's read back
recomputed. Each run removes what it loaded before the engine stops, but for the release
images it may keep (:meth:`SeededEngine.keep_after`, at most KEPT_MAX: the release it made and, made
``--from`` another, that one too; a hotfix keeps its base release, as no release is made on a hotfix),
named in the folder's ``kept`` mark: a hotfix or a ``--from`` release on one of them then finds its
base release there and loads only itself (the engine held that release and the base image, nothing
else: the other kept one is removed as the engine starts). So a second release made on the same
release, as well as a release made on the last one, loads only what it adds. A run that wants none
(a release's round trip starts from the base image alone) has every kept one removed as it starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import docker
import requests

from .docker_engine import TIMEOUT, DockerEngine
from .errors import EngineError, RoundTripUnavailable, VerificationError
from .files import private_folder
from .layerstore import StoredImage, chain_ids, stored_image
from .publish import held_signals
from .schema import IMAGE_ID_RE
from .threads import Thread, counted

SCRATCH_PREFIX = "ub-scratch-"
SEED_PREFIX = "ub-seed-"
SEEDED_MARK = "seeded"  # written once the base image is loaded: the base image ID it holds
KEPT_MARK = "kept"  # the release images a seeded engine keeps besides its base image, one per line, if any
KEPT_MAX = 2  # the release a run made and the one it was made on
SEED_DIGITS = 16  # of the base image ID, in a seeded engine's folder name
_SEED_DIGITS = re.compile(f"[0-9a-f]{{{SEED_DIGITS}}}")
_SEED_CONTENTS = frozenset({"root", "dockerd.log", SEEDED_MARK, KEPT_MARK})  # all a seeded engine's folder holds
SEEDS_KEPT = 2  # seeded engines kept per scratch folder (each holds a copy of one base image)
RUNTIME_PREFIX = "ubx-"
START_TIMEOUT = 90
PROBE_TIMEOUT = 5  # one readiness probe of a starting scratch dockerd
STOP_TIMEOUT = 30
OWNERLESS_SECONDS = 60  # a scratch folder with no owner file yet is a starting run's for this long
# What a scratch engine runs: only processes of these executables, of this user, whose arguments
# name one of its folders, are ever stopped; a file in a folder (which anyone may have planted) is
# never enough.
DAEMON_EXECUTABLES = frozenset({"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2",
                                "docker-proxy", "runc"})


def _default_base() -> Path:
    return Path("/var/tmp") / f"unibake-{os.geteuid()}"


def private_base() -> Path:
    """``/var/tmp/unibake-<uid>``: the default scratch place, on disk (a scratch engine holds a whole
    image), created 0700 and refused unless it is this user's own folder."""
    base = _default_base()
    try:
        base.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RoundTripUnavailable(f"cannot make the scratch folder {base}: {exc.strerror}") from None
    check_private(base)
    return base


def check_private(folder: Path) -> None:
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() \
            or info.st_mode & 0o077:
        raise RoundTripUnavailable(f"{folder} is not a private folder of this user (a symlink, another owner, or "
                                   "open to others); remove it or choose --scratch-dir")
    above = open_above(folder)
    if above is not None:
        raise RoundTripUnavailable(f"{folder} lies under {above}, which another user may write (neither this "
                                   "user's nor root's, or open to others without the sticky bit): they could put a "
                                   "folder of theirs in its place, where the scratch engine (root's daemon) then "
                                   "writes; choose --scratch-dir under folders only this user and root can write")


def open_above(folder: Path) -> str | None:
    """The first folder above ``folder`` (as given, and as its links lead) that another user may write: owned by
    another user than this one or root, or writable by group or others without the sticky bit (``/var/tmp``'s is
    set: no one may rename another's folder there). None: only this user and root can move what lies there."""
    given = Path(os.path.abspath(folder))
    real = Path(os.path.realpath(folder))
    for above in dict.fromkeys([*given.parents, *real.parents]):
        try:
            link = os.lstat(above)
            info = os.stat(above)
        except FileNotFoundError:  # (made by this run, this user's)
            continue
        except OSError:
            return str(above)
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, os.geteuid()):  # its owner may point it elsewhere
            return str(above)
        if info.st_uid not in (0, os.geteuid()) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            return str(above)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name (state, parent PID, ...); [] when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> str:
    """The process's start time (in clock ticks since boot): a PID that was reused has another."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def _mount_namespace(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _processes_of(places: list[Path]) -> list[tuple[int, str]]:
    """The scratch engine's processes: this user's dockerd/containerd/shims whose arguments name one
    of ``places`` (the data root, the exec root, the socket), each with its start time (a PID reused
    later has another). Only those that see the files this process sees: a run in a container (its own
    mount namespace, the host's PIDs visible from the host) names the same paths, and they are its own."""
    prefixes = [str(p) for p in places]
    ours = _mount_namespace("self")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.geteuid():
                continue
            exe = os.path.basename(os.readlink(entry / "exe")).removesuffix(" (deleted)")
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # (where this process's own namespace cannot be read, a sandbox's /proc: every one is taken as its own)
        if exe not in DAEMON_EXECUTABLES or (ours and _mount_namespace(entry.name) != ours):
            continue
        words = [a.decode("utf-8", "replace").removeprefix("unix://") for a in args]
        if any(w == p or w.startswith(p + "/") for w in words for p in prefixes):
            when = _start_time(int(entry.name))
            if when:
                found.append((int(entry.name), when))
    return found


def _stop(pid: int, started: str, timeout: float) -> None:
    """Stop the process ``pid`` that started at ``started`` (clock ticks since boot): each signal is sent only while
    that PID is still that process (a dockerd's containerd and shims end with it, and their PIDs may then be
    another's by the time this one is reached)."""
    if _start_time(pid) != started:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # it ended (and was reaped) since its start time was read: stopped
        return
    deadline = time.monotonic() + timeout
    while _start_time(pid) == started and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    if _start_time(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _children(pid: int) -> list[tuple[int, str]]:
    """The processes ``pid`` started that still run, each with its start time (a reused PID has another)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(entry.name)
            if len(fields) > 19 and fields[1] == str(pid):
                found.append((int(entry.name), fields[19]))
    return found


def _stop_dockerd(pid: int, timeout: float) -> None:
    """Stop a dockerd this process started, and the containerd it manages.

    Engine 20.10 shuts its daemon down in milliseconds, then asks its containerd to stop and looks
    whether it is gone once a second: its exit waited a whole second for a containerd gone in a few
    milliseconds. It asks that containerd to stop only once its own shutdown is over (its data closed),
    and after that has nothing left to do but remove its pid file (in the runtime folder, removed
    with it): so once every process it started is gone, it is killed instead of waited for.
    """
    if not _alive(pid):
        return
    started = _children(pid)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pause = 0.005
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
        except ChildProcessError:  # not our child after all: looked for as any process
            if not _alive(pid):
                return
        if started and all(_start_time(child) != when for child, when in started):
            break  # its containerd is gone: it only sleeps out its second now
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _unmount_under(folder: Path) -> None:
    """Every mount at or under ``folder``, unmounted (lazily): a killed daemon's. mountinfo's mount points are bytes
    with space, tab, newline and backslash as octal escapes (read as bytes: a UTF-8 --scratch-dir's is its own)."""
    mounts = []
    here = os.fsencode(str(folder))
    try:
        for line in Path("/proc/self/mountinfo").read_bytes().splitlines():
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8) & 0xFF]), line.split()[4])
            if point == here or point.startswith(here + b"/"):
                mounts.append(point)
    except (OSError, IndexError):
        return
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def runtime_of(folder: Path, base: Path | None = None) -> Path:
    """The short folder of a scratch engine's sockets (Unix socket paths are limited to 107 bytes),
    named after its data folder, never read from a file; under ``base``, else the private base (made)."""
    base = private_base() if base is None else base
    name = RUNTIME_PREFIX + folder.name.removeprefix(SCRATCH_PREFIX)
    parent = os.path.abspath(folder.parent)
    if parent != str(base):  # a --scratch-dir: its seed of the same base image is another engine, another runtime
        name += "-" + hashlib.sha256(parent.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return base / name


def _remove(place: Path) -> None:
    """A scratch engine's folder removed, whatever it holds (errors ignored, as the folder is private). An image
    whose files nest about a thousand folders deep (its layers are unpacked here) is past shutil.rmtree, which
    recurses once per level (a RecursionError, which ignore_errors does not cover: a traceback, the folder
    left, and every later run's clean-up failing on it): coreutils' rm walks any depth, and stays on the file
    system (a mount left under it is not followed)."""
    try:
        shutil.rmtree(place, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(place)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def remove_scratch_dir(folder: Path) -> None:
    """Stop what still runs from ``folder`` and its runtime folder (verified processes, by PID),
    unmount, delete both: only folders this user made."""
    # the runtime folder only where the default base is already this user's private folder: prune of a
    # --scratch-dir neither makes that base nor fails on one it does not own (after removing images, before)
    base = _default_base()
    places = [p for p in (folder, runtime_of(folder, base) if private_folder(base) else None)
              if p is not None and private_folder(p)]
    for pid, started in _processes_of(places):
        _stop(pid, started, STOP_TIMEOUT)
    for place in places:
        _unmount_under(place)
        _remove(place)


def _owner_alive(folder: Path) -> bool:
    """Whether the run that made ``folder`` still runs (its PID and that process's start time). A folder with no
    owner yet, made less than OWNERLESS_SECONDS ago, counts as a live run's: a run writes its owner a moment after
    it makes the folder, and another run's clean-up in that moment removed it (one a run killed in that moment left
    is removed by a run after that)."""
    try:
        pid, started = (folder / "owner").read_text().split()
        pid_number = int(pid)
    except (OSError, ValueError):
        try:
            return time.time() - folder.stat().st_mtime < OWNERLESS_SECONDS
        except OSError:
            return False
    return _alive(pid_number) and _start_time(pid_number) == started  # this process's other engines too


def clean_stale_scratch(base: Path) -> list[Path]:
    """Scratch folders of this user whose run is gone (killed with SIGKILL): stop their daemon, remove
    them. A seeded engine's daemon left running by such a run is stopped; its data folder stays."""
    removed = []
    for folder in sorted(base.glob(f"{SCRATCH_PREFIX}*")):
        if not private_folder(folder) or _owner_alive(folder):
            continue
        remove_scratch_dir(folder)
        removed.append(folder)
    for folder in _seed_folders(base):
        try:
            lock = _try_lock(folder)
        except RoundTripUnavailable:  # its lock cannot be opened (planted?): not ours to touch
            continue
        if lock is None:  # in use by a running run
            continue
        try:
            _stop_seed_processes(folder)
        finally:
            os.close(lock)
    return removed


def _try_lock(folder: Path, *, create: bool = True) -> int | None:
    """The seeded engine's lock (a file beside its folder), taken without waiting; None: another run
    holds it. The lock goes with the process, so a killed run never leaves it taken. ``create=False``
    (a dry run, which writes nothing) only opens a lock file that is there."""
    flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
    try:
        fd = os.open(_lock_path(folder), flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RoundTripUnavailable(f"cannot open the lock of {folder}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:  # (ENOLCK: a --scratch-dir on a file system that takes no locks)
        os.close(fd)
        raise RoundTripUnavailable(f"cannot lock {_lock_path(folder)} ({exc.strerror}): --scratch-dir must be on a "
                                   "file system that takes locks (flock)") from None
    return fd


def _lock_path(folder: Path) -> Path:
    return folder.parent / f"{folder.name}.lock"


def _seed_folders(base: Path) -> list[Path]:
    """The seeded verify engines unibake made in ``base``: a private folder of this user named after
    a base image ID (``ub-seed-`` and 16 hex digits), holding only what a seeded engine holds (its
    data root, dockerd's log, the mark) and one of unibake's marks: the mark naming a base image of
    that ID, or the log every start writes (a seeding that never finished). A folder of the same
    prefix made by anyone else (``ub-seed-thesis``) is never locked, stopped or removed."""
    found = []
    for folder in sorted(base.glob(f"{SEED_PREFIX}*")):
        digits = folder.name.removeprefix(SEED_PREFIX)
        if not (_SEED_DIGITS.fullmatch(digits) and private_folder(folder)):
            continue
        try:
            names = set(os.listdir(folder))
        except OSError:
            continue
        mark = _read_mark(folder)
        if names <= _SEED_CONTENTS and (mark.startswith(f"sha256:{digits}") or "dockerd.log" in names):
            found.append(folder)
    return found


def _stop_seed_processes(folder: Path) -> None:
    """Stop a seeded engine's daemon (verified processes, by PID) and remove its runtime folder; the
    data folder stays."""
    runtime = runtime_of(folder)
    for pid, started in _processes_of([p for p in (folder, runtime) if private_folder(p)]):
        _stop(pid, started, STOP_TIMEOUT)
    for place in (folder, runtime):
        if private_folder(place):
            _unmount_under(place)
    if private_folder(runtime):
        _remove(runtime)


def _evict_seeds(base: Path, keep: Path) -> list[Path]:
    """Seeded engines beyond the newest SEEDS_KEPT (``keep`` counts as the newest), removed whole
    unless a run is using them."""
    others = [f for f in _seed_folders(base) if f != keep]
    others.sort(key=lambda f: f.stat().st_mtime, reverse=True)
    return [f for f, busy in _remove_seeds(others[SEEDS_KEPT - 1:]) if not busy]


def _read_mark(folder: Path, name: str = SEEDED_MARK) -> str:
    """The base image ID a seeded engine's mark names; "" when it has none (never seeded to the end) or
    it names no image ID."""
    try:
        mark = (folder / name).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return mark if IMAGE_ID_RE.fullmatch(mark) else ""


def _read_kept(folder: Path) -> tuple[str, ...]:
    """The release image IDs the ``kept`` mark names (at most KEPT_MAX, one per line); none when it is
    missing, or names anything but image IDs, or more of them (then every kept image goes: the engine
    holding more than its base, it is seeded again)."""
    try:
        lines = (folder / KEPT_MARK).read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return ()
    if len(lines) > KEPT_MAX or not all(IMAGE_ID_RE.fullmatch(x) for x in lines):
        return ()
    return tuple(dict.fromkeys(lines))


@dataclass(frozen=True, kw_only=True)
class Seed:
    folder: Path
    base_id: str  # what its mark names ("" when it was never seeded to the end)
    busy: bool  # a run holds its lock: not removed


def _remove_seeds(folders: list[Path], *, dry_run: bool = False) -> list[tuple[Path, bool]]:
    """Each folder removed whole (daemon stopped, mounts undone) unless a run holds its lock:
    ``(folder, busy)``. The lock file stays: removing it could let two runs lock two files."""
    out = []
    for folder in folders:
        if dry_run and not os.path.lexists(_lock_path(folder)):  # no run ever locked it (and none writes here)
            out.append((folder, False))
            continue
        try:
            lock = _try_lock(folder, create=not dry_run)
        except RoundTripUnavailable:  # its lock cannot be opened (planted?): not ours to touch
            continue
        if lock is None:
            out.append((folder, True))
            continue
        try:
            if not dry_run:
                remove_scratch_dir(folder)
            out.append((folder, False))
        finally:
            os.close(lock)
    return out


def prune_seeds(base: Path, *, dry_run: bool = False) -> list[Seed]:
    """``build.py prune``: every seeded verify engine of this user in the scratch folder ``base``
    removed (a copy of a base image each; the next release on that base seeds one again), except
    those a run is using. Refuses a scratch folder that is not this user's private folder."""
    if not base.exists():
        return []
    check_private(base)
    folders = _seed_folders(base)
    marks = {folder: _read_mark(folder) for folder in folders}
    return [Seed(folder=f, base_id=marks[f], busy=busy) for f, busy in _remove_seeds(folders, dry_run=dry_run)]


class ScratchEngine:
    """A throwaway dockerd in its own network namespace; a context manager that always stops it."""

    def __init__(self, base: Path | None = None, *, on_line=lambda line: None):
        self.base = Path(base) if base else None
        self.on_line = on_line
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None
        self.engine: DockerEngine | None = None
        self._stopping: Thread | None = None
        self._stop_error: BaseException | None = None  # what the stop raised in its thread

    @staticmethod
    def unavailable_reason() -> str | None:
        if os.geteuid() != 0:
            return "starting a scratch dockerd needs root"
        for tool in ("dockerd", "unshare", "nsenter"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed (Debian: docker.io, util-linux)"
        return None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> "ScratchEngine":
        self._prepare_base()
        try:  # an interrupt from the folder's making on is cleaned up by the exit (it left an empty folder)
            with held_signals():  # made and recorded as one step: a signal lands once self.folder names it
                self.folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.base))  # 0700, this user's
            (self.folder / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._start()
        return self

    def _prepare_base(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise RoundTripUnavailable(f"no scratch engine for the round trip: {reason}; run as root, name an "
                                       "engine that never saw the image with --verify-engine URL, or skip with "
                                       "--no-roundtrip (the notes will say so)")
        if self.base is None:
            self.base = private_base()
        else:
            try:
                self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise RoundTripUnavailable(f"cannot use --scratch-dir {self.base}: {exc.strerror}") from None
            check_private(self.base)  # as prune checks it: a seed made in a shared /tmp could not be pruned
        for folder in clean_stale_scratch(self.base):
            self.on_line(f"removed a scratch engine left by an interrupted run: {folder}")

    def _start(self) -> None:
        """Start dockerd on ``self.folder``'s data root and wait until it answers; on any failure
        everything is stopped and cleaned up."""
        try:
            self._start_daemon()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _start_daemon(self) -> None:
        runtime = runtime_of(self.folder)
        runtime.mkdir(mode=0o700, exist_ok=True)
        check_private(runtime)
        sock = runtime / "sock"
        log = open(self.folder / "dockerd.log", "wb")
        cmd = daemon_command(self.folder, runtime)
        try:
            # started and recorded as one step: an interrupt inside Popen (the child made, the object never
            # returned) lands once self.process names the child, for the exit to stop it (it ran on, in its session)
            with held_signals():
                self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        except OSError as exc:
            raise RoundTripUnavailable(f"cannot start a scratch dockerd: {exc}") from None
        finally:
            log.close()
        self._wait_ready(sock)

    def _wait_ready(self, sock: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pause = 0.01  # a dockerd on a kept data folder answers in about 0.1 s: asked often at first, then every 0.2 s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RoundTripUnavailable(f"the scratch dockerd exited at start ({self._log_tail()})")
            if sock.exists():
                try:
                    # each probe bounded: a dockerd whose socket accepts but never answers would
                    # otherwise hold the first request for the client's hour-long timeout
                    engine = DockerEngine(f"unix://{sock}", timeout=PROBE_TIMEOUT)
                    engine.version()
                    engine.api.timeout = TIMEOUT  # the loads and runs to come may take long
                    self.engine = engine
                    return
                except EngineError:
                    pass
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        raise RoundTripUnavailable(f"the scratch dockerd did not answer within {START_TIMEOUT} s "
                                   f"({self._log_tail()})")

    def _log_tail(self) -> str:
        try:
            lines = (self.folder / "dockerd.log").read_text(errors="replace").strip().splitlines()
            return "; ".join(lines[-3:]) or "no output"
        except OSError:
            return "no log"

    def _cleanup(self) -> None:
        if self.folder is not None:
            remove_scratch_dir(self.folder)
            self.folder = None

    def stop_in_background(self) -> None:
        """No stage needs this engine any more: stop it and remove its data in a thread while the
        release's last stages run (about 3 s for a 1.3 GB image: dockerd's shutdown and the removal
        of its layer store). The exit waits for that thread, so nothing is left behind either way."""
        if self._stopping is None and (self.process is not None or self.folder is not None):
            self._stopping = Thread(target=self._stop_caught, name="scratch-engine-stop")
            self._stopping.start()

    def _stop_caught(self) -> None:
        try:
            self._stop_all()
        except BaseException as exc:  # raised by the exit, as a stop run there raises it
            self._stop_error = exc

    def __exit__(self, *exc) -> None:
        # the stop runs in its thread however the run ends (a failed run's exit stops it too): Ctrl-C while it
        # stops cannot cut it short, and the exit waits for it alone (a second stop beside it raced it)
        interrupted = None
        self.stop_in_background()
        if self._stopping is not None:
            while self._stopping.is_alive():
                try:
                    self._stopping.join()
                except KeyboardInterrupt as stop:  # Ctrl-C while it stops: the clean-up still runs to its end
                    interrupted = stop
            self._stopping = None
        error, self._stop_error = self._stop_error, None
        try:
            self._stop_all()
        except Exception as again:  # (what the stop in its thread left undone, tried once more)
            if exc[0] is None and error is None:
                raise
            print(f"warning: stopping the scratch engine: {again}", file=sys.stderr)  # the first error goes on
        if interrupted is not None:
            raise interrupted
        if error is not None:
            if exc[0] is not None:  # the run's own failure is the one passed on; the stop's is said beside it
                print(f"warning: stopping the scratch engine: {error}", file=sys.stderr)
                return
            raise error

    def _stop_all(self) -> None:
        self._stop_daemon()
        self._cleanup()

    def _stop_daemon(self) -> None:
        if self.engine is not None:
            self.engine.api.close()
            self.engine = None
        if self.process is not None:
            if self.process.poll() is None:  # (one that ended was reaped: its PID may be another process's now)
                _stop_dockerd(self.process.pid, STOP_TIMEOUT)
            self.process = None


def daemon_command(folder: Path, runtime: Path) -> list[str]:
    """The scratch dockerd's command line: its data in ``folder``, its sockets in ``runtime``.

    Its own network namespace: its bridge can never touch the host engine's docker0. Its own containerd
    namespaces, named after its folder: Engine 20.10 uses the system's containerd where
    ``/run/containerd/containerd.sock`` is (Docker CE's layout) instead of starting its own, and in the host
    engine's namespace ("moby") each daemon got the other's containers' events, and the scratch engine's
    containers (the smoke gates') sat among the host engine's (moby#41640)."""
    namespace = "unibake-" + hashlib.sha256(os.fsencode(str(folder))).hexdigest()[:16]
    return ["unshare", "--net", "--", shutil.which("dockerd") or "dockerd", "--data-root", str(folder / "root"),
            "--exec-root", str(runtime / "exec"), "--pidfile", str(runtime / "pid"),
            "-H", f"unix://{runtime / 'sock'}", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
            "--userland-proxy=false", "--containerd-namespace", namespace,
            "--containerd-plugins-namespace", f"{namespace}-plugins"]


class SeedBusy(RoundTripUnavailable):
    """Another run is using the seeded engine of this base image."""


class SeededEngine(ScratchEngine):
    """A scratch engine kept between runs that holds only the base image ``base_id`` when a run
    starts using it (see the module's docstring). A run that finds it in use by another run, or
    holding anything else, gets :class:`SeedBusy`, or a wiped and newly seeded engine."""

    def __init__(self, base: Path | None = None, *, source, base_id: str, on_line=lambda line: None,
                 progress: Callable[[str, int | None], AbstractContextManager] | None = None,
                 keep: str | None = None, defer: bool = False):
        super().__init__(base, on_line=on_line)
        self.progress = progress or (lambda description, total: nullcontext(lambda n: None))
        if not IMAGE_ID_RE.fullmatch(base_id) or (keep is not None and not IMAGE_ID_RE.fullmatch(keep)):
            raise EngineError(f"the base image ID {base_id!r} is not a sha256 digest")
        self.source, self.base_id = source, base_id
        self.seeded_now = False
        self.defer = defer  # an engine to seed starts empty, and is seeded from the run's round trip (_seed_or_defer)
        self.deferred: bytes | None = None  # then: the base image as its config alone, loaded as the run stops
        self._lock: int | None = None
        self.wanted = keep  # the release image the run would find kept here (a hotfix's base release)
        self.kept: str | None = None  # ``wanted``, when the engine holds it as the run starts
        self._keep_after: tuple[str, ...] = ()

    def __enter__(self) -> "SeededEngine":
        self._prepare_base()
        folder = self.base / f"{SEED_PREFIX}{self.base_id.removeprefix('sha256:')[:SEED_DIGITS]}"
        self._lock = _try_lock(folder)
        if self._lock is None:
            raise SeedBusy(f"the verify engine seeded with the base image {self.base_id[:19]} is in use by another run")
        try:
            try:
                folder.mkdir(mode=0o700, exist_ok=True)
            except OSError as exc:
                raise RoundTripUnavailable(f"cannot make the verify engine's folder {folder}: "
                                           f"{exc.strerror or exc}") from None
            check_private(folder)
            _stop_seed_processes(folder)  # a daemon a killed run left running
            self.folder = folder
            if _read_mark(self.folder) != self.base_id:
                self._wipe()
            self._start()
            self._settle_kept()
            if not self._holds_only_base():
                if _read_mark(self.folder) == self.base_id:
                    self.on_line(f"    the seeded verify engine {folder} held more than its base image: seeded again")
                    self._stop_daemon()
                    self._wipe()
                    self._start()
                self._seed_or_defer()
            os.utime(folder)  # the newest, for the eviction of older ones
            for old in _evict_seeds(self.base, folder):
                self.on_line(f"    removed an older seeded verify engine: {old}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wipe(self) -> None:
        """The data root removed (the engine must be stopped): the next start is an empty engine."""
        (self.folder / SEEDED_MARK).unlink(missing_ok=True)
        (self.folder / KEPT_MARK).unlink(missing_ok=True)
        self.kept = None
        _unmount_under(self.folder)
        _remove(self.folder / "root")

    def _holds_only_base(self, kept: frozenset[str] | None = None) -> bool:
        """The base image and nothing else (but the kept release, when the run wants it; ``kept``: these
        instead): no other image, no container."""
        return self._holds({self.base_id} | (kept if kept is not None else {self.kept} if self.kept else set()))

    def _holds(self, images: set[str]) -> bool:
        """The engine holds these images (by ID) and nothing else: no other image, no container, and no layer but
        theirs in its store. A load the daemon was stopped or killed in (a run's failure while a base release still
        loaded, a crash) leaves layers no image names; a later load finds such a layer by its chain ID and takes it
        as it is, without unpacking the archive's bytes of it: the engine would not be one that never saw them."""
        try:
            api = self.engine.api
            if {i["Id"] for i in api.images(all=True)} != images or api.containers(all=True):
                return False
            infos = [self.engine.inspect_image(image) for image in images]
            if any(info is None for info in infos):
                return False
            return self._layers() == {c for info in infos for c in chain_ids(info.diff_ids)}
        except (docker.errors.DockerException, requests.exceptions.RequestException, EngineError, OSError):
            return False

    def _layers(self) -> set[str]:
        """The chain IDs of the layers the engine's store holds (``image/<driver>/layerdb/sha256/`` of its data
        root, which this run's daemon owns: read here, as the engine's API lists no layer that no image names)."""
        return {f"sha256:{entry.name}" for db in (self.folder / "root" / "image").glob("*/layerdb/sha256")
                for entry in db.iterdir()}

    def _settle_kept(self) -> None:
        """The kept release the run wants (``self.wanted``, one the ``kept`` mark names) stays (``self.kept``),
        when the engine holds the base image, the kept releases and nothing else; every other kept release
        is removed. An engine holding anything else is then seeded again, as before."""
        kept = _read_kept(self.folder)
        (self.folder / KEPT_MARK).unlink(missing_ok=True)  # written again at the end, if kept then
        if not kept:
            return
        try:
            api = self.engine.api
            found = {i["Id"] for i in api.images(all=True)}
            stays = (self.wanted if self.wanted in kept and found <= {self.base_id, *kept} and self.wanted in found
                     and not api.containers(all=True) else None)
            for image in kept:
                if image in found and image != stays:
                    try:
                        api.remove_image(image, force=True)
                    except docker.errors.NotFound:
                        pass
            self.kept = stays
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            self.kept = None  # (then it holds more than its base: seeded again)

    def keep_after(self, *image_ids: str | None) -> None:
        """The release images to keep when the engine stops (besides the base image; at most KEPT_MAX), for
        a hotfix or a ``--from`` release on one of them: each must be in the engine then, or it is not kept."""
        ids = tuple(dict.fromkeys(i for i in image_ids if i and IMAGE_ID_RE.fullmatch(i)))
        if len(ids) > KEPT_MAX:
            raise ValueError(f"a seeded verify engine keeps at most {KEPT_MAX} releases, not {len(ids)}")
        self._keep_after = ids

    def _seed_or_defer(self) -> None:
        """The engine, empty, seeded now; or, ``defer``, left empty for the run's round trip, which loads the whole
        image, the base image's layers at its bottom: the base image is then made from those layers as the run stops
        (:meth:`_seed_from_loaded`), by loading its config alone. The first release on a base then costs one load of
        the whole image, no more: seeding first loaded the base image on its own (16-23 s on the benchmark's 0.86 GB
        base, benchmarks/NOTES.md) and then the release's own layers. Its config is read from the source engine's
        storage (checked against the base image's ID); where it cannot be read, the engine is seeded now."""
        if self.defer:
            stored = stored_image(self.source, self.base_id)
            if isinstance(stored, StoredImage) and self._holds(set()):
                self.deferred = stored.config_archive()
                self.on_line(f"    the verify engine {self.folder} starts empty: it keeps the base image "
                             f"{self.base_id[:19]} from this run's round trip (once per base image)")
                return
        self._seed()

    def _seed_from_loaded(self) -> bool:
        """The base image made in the engine from the layers the run's round trip loaded: its config alone (the
        engine makes its ID from those bytes, and finds each layer by the chain ID the config's diffIDs give, as it
        registered them from the bytes it unpacked). False when the engine lacks a layer: the run ended before its
        round trip loaded them, or loaded an image on another base."""
        archive, self.deferred = self.deferred, None
        try:
            self.engine.load([archive])
        except EngineError:
            return False
        return True

    def _seed(self) -> None:
        """Load the base image from the engine that built on it (by ID: a tag moved meanwhile cannot
        put another image here), then check it is all the engine holds."""
        self.on_line(f"    seeding the verify engine with the base image {self.base_id[:19]} (once per base image; "
                     f"kept in {self.folder})")
        info = self.source.inspect_image(self.base_id)
        with self.progress("seeding the verify engine", info.size if info else None) as advance:
            self.engine.load(counted(self.source.save(self.base_id), advance))
        if not self._holds_only_base():
            raise VerificationError(f"the verify engine {self.folder} does not hold exactly the base image "
                                    f"{self.base_id} after seeding it")
        self._mark_seeded()

    def _mark_seeded(self) -> None:
        """The folder's mark: the engine holds the base image (the next run checks it holds nothing else)."""
        (self.folder / SEEDED_MARK).write_text(self.base_id + "\n", encoding="ascii")
        self.seeded_now = True

    def _forget_loaded(self) -> None:
        """Every container and every image but the base (and the release :meth:`keep_after` named)
        removed: the engine is as the next run expects. If that fails, the mark goes, and the next run
        seeds it again."""
        (self.folder / KEPT_MARK).unlink(missing_ok=True)
        try:
            api = self.engine.api
            for container in api.containers(all=True):
                api.remove_container(container["Id"], force=True, v=True)
            seeded = self.deferred is not None and self._seed_from_loaded()
            found = {i["Id"] for i in api.images(all=True)}
            keep = [i for i in self._keep_after if i in found]
            for image in found - {self.base_id, *keep}:
                try:
                    api.remove_image(image, force=True)
                except docker.errors.NotFound:
                    pass  # (a parent removed with its child)
            if not self._holds_only_base(frozenset(keep)):
                raise EngineError("it still holds more than its base image")
            if seeded:
                self._mark_seeded()
            if keep:  # (the tags the loads gave it stay: a kept release is found by its image ID)
                (self.folder / KEPT_MARK).write_text("".join(i + "\n" for i in keep), encoding="ascii")
        except (docker.errors.DockerException, requests.exceptions.RequestException, EngineError):
            (self.folder / KEPT_MARK).unlink(missing_ok=True)
            (self.folder / SEEDED_MARK).unlink(missing_ok=True)

    def _stop_all(self) -> None:
        if self.engine is not None and self.folder is not None:
            self._forget_loaded()
        super()._stop_all()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _cleanup(self) -> None:
        """The daemon's stragglers stopped and its runtime folder removed; the data folder stays."""
        if self.folder is not None:
            _stop_seed_processes(self.folder)
            self.folder = None
