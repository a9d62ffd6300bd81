"""``build.py push`` and ``build.py pull``: a release through a container registry, by digest.

Push reads the release's own archive (checked first with :func:`unibake.verify.verify_folder`) and
uploads its blobs over the registry API (python-dxf, on requests): no image is needed in any engine,
the layers are compressed here (gzip by default, deterministic, so the same release always gives the
same manifest digest and a second push uploads nothing; ``zstd`` as an option), and the manifest
digest is computed here and compared with what the registry answers. Pull asks the registry for
the manifest by digest, checks its bytes, its config digest (the image ID) and its layers (a digest
the release recorded, or the one a push of its archive gives) before the engine pulls anything, then
lets the engine pull by digest and compares the image ID again.

Credentials come from the Docker config (``DOCKER_CONFIG``, else ``~/.docker/config.json``, with its
credential helpers, read by docker-py) or ``--auth-file``; never from YAML; never printed. TLS is
always verified (``--ca-file`` adds a private CA). Connection errors, timeouts and 5xx/429 answers
are retried with exponential backoff; a refused login is exit 1, a digest that differs exit 3.

The OCI documents (the image manifest today; an image index when a release has several platforms)
are made in one place: :func:`image_manifest` and :func:`manifest_config_digest`.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import io
import ipaddress
import json
import os
import re
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import docker.auth
import docker.credentials
import docker.credentials.errors
import docker.credentials.utils
import docker.errors
import requests
import requests.adapters
import requests.exceptions
import urllib3
import urllib3.connection
import urllib3.exceptions
import urllib3.response
import urllib3.util
import www_authenticate
from dxf import DXF
from dxf import exceptions as dxf_errors

from .archive import compressor
from .archive_reader import ArchiveReader
from .console import one_line
from .engine import Engine
from .errors import (DigestMismatch, DiskFull, EngineError, HandoffAborted, InputError, RegistryAuthError,
                     RegistryError, UnibakeError, VerificationError)
from .files import bounded_body, no_auth, read_small_text, strip_auth, work_folder, work_folder_done
from .imagetar import GZIP_MAGIC, ZSTD_MAGIC, Member, SavedImage, check_against, interpret, looks_like_layer, \
    read_members
from .manifest import ReleaseManifest, RegistryRecord, load_manifest
from .platforms import of_config
from .publish import held_signals
from .schema import REGISTRY_HOST, REGISTRY_PATH
from .signing import SECRETS

# ---------------------------------------------------------------------------------------------
# References: REGISTRY/REPO[:TAG][@sha256:...], the grammar of the distribution project's
# reference package (only what a registry path needs; written here to give exact errors).

_HOST = rf"{REGISTRY_HOST}(?::(?P<port>[0-9]{{1,5}}))?"
# re.ASCII: the grammar is ASCII (a tag is manifest.TAG_PATTERN); without it \w takes any letter or digit
REFERENCE_RE = re.compile(rf"^(?P<host>{_HOST})/(?P<path>{REGISTRY_PATH})"
                          r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$",
                          re.ASCII)
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
LAYER_TYPES = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
DOCKER_LAYER_TYPES = {"application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip"}
COMPRESSIONS = tuple(LAYER_TYPES)
GZIP_LEVEL = 6
ZSTD_LEVEL = 3
MAX_MANIFEST = 4 << 20
MAX_ANSWER = 1 << 20  # any other answer's body: a token, an error, an upload's reply
MAX_CHALLENGE = 16 << 10  # a 401's WWW-Authenticate (python-dxf's parser takes time quadratic in its length)
AUTH_FILE_LIMIT = 1 << 20
HELPER_TIMEOUT = 120.0  # s a Docker credential helper may take to answer (docker-py waits without end)
HELPER_ANSWER = 1 << 20  # what a credential helper's answer may hold: a user name and a secret, a token
UPLOAD_CHUNK = 1 << 20
ANSWER_TIMEOUT = (30, 60)  # connect, then each read: a registry silent for a minute is not answering
UPLOAD_TIMEOUT = (30, 600)  # a request with a body (a blob): the registry answers once it has stored all of it
UPLOAD_REDIRECTS = 3  # redirects a request with a body follows (it sends the body again to each: not requests' 30)
# The timeouts above are per read: a registry that sends a byte a minute would never trip them. Each
# attempt at a request is also held to these as a whole (see _Watch):
ANSWER_DEADLINE = 120.0  # s for a whole small answer (a manifest, a token, an error, an upload's location)
BLOB_RATE = (1 << 20, 60.0)  # a blob's upload moves at least 1 MiB in every minute it takes
BLOB_ANSWER_DEADLINE = 600.0  # s for the answer to a blob's upload after its last byte (it is stored, hashed)
WATCH_TICK = 1.0  # s between two looks at an attempt's clock
ZSTD_ENGINE_MAJOR = 23  # Docker Engine pulls tar+zstd layers from 23.0 on


@dataclass(frozen=True, kw_only=True)
class Reference:
    host: str  # registry host[:port]
    path: str  # repository path inside the registry
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.host}/{self.path}"

    @property
    def pinned(self) -> str:
        """``REGISTRY/REPO@sha256:...``: what to pull."""
        return f"{self.repository}@{self.digest}"


DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})


def parse_reference(text: str, *, what: str, digest: bool) -> Reference:
    """A registry reference from the command line; ``digest``: one is required (pull) or refused (push)."""
    shown = text[:300]
    match = REFERENCE_RE.fullmatch(text) if len(text) <= 512 else None
    if not match:
        raise InputError(f"{what} {shown!r} is not REGISTRY/REPOSITORY[:TAG]{'@sha256:DIGEST' if digest else ''} "
                         "(the registry host first, e.g. localhost:5000/demo-llm; lower-case repository names)")
    host, path = match.group("host"), match.group("path")
    # docker's rule: the first part is a registry host only with a '.' or a ':port', or as localhost;
    # anything else docker reads as a repository on docker.io, and unibake pushes only where it is told
    if "." not in host and ":" not in host and host != "localhost":
        raise InputError(f"{what} {shown!r} names no registry host: {host!r} is not one (a host has a '.' or a "
                         f"':PORT', or is localhost; docker would read docker.io here, unibake needs the registry "
                         f"named): give REGISTRY/REPOSITORY, e.g. registry.example:5000/{host}/{path}")
    if host.lower() in DOCKER_HUB:
        # (Docker Hub's API is not at the host its names give, and its credentials are kept under another; neither
        # mapping can be tried here, so it is refused by name rather than sent where it fails in a registry's words)
        raise InputError(f"{what} {shown!r} names Docker Hub ({host}), which unibake does not push to or pull from: "
                         "its API is registry-1.docker.io and its logins are kept under index.docker.io; use another "
                         "registry (a self-hosted one, or your cloud's)")
    if host.startswith("["):  # the grammar takes hex digits and colons: an address is checked as one
        try:
            ipaddress.IPv6Address(host[1:host.index("]")])
        except ValueError:
            raise InputError(f"{what} {shown!r}: {host[:host.index(']') + 1]} is not an IPv6 address (in brackets, "
                             "e.g. [::1]:5000)") from None
    port = match.group("port")
    if port is not None and not 1 <= int(port) <= 65535:
        raise InputError(f"{what} {shown!r}: port {port} of the registry host is out of range 1..65535")
    if len(f"{host}/{path}") > 255:
        raise InputError(f"{what} {shown!r}: the repository name is longer than 255 characters")
    if digest and not match.group("digest"):
        raise InputError(f"{what} {shown!r} names no digest: give REPOSITORY@sha256:<64 hex digits> (the pull line "
                         "of the release's notes)")
    if not digest and match.group("digest"):
        raise InputError(f"{what} {shown!r}: a push names a tag, not a digest (the digest is what the push gives)")
    return Reference(host=host, path=path, tag=match.group("tag"), digest=match.group("digest"))


# ---------------------------------------------------------------------------------------------
# Credentials


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """A user name and secret for one registry host, and where they were found (never the secret)."""

    username: str
    password: str = field(repr=False)
    source: str


def docker_config_path(env: Mapping[str, str]) -> Path | None:
    """``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json`` (as the docker CLI reads it)."""
    if env.get("DOCKER_CONFIG"):
        return Path(env["DOCKER_CONFIG"]) / "config.json"
    home = env.get("HOME")
    return Path(home) / ".docker" / "config.json" if home else None


def load_credentials(host: str, env: Mapping[str, str], auth_file: Path | None) -> Credentials | None:
    """The credentials for ``host`` from ``auth_file`` (a Docker config file) or the Docker config;
    None when neither has any for it. Credential helpers (``credsStore``, ``credHelpers``) are run by
    docker-py as the docker CLI runs them."""
    path = auth_file or docker_config_path(env)
    if path is None or (auth_file is None and not path.is_file()):
        return None
    error = InputError if auth_file else UnibakeError
    text = read_small_text(path, error, limit=AUTH_FILE_LIMIT, what="a Docker config file (config.json format)")
    helper_env = {k: v for k, v in env.items() if k not in SECRETS}  # a credential helper is a child too
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:  # (nested deeper than the stack: no Docker config either)
        raise error(f"{path}: not valid JSON ({str(exc)[:80]}); it must be a Docker config file") from None
    if not isinstance(config, dict):
        raise error(f"{path}: not a Docker config file (a JSON object with 'auths')")
    try:
        with warnings.catch_warnings():  # docker-py warns of a helper it cannot find, with its own source line
            warnings.simplefilter("ignore")
            found = _resolve(config, text, host, helper_env)
    except _HelperTrouble as exc:
        raise UnibakeError(f"{path}: the credential helper for {host}, {one_line(_helper(config, host))[:100]}, "
                           f"{exc}: check it with 'echo {host} | {one_line(_helper(config, host))[:100]} get', or "
                           "give --auth-file") from None
    except (ValueError, TypeError, AttributeError, KeyError, docker.errors.InvalidConfigFile):
        raise error(f"{path}: the entry for {host} cannot be read: its 'auth' must be user:password in base64 "
                    "(what docker login writes)") from None
    except docker.errors.DockerException as exc:
        helper = _helper(config, host)
        if shutil.which(helper) is None:
            raise UnibakeError(f"{path}: the credential helper for {host}, {one_line(helper)[:100]}, is not "
                               "installed (not on PATH): install it, or give --auth-file") from None
        # the helper's own message may quote what it was given: only its kind is shown
        raise UnibakeError(f"{path}: the credential helper for {host} failed ({type(exc).__name__})") from None
    if not found:
        found = _plain_entry(config, host)
    if not found:
        return None
    if found.get("IdentityToken"):
        raise InputError(f"{path}: the entry for {host} holds an identity token, which unibake cannot use; "
                         "log in with a user name and password or token (docker login), or give --auth-file")
    username, password = found.get("Username") or found.get("username"), found.get("Password") or found.get("password")
    if not username or password is None:
        raise InputError(f"{path}: the entry for {host} has no user name and password (an 'auth' of user:password "
                         "in base64)")
    return Credentials(username=username, password=password, source=str(path))


def _helper(config: dict, host: str) -> str:
    """The credential helper the Docker config names for ``host`` (its ``credHelpers`` entry, else its
    ``credsStore``)."""
    helpers = config.get("credHelpers") if isinstance(config.get("credHelpers"), dict) else {}
    return f"docker-credential-{helpers.get(host) or config.get('credsStore')}"


class _HelperTrouble(Exception):
    """A credential helper that did not answer in time, or answered something that is no credential."""


class _TimedStore(docker.credentials.Store):
    """docker-py's credential store, whose helper is given :data:`HELPER_TIMEOUT` to answer (docker-py
    waited without end: a helper that hung, waiting on a keyring that never unlocks, held push and pull
    with nothing said), and whose answer must be a credential (one that was not JSON was said to be a
    config entry whose 'auth' is not base64)."""

    def _execute(self, subcmd, data_input):
        if self.exe is None:  # (docker-py's own error: not installed)
            return super()._execute(subcmd, data_input)
        proc = None
        try:
            try:  # started and recorded as one step: an interrupt inside Popen (the helper made, the object never
                with held_signals():  # returned) lands once proc names it, for the finally to end it (it ran on)
                    proc = subprocess.Popen([self.exe, subcmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            env=docker.credentials.utils.create_environment_dict(self.environment))
            except OSError as exc:
                raise docker.credentials.StoreError(f"{self.program} could not be run ({exc.strerror})") from None
            answer = _bounded_answer(proc, data_input, time.monotonic() + HELPER_TIMEOUT)
        finally:
            if proc is not None:
                if proc.poll() is None:
                    _end_with_its_children(proc.pid)
                proc.wait()
                for pipe in (proc.stdin, proc.stdout):
                    try:  # (a helper gone before it read what it was sent: its stdin is a broken pipe)
                        pipe.close()
                    except OSError:
                        pass
        if proc.returncode:
            # (docker-py decoded it as UTF-8 strictly: other bytes were 'its auth must be base64')
            message = one_line(answer.decode("utf-8", "replace"))[:200]
            if "credentials not found in native keychain" in message:
                raise docker.credentials.errors.CredentialsNotFound(f"No matching credentials in {self.program}")
            raise docker.credentials.StoreError(f'Credentials store {self.program} exited with "{message}".')
        return answer

    def get(self, server):
        try:
            found = super().get(server)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            found = None
        # (a Username or Secret that is no text, a number or a list, was sent to the registry as its str())
        if not isinstance(found, dict) or not isinstance(found.get("Username"), str) or \
                not isinstance(found.get("Secret"), str):
            raise _HelperTrouble("answered with no credential (a JSON object with 'Username' and 'Secret' strings)")
        return found


def _end_with_its_children(pid: int) -> None:
    """End the credential helper ``pid`` (this process's child) and every process it started, each by
    its PID: killed alone, a helper's child (a keyring's agent, a ``sleep``, a pinentry) ran on after
    an interrupt or the helper's timeout. Each is stopped before its children are looked for, so none
    can start another meanwhile, nor be re-parented away before it is found."""
    stopped: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            os.kill(current, signal.SIGSTOP)
        except OSError:  # (gone already; or a set-user-ID child, sudo's, this user may not signal: left to it)
            continue
        stopped.append(current)
        todo += _children(current)
    for current in stopped:
        try:
            os.kill(current, signal.SIGKILL)
        except OSError:  # (ended meanwhile)
            pass


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc: Linux)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # (ended meanwhile)
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(pid).encode():
            found.append(int(entry))
    return found


def _bounded_answer(proc: subprocess.Popen, data_input: bytes, end: float) -> bytes:
    """What credential helper ``proc`` prints to its end, given ``data_input``: at most
    :data:`HELPER_ANSWER` bytes by ``end`` (a helper that printed without end filled this process's
    memory for the whole HELPER_TIMEOUT), else :class:`_HelperTrouble`."""
    try:
        proc.stdin.write(data_input)
        proc.stdin.flush()
    except OSError:  # (a helper that exits or answers without reading it: its answer says)
        pass
    try:
        proc.stdin.close()
    except OSError:
        pass
    answer = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise _HelperTrouble(f"did not answer in {HELPER_TIMEOUT:g} s (it was ended)")
            piece = os.read(proc.stdout.fileno(), 64 << 10)
            if not piece:
                break
            answer += piece
            if len(answer) > HELPER_ANSWER:
                raise _HelperTrouble(f"answered with more than {HELPER_ANSWER >> 10} KiB (it was ended), which is "
                                     "no credential")
    try:
        proc.wait(max(end - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        raise _HelperTrouble(f"did not answer in {HELPER_TIMEOUT:g} s (it was ended)") from None
    return bytes(answer)


class _AuthConfig(docker.auth.AuthConfig):
    """docker-py's reading of a Docker config, its credential helpers run as :class:`_TimedStore`."""

    def _get_store_instance(self, name):
        if name not in self._stores:
            self._stores[name] = _TimedStore(name, environment=self._credstore_env)
        return self._stores[name]


