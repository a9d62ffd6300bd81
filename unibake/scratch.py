"""A scratch ``dockerd``: an engine that has never seen the image, for the round trip.

It runs in its own network namespace (``unshare --net``: its bridge can never touch the host
engine's ``docker0``), with its own data root, exec root, pidfile and socket, and is stopped by its
PID when the context ends (also on Ctrl-C and SIGTERM). One left behind by a killed run is
stopped and removed by the next run that uses the same scratch folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .docker_engine import DockerEngine
from .errors import EngineError, RoundTripUnavailable

SCRATCH_PREFIX = "ub-scratch-"
START_TIMEOUT = 90
STOP_TIMEOUT = 30


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _processes_using(folder: Path) -> list[int]:
    """PIDs whose command line names ``folder``: the scratch dockerd and the containerd it started."""
    marker = str(folder)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and marker in _cmdline(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _stop(pid: int, timeout: float) -> None:
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _unmount_under(folder: Path) -> None:
    mounts = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(folder) or point.startswith(str(folder) + "/"):
                mounts.append(point)
    except OSError:
        return
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _runtime_of(folder: Path) -> Path | None:
    try:
        return Path((folder / "runtime").read_text().strip())
    except OSError:
        return None


def remove_scratch_dir(folder: Path) -> None:
    """Stop whatever still runs from ``folder`` or its runtime folder (by PID), unmount, delete both."""
    runtime = _runtime_of(folder)
    for place in (folder, runtime):
        if place is not None:
            for pid in _processes_using(place):
                _stop(pid, STOP_TIMEOUT)
    for place in (folder, runtime):
        if place is not None and place.name.startswith(("ub-scratch-", "ubx-")):
            _unmount_under(place)
            shutil.rmtree(place, ignore_errors=True)


def clean_stale_scratch(base: Path) -> list[Path]:
    """Scratch folders whose owning run is gone (killed with SIGKILL): stop their daemon, remove them."""
    removed = []
    for folder in sorted(base.glob(f"{SCRATCH_PREFIX}*")):
        try:
            owner = int((folder / "owner").read_text().strip())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner) and owner != os.getpid():
            continue
        remove_scratch_dir(folder)
        removed.append(folder)
    return removed


class ScratchEngine:
    """A throwaway dockerd in its own network namespace; a context manager that always stops it."""

    def __init__(self, base: Path | None = None, *, on_line=lambda line: None):
        self.base = Path(base or tempfile.gettempdir())
        self.on_line = on_line
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None
        self.engine: DockerEngine | None = None

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
        reason = self.unavailable_reason()
        if reason:
            raise RoundTripUnavailable(f"no scratch engine for the round trip: {reason}; run as root, name an "
                                       "engine that never saw the image with --verify-engine URL, or skip with "
                                       "--no-roundtrip (the notes will say so)")
        self.base.mkdir(parents=True, exist_ok=True)
        for folder in clean_stale_scratch(self.base):
            self.on_line(f"removed a scratch engine left by an interrupted run: {folder}")
        self.folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.base))
        (self.folder / "owner").write_text(f"{os.getpid()}\n")
        # Unix socket paths are limited to 107 bytes: the sockets live in a short folder of their own.
        runtime = Path(tempfile.mkdtemp(prefix="ubx-", dir="/tmp" if os.path.isdir("/tmp") else None))
        (self.folder / "runtime").write_text(f"{runtime}\n")
        sock = runtime / "sock"
        log = open(self.folder / "dockerd.log", "wb")
        # Its own network namespace: its bridge can never touch the host engine's docker0.
        cmd = ["unshare", "--net", "--", shutil.which("dockerd"), "--data-root", str(self.folder / "root"),
               "--exec-root", str(runtime / "exec"), "--pidfile", str(runtime / "pid"),
               "-H", f"unix://{sock}", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
               "--userland-proxy=false"]
        try:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        except OSError as exc:
            log.close()
            self._cleanup()
            raise RoundTripUnavailable(f"cannot start a scratch dockerd: {exc}") from None
        log.close()
        try:
            self._wait_ready(sock)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self, sock: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RoundTripUnavailable(f"the scratch dockerd exited at start ({self._log_tail()})")
            if sock.exists():
                try:
                    engine = DockerEngine(f"unix://{sock}")
                    engine.version()
                    self.engine = engine
                    return
                except EngineError:
                    pass
            time.sleep(0.2)
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

    def __exit__(self, *exc) -> None:
        if self.engine is not None:
            self.engine.api.close()
            self.engine = None
        if self.process is not None:
            _stop(self.process.pid, STOP_TIMEOUT)
            self.process = None
        self._cleanup()
