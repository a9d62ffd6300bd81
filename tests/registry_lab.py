"""A real registry for the engine tests: Debian's ``docker-registry`` (the CNCF distribution registry
2.8) on loopback, with TLS from a CA made here with openssl and htpasswd (bcrypt) authentication,
trusted by the engines through ``/etc/docker/certs.d/localhost:PORT/ca.crt`` (removed at the end).

A scratch engine lives in its own network namespace, where the host's loopback is out of reach:
:func:`bridge` makes ``localhost:PORT`` inside that namespace reach the registry, through two
socat relays joined by a Unix socket (which crosses network namespaces). The engine in there then
pulls from the very address the host pushes to, with the same certificate, and no address outside
loopback is ever used.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

CERTS_D = Path("/etc/docker/certs.d")
USER = "unibake-ci"


def _run(*cmd: str, cwd: Path | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr.strip()}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen | None) -> None:
    """Stop a process this module started (and its socat children), by its process group's ID."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Registry:
    """The registry process and everything it needs, in ``folder``; ``start()``, ``kill()``, ``stop()``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.host = f"localhost:{self.port}"
        self.password = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        self.data = folder / "data"
        self.ca = folder / "ca.crt"
        self.certs_d = CERTS_D / self.host
        self._make_tls()
        (folder / "htpasswd").write_text(_run("htpasswd", "-Bbn", USER, self.password))
        (folder / "config.yml").write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.data)}, "delete": {"enabled": True}},
            "http": {"addr": f"127.0.0.1:{self.port}", "secret": secrets.token_hex(16),
                     "tls": {"certificate": str(folder / "server.crt"), "key": str(folder / "server.key")}},
            "auth": {"htpasswd": {"realm": "unibake-test", "path": str(folder / "htpasswd")}},
        }))
        self.auth_file = self.write_auth(folder / "auth" / "config.json", self.password)

    def _make_tls(self) -> None:
        f = self.folder
        _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=unibake test CA", cwd=f)
        _run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=f)
        (f / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        _run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=f)

    def write_auth(self, path: Path, password: str) -> Path:
        """A Docker config file with credentials for this registry."""
        path.parent.mkdir(parents=True, exist_ok=True)
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        return path

    def start(self) -> None:
        log = open(self.folder / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.folder / "config.yml")], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        # the port was free when it was chosen; another run's server may have taken it since: only a TLS
        # handshake with this registry's own certificate (its CA is made here) says this registry listens
        context = ssl.create_default_context(cafile=str(self.ca))
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "registry.log").read_text()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    with context.wrap_socket(sock, server_hostname="localhost"):
                        return
            except OSError:  # (ssl.SSLError too: another server, or ours not ready)
                time.sleep(0.05)
        raise AssertionError(f"the registry did not listen within 20 s: "
                             f"{(self.folder / 'registry.log').read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL, as a registry that dies mid-push."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        _stop(self.proc)

    def uploads_started(self) -> bool:
        """Whether an upload is in progress (the registry keeps it under _uploads until it completes)."""
        return any(p.name == "startedat" for p in self.data.rglob("startedat"))

    def __enter__(self) -> "Registry":
        self.certs_d.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.ca, self.certs_d / "ca.crt")
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.certs_d, ignore_errors=True)


@contextmanager
def registry():
    folder = Path(tempfile.mkdtemp(prefix="ub-registry-"))
    try:
        with Registry(folder) as reg:
            yield reg
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def bridge(reg: Registry, netns_pid: int):
    """``localhost:PORT`` inside the network namespace of ``netns_pid`` reaches the registry."""
    folder = Path(tempfile.mkdtemp(prefix="ubb-", dir="/tmp"))
    sock = folder / "sock"
    netns = f"--net=/proc/{netns_pid}/ns/net"
    _run("nsenter", netns, "ip", "link", "set", "lo", "up")
    outside = inside = None
    try:
        outside = subprocess.Popen(["socat", f"UNIX-LISTEN:{sock},fork", f"TCP:127.0.0.1:{reg.port}"],
                                   start_new_session=True, stderr=subprocess.DEVNULL)
        inside = subprocess.Popen(["nsenter", netns, "socat", f"TCP-LISTEN:{reg.port},bind=127.0.0.1,fork,reuseaddr",
                                   f"UNIX-CONNECT:{sock}"], start_new_session=True, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not sock.exists() or _run("nsenter", netns, "ss", "-ltnH", f"sport = :{reg.port}").strip() == "":
            assert time.monotonic() < deadline, "the relays did not start"
            time.sleep(0.05)
        yield
    finally:
        _stop(inside)
        _stop(outside)
        shutil.rmtree(folder, ignore_errors=True)
