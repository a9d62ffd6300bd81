"""The sanitisation gate: no key, token, password, home folder or private address ships.

It scans, in this order: the profiles' values (env, labels, args, checks) when the plan is made,
before anything is rendered or built; every file of the build context, whole and as bytes
(binary files too: a key after a NUL byte or past the first megabytes is still a key), before the
build; the image config's environment, labels and history (where build arguments end up) after
it; and the release's text files before they are published. A finding fails the run (exit 3),
naming the repository file and line (or the YAML key) with the value masked, and says how to let a
deliberate value through: ``sanitise.allow`` in product.yaml or ``--allow REGEX``.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import pwd
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError, UnibakeError, VerificationError
from .files import linked_above, open_regular, read_small_text, write_atomic
from .regexsafe import backtracks

# Names that mean a secret: their literal values must not be baked (mount a file at run time).
# TOKEN, not TOKENS: MAX_TOKENS and ..._TOKENS_PER_RANK are counts, not secrets; nor TOKENIZER(S):
# TOKENIZERS_PARALLELISM=false and TOKENIZER_MODE=auto are settings every Hugging Face stack has
# (PASS, AUTHORIZATION and a connection string only as the name's last word: SMTP_PASS, HTTP_AUTHORIZATION,
# AZURE_STORAGE_CONNECTION_STRING; not BYPASS_CACHE, AUTHORIZATION_MODE or KAFKA_CONNECTION_STRATEGY. A personal
# access token is found by its form, ghp_/github_pat_, not by a name: URL_PAT and LOG_PAT are patterns)
SECRET_NAME_RE = re.compile(r"(PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN(?!S|I[SZ])|CREDENTIAL|API_?KEY|PRIVATE_?KEY|"
                            r"(^|_)PWD$|(^|_)PASS$|(^|_)AUTH($|_)|AUTHORI[SZ]ATION$|CONN(ECTION)?_?STR(ING)?$|"
                            r"_KEY$)", re.I)
# a value no secret is, whatever its name says: a switch or a small count (TWO_PASS=1, ENABLE_AUTH=true)
NOT_A_SECRET_RE = re.compile(r"(true|false|yes|no|on|off|none|null|\d{1,3})", re.I)
# where a secret is mounted at run time, as the gate's own message asks (HF_TOKEN_PATH=/run/secrets/hf_token,
# DB_PASSWORD_FILE=/run/secrets/db): a name that says so, and an absolute path as its value
SECRET_PLACE_NAME_RE = re.compile(r"_(FILE|PATH|DIR)$", re.I)
SECRET_PLACE_RE = re.compile(r"/[A-Za-z0-9._/-]+")


def secret_by_name(name: str, value: str) -> bool:
    """Whether ``name`` says secret and ``value`` may be one."""
    if SECRET_PLACE_NAME_RE.search(name) and SECRET_PLACE_RE.fullmatch(value.strip()):
        return False
    return bool(value) and bool(SECRET_NAME_RE.search(name)) and not NOT_A_SECRET_RE.fullmatch(value.strip())


# Each rule: what it finds, the literal anchors every match contains (found first, at memory
# speed: Python's regex engine would otherwise try the whole pattern at every byte of a 400 MB
# library), and the pattern, searched only around an anchor.
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("private key", ("-----BEGIN ",), r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    ("AWS access key", ("AKIA", "ASIA"), r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("GitHub token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b"),
    ("Hugging Face token", ("hf_",), r"\bhf_[A-Za-z0-9]{30,}\b"),
    ("OpenAI key", ("sk-",), r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}\b"),
    ("Slack token", ("xox",), r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"),
    ("Google API key", ("AIza",), r"\bAIza[0-9A-Za-z_-]{35}\b"),
    ("GitLab token", ("glpat-",), r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("Docker Hub token", ("dckr_pat_",), r"\bdckr_pat_[A-Za-z0-9_-]{20,}"),
    ("npm token", ("npm_",), r"\bnpm_[A-Za-z0-9]{36}\b"),
    ("PyPI token", ("pypi-AgE",), r"\bpypi-AgE[A-Za-z0-9_-]{50,}"),
    ("Slack webhook", ("hooks.slack.com/",), r"hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/[A-Za-z0-9]+"),
    ("credentials in an Authorization header", ("uthorization:",),
     r"[Aa]uthorization:[ \t]*(?:Basic|Bearer|Token)[ \t]+[A-Za-z0-9+/=._~-]{16,}"),
    ("registry credentials (a docker config's auth)", ('"auth"',), r'"auth"[ \t]*:[ \t]*"[A-Za-z0-9+/]{8,}={0,2}"'),
    ("password in a netrc", ("machine ",), r"\bmachine[ \t]+\S+[ \t]+login[ \t]+\S+[ \t]+password[ \t]+\S+"),
    ("JSON web token", ("eyJ",), r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    # no backslash in the host: a URL inside escaped JSON (a label) ends at its \"
    ("password in a URL", ("://",), r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@\"'<>]*:[^\s/@\"'<>]+@[^\s/\"'<>\\]+"),
    ("home folder", ("/home/", "/Users/"), r"(?:/home/|/Users/)[A-Za-z0-9._-]+"),
    ("the builder's /root folder", ("/root/",), r"/root/[A-Za-z0-9._-][^\s\"'\x00]*"),
)
# what a memo of scan_context may remember (anything else in one means it is not ours: scanned again)
MEMO_KINDS = frozenset({kind for kind, _, _ in RULES} | {"private network address", "the builder's home or user name"})
MEMO_LIMIT = 4 << 20
PRIVATE_ADDRESS = (("10.", "172.", "192.168."),
                   r"\b(?:10\.\d{1,3}|172\.(?:1[6-9]|2\d|3[01])|192\.168)\.\d{1,3}\.\d{1,3}\b")
WINDOW = 4096  # how far before and after an anchor a match may reach
TEXT_LIMIT = 16 << 20  # files up to this size are read whole (line numbers); bigger ones around anchors
NEWLINE = b"\n"


# a value whose name says secret shows its first 4 and last 2 characters (an allow pattern's hint) only when it is
# this long: 6 of a 9-character password, shown on stderr and in a CI log, left little to guess; a shorter one
# shows its first 2. (What a rule finds shows them from 9 characters: a token's are its kind's prefix, a home
# folder's or an address's are no secret.)
SHOWN_FROM = 20
BY_NAME = "secret in the environment"
BY_OPTION = "secret given to an option"  # (--api-key VALUE, --api-key=VALUE in a command line)


@dataclass(frozen=True, kw_only=True)
class Finding:
    where: str  # file:line, file at byte N, a YAML key, or "image config: env"
    kind: str
    value: str

    @property
    def masked(self) -> str:
        v = self.value
        return v[:4] + "…" + v[-2:] if self.shows_ends else v[:2] + "…"

    @property
    def shows_ends(self) -> bool:
        return len(self.value) >= (SHOWN_FROM if self.kind in (BY_NAME, BY_OPTION) else 9)

    def __str__(self) -> str:
        return f"{self.where}: {self.kind} ({self.masked}, {len(self.value)} characters)"


def _rules(addresses: bool, identity: tuple[str, ...]) -> list[tuple[str, tuple[bytes, ...], re.Pattern[bytes]]]:
    rules = [(kind, tuple(a.encode() for a in anchors), re.compile(pattern.encode()))
             for kind, anchors, pattern in RULES]
    if addresses:
        rules.append(("private network address", tuple(a.encode() for a in PRIVATE_ADDRESS[0]),
                      re.compile(PRIVATE_ADDRESS[1].encode())))
    for value in identity:
        rules.append(("the builder's home or user name", (value.encode(),),
                      re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(value.encode()) + rb"(?![A-Za-z0-9_])")))
    return rules


def _windows(data: bytes, anchor: bytes) -> Iterator[tuple[int, int]]:
    """The stretches of ``data`` within WINDOW of an occurrence of ``anchor``, overlapping ones merged,
    in order. A stretch grows to the last occurrence inside it at once (rfind), so a file dense with
    an anchor (``hf_`` six million times) is a few steps, not one per occurrence."""
    at = data.find(anchor)
    while at >= 0:
        lo, hi = max(0, at - WINDOW), at + len(anchor) + WINDOW
        while True:
            last = data.rfind(anchor, at + 1, hi + len(anchor) - 1)  # the last one starting before hi
            if last < 0:
                break
            at, hi = last, last + len(anchor) + WINDOW
        yield lo, min(len(data), hi)
        at = data.find(anchor, hi)


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _matches(data: bytes, anchors: tuple[bytes, ...], rule: re.Pattern[bytes]) -> list[re.Match[bytes]]:
    """Every match of ``rule`` in ``data`` that holds (or starts at) an occurrence of an anchor,
    searched only near one: each byte once per rule, whatever the number of anchors (windows around
    each occurrence, searched one by one, made a file dense with anchors quadratic)."""
    found: dict[int, re.Match[bytes]] = {}
    for lo, hi in _merged(w for anchor in anchors for w in _windows(data, anchor)):
        for m in rule.finditer(data, lo, hi):
            end = max(m.end(), m.start() + 1)
            if any(0 <= data.find(anchor, m.start(), end + len(anchor) - 1) < end for anchor in anchors):
                found.setdefault(m.start(), m)
    return [found[k] for k in sorted(found)]


def _account_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a uid with no passwd entry (a container run as --user 1234)
        return ""


def builder_identity(env: dict[str, str] | None = None, account_home: str | None = None) -> tuple[str, ...]:
    """The builder's home folders (``HOME``, and the account's in the passwd database, which a CI
    job's ``HOME=/srv/ci`` does not change: ``~user`` paths still lead there) and user name (other
    than root): they must not ship. ``account_home``: the passwd entry's (default: looked up)."""
    env = env if env is not None else dict(os.environ)
    user = env.get("USER") or getpass.getuser()
    out = []
    account = (_account_home() if account_home is None else account_home).rstrip("/")
    # a system account's home (/bin, /usr/sbin's daemon, /nonexistent) is no personal folder: only one
    # two folders deep or more (/var/lib/jenkins, /srv/ci) is taken from the passwd entry
    homes = [env.get("HOME") or os.path.expanduser("~")] + ([account] if account.count("/") >= 2 else [])
    for home in homes:
        home = home.rstrip("/")  # HOME=/srv/ci/ names /srv/ci
        if home and home != "/root" and home not in out:
            out.append(home)
    if user and user != "root" and len(user) >= 3:
        out.append(user)
    return tuple(out)