def _plain_entry(config: dict, host: str) -> dict | None:
    """An entry of ``username`` and ``password`` with no ``auth`` (the docker CLI reads it; docker-py
    passes over it as if the credentials were in a helper)."""
    auths = config.get("auths") if isinstance(config.get("auths"), dict) else {}
    for key, entry in auths.items():
        if isinstance(key, str) and docker.auth.resolve_index_name(key) == host and isinstance(entry, dict) \
                and not entry.get("auth") and isinstance(entry.get("username"), str) \
                and isinstance(entry.get("password"), str):
            return {"Username": entry["username"], "Password": entry["password"]}
    return None


def _resolve(config: dict, text: str, host: str, helper_env: Mapping[str, str]) -> dict | None:
    try:  # (docker-py empties the dict it is given: each try gets its own copy)
        return _AuthConfig.load_config(None, json.loads(text), helper_env).resolve_authconfig(host)
    except (ValueError, TypeError, AttributeError, KeyError, docker.errors.InvalidConfigFile):
        # docker-py decodes every entry: one broken entry, even another registry's, fails them all;
        # the entries for this host are tried alone (a broken one of its own is still an error)
        auths = config.get("auths") if isinstance(config.get("auths"), dict) else {}
        own = {**config, "auths": {k: v for k, v in auths.items() if isinstance(k, str) and host in k}}
        return _AuthConfig.load_config(None, own, helper_env).resolve_authconfig(host)


# ---------------------------------------------------------------------------------------------
# The registry client: python-dxf for the protocol and its authentication (Basic and Bearer
# tokens), and one retry loop around each request.

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def _registry_message(response, hide: Callable[[str], str] = lambda text: text) -> str:
    """The registry's own error code and message (its JSON ``errors``), short and printable; ``hide`` takes the
    credentials out of it first (a registry or proxy that echoes the Authorization it was sent)."""
    try:
        errors = response.json().get("errors") or []
        first = errors[0]
        text = f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")
    except (ValueError, AttributeError, IndexError, TypeError, RecursionError):  # (JSON nested past the stack)
        text = ""
    # (hidden first, then cut: a credential cut through at 4096 characters no longer matched, and its head was shown)
    text = "".join(c if c.isprintable() else "?" for c in hide(text)[:4096])[:200]
    return f"HTTP {response.status_code}" + (f" {text}" if text else "")


def _certificate_refused(exc: BaseException) -> bool:
    """A TLS error that is about the certificate (not a connection that broke during TLS)."""
    text = str(exc).lower()
    return isinstance(exc, requests.exceptions.SSLError) and ("certificate" in text or "hostname" in text)


def _not_tls(exc: BaseException) -> bool:
    """A TLS handshake answered with what is not TLS: a registry that speaks plain HTTP on that port (the
    same answer on every try)."""
    return isinstance(exc, requests.exceptions.SSLError) and "wrong_version_number" in str(exc).lower()


