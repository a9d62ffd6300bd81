"""Shared helpers: the repository's paths, a copy of a product to change freely, the CLI in-process."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from unibake.cli import main

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BUSYBOX_PRODUCT = FIXTURES / "busybox-product"


def as_nobody(fn) -> str:
    """What ``fn()`` gives (``ok: VALUE``) or raises (``TYPE: MESSAGE``), run in a child as the user nobody:
    root reads every file, so a file or folder another user cannot read is tried as one."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            said = f"ok: {fn()}"
        except BaseException as exc:  # noqa: BLE001 - said to the parent
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as said:
        return said.read()


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


@pytest.fixture
def cli(capsys):
    """Run ``python build.py ARGS`` in-process from ``cwd``; returns the exit code and output."""

    def run(*args: str, cwd: Path = REPO, env: dict | None = None) -> CliResult:
        capsys.readouterr()
        code = main(list(args), env=env if env is not None else {"CI": "true"}, cwd=cwd)
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return run


def copy_product(src: Path, dst: Path) -> Path:
    """A writable copy of a product folder (profiles/, images/); returns its profiles folder."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("dockerfiles", "__pycache__", ".cache"))
    return dst / "profiles"


@pytest.fixture
def busybox_product(tmp_path) -> Path:
    """A copy of the busybox test product; returns its profiles folder."""
    return copy_product(BUSYBOX_PRODUCT, tmp_path / "product")


@pytest.fixture
def demo_product(tmp_path) -> Path:
    """A copy of the example product (profiles/ and images/); returns its profiles folder."""
    root = tmp_path / "demo"
    root.mkdir()
    shutil.copytree(REPO / "profiles", root / "profiles")
    shutil.copytree(REPO / "images", root / "images", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "profiles"


def run(*argv: str, env: dict | None = None, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    """A command's exit code and output (text), with ``env`` added to ours."""
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd,
                          input=stdin)


@contextmanager
def throwaway_gpg_home():
    """A throwaway OpenPGP keyring with one signing key (no passphrase), and its armoured public key.
    The folder's path is short: gpg-agent's socket lives in it."""
    home = Path(tempfile.mkdtemp(prefix="ubg-"))
    home.chmod(0o700)
    env = {"GNUPGHOME": str(home)}
    try:
        made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Release Signer <signer@example.invalid>",
                   "ed25519", "sign", "never", env=env)
        assert made.returncode == 0, made.stderr
        public = home / "publisher.asc"
        public.write_text(run("gpg", "--armor", "--export", "signer@example.invalid", env=env).stdout)
        yield env, public
    finally:
        run("gpgconf", "--kill", "gpg-agent", env=env)  # the agent gpg started for this keyring
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def gpg_home():
    with throwaway_gpg_home() as made:
        yield made


@pytest.fixture(scope="session")
def minisign_key(tmp_path_factory):
    """A throwaway minisign key pair without a password (a password costs seconds of key derivation
    per signature; the password path has its own test): (secret key, public key)."""
    folder = tmp_path_factory.mktemp("minisign")
    made = run("minisign", "-G", "-W", "-p", str(folder / "publisher.pub"), "-s", str(folder / "secret.key"))
    assert made.returncode == 0, made.stderr
    return folder / "secret.key", folder / "publisher.pub"


@contextmanager
def terminated_as_the_cli():
    """SIGTERM handled as the command line handles it (``unibake.cli._terminate``: a KeyboardInterrupt where the
    signal lands), the count of interrupts cleared before and after, the handler before it put back."""
    import signal

    from unibake import cli as cli_module

    previous = signal.signal(signal.SIGTERM, cli_module._terminate)
    cli_module._interrupts.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        cli_module._interrupts.clear()


def signal_inside_popen(monkeypatch, module, wanted) -> list[int]:
    """``module.subprocess.Popen`` replaced by one that sends this process SIGTERM inside ``Popen.__init__``, once
    the first child whose argument list ``wanted(args)`` accepts is running: the Popen object is never returned, so
    only what the code under test recorded can end the child. Returns the list that child's PID goes into."""
    import signal

    started: list[int] = []

    class InterruptedPopen(subprocess.Popen):
        def _execute_child(self, args, *rest, **kwargs):
            super()._execute_child(args, *rest, **kwargs)
            if not started and wanted([str(a) for a in args]):
                started.append(self.pid)
                os.kill(os.getpid(), signal.SIGTERM)  # lands inside __init__, the child running

    monkeypatch.setattr(module.subprocess, "Popen", InterruptedPopen)
    return started


def child_ended(pid: int) -> bool:
    """Whether a child of this process has ended (reaped here if it has, or already reaped)."""
    try:
        return os.waitpid(pid, os.WNOHANG) != (0, 0)
    except ChildProcessError:  # ended and reaped by the code under test
        return True


def kill_children(pids) -> None:
    """Children a test started and lost: killed and reaped, whatever the test found."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