def scan_bytes(data: bytes, where: str, *, addresses: bool = False, identity: tuple[str, ...] = (),
               offset: int = 0, lines: bool = True) -> list[Finding]:
    """Every rule over ``data``, as bytes: a NUL or invalid UTF-8 hides nothing. ``where:LINE`` when
    ``lines``, else ``where at byte N`` (from ``offset``)."""
    findings = []
    for kind, anchors, rule in _rules(addresses, identity):
        line, counted = 1, 0  # matches come in order: lines counted once, not from the start each time
        for m in _matches(data, anchors, rule):
            if lines:
                line += data.count(NEWLINE, counted, m.start())
                counted = m.start()
            place = f"{where}:{line}" if lines else f"{where} at byte {offset + m.start()}"
            findings.append(Finding(where=place, kind=kind, value=m.group(0).decode("utf-8", "replace")))
    return findings


def scan_text(text: str, where: str, *, addresses: bool = False, identity: tuple[str, ...] = ()) -> list[Finding]:
    findings = scan_bytes(text.encode("utf-8", "surrogateescape"), where, addresses=addresses, identity=identity)
    return sorted(findings, key=lambda f: int(f.where.rsplit(":", 1)[1]))


DENSE = 100_000  # anchors in one big file past which it is scanned whole, in chunks, rather than around each
GREP_MEMORY = 256 << 20  # grep holds a line whole: a file with no newline for gigabytes is scanned in chunks
CHUNK = 4 << 20