def _header_refusal(exc: BaseException) -> str | None:
    """What the HTTP client refused in an answer (more than 100 header lines, a header line over 64 KiB,
    a chunk length that is no number, or whose line is over 64 KiB, a trailer line over 64 KiB), which
    requests reports as a failed or broken connection; None for any other error. The same answer comes
    again on every try: it is not worth a retry."""
    for found in _chain(exc):
        if isinstance(found, http.client.LineTooLong):
            return f"a header line longer than the {http.client._MAXLINE} bytes an HTTP client reads"
        if type(found) is http.client.HTTPException and "more than" in str(found) and "headers" in str(found):
            return f"more than the {http.client._MAXHEADERS} header lines an HTTP client reads"
        if isinstance(found, urllib3.exceptions.ProtocolError) and "chunk size line exceeded" in str(found):
            return ("a chunked body whose chunk length line is longer than the "
                    f"{urllib3.response._MAX_CHUNK_LINE_LENGTH} bytes an HTTP client reads")
        if isinstance(found, urllib3.exceptions.ProtocolError) and "chunk trailer line exceeded" in str(found):
            return ("a chunked body whose trailer line (after its last chunk) is longer than the "
                    f"{urllib3.response._MAX_CHUNK_LINE_LENGTH} bytes an HTTP client reads")
        length = getattr(found, "length", b"") if isinstance(found, urllib3.exceptions.InvalidChunkLength) else b""
        if isinstance(length, bytes) and length.strip():  # (an empty one: the connection ended there)
            shown = length.strip()[:40].decode("ascii", "replace")
            return f"a chunked body whose chunk length is no number ({one_line(shown)!r})"
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or holds (its args, cause and context, as requests wraps
    urllib3's, which wraps the socket's), each once, at most 20."""
    seen: list[BaseException] = []
    todo: list[object] = [exc]
    while todo and len(seen) < 20:
        found = todo.pop()
        if not isinstance(found, BaseException) or any(found is s for s in seen):
            continue
        seen.append(found)
        yield found
        todo += [*found.args, found.__cause__, found.__context__]


def _transient(exc: BaseException, hide: Callable[[str], str] = lambda text: text) -> str | None:
    """Why ``exc`` is worth another try, or None when it is not."""
    if isinstance(exc, _TooSlow):
        return f"too slow: {exc}"
    if _certificate_refused(exc) or _header_refusal(exc) or _not_tls(exc):
        return None
    if isinstance(exc, requests.exceptions.SSLError):  # the registry went away during TLS
        return "connection broken"
    if _no_such_host(exc):  # (a name the resolver says does not exist: another try says the same)
        return None
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "connection refused" if "refused" in str(exc).lower() else "connection failed"
    if isinstance(exc, requests.exceptions.Timeout):
        return "timed out"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "connection broken"
    if isinstance(exc, requests.exceptions.HTTPError) and exc.response is not None \
            and exc.response.status_code in TRANSIENT_STATUS:
        return _registry_message(exc.response, hide)
    return None


def _no_such_host(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a host name the resolver says does not exist (not one it could not ask about
    now: that is worth another try)."""
    unknown = (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
    return any(isinstance(found, socket.gaierror) and found.errno in unknown for found in _chain(exc))


def _origin(url: str) -> tuple[str, str, int]:
    """Scheme, host and port of ``url``: what one server is (a port left out is the scheme's). Read by
    urllib3, which makes the connection: Python's urlsplit reads ``https://OTHER\\@REGISTRY/`` as
    REGISTRY, and the connection goes to OTHER."""
    try:
        parts = urllib3.util.parse_url(url)
    except ValueError:  # (LocationParseError: a port past 65535, say) no server: unlike every one, the registry too
        return "", one_line(url)[:100], -1
    scheme = (parts.scheme or "").lower()
    return scheme, (parts.host or "").lower(), parts.port or (443 if scheme == "https" else 80)


def _redirected_to(exc: BaseException, asked: str) -> str | None:
    """The ``host:port`` a request that failed with ``exc`` had gone to, when a redirect took it to another
    server than ``asked`` (the URL it began with; each read as https, as it is asked); else None."""
    url = getattr(getattr(exc, "request", None), "url", None)
    if not isinstance(url, str):
        return None
    try:
        went, began = (urllib3.util.parse_url(u)._replace(scheme="https").url for u in (url, asked))
    except ValueError:  # a Location no URL reader takes (a port past 65535): a server it cannot be
        return f"{one_line(url)[:100]!r} (an address that cannot be read)"
    if _origin(went) == _origin(began):
        return None
    _, host, port = _origin(went)
    return one_line(f"{host}:{port}")[:100]


def _challenge_realm(challenge: str, host: str, path: str) -> str | None:
    """The token server's URL that a 401's ``WWW-Authenticate`` names (None for a Basic challenge), or
    one error naming what the challenge lacks: python-dxf read a missing header, a bare ``Bearer`` or an
    empty realm as "an answer that cannot be read (KeyError/TypeError/ValueError)"."""
    said = f"the registry {host} answered {path} with HTTP 401 (authentication required)"
    if not challenge.strip():
        raise RegistryError(f"{said} and no WWW-Authenticate header, which must say how to log in (Basic, or "
                            f"Bearer with the token server's realm): is {host} the registry itself, or a proxy in "
                            "front of it?")
    shown = one_line(challenge)[:200]
    try:
        parsed = www_authenticate.parse(challenge)
    except (ValueError, AttributeError, TypeError, IndexError):  # (its parser's own errors on some forms)
        raise RegistryError(f"{said} and a WWW-Authenticate that cannot be read: {shown!r}") from None
    if "bearer" in parsed:
        realm = parsed["bearer"].get("realm") if isinstance(parsed["bearer"], dict) else None
        try:
            parts = urllib3.util.parse_url(realm) if realm and realm.isprintable() and " " not in realm else None
        except ValueError:  # (urllib3's LocationParseError)
            parts = None
        if parts is None or (parts.scheme or "").lower() not in ("http", "https") or not parts.host:
            raise RegistryError(f"{said} and a Bearer challenge whose realm (the token server's URL) is "
                                f"{'missing' if not realm else 'not an http or https URL'}: {shown!r}")
        return realm
    if "basic" not in parsed:
        raise RegistryError(f"{said} asking for {', '.join(repr(str(k)[:40]) for k in parsed)[:200]} authentication, "
                            f"which unibake cannot do (Basic and Bearer, as docker): {shown!r}")
    return None


class _BadLocation(Exception):
    """An upload's start answered with no ``Location`` to send the blob to, or one of another scheme."""


class _DXF(DXF):
    """python-dxf, sending its credentials (Basic, or the token they gave) to the registry alone:
    dxf adds them to every request, also to an upload's ``Location``, which the registry may point at
    any host; docker sends them only to the registry it logged in to, and so does unibake."""

    def _base_request(self, method, path, **kwargs):
        if method == "post":  # (the start of an upload: python-dxf sends the blob to its Location)
            return _upload_location(self._as_registry(method, path, **kwargs))
        if "data" not in kwargs:
            return self._as_registry(method, path, **kwargs)
        kwargs.setdefault("timeout", UPLOAD_TIMEOUT)
        session = self._sessions[0]  # (one client is used by one thread)
        if not isinstance(session, requests.Session):  # (outside `with`: python-dxf's module-level requests)
            return self._as_registry(method, path, **kwargs)
        most, session.max_redirects = session.max_redirects, UPLOAD_REDIRECTS  # each one sends the blob again
        try:
            response = self._as_registry(method, path, **kwargs)
        finally:
            session.max_redirects = most
        sent = parse_qs(urlsplit(path).query).get("digest") or [""]  # (a blob's upload: its digest is asked for)
        stored = response.headers.get("Docker-Content-Digest") or ""
        if DIGEST_RE.fullmatch(sent[-1]) and DIGEST_RE.fullmatch(stored) and stored != sent[-1]:
            raise DigestMismatch(f"the registry {self._host} answered the upload of blob {sent[-1]} with "
                                 f"Docker-Content-Digest {stored}: it did not store what was sent")
        return response

    def _as_registry(self, method, path, **kwargs):
        if _origin(urljoin(self._base_url, path)) == _origin(self._base_url):
            return super()._base_request(method, path, **kwargs)
        headers, auth = self._headers, self._auth
        self._headers, self._auth = {}, None  # (one client is used by one thread)
        try:
            return super()._base_request(method, path, **kwargs)
        finally:
            self._headers, self._auth = headers, auth


def _upload_location(response):
    """The answer to an upload's start, whose ``Location`` is where the blob goes: python-dxf sends it
    there over https whatever its scheme (``ftp://HOST/`` was tried as ``https://HOST/``, and its failure
    retried and reported as the registry's); one of another scheme than http or https, or none, is
    refused here, and not retried."""
    location = response.headers.get("Location")
    if location is None:
        raise _BadLocation("no Location to upload to (an upload's start must give one)")
    scheme = urlsplit(location).scheme.lower() if location.isprintable() else "?"
    if scheme not in ("", "http", "https"):
        raise _BadLocation(f"the upload Location {one_line(location)[:200]!r}, whose scheme {scheme[:20]!r} is "
                           "neither https nor http: nothing was sent there")
    return response


class _TooSlow(Exception):
    """An attempt that went past its time limits (:class:`_Watch`); retried like a timeout."""


class _Watch:
    """The time limits of one attempt at a request (its authentication round trips, its redirects and
    its answer's body included), kept by a thread of its own: past them, every connection the attempt
    used is shut down, so that a read or a write blocked on it returns at once, and the attempt fails
    as too slow. A small answer must be whole within :data:`ANSWER_DEADLINE`; a blob's upload must
    move :data:`BLOB_RATE` (bytes in seconds) all along, and be answered within
    :data:`BLOB_ANSWER_DEADLINE` after its last byte."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.expired: str | None = None
        self.sent = 0
        self.sending_since: float | None = None  # the first byte of a blob read for sending
        self.mark = (0.0, 0)  # when the bytes sent last reached a rate's worth more, and how many they were
        self.sent_all: float | None = None  # the last byte of the blob read for sending
        self.done = threading.Event()

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self.lock:
            if sock not in self.sockets:
                self.sockets.append(sock)
            if self.expired:
                self._shut(sock)

    def counted(self, size: int) -> None:
        """``size`` more bytes of the blob read for sending (0: the end of it)."""
        now = time.monotonic()
        if self.sending_since is None:
            self.sending_since, self.mark = now, (now, 0)
        if not size:
            self.sent_all = self.sent_all or now
            return
        self.sent += size
        if self.sent - self.mark[1] >= BLOB_RATE[0]:
            self.mark = (now, self.sent)

    def again(self) -> None:
        """The blob is sent again from its start (a redirect, a new token): its time limits count anew,
        from a new request's (till its first byte is read) to the pace of its bytes."""
        self.start = time.monotonic()
        self.sending_since = self.sent_all = None
        self.sent = 0

    def overdue(self, now: float) -> str | None:
        if self.sent_all is not None:
            if now - self.sent_all > BLOB_ANSWER_DEADLINE:
                return f"no answer {BLOB_ANSWER_DEADLINE:g} s after the last byte of the blob"
        elif self.sending_since is not None:
            if now - self.mark[0] > BLOB_RATE[1]:
                return (f"the upload moved less than {BLOB_RATE[0]} bytes in {BLOB_RATE[1]:g} s, after "
                        f"{self.sent} bytes")
        elif now - self.start > ANSWER_DEADLINE:
            return f"no whole answer in {ANSWER_DEADLINE:g} s"
        return None

    def _shut(self, sock: socket.socket) -> None:
        try:  # the plain socket's shutdown, also under TLS: the blocked thread still holds the TLS object
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def _run(self) -> None:
        while not self.done.wait(WATCH_TICK):
            reason = self.overdue(time.monotonic())
            if reason:
                with self.lock:
                    if self.done.is_set():  # the attempt ended meanwhile: its connections are the next one's
                        return
                    self.expired = reason
                    for sock in self.sockets:
                        self._shut(sock)
                return

    def __enter__(self) -> "_Watch":
        _WATCHING.current = self
        threading.Thread(target=self._run, daemon=True, name="unibake-registry-watch").start()
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:  # after this, no connection of the attempt is shut (the next one may take it up)
            self.done.set()
        _WATCHING.current = None


_WATCHING = threading.local()  # the attempt this thread makes now


def _watched(sock: socket.socket | None) -> None:
    watch = getattr(_WATCHING, "current", None)
    if watch is not None:
        watch.watch(sock)


def _connect_watched(watch: _Watch, address: tuple[str, int], timeout, source_address, options) -> socket.socket:
    """urllib3's ``create_connection``, each address's socket watched from before its connect: a connect
    waits up to the connect timeout (30 s) for each address the host's name gives, and a name of many
    addresses that do not answer (a broken IPv6 route, a CDN's hosts behind a redirect) held an attempt
    for that many times 30 s, past its time limits, as the watch knew no socket to shut yet."""
    host, port = address
    host = host.strip("[]") if host.startswith("[") else host
    error: OSError | None = None
    for family, kind, proto, _, where in socket.getaddrinfo(host, port, urllib3.util.connection.allowed_gai_family(),
                                                            socket.SOCK_STREAM):
        if watch.expired:
            break
        sock = socket.socket(family, kind, proto)
        try:
            watch.watch(sock)  # (shut past the attempt's limits: a connect blocked on it returns)
            for option in options or ():
                sock.setsockopt(*option)
            if timeout is not urllib3.util.timeout._DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            if watch.expired:  # (expired as it was watched: shut before its connect, which shutting does not stop)
                raise OSError(errno.ETIMEDOUT, "the attempt's time ran out")
            sock.connect(where)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"no address to connect to {host}:{port}")