def _anchor_offsets(paths: list[Path], anchors: list[bytes], opened=None) -> dict[Path, list[int] | None]:
    """Where any anchor occurs in each file: GNU grep's fixed-string search (Aho-Corasick, hundreds of
    MB/s; Python's find, one pass per anchor, is three times slower on a 0.43 GB library) over each
    big file. None for a file grep cannot bound (more than DENSE anchors, or a line bigger than
    GREP_MEMORY): it is scanned whole, in chunks, by :func:`scan_file`."""
    found: dict[Path, list[int] | None] = {}
    if not paths:
        return found
    with tempfile.NamedTemporaryFile("wb", suffix=".anchors") as patterns:
        patterns.write(b"\n".join(anchors) + b"\n")
        patterns.flush()
        for path in paths:
            if opened is not None:  # the file as it is open: grep reads it, not whatever the path names now
                found[path] = _grep_offsets(path, patterns.name, opened)
                continue
            with open_regular(path) as fh:
                found[path] = _grep_offsets(path, patterns.name, fh)
    return found


def _grep_offsets(path: Path, patterns: str, fh) -> list[int] | None:
    # grep's memory capped by the shell's ulimit (a preexec_fn is unsafe beside the run's threads), so a
    # huge line fails grep, not the machine; it reads the open file (from its start) on its standard input
    command = ["sh", "-c", f'ulimit -v {GREP_MEMORY >> 10} && exec "$@"', "sh",
               "grep", "-F", "-a", "-b", "-o", "-f", patterns, "-"]
    offsets: list[int] = []
    fh.seek(0)
    with subprocess.Popen(command, stdin=fh, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={"LC_ALL": "C", "PATH": os.defpath}) as grep:
        assert grep.stdout is not None and grep.stderr is not None
        for line in grep.stdout:  # read as it comes: a dense file's millions of lines are never held
            offsets.append(int(line.split(b":", 1)[0]))
            if len(offsets) > DENSE:
                grep.kill()
                return None
        error = grep.stderr.read().decode(errors="replace").strip()
    if grep.returncode not in (0, 1):
        if "memory exhausted" in error:
            return None
        raise VerificationError(f"sanitisation: grep could not read {path}: {error[:200]}")
    return offsets


def _changed(where: str, sha256: str, now: str) -> InputError:
    return InputError(f"{where}: changed after the plan hashed it (sha256 {sha256[:12]}, now {now[:12]}), while the "
                      "sanitisation gate read it: the bytes scanned must be the bytes baked; run again")


def _same_file(before: os.stat_result, after: os.stat_result) -> bool:
    # a write changes the ctime, which no user can set back: unchanged, the bytes read at any time are the same
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (after.st_size, after.st_mtime_ns,
                                                                        after.st_ctime_ns)


def scan_file(path: Path, where: str, identity: tuple[str, ...] = (), sha256: str | None = None) -> list[Finding]:
    """A file of the build context, whole and as bytes: small ones read at once (findings with line
    numbers), big ones read around the anchors grep found (findings with byte offsets), each stretch
    once; a file grep could not bound read in chunks from end to end.

    ``sha256``: what the plan hashed (and the build context checks again): bytes scanned that are not
    those (a file swapped for a clean one during the scan, and back) are an InputError. A small file's
    bytes scanned are hashed; a big one, read several times, is hashed from the same open file after
    the scan, and must not have been written meanwhile (its ctime)."""
    path = Path(path)
    with open_regular(path) as fh:
        before = os.fstat(fh.fileno())
        size = before.st_size
        if size <= TEXT_LIMIT:
            data = fh.read()
            if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
                raise _changed(where, sha256, hashlib.sha256(data).hexdigest())
            return scan_bytes(data, where, identity=identity)
        offsets = _anchor_offsets([path], _all_anchors(identity), fh)[path]
        spans = [(0, size)] if offsets is None else _merged((max(0, at - WINDOW), at + WINDOW + 64) for at in offsets)
        findings, seen = [], set()
        for lo, hi in spans:
            # in chunks that overlap by a window, so no match is cut and memory stays flat
            for start in range(lo, hi, CHUNK):
                fh.seek(start)
                data = fh.read(min(hi, start + CHUNK + 2 * WINDOW) - start)
                for f in scan_bytes(data, where, identity=identity, offset=start, lines=False):
                    if (f.where, f.kind) not in seen:
                        seen.add((f.where, f.kind))
                        findings.append(f)
        if sha256 is not None:
            h = hashlib.sha256()
            fh.seek(0)
            for block in iter(lambda: fh.read(CHUNK), b""):
                h.update(block)
            if h.hexdigest() != sha256 or not _same_file(before, os.fstat(fh.fileno())):
                raise _changed(where, sha256, h.hexdigest())
        return findings