class _WatchedHTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self):  # (a new connection's socket: before its connect and its TLS handshake, which may trickle)
        watch = getattr(_WATCHING, "current", None)
        if watch is None:
            return super()._new_conn()
        try:  # (urllib3's _new_conn, connecting through _connect_watched; its errors made as urllib3 makes them)
            return _connect_watched(watch, (self._dns_host, self.port), self.timeout, self.source_address,
                                    self.socket_options)
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(self.host, self, exc) from exc
        except socket.timeout as exc:
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})") from exc
        except OSError as exc:
            raise urllib3.exceptions.NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc

    def request(self, *args, **kwargs):  # (a connection kept from an earlier request)
        _watched(self.sock)
        return super().request(*args, **kwargs)


class _WatchedHTTPSConnection(_WatchedHTTPConnection, urllib3.connection.HTTPSConnection):
    pass


class _WatchedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter, whose connections tell the attempt that uses them (:class:`_Watch`), and which
    checks certificates with ``trust`` (:func:`_trust`) where a CA file is given."""

    def __init__(self, trust: ssl.SSLContext | None = None) -> None:
        self.trust = trust
        super().__init__()

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host, pool = super().build_connection_pool_key_attributes(request, verify, cert)
        if self.trust is not None and isinstance(verify, str):  # (requests' way to give its own SSL context)
            pool.pop("ca_certs", None)
            pool.pop("ca_cert_dir", None)
            pool["ssl_context"] = self.trust
        return host, pool

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _WATCHED_POOLS

    def proxy_manager_for(self, proxy, **kwargs):
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # (a SOCKS proxy has connections of its own)
            manager.pool_classes_by_scheme = _WATCHED_POOLS
        return manager


def _trust(ca_file: Path) -> ssl.SSLContext:
    """The CAs a certificate is checked with given ``--ca-file``: those a registry is checked with without
    it (requests': ``$REQUESTS_CA_BUNDLE``, else ``$CURL_CA_BUNDLE``, else certifi's), and the file's, as
    docker adds ``certs.d``'s CA to the system's. The file alone (requests' ``verify=FILE``) was every
    host's only CA: a registry that sends blob requests on to its storage (S3, a CDN: a 307 to a host of a
    public CA) failed as soon as a blob was there, 'the CA certificate in --ca-file does not vouch for the
    TLS certificate of the registry'."""
    context = urllib3.util.ssl_.create_urllib3_context()
    defaults = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or \
        requests.utils.DEFAULT_CA_BUNDLE_PATH
    try:
        if os.path.isdir(defaults):
            context.load_verify_locations(capath=defaults)
        else:
            context.load_verify_locations(cafile=defaults)
    except (OSError, ssl.SSLError):  # (no default CAs to be had: the file's alone, as before)
        pass
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:  # (checked before, by the command line: changed since)
        raise InputError(f"--ca-file {ca_file}: no CA certificate can be read from it ({exc.__class__.__name__})") \
            from None
    return context