def scan_stream(opener: Callable[[], Any], where: str, identity: tuple[str, ...] = (),
                sha256: str | None = None) -> list[Finding]:
    """A file of the build context read from a stream ``opener()`` gives (a member of a prebuilt archive): a
    small one whole (findings with line numbers), a big one in chunks that overlap by a window (findings with
    byte offsets), so memory stays flat; the bytes scanned are hashed, and must be ``sha256``."""
    h = hashlib.sha256()
    with opener() as fh:
        data = fh.read(TEXT_LIMIT + 1)
        h.update(data)
        if len(data) <= TEXT_LIMIT:
            findings = scan_bytes(data, where, identity=identity)
        else:
            findings, seen, offset = [], set(), 0
            while True:
                for f in scan_bytes(data, where, identity=identity, offset=offset, lines=False):
                    if (f.where, f.kind) not in seen:
                        seen.add((f.where, f.kind))
                        findings.append(f)
                more = fh.read(CHUNK)
                if not more:
                    break
                h.update(more)
                keep = data[-2 * WINDOW:]
                offset += len(data) - len(keep)
                data = keep + more
    if sha256 is not None and h.hexdigest() != sha256:
        raise _changed(where, sha256, h.hexdigest())
    return findings


def _all_anchors(identity: tuple[str, ...]) -> list[bytes]:
    return sorted({a for _, anchors, _ in _rules(False, identity) for a in anchors})


def scan_env(pairs: Iterable[tuple[str, str]], where: str | Callable[[str], str]) -> list[Finding]:
    """Variables whose name says secret and whose value is set (PASSWORD=..., HF_TOKEN=..., MYSQL_PWD=...)."""
    place = where if callable(where) else (lambda key: f"{where} {key}")
    return [Finding(where=place(key), kind=BY_NAME, value=value)
            for key, value in pairs if secret_by_name(key, value)]


def scan_values(pairs: Iterable[tuple[str, str, str]], identity: tuple[str, ...] = ()) -> list[Finding]:
    """Profile values at plan time: (where, name, value); secret names with a literal value, and every
    value against every rule, private addresses and the builder's ``identity`` included."""
    findings = []
    for where, name, value in pairs:
        option = name.startswith("-")  # an option's name (--api-key), read as an env key's (API_KEY)
        key = re.sub(r"[^A-Za-z0-9]", "_", name.lstrip("-")).upper() if option else name
        if key and secret_by_name(key, value):
            findings.append(Finding(where=where, kind=BY_OPTION if option else BY_NAME, value=value))
        findings += [Finding(where=where, kind=f.kind, value=f.value)
                     for f in scan_bytes(value.encode("utf-8", "surrogateescape"), where, addresses=True,
                                         identity=identity)]
    return findings


OPTION_RE = re.compile(r"--?([A-Za-z][A-Za-z0-9_.-]*)")
REFERENCE_RE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*")