class _Counted:
    """A blob's bytes as requests sends them (block by block, with their length known), each block
    counted by the attempt's watch. Sent again, it is sent whole from its start: requests rewinds it
    (``tell``, ``seek``) to follow a 307/308 redirect of the upload, and python-dxf sends it again after
    a 401 (:meth:`RegistryClient.__init__` rewinds it then); before, the second sending had nothing
    left to send (an empty upload, or a Content-Length the registry waited for in vain)."""

    def __init__(self, data, watch: _Watch | None, at: Callable[[int], None] = lambda n: None):
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = io.BytesIO(data)
        self.file, self.watch, self.at = data, watch, at  # (at: told how far into the blob each block reached)
        self.start = data.tell()
        try:
            self.end = os.fstat(data.fileno()).st_size
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.end = len(data.getbuffer())

    def __len__(self) -> int:  # (requests takes the length less tell(): what is left to send)
        return self.end

    def __bool__(self) -> bool:
        return True

    def __iter__(self):  # (an iterable body with a tell() is one requests can rewind)
        return iter(lambda: self.read(1 << 16), b"")

    def tell(self) -> int:
        return self.file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self.file.seek(offset, whence)
        if self.watch is not None:
            self.watch.again()
        return position

    def rewind(self) -> None:
        self.seek(self.start)

    def read(self, size: int = -1) -> bytes:
        block = self.file.read(size)
        if self.watch is not None:
            self.watch.counted(len(block))
        if block:
            self.at(self.file.tell() - self.start)
        return block

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How often and how patiently a request is tried: ``attempts`` in all, waiting ``delay`` s, then
    twice as long each time (at most ``max_delay``)."""

    attempts: int = 5
    delay: float = 1.0
    max_delay: float = 30.0
    sleep: Callable[[float], None] = time.sleep


class RegistryClient:
    """One repository of one registry, with credentials, a CA and retries; a context manager
    (one HTTP session). Errors are :class:`RegistryError`, :class:`RegistryAuthError` or
    :class:`DigestMismatch`, and never carry a credential."""

    def __init__(self, ref: Reference, *, credentials: Credentials | None, ca_file: Path | None,
                 retry: Retry = Retry(), on_retry: Callable[[str], None] = lambda line: None, push: bool = False):
        self.ref, self.credentials, self.retry, self.on_retry, self.push = ref, credentials, retry, on_retry, push
        self.ca_file = ca_file
        self._sending: _Counted | None = None  # the blob being uploaded
        self._last_type = ""  # the Content-Type of the last answer (an HTML page is named)
        actions = ["pull", "push"] if push else ["pull"]

        def authenticate(client: DXF, response) -> None:
            if _origin(response.url) != _origin(client._base_url):
                return  # a 401 from a host the registry redirected to: not the registry's to answer with credentials
            challenge = response.headers.get("WWW-Authenticate") or ""
            if len(challenge) > MAX_CHALLENGE:  # (100 headers of 64 kB: 40 minutes of parsing, no socket to shut)
                raise RegistryError(f"the registry {ref.host} answered {urlsplit(response.url).path[:100]} with a "
                                    f"WWW-Authenticate of {len(challenge)} characters, more than the {MAX_CHALLENGE} "
                                    "a challenge may be")
            realm = _challenge_realm(challenge, ref.host, urlsplit(response.url).path[:100])
            if self._sending is not None:  # python-dxf sends the request again: an upload's blob from its start
                self._sending.rewind()
            try:
                if credentials is None:
                    client.authenticate(response=response, actions=actions)
                else:
                    client.authenticate(credentials.username, credentials.password, response=response,
                                        actions=actions)
            except requests.exceptions.SSLError as exc:
                if realm is None or not _not_tls(exc):
                    raise
                # python-dxf asks a realm named http:// over https all the same (a proxy that names its own
                # https URL http:// still works): a token server that speaks plain HTTP only was 'the
                # registry answered the TLS handshake with something that is not TLS', naming the registry
                elsewhere = _redirected_to(exc, realm)
                raise RegistryError(f"the token server {one_line(realm)[:200]} named by the registry {ref.host} "
                                    f"{f'redirected to {elsewhere}, which ' if elsewhere else ''}"
                                    "answered the TLS handshake with something that is not TLS (a token server "
                                    "that speaks plain HTTP?): unibake sends no credentials and takes no token "
                                    "unencrypted (TLS is never turned off); serve the token server over HTTPS") \
                    from None
            except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
                if realm is None or isinstance(exc, requests.exceptions.InvalidURL):  # (the token's own URL)
                    raise
                # python-dxf reads the token server's answer as {"token": "..."} (or "access_token") and
                # nothing else: not JSON, no object, no token, or a token that is no string
                raise RegistryError(f"the token server {one_line(realm)[:200]} named by the registry {ref.host} "
                                    f"answered with no token ({type(exc).__name__}): a token answer is a JSON "
                                    f"object with a 'token' or 'access_token' string{self._page()}") from None
            token = client.token if realm is not None else None
            if realm is not None and not token:  # ({"token": ""}: sent as 'Bearer ', refused as the user's credentials)
                raise RegistryError(f"the token server {one_line(realm)[:200]} named by the registry {ref.host} "
                                    "answered with an empty token: a token answer is a JSON object with a 'token' "
                                    f"or 'access_token' string{self._page()}")
            if isinstance(token, str) and not (token.isascii() and token.isprintable() and token == token.strip()):
                # (sent as it is, requests refused the header: '(InvalidHeader)', or a header split in two)
                raise RegistryError(f"the token server {one_line(realm)[:200]} named by the registry {ref.host} "
                                    "answered with a token that is not printable ASCII, which no Authorization "
                                    "header can carry")

        self.dxf = _DXF(ref.host, ref.path, auth=authenticate, tlsverify=str(ca_file) if ca_file else True,
                        timeout=ANSWER_TIMEOUT)

    def __enter__(self) -> "RegistryClient":
        self.dxf.__enter__()
        session = self.dxf._sessions[0]
        # credentials come from the Docker config or --auth-file alone, as docker has them: requests added those
        # of ~/.netrc (a `default` entry too) to every request without an Authorization header of its own, and
        # to every redirect, whatever host it pointed at; its environment's proxies and CA bundle still count
        session.auth = no_auth
        session.rebuild_auth = strip_auth.__get__(session)
        session.hooks["response"].append(self._bounded)
        trust = _trust(self.ca_file) if self.ca_file else None
        for prefix in ("https://", "http://"):
            session.mount(prefix, _WatchedAdapter(trust))
        return self

    def _bounded(self, response, *args, stream: bool = False, **kwargs):
        """Every answer's body read here, up to :data:`MAX_ANSWER` (requests would read it whole, and an
        endless one without end): a streamed one (a manifest) is read by its reader, unless it is an error
        or a redirect (whose body requests reads whole before it follows it)."""
        self._last_type = response.headers.get("Content-Type") or ""
        if not 200 <= response.status_code <= 599:
            # (the HTTP client takes any three digits, and a 1xx but 100 Continue as the answer, bodiless; requests and
            # python-dxf count all but 4xx/5xx as success: a proxy's "999 Request denied" or a "103 Early Hints" to a
            # blob's HEAD was "already in the registry", to its upload "stored", to a manifest's GET an empty manifest)
            response.close()
            raise RegistryError(f"the registry {self.ref.host} answered {urlsplit(response.url).path[:100]} with HTTP "
                                f"{response.status_code}, which is no final HTTP status (they run from 200 to 599): not "
                                "an answer to that request")
        if 300 <= response.status_code < 400:
            self._followable(response)
        passing = response.ok and not response.is_redirect
        if stream and passing:
            return response
        # (an error's body is only its message, kept cut; a redirect's is not read)
        if bounded_body(response, MAX_ANSWER)[1] and passing:
            raise RegistryError(f"the registry {self.ref.host} answered {urlsplit(response.url).path[:100]} "
                                f"with more than the {MAX_ANSWER} bytes such an answer may be")
        return response

    def _followable(self, response) -> None:
        """A 3xx answer is a redirect to follow, over http or https, or an error: one without a Location
        (or a 304, a 300) was taken as the answer itself, its empty body as a manifest (exit 3, 'a
        document whose digest is ...') and as a blob that is there (its upload skipped)."""
        location = response.headers.get("Location") or ""
        path = urlsplit(response.url).path[:100]
        if not response.is_redirect or not location:
            response.close()
            raise RegistryError(f"the registry {self.ref.host} answered {path} with HTTP {response.status_code} and "
                                "no Location to follow: not an answer to that request")
        try:
            scheme = urlsplit(location).scheme.lower() if location.isprintable() else "?"
            urllib3.util.parse_url(urljoin(response.url, location))  # (as requests reads it to follow it)
        except ValueError:  # a port past 65535, an unclosed "[": was a traceback (LocationParseError)
            response.close()
            raise RegistryError(f"the registry {self.ref.host} answered {path} with a redirect to "
                                f"{one_line(location)[:200]!r}, an address that cannot be read: nothing was sent "
                                "there") from None
        if scheme not in ("", "http", "https"):
            response.close()
            raise RegistryError(f"the registry {self.ref.host} answered {path} with a redirect to "
                                f"{one_line(location)[:200]!r}, whose scheme {scheme[:20]!r} is neither https nor http")
        if scheme == "http":
            # followed over https, as python-dxf asks an upload Location or a token realm named http:// (a proxy
            # that lost the forwarded scheme names its own https URL so): a redirect to http:// was followed in
            # the clear, a token server's sending the token (push access) and an upload's the whole layer
            response.headers["Location"] = "https" + location.lstrip(" ")[len("http"):]

    def __exit__(self, *exc) -> None:
        self.dxf.__exit__(*exc)

    # the retry loop is written here, not taken from a retry library: it must classify the
    # registry's answers (a 401 is never retried), report each wait, and raise our own errors
    def _call(self, what: str, call: Callable[[], object]):
        retry = self.retry
        for attempt in range(1, retry.attempts + 1):
            self._last_type = ""
            try:
                with _Watch() as watch:
                    try:
                        result = call()
                    except Exception:
                        if watch.expired:  # whatever the shut connection made of it
                            raise _TooSlow(watch.expired) from None
                        raise
                    if watch.expired:  # (an answer cut short may still have looked whole)
                        raise _TooSlow(watch.expired)
                return result
            except Exception as exc:  # classified below; anything unknown is re-raised as it is
                reason = _transient(exc, self._hidden)
                if reason is None:
                    raise self._translate(exc, what) from None
                if attempt == retry.attempts:
                    # a pull or a deploy neither records nor uploads anything: its own words
                    after = ("nothing was recorded in the release; run the command again when the registry is "
                             "back (blobs already there are not uploaded again)") if self.push else \
                        ("nothing was pulled, tagged or changed; run the command again when the registry is back")
                    tries = f"{retry.attempts} attempt{'s' if retry.attempts != 1 else ''}"
                    raise RegistryError(f"the registry {self.ref.host} did not answer while {what} ({reason}) after "
                                        f"{tries}; {after}") from None
                wait = min(retry.delay * 2 ** (attempt - 1), retry.max_delay)
                self.on_retry(f"{self.ref.host}: {what}: {reason}; retrying in {wait:g} s "
                              f"(attempt {attempt + 1} of {retry.attempts})")
                retry.sleep(wait)
        raise AssertionError("unreachable")

    def _hidden(self, text: str) -> str:
        """``text`` (what the registry or its token server said) with the credentials and the token taken out,
        also as the Basic header carries them: they never appear in output or errors, also where the other side
        echoes what it was sent."""
        secrets = [getattr(self.dxf, "_token", None) or ""]
        if self.credentials is not None:
            pair = f"{self.credentials.username}:{self.credentials.password}"
            secrets += [pair, base64.b64encode(pair.encode()).decode(), self.credentials.password]
        for secret in sorted((s for s in secrets if isinstance(s, str) and len(s) >= 3), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _page(self) -> str:
        """What to say of an answer that was an HTML page (a login page, a proxy's), or nothing."""
        if not self._last_type.lower().startswith(("text/html", "application/xhtml")):
            return ""
        return (f" (an HTML page, {self._last_type.split(';')[0][:40]}: is {self.ref.host} the registry itself, or a "
                "login page or proxy in front of it?)")

    def _translate(self, exc: Exception, what: str) -> UnibakeError:
        host, repo = self.ref.host, self.ref.repository
        creds = self.credentials
        where = f"the credentials from {creds.source}" if creds else "no credentials (none found for it)"
        elsewhere = _redirected_to(exc, self.dxf._base_url)
        if _certificate_refused(exc) and elsewhere:
            why = re.search(r"certificate verify failed: ([^(']{1,120})", str(exc))
            trusted = f"neither the default CAs nor --ca-file {self.ca_file} vouch" if self.ca_file else \
                "none of the default CAs vouches"
            return RegistryError(f"the registry {host} redirected to {elsewhere}, whose TLS certificate {trusted} for, "
                                 f"while {what}{f' ({why.group(1).strip()})' if why else ''}: give that host's CA with "
                                 "--ca-file (it may hold several, the registry's too; TLS is never turned off)")
        if _certificate_refused(exc) and self.ca_file:
            why = re.search(r"certificate verify failed: ([^(']{1,120})", str(exc))
            return RegistryError(f"the CA certificate in --ca-file {self.ca_file} does not vouch for the TLS certificate "
                                 f"of the registry {host} while {what}"
                                 f"{f' ({why.group(1).strip()})' if why else ''}: give the CA that signed it "
                                 "(TLS is never turned off)")
        if _certificate_refused(exc):
            return RegistryError(f"cannot verify the TLS certificate of the registry {host} while {what}: give its "
                                 "CA certificate with --ca-file (TLS is never turned off)")
        if _not_tls(exc) and _redirected_to(exc, self.dxf._base_url):
            return RegistryError(f"the registry {host} redirected to {_redirected_to(exc, self.dxf._base_url)}, which "
                                 f"answered the TLS handshake with something that is not TLS while {what} (a server "
                                 "that speaks plain HTTP?): unibake follows a redirect to http:// over HTTPS and sends "
                                 "nothing unencrypted (TLS is never turned off)")
        if _not_tls(exc):
            return RegistryError(f"the registry {host} answered the TLS handshake with something that is not TLS while "
                                 f"{what} (a registry that speaks plain HTTP?): unibake reaches a registry over HTTPS "
                                 "only (TLS is never turned off); serve it over TLS (a private CA: --ca-file)")
        if _no_such_host(exc):
            named = _redirected_to(exc, self.dxf._base_url) or host
            return RegistryError(f"the host name of {'the registry ' if named == host else ''}{named}"
                                 f"{f' (where the registry {host} redirected)' if named != host else ''} does not "
                                 f"resolve (no such host) while {what}: check the name given")
        refused = _header_refusal(exc)
        if refused:
            return RegistryError(f"the registry {host} answered with {refused} while {what}: that answer cannot be "
                                 "read, and would come again on another try")
        if isinstance(exc, _BadLocation):
            return RegistryError(f"the registry {host} answered the start of {what} with {exc}")
        if isinstance(exc, dxf_errors.DXFUnauthorizedError):
            return RegistryAuthError(f"the registry {host} refused {where} for {repo} while {what}; log in with "
                                     f"'docker login {host}' or give --auth-file")
        if isinstance(exc, dxf_errors.DXFDigestMismatchError):
            return DigestMismatch(f"the registry {host} sent content that does not match its digest while {what}")
        if isinstance(exc, requests.exceptions.HTTPError) and exc.response is not None:
            status = exc.response.status_code
            if status == 403:
                return RegistryAuthError(f"the registry {host} denied {where} access to {repo} while {what} "
                                         f"({_registry_message(exc.response, self._hidden)})")
            return RegistryError(f"the registry {host} refused {what}: {_registry_message(exc.response, self._hidden)}")
        if isinstance(exc, (requests.exceptions.RequestException, dxf_errors.DXFError)):
            return RegistryError(f"the registry {host} failed while {what} ({type(exc).__name__}){self._page()}")
        if isinstance(exc, UnibakeError):
            return exc
        if isinstance(exc, (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError)):
            # what python-dxf makes of an answer it cannot read: a body that is not UTF-8 or JSON (or JSON
            # nested deeper than the stack), a 401 without WWW-Authenticate, a token answer without a token
            return RegistryError(f"the registry {host} gave an answer that cannot be read while {what} "
                                 f"({type(exc).__name__}){self._page()}")
        raise exc

    def blob_exists(self, digest: str, size: int | None = None) -> bool:
        """Whether the registry holds blob ``digest`` (of ``size`` bytes): its HEAD answers 200, and what that
        answer says of the blob (its Content-Length, its Docker-Content-Digest: neither is required) is this
        blob. A 200 that names another size or digest, or is an HTML page (a registry, proxy or login page
        that answers 200 to every HEAD, whose push uploaded nothing), is "not there": the blob is uploaded,
        and the registry checks what it is sent."""
        def head() -> bool:
            try:  # (not python-dxf's blob_size: it needs a Content-Length, which a HEAD's answer need not have)
                response = self.dxf._request("head", "blobs/" + digest)
            except requests.exceptions.HTTPError as exc:
                if exc.response is not None and exc.response.status_code == 404:
                    return False
                raise
            said = response.headers.get("Docker-Content-Digest") or ""
            length = response.headers.get("Content-Length") or ""
            if (DIGEST_RE.fullmatch(said) and said != digest) or self._page():
                return False
            return size is None or not (length.isascii() and length.isdigit()) or int(length) == size
        return self._call(f"looking for blob {digest[:19]}", head)

    def upload(self, digest: str, opener: Callable[[], object], what: str,
               progress: Callable[[int], None] = lambda n: None) -> None:
        """Upload a blob whose bytes ``opener()`` gives (a fresh file object or bytes on every try).
        ``progress`` is told the bytes sent as they go; a blob sent again (a retry, a redirect, a new
        token) is told only what goes past the furthest point sent before, so it never counts more
        than the blob."""
        furthest = [0]

        def at(position: int) -> None:
            if position > furthest[0]:
                progress(position - furthest[0])
                furthest[0] = position

        def put() -> None:
            data = self._sending = _Counted(opener(), getattr(_WATCHING, "current", None), at)
            try:
                self.dxf.push_blob(data=data, digest=digest, check_exists=False)
            except DigestMismatch as exc:
                raise DigestMismatch(f"{exc} ({what}); nothing was recorded") from None
            finally:
                self._sending = None
                data.close()
        self._call(f"uploading {what}", put)

    def put_manifest(self, tag: str, body: bytes, media_type: str) -> tuple[str, str]:
        """Put a manifest under ``tag``: ``(digest, tagged)``, the manifest's digest, read back by it from
        the registry and checked, and the digest the tag names now (another push to the tag at the same
        time may have replaced it: the manifest stays stored under its own digest)."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        where = f"{self.ref.repository}:{tag}"

        def put() -> str:
            response = self.dxf._request("put", "manifests/" + tag, data=body, headers={"Content-Type": media_type})
            return response.headers.get("Docker-Content-Digest") or ""
        stored = self._call(f"putting the manifest as {where}", put)
        # Docker-Content-Digest is optional (the OCI distribution spec: clients should not depend on it), and
        # one that is no sha256 digest (another algorithm's, or junk) is no digest to compare with
        if DIGEST_RE.fullmatch(stored) and stored != digest:
            raise DigestMismatch(f"the registry {self.ref.host} stored the manifest pushed as {where} as {stored}, "
                                 f"not as {digest}, its digest; nothing was recorded")
        def back() -> bytes | None:  # stored under its own digest: read back by it, and its bytes hashed
            try:
                return self._manifest_get(digest)
            except requests.exceptions.HTTPError as exc:
                if exc.response is not None and exc.response.status_code == 404:
                    return None
                raise
        for wait in (1.0, 2.0, None):  # (a registry of several replicas may not show it at once)
            found = self._call(f"reading back {self.ref.repository}@{digest[:19]}", back)
            if found is not None or wait is None:
                break
            self.retry.sleep(wait)
        got = "sha256:" + hashlib.sha256(found).hexdigest() if found is not None else None
        if got != digest:
            said = "holds nothing" if got is None else f"gives a document whose digest is {got}{self._page()}"
            raise DigestMismatch(f"the registry {self.ref.host} took the manifest pushed as {where} but {said} as "
                                 f"{self.ref.repository}@{digest}; nothing was recorded")
        return digest, self._tagged(tag)

    def _tagged(self, tag: str) -> str:
        """The digest ``tag`` names now (its ``Docker-Content-Digest``, else its manifest read and hashed)."""
        def head() -> str | None:
            try:
                named, _ = self.dxf.head_manifest_and_response(tag)
            except requests.exceptions.HTTPError as exc:
                if exc.response is not None and exc.response.status_code == 404:
                    return None  # (another client removed the tag meanwhile)
                raise
            return named or ""
        named = self._call(f"reading the digest of {self.ref.repository}:{tag}", head)
        if named is None or DIGEST_RE.fullmatch(named):
            return named or ""
        return "sha256:" + hashlib.sha256(self._manifest_bytes(tag)).hexdigest()

    def manifest(self, digest: str) -> bytes:
        """The manifest (or index) stored under ``digest``, its bytes checked against the digest."""
        body = self._manifest_bytes(digest)
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != digest:
            raise DigestMismatch(f"the registry {self.ref.host} answered {self.ref.pinned} with a document whose "
                                 f"digest is {got}{self._page()}")
        return body

    def _manifest_bytes(self, reference: str) -> bytes:
        """The manifest stored under ``reference`` (a digest or a tag), read up to :data:`MAX_MANIFEST`."""
        return self._call(f"reading manifest {reference[:19]}", lambda: self._manifest_get(reference))

    def _manifest_get(self, reference: str) -> bytes:
        """One attempt at :meth:`_manifest_bytes`."""
        def too_big(size: str) -> RegistryError:
            return RegistryError(f"the registry {self.ref.host} answered {size} bytes for manifest {reference}, more "
                                 f"than the {MAX_MANIFEST} a manifest may be")

        # python-dxf's get_manifest reads the whole body (and decodes it) before anything can look at its
        # size: its request is streamed here and read up to the limit (dxf still does the auth)
        response = self.dxf._request("get", "manifests/" + reference, stream=True,
                                     headers={"Accept": ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST,
                                                                   DOCKER_LIST))})
        try:
            declared = response.headers.get("Content-Length", "")
            if declared.isascii() and declared.isdigit() and int(declared) > MAX_MANIFEST:
                raise too_big(declared)
            body = bytearray()
            for chunk in response.iter_content(1 << 16):
                body += chunk
                if len(body) > MAX_MANIFEST:
                    raise too_big(f"over {MAX_MANIFEST}")
            return bytes(body)
        finally:
            response.close()


# ---------------------------------------------------------------------------------------------
# OCI documents: made and read here only (a release of several platforms adds an image index here)


@dataclass(frozen=True, kw_only=True)
class Blob:
    digest: str
    size: int
    media_type: str


def image_manifest(config: Blob, layers: list[Blob]) -> bytes:
    """An OCI image manifest, serialised in one fixed form (so its digest is a function of its blobs)."""
    def descriptor(blob: Blob) -> dict:
        return {"mediaType": blob.media_type, "digest": blob.digest, "size": blob.size}
    document = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor(config),
                "layers": [descriptor(b) for b in layers]}
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, kw_only=True)
class ManifestInfo:
    media_type: str
    config_digest: str
    compressions: frozenset[str]
    layers: tuple[str, ...] = ()  # the layers' digests, in order
    layer_bytes: int = 0  # the layers' sizes as the manifest gives them (what a pull downloads at most)
    layer_sizes: tuple[int, ...] = ()  # each layer's, in order (0: the manifest gives none)


def manifest_config_digest(body: bytes, where: str) -> ManifestInfo:
    """What an image manifest names: its config digest (the image ID) and its layers' compression.
    An image index (several platforms) is refused with a clear message."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # (nested deeper than the stack is no manifest either)
        raise DigestMismatch(f"{where}: the manifest is not JSON") from None
    if not isinstance(document, dict):
        raise DigestMismatch(f"{where}: the manifest is not a JSON object")
    media_type = document.get("mediaType")
    if media_type in (OCI_INDEX, DOCKER_LIST) or "manifests" in document:
        raise RegistryError(f"{where} is an image index (several platforms); this release has one image: pull the "
                            "digest its notes give")
    config, layers = document.get("config"), document.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list) \
            or not isinstance(config.get("digest"), str) or not DIGEST_RE.fullmatch(config["digest"]):
        raise DigestMismatch(f"{where}: not an image manifest (no config digest or layers)")
    kinds, digests, sizes = set(), [], []
    for layer in layers:
        if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str) \
                or not DIGEST_RE.fullmatch(layer["digest"]):
            raise DigestMismatch(f"{where}: not an image manifest (a layer without a sha256 digest)")
        kind = layer.get("mediaType", "") if isinstance(layer.get("mediaType"), str) else ""
        kinds.add("zstd" if kind.endswith("+zstd") or kind.endswith(".zstd") else "gzip")
        digests.append(layer["digest"])
        sizes.append(layer["size"] if type(layer.get("size")) is int and layer["size"] > 0 else 0)
    return ManifestInfo(media_type=str(media_type or ""), config_digest=config["digest"],
                        compressions=frozenset(kinds), layers=tuple(digests), layer_bytes=sum(sizes),
                        layer_sizes=tuple(sizes))


# ---------------------------------------------------------------------------------------------
# Push


class _Spool:
    """A layer's bytes in, compressed into a spool file (or kept as they are when the archive already
    holds them compressed); ``close()`` gives the blob and its file."""

    def __init__(self, folder: Path, compression: str, head: bytes):
        kept = "gzip" if head.startswith(GZIP_MAGIC) else "zstd" if head.startswith(ZSTD_MAGIC) else None
        self.compression = kept or compression
        if kept:
            self.compress = None
        elif compression == "gzip":
            # wbits 31: a gzip stream with a fixed header (no name, no time): the same bytes every push
            self.compress = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        else:
            self.compress = compressor(ZSTD_LEVEL, False).compressobj()
        try:
            fd, name = tempfile.mkstemp(prefix="layer-", dir=folder)
        except OSError as exc:
            raise _spool_error(exc, folder) from None
        self.path = Path(name)
        self.file = os.fdopen(fd, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def _out(self, data: bytes) -> None:
        if data:
            try:
                self.file.write(data)
            except OSError as exc:
                raise _spool_error(exc, self.path.parent) from None
            self.digest.update(data)
            self.size += len(data)

    def write(self, piece: memoryview) -> None:
        self._out(self.compress.compress(piece) if self.compress else bytes(piece))

    def close(self) -> tuple[Blob, Path]:
        if self.compress is not None:
            self._out(self.compress.flush())
        try:
            self.file.close()
        except OSError as exc:
            raise _spool_error(exc, self.path.parent) from None
        return Blob(digest=f"sha256:{self.digest.hexdigest()}", size=self.size,
                    media_type=LAYER_TYPES[self.compression]), self.path


def _spool_error(exc: OSError, folder: Path) -> UnibakeError:
    """A layer that cannot be compressed into the spool folder: the folder named, and how to give another."""
    where = f"{folder.parent} (--temp-dir; default $TMPDIR)"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left in {where} while the release's layers are compressed for the registry: "
                        "give a --temp-dir with room for them; nothing was sent")
    return UnibakeError(f"cannot write in {where} while the release's layers are compressed for the registry "
                        f"({exc.strerror}): give another --temp-dir; nothing was sent")