def command_words(words: list, where) -> list[tuple[str, str, str]]:
    """A command line's words as (where, name, value): each word as it is, with no name; and a word an option
    names (``--api-key VALUE``, ``--api-key=VALUE``) with the option (read as the env key API_KEY), so that a
    secret given to an engine's option is refused as one in its env is. A ``${NAME}`` alone is no secret: it is
    expanded from the container's environment at start."""
    out = []
    for i, word in enumerate(words):
        if not isinstance(word, str):
            continue
        out.append((where(i), "", word))
        option, value = None, None
        if "=" in word and OPTION_RE.fullmatch(word.split("=", 1)[0]):
            option, value = word.split("=", 1)
        elif i > 0 and isinstance(words[i - 1], str) and OPTION_RE.fullmatch(words[i - 1]) \
                and not OPTION_RE.fullmatch(word):
            option, value = words[i - 1], word
        if option is not None and not REFERENCE_RE.fullmatch(value):
            out.append((where(i), option, value))  # (scan_values reads --api-key as API_KEY)
    return out


def scan_image(env: list[str], labels: dict[str, str], history: list[str], where: str,
               identity: tuple[str, ...] = ()) -> list[Finding]:
    """What an image's config holds: environment, labels and history (where build arguments end up)."""
    pairs = [tuple(e.split("=", 1)) if "=" in e else (e, "") for e in env]
    findings = scan_env(pairs, f"{where}: env")
    for key, value in pairs:
        findings += scan_text(f"{key}={value}", f"{where}: env {key}", identity=identity)
    for key, value in labels.items():
        findings += scan_text(f"{key}={value}", f"{where}: label {key}", identity=identity)
    for i, text in enumerate(history):
        findings += scan_text(text, f"{where}: history[{i}]", identity=identity)
        # build arguments show as "|2 NAME=value NAME=value /bin/sh -c ..." (the classic builder's), "RUN |2
        # NAME=value ... /bin/sh -c ... # buildkit" (BuildKit's, the docker CLI's default since 23.0)
        args = text.split("/bin/sh -c", 1)[0] if re.match(r"(?:RUN )?\|\d+ ", text) else ""
        for match in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args):
            findings += scan_env([(match.group(1), match.group(2))], f"{where}: history[{i}] build argument")
    return findings


# the image config's settings besides env and labels that a release carries as they are (found by review: an
# image made with `docker commit -c 'CMD ["serve", "--hf-token", "..."]' -a "Alice <...>"` shipped its command and
# author unread). WorkingDir, User and the like are left out: a /root/app there is the image's, not the builder's
SETTINGS = ("Cmd", "Entrypoint", "Healthcheck", "OnBuild", "Shell")


def scan_added(engine, image: str, base: str | None, identity: tuple[str, ...]) -> list[Finding]:
    """What an image adds to its base (or all of it, without a base): env, labels, history, its command,
    entrypoint, health check, ONBUILD triggers, shell and author."""
    info = engine.inspect_image(image)
    history = engine.history(image)
    env, labels = list(info.env), dict(info.labels)
    config = engine.image_config(image) or {}
    base_config: dict = {}
    if base is not None:
        base_info = engine.inspect_image(base)
        if base_info is not None:
            env = [e for e in env if e not in base_info.env]
            labels = {k: v for k, v in labels.items() if base_info.labels.get(k) != v}
            history = history[len(engine.history(base)):]
            base_config = engine.image_config(base) or {}
    where = f"image config of {image}"
    findings = scan_image(env, labels, history, where, identity)
    settings, base_settings = config.get("config") or {}, base_config.get("config") or {}
    for key in SETTINGS:
        value = settings.get(key)
        if not value or value == base_settings.get(key):
            continue
        findings += scan_text(json.dumps(value, ensure_ascii=False), f"{where}: {key}", identity=identity)
        if key in ("Cmd", "Entrypoint") and isinstance(value, list):  # (--api-key VALUE, as in the profiles)
            findings += [f for f in scan_values(command_words(value, lambda i, key=key: f"{where}: {key}[{i}]"))
                         if f.kind in (BY_NAME, BY_OPTION)]
    author = config.get("author")
    if isinstance(author, str) and author and author != base_config.get("author"):
        findings += scan_text(author, f"{where}: author", identity=identity)
    return findings