def _read_image(folder: Path, manifest: ReleaseManifest, spool: Path, compression: str,
                advance: Callable[[int], None] = lambda n: None) -> SavedImage:
    """One read of the archive: every layer compressed into the spool folder, the image recomputed;
    ``advance`` is told each decoded piece's size (of the archive's ``uncompressed_bytes``)."""
    def route(name: str, size: int, head: bytes):
        if looks_like_layer(name, head) or head.startswith((GZIP_MAGIC, ZSTD_MAGIC)):
            return _Spool(spool, compression, head)
        return None

    def counted(chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            advance(len(chunk))
            yield chunk

    reader = ArchiveReader(folder, [f.name for f in manifest.archive.files], hashed=False,
                           limit=manifest.archive.uncompressed_bytes)
    omitted = frozenset(manifest.hotfix.omitted_diff_ids) if manifest.hotfix else frozenset()
    return interpret(read_members(counted(reader.chunks()), route), omitted)


def _layer_blob(member: Member, spool: Path, compression: str) -> tuple[Blob, Path]:
    if member.routed is not None:
        return member.routed
    sink = _Spool(spool, compression, (member.data or b"")[:512])  # a small layer the walker kept in memory
    sink.write(memoryview(member.data or b""))
    return sink.close()


@dataclass(frozen=True, kw_only=True)
class PushResult:
    record: RegistryRecord
    uploaded: int
    present: int
    uploaded_bytes: int
    seconds: float
    tagged: str = ""  # the digest the tag names after the push (another push's, when one replaced it meanwhile)
    manifest_size: int = 0  # the bytes of the manifest pushed (an image index's entry gives them)
    platform: dict | None = None  # the image config's os, architecture and variant (None: it records none)



def push_release(folder: Path, manifest: ReleaseManifest, target: Reference, client: RegistryClient, *,
                 compression: str = "gzip", temp_dir: Path | None = None, index_tag: str | None = None,
                 on_line: Callable[[str], None] = lambda line: None,
                 on_warning: Callable[[str], None] | None = None,
                 progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None = None
                 ) -> PushResult:
    """Push the release's image from its archive (a hotfix's unchanged layers from its base release's
    archive); returns the record of the push. The folder must have been verified. A tag that another
    push moved on while this one ran is said through ``on_warning`` (else ``on_line``). ``progress``
    (the reporter's) shows the compression of the layers, which comes before any upload (minutes for
    an image of many gigabytes), then each layer's upload. With ``index_tag`` (one platform of several pushed
    at once) the manifest is stored by its digest alone: the tag is given to the image index that
    :func:`push_index` puts next, and the record names it."""
    on_warning = on_warning or on_line
    start = time.monotonic()
    tag = index_tag or target.tag or manifest.release
    spool = None
    try:  # made and recorded as one step: an interrupt as it is made lands inside the try that removes it (it stayed)
        # the registry reached, and the credentials taken, before minutes of compression: a typo in its name, a
        # registry that is down or a wrong password is said in seconds (the answer itself is asked again below)
        client.blob_exists(manifest.image_id)
        with held_signals():
            spool = work_folder("unibake-push-", temp_dir)
        on_line(f"compressing the layers of {manifest.archive.name} in {spool.parent} ({compression}; a layer it holds "
                "compressed goes as it is), then uploading those the registry lacks")
        shown = progress or (lambda what, total: nullcontext(lambda n: None))
        with shown(f"compress {manifest.tag}", manifest.archive.uncompressed_bytes) as advance:
            saved, layers = _release_blobs(folder, manifest, spool, compression, advance, progress)
        uploaded = present = uploaded_bytes = 0
        seen: set[str] = set()
        for i, (blob, path) in enumerate(layers, 1):
            if blob.digest in seen:
                continue
            seen.add(blob.digest)
            if client.blob_exists(blob.digest, blob.size):
                present += 1
                on_line(f"layer {i} of {len(layers)}: {blob.digest[:19]} already in the registry")
            else:
                with shown(f"upload layer {i} of {len(layers)}", blob.size) as sent:
                    client.upload(blob.digest, lambda p=path: open(p, "rb"), f"layer {i} of {len(layers)} "
                                  f"({blob.digest[:19]}, {blob.size} bytes)", progress=sent)
                uploaded, uploaded_bytes = uploaded + 1, uploaded_bytes + blob.size
                on_line(f"layer {i} of {len(layers)}: {blob.digest[:19]} uploaded ({blob.size} bytes)")
            path.unlink(missing_ok=True)
        config = Blob(digest=saved.image_id, size=len(saved.config_bytes), media_type=OCI_CONFIG)
        if not client.blob_exists(config.digest, config.size):
            client.upload(config.digest, lambda: saved.config_bytes, "the image config")
        body = image_manifest(config, [blob for blob, _ in layers])
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        # what the layers are: an archive that holds them compressed already gives them as they are
        used = "zstd" if any(blob.media_type == LAYER_TYPES["zstd"] for blob, _ in layers) else "gzip"
        if used != compression:
            on_line(f"the archive holds its layers {used}-compressed: they are pushed as they are ({used} layers, "
                    f"not {compression})")
        stored, tagged = client.put_manifest(digest if index_tag else tag, body, OCI_MANIFEST)
        if stored != digest:
            raise DigestMismatch(f"the registry {target.host} says the manifest just pushed as {target.repository}:"
                                 f"{tag} is {stored or 'nothing'}, not {digest}; nothing was recorded")
        if tagged != digest and not index_tag:
            # another push to the tag at the same time replaced it after this one: this push is stored, and
            # recorded, by its digest (what pull and deploy use); the tag is the last push's, as in docker push
            now = f"names {tagged} now" if tagged else "names nothing now (it was removed)"
            on_warning(f"{target.repository}:{tag} {now}, not this push's {digest}: another push to the tag replaced "
                       f"it while this one ran; this release is stored as {target.repository}@{digest}, which is "
                       "recorded (pull it by that); push again to point the tag at it")
    finally:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
            work_folder_done(spool)
    record = RegistryRecord(reference=f"{target.repository}@{digest}", repository=target.repository, tag=tag,
                            digest=digest, media_type=OCI_MANIFEST, layers=used,
                            pushed=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return PushResult(record=record, uploaded=uploaded, present=present, uploaded_bytes=uploaded_bytes,
                      seconds=time.monotonic() - start, tagged=tagged, manifest_size=len(body),
                      platform=of_config(json.loads(saved.config_bytes)))


def image_index(entries: list[tuple[str, int, dict]]) -> bytes:
    """An OCI image index of (manifest digest, its size, its platform) entries, in one fixed form and order (by
    platform), so the same releases always give the same index digest."""
    manifests = [{"mediaType": OCI_MANIFEST, "digest": digest, "size": size, "platform": platform}
                 for digest, size, platform in sorted(entries, key=lambda e: (sorted(e[2].items()), e[0]))]
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests},
                      separators=(",", ":")).encode("utf-8")


def push_index(client: RegistryClient, target: Reference, tag: str, pushed: list[PushResult],
               on_warning: Callable[[str], None]) -> tuple[str, bytes]:
    """The image index of the platforms just pushed (each by its digest) put under ``tag``: a ``docker pull`` of
    the tag then takes the manifest of the engine's own platform. Its digest and bytes."""
    body = image_index([(p.record.digest, p.manifest_size, p.platform or {}) for p in pushed])
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    stored, tagged = client.put_manifest(tag, body, OCI_INDEX)
    if stored != digest:
        raise DigestMismatch(f"the registry {target.host} says the image index just pushed as {target.repository}:"
                             f"{tag} is {stored or 'nothing'}, not {digest}; nothing was recorded")
    if tagged != digest:
        now = f"names {tagged} now" if tagged else "names nothing now (it was removed)"
        on_warning(f"{target.repository}:{tag} {now}, not this push's image index {digest}: another push to the tag "
                   f"replaced it while this one ran; the index is stored as {target.repository}@{digest}; push again "
                   "to point the tag at it")
    return digest, body


def _release_blobs(folder: Path, manifest: ReleaseManifest, spool: Path, compression: str,
                   advance: Callable[[int], None] = lambda n: None,
                   progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None = None
                   ) -> tuple[SavedImage, list]:
    """The release's image read from its archive, checked against its manifest, and its layers
    compressed into ``spool``: ``(blob, file)`` each, in order (``advance`` told what is read of it;
    ``progress`` shows a hotfix's base release, verified and read too)."""
    saved = _read_image(folder, manifest, spool, compression, advance)
    check_against(saved, image_id=manifest.image_id, diff_ids=manifest.diff_ids, what="manifest.json")
    layers = [_layer_blob(m, spool, compression) if m is not None else None for m in saved.layer_members]
    if None in layers:
        layers = _with_base_layers(folder, manifest, saved, layers, spool, compression, progress)
    return saved, layers