def check_allow(pattern: str, where: str) -> None:
    """An allow pattern (``--allow``, ``sanitise.allow``), refused when it is not a regular expression,
    could backtrack without end (it is searched in every finding: ``(\\w+)+!`` would take the child process
    that searches it past its time, :func:`allowed`) or matches an empty value: such a pattern (``''``, ``.*``,
    ``x?``, an unset CI variable) is found in every value, so it would let every finding through."""
    try:
        compiled = re.compile(pattern)
        found = backtracks(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InputError(f"{where} {pattern[:80]!r} is not a regular expression: {exc}") from None
    if found:
        raise InputError(f"{where} {pattern[:80]!r} could backtrack without end ({found}); write it without "
                         "nesting or back-references, e.g. '^hf_[A-Za-z0-9]{30,}$' instead of '^hf_([A-Za-z0-9]+)+$'")
    if compiled.search("") is not None:
        raise InputError(f"{where} {pattern[:80]!r} matches an empty value, so it would let every value through the "
                         "sanitisation gate; write what the deliberate value looks like, e.g. '^hf_A.*Ij$'")
    # no secret the gate finds is one character long: a pattern one matches ('.', '\w', '[a-z]') is
    # found in almost every value
    one = next((c for c in "xZ0_-/ " if compiled.search(c)), None)
    if one is not None:
        raise InputError(f"{where} {pattern[:80]!r} matches the one-character value {one!r}, so it would let almost "
                         "every value through the sanitisation gate; write what the deliberate value looks like, "
                         "e.g. '^hf_A.*Ij$'")


ALLOW_SECONDS = 10.0  # every allow pattern searched in every value found: far longer than any search that ends takes
# the search, in a child process that can be stopped: ``re`` cannot be interrupted, and the plan refuses only the
# patterns that could backtrack without end; polynomial ones (^.*.*.*.*=$) took hours on a value of 4,000 blanks
_SEARCH = ("import json, re, sys; ps, vs = json.load(sys.stdin); "
           "print(json.dumps([any(re.search(p, v) for p in ps) for v in vs]))")


def allowed(findings: list[Finding], allow: Iterable[str]) -> list[Finding]:
    """The findings no allow pattern is found in."""
    patterns = list(allow)
    if not findings or not patterns:
        return list(findings)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _SEARCH],
                              input=json.dumps([patterns, [f.value for f in findings]]), capture_output=True,
                              text=True, timeout=ALLOW_SECONDS)
    except subprocess.TimeoutExpired:
        shown = ", ".join(repr(p[:60]) for p in patterns[:3]) + (", ..." if len(patterns) > 3 else "")
        raise InputError(f"sanitise.allow / --allow: the allow patterns ({shown}) took longer than "
                         f"{ALLOW_SECONDS:g} s to search in the {len(findings)} value(s) the sanitisation gate found "
                         f"(the longest of {max(len(f.value) for f in findings)} characters); write them with fewer "
                         "unbounded repeats such as .*, e.g. '^hf_[A-Za-z0-9]{30,}$'") from None
    try:
        verdicts = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        verdicts = None
    if not isinstance(verdicts, list) or len(verdicts) != len(findings):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UnibakeError(f"sanitise.allow / --allow: the allow patterns could not be searched: {tail[:200]}")
    return [f for f, allowed_ in zip(findings, verdicts) if not allowed_]


def enforce(findings: list[Finding], allow: Iterable[str], what: str) -> None:
    left = allowed(findings, allow)
    if left:
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        first = left[0]
        v = first.value
        # an allow pattern is searched in what was found (an address inside a value, a token inside a
        # line), not in the whole value: a pattern for the whole MASTER=10.0.0.5:50051 never matched
        hint = (f"'^{re.escape(v[:4])}.*{re.escape(v[-2:])}$'" if first.shows_ends else
                f"a regular expression for the {len(v)} characters found, not the whole value")
        raise VerificationError(f"sanitisation: {first}{more} in {what}; remove it, or if it is deliberate, allow "
                                f"it in product.yaml under sanitise.allow (e.g. {hint}) or with --allow")