def pushed_manifest_digest(folder: Path, manifest: ReleaseManifest, compression: str,
                           temp_dir: Path | None = None,
                           progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None
                           = None) -> str:
    """The manifest digest a push of the release with ``compression`` gives (nothing is uploaded):
    the layers are compressed the same way every time, so it names exactly the release's blobs.
    ``progress`` (the reporter's) shows that compression: the whole archive's, minutes for a big one."""
    shown = progress or (lambda what, total: nullcontext(lambda n: None))
    spool = None
    try:  # made and recorded as one step: an interrupt as it is made lands inside the try that removes it (it stayed)
        with held_signals():
            spool = work_folder("unibake-check-", temp_dir)
        with shown(f"compress {manifest.tag} ({compression}, as a push would)",
                   manifest.archive.uncompressed_bytes) as advance:
            saved, layers = _release_blobs(folder, manifest, spool, compression, advance, progress)
    finally:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
            work_folder_done(spool)
    config = Blob(digest=saved.image_id, size=len(saved.config_bytes), media_type=OCI_CONFIG)
    return "sha256:" + hashlib.sha256(image_manifest(config, [blob for blob, _ in layers])).hexdigest()


def _with_base_layers(folder: Path, manifest: ReleaseManifest, saved: SavedImage, layers: list, spool: Path,
                      compression: str,
                      progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None = None
                      ) -> list:
    """A hotfix archive leaves out the layers its base release shipped: they come from the base's archive
    (verified, then read: both shown through ``progress``, a whole release's archive each)."""
    from .verify import verify_folder

    shown = progress or (lambda what, total: nullcontext(lambda n: None))

    hotfix = manifest.hotfix
    base_folder = folder.parent / hotfix.base_release
    if not base_folder.is_dir():
        raise InputError(f"{folder.name} is a hotfix on {hotfix.base_release}, whose folder {base_folder} holds the "
                         "layers it leaves out; put that release beside it to push")
    report = verify_folder(base_folder, progress=lambda what, total: shown(f"{what} of {hotfix.base_release} (the "
                                                                           "base)", total))
    report.raise_if_failed()
    base = load_manifest(base_folder)
    if base.image_id != hotfix.base_image_id:
        raise VerificationError(f"{base_folder} holds image {base.image_id}, not the base {hotfix.base_image_id}")
    with shown(f"compress {base.tag} (the base)", base.archive.uncompressed_bytes) as advance:
        base_saved = _read_image(base_folder, base, spool, compression, advance)
    by_diff = {d: _layer_blob(m, spool, compression) for d, m in zip(base_saved.diff_ids, base_saved.layer_members)
               if m is not None}
    out = []
    for diff_id, layer in zip(saved.diff_ids, layers):
        if layer is None and diff_id not in by_diff:
            raise VerificationError(f"layer {diff_id} is in neither {folder.name}'s archive nor its base's")
        out.append(layer if layer is not None else by_diff[diff_id])
    return out


def merge_record(manifest: ReleaseManifest, record: RegistryRecord) -> ReleaseManifest | None:
    """The manifest with ``record`` added (replacing an older push to the same repository and tag);
    None when it already holds that exact push (a second push changes nothing)."""
    for old in manifest.registry:
        if (old.repository, old.tag, old.digest, old.layers, old.index) == (record.repository, record.tag,
                                                                             record.digest, record.layers,
                                                                             record.index):
            return None
    kept = tuple(r for r in manifest.registry if (r.repository, r.tag) != (record.repository, record.tag))
    return manifest.model_copy(update={"registry": kept + (record,)})


# ---------------------------------------------------------------------------------------------
# Pull


def find_release_by_digest(out: Path, digest: str) -> Path | None:
    """The release folder under ``out`` whose manifest records a push with ``digest``."""
    from .publish import find_releases

    for found in find_releases(out):
        if found.manifest is not None and any(r.digest == digest for r in found.manifest.registry):
            return found.folder
    return None


def find_release_by_index(out: Path, ref: Reference, engine: Callable[[], tuple[str, str]]) -> Path | None:
    """The release folder under ``out`` of the engine's platform among those pushed together under the image
    index ``ref.digest`` to ``ref``'s repository; None when no release records that index (the engine is
    then not asked). ``engine()`` gives the engine's platform and address. An index of no release of that
    platform is exit 2, naming the platforms it has."""
    from .publish import find_releases

    found = [(f.folder, f.manifest.platform) for f in find_releases(out) if f.manifest is not None and any(
        r.index == ref.digest and r.repository == ref.repository for r in f.manifest.registry)]
    if not found:
        return None
    platform, engine_address = engine()
    mine = [folder for folder, of in found if of == platform]
    if len(mine) != 1:
        has = ", ".join(sorted(f"{of} ({folder.name})" for folder, of in found))
        raise InputError(f"{ref.pinned} is the image index of the releases {has} under {out}; the engine at "
                         f"{engine_address} is {platform or 'of a platform it does not say'}" + (
                             "" if not mine else ", and more than one release of it records the index") +
                         ": pull one by its own digest (its notes give it) or name it with --release DIR")
    return mine[0]


def check_remote(ref: Reference, manifest: ReleaseManifest, client: RegistryClient, *, folder: Path | None = None,
                 temp_dir: Path | None = None,
                 progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None = None,
                 before_recompress: Callable[[], None] | None = None) -> ManifestInfo:
    """The registry's manifest for ``ref``'s digest: its bytes match the digest, it names the
    release's image ID, and its layers are the release's (exit 3 otherwise), before any engine pulls
    anything. The layers are the release's when the digest is one the release recorded at its push
    (that manifest was made here from the archive); any other digest is compared with what a push of
    ``folder``'s archive gives, and without ``folder`` it is refused. ``before_recompress``: called before that
    compression (minutes for a big archive), to find first what would make it wasted (an engine that is not there)."""
    body = client.manifest(ref.digest)
    info = manifest_config_digest(body, ref.pinned)
    if info.config_digest != manifest.image_id:
        raise DigestMismatch(f"{ref.pinned} is image {info.config_digest}, not release {manifest.release}'s "
                             f"{manifest.image_id}")
    if len(info.layers) != len(manifest.diff_ids):
        raise DigestMismatch(f"{ref.pinned} names {len(info.layers)} layers; release {manifest.release}'s image has "
                             f"{len(manifest.diff_ids)}: it is not the release's image")
    if ref.digest in {r.digest for r in manifest.registry}:
        return info
    if folder is None:
        raise DigestMismatch(f"{ref.pinned} is not a push release {manifest.release} records (its manifest.json "
                             f"lists {', '.join(r.digest for r in manifest.registry) or 'none'}); pull a digest it "
                             "records, or push the release to record this one")
    # (a push of the folder's archive made again: every layer compressed, shown through ``progress``)
    if before_recompress is not None:
        before_recompress()
    expected = {c: pushed_manifest_digest(folder, manifest, c, temp_dir, progress) for c in sorted(info.compressions)}
    if ref.digest not in expected.values():
        raise DigestMismatch(f"{ref.pinned} names release {manifest.release}'s image ID but layers that are not its "
                             f"own: a push of its archive gives "
                             f"{', '.join(f'{d} ({c} layers)' for c, d in expected.items())}")
    return info


def engine_major(engine: Engine) -> int:
    try:
        return int(engine.version().split(".")[0])
    except ValueError:
        return 0


class _PullClock(threading.Event):
    """The ``stop`` of a pull held to a deadline: set once ``stop`` is, or ``seconds`` after the pull
    began (the engine's pull reads it with ``is_set``, polled)."""

    def __init__(self, stop: threading.Event | None, seconds: float) -> None:
        super().__init__()
        self.stop, self.end = stop, time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def is_set(self) -> bool:
        return super().is_set() or (self.stop is not None and self.stop.is_set()) or self.expired


def pull_into(engine: Engine, ref: Reference, manifest: ReleaseManifest, info: ManifestInfo,
              credentials: Credentials | None, warn: Callable[[str], None] | None = None,
              stop: threading.Event | None = None, deadline: float | None = None,
              progress: Callable[[int], None] | None = None, on_clear: Callable[[str], None] | None = None) -> str:
    """Let ``engine`` pull ``ref`` by digest, compare the image ID with the release's, and tag it as the
    release's tag (as a load of the archive would); returns the image ID. A tag that named another image
    before is moved, and said through ``warn`` (as deploy's row says it); credentials handed to an engine reached
    without TLS are said through ``on_clear``. ``stop`` set breaks the pull
    off (:class:`unibake.errors.HandoffAborted`), and nothing is tagged. A pull still under way
    ``deadline`` s after it began (``--pull-deadline``: an engine whose registry trickles) is broken off
    too, an :class:`EngineError` that says so."""
    if "zstd" in info.compressions and engine_major(engine) < ZSTD_ENGINE_MAJOR:
        raise EngineError(f"the engine at {engine.address} (Docker {engine.version()}) cannot pull zstd layers; "
                          f"Docker {ZSTD_ENGINE_MAJOR} or later can; push the release with --compression gzip "
                          "(the default) for this engine")
    auth = {"username": credentials.username, "password": credentials.password} if credentials else None
    if auth and engine.in_the_clear and on_clear is not None:  # (as docker pull -H would send them: said, not refused)
        on_clear(f"the engine at {engine.address} is reached without TLS: the registry credentials it is given for "
                 f"the pull (from {credentials.source}) cross the network as they are; set DOCKER_TLS_VERIFY (and "
                 "DOCKER_CERT_PATH) for a tcp:// engine on port 2376, or give it a pull-only account")
    before = engine.inspect_image(manifest.tag)
    clock = _PullClock(stop, deadline) if deadline is not None else None
    try:
        engine.pull(ref.repository, ref.digest, auth, clock or stop, progress,
                    sizes=dict(zip(info.layers, info.layer_sizes)))
    except HandoffAborted:
        if clock is None or not clock.expired or (stop is not None and stop.is_set()):
            raise
        raise EngineError(f"the engine at {engine.address} did not finish pulling {ref.pinned} in {deadline:g} s "
                          "(--pull-deadline): the pull was broken off (the engine ends it) and nothing was tagged; "
                          "give a longer --pull-deadline, or check the engine's way to the registry") from None
    pulled = engine.inspect_image(ref.pinned)
    if pulled is None:
        raise EngineError(f"after pulling {ref.pinned}, the engine at {engine.address} does not have it")
    if pulled.id != manifest.image_id:
        raise DigestMismatch(f"the engine at {engine.address} pulled {ref.pinned} as image {pulled.id}, not "
                             f"{manifest.image_id} (release {manifest.release})")
    engine.tag(pulled.id, manifest.tag)
    if before is not None and before.id != pulled.id and warn is not None:
        warn(f"{manifest.tag} named {before.id[:19]}... before; it names release {manifest.release}'s image now")
    return pulled.id