def scan_context(files: Iterable[tuple[str, object, str]], identity: tuple[str, ...],
                 cache: Path | None = None) -> list[Finding]:
    """The build context, every file whole and as bytes: (where, bytes, a path or a function opening a stream,
    sha256) triples.
    ``cache``: a folder remembering each file's findings by its sha256 (and the rules and identity
    they were made with), so an unchanged 400 MB library is read once, not at every release."""
    findings: list[Finding] = []
    todo: list[tuple[str, Any, Path | None, str]] = []
    rules_key = hashlib.sha256(repr((RULES, PRIVATE_ADDRESS, identity)).encode()).hexdigest()[:16]
    writable = cache is not None and _cache_folder(cache)  # (made private, or made so again, before a memo is read)
    for where, content, sha256 in files:
        if isinstance(content, (bytes, bytearray)):
            if hashlib.sha256(content).hexdigest() != sha256:  # a prebuilt archive's member, read from it again
                raise _changed(where, sha256, hashlib.sha256(content).hexdigest())
            findings += scan_bytes(bytes(content), where, identity=identity)
            continue
        memo = cache / f"{rules_key}-{sha256}.json" if cache is not None else None
        remembered = _read_memo(memo) if memo is not None else None
        if remembered is not None:
            findings += [Finding(where=where, kind=k, value=v) for k, v in remembered]
            continue
        todo.append((where, content if callable(content) else Path(content), memo, sha256))
    for where, path, memo, sha256 in todo:
        found = scan_stream(path, where, identity, sha256) if callable(path) else \
            scan_file(path, where, identity=identity, sha256=sha256)
        findings += found
        if memo is not None and writable:
            # (0600: a memo holds what it found whole, a token as it is, for the allow patterns to match)
            write_atomic(memo.parent, memo.name, json.dumps([[f.kind, f.value] for f in found]), mode=0o600)
    return findings


def _cache_folder(folder: Path) -> bool:
    """The memo folder made if need be; False (no memo written) when it, or the folder above it, is a
    link or not a folder: the memos are not written somewhere else."""
    if linked_above(folder, 1) or any(part.exists() and not part.is_dir() for part in (folder.parent, folder)):
        return False
    try:  # (private: made here first, the user's unibake folder was 0755 and the memos readable by all)
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:  # one an earlier version made 0755: its memos too
            os.chmod(folder, 0o700)
    except OSError:
        return False
    return True


def _read_memo(memo: Path) -> list[tuple[str, str]] | None:
    """A file's remembered findings; None (the file is scanned again) for anything that is not a
    memo this code wrote: a missing, linked, truncated or malformed file never stops a run."""
    if linked_above(memo.parent, 1):  # (a memo folder, or the one above it, linked: not read)
        return None
    try:
        found = json.loads(read_small_text(memo, UnibakeError, limit=MEMO_LIMIT, follow=False))
    except (UnibakeError, ValueError, RecursionError):
        return None
    if not isinstance(found, list) or not all(
            isinstance(f, list) and len(f) == 2 and f[0] in MEMO_KINDS and isinstance(f[1], str) for f in found):
        return None
    return [(k, v) for k, v in found]


def scan_release_texts(texts: dict[str, str | bytes], identity: tuple[str, ...]) -> list[Finding]:
    """The release's files (notes, manifest, attachments): a binary attachment (a NUL in its first 8 KiB: a
    database, UTF-16 text, an archive) is scanned as bytes, each finding named by its byte offset."""
    findings = []
    for name, text in texts.items():
        if isinstance(text, bytes):
            if b"\0" in text[:8192]:
                findings += scan_bytes(text, name, addresses=True, identity=identity, lines=False)
                if text[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 text (a spreadsheet's export): read as such
                    findings += scan_text(text.decode("utf-16", "replace"), name, addresses=True, identity=identity)
                continue
            text = text.decode("utf-8", "replace")
        findings += scan_text(text, name, addresses=True, identity=identity)
    return findings
