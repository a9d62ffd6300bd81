"""Env files: the ``KEY=VALUE`` lines of a validated configuration, read as ``docker run --env-file``
reads them, strictly.

A line is ``KEY=VALUE`` (the value is everything after the first ``=``, quotes included, as Docker
keeps them), a comment starting with ``#``, or blank. Everything else is refused with the file and
line: a key alone (Docker would take it from the host's environment, which cannot be baked), a key
twice, ``export KEY=...``, an invalid key, a control character. Written by hand: Docker's format has
no escapes or quoting to interpret, and python-dotenv interprets both (and only logs bad lines).

An env's count and fingerprint (:func:`fingerprint`) are what the notes compare between releases.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .files import decode_text
from .inputs import Source, read_hashed, read_source
from .schema import BIDI_RE, ENV_KEY_RE, MAX_VALUE_LEN, describe_character, hidden_character

MAX_ENV_FILE = 1 << 20
# What docker's env-file reader trims from a line's start (Go's unicode.IsSpace): ASCII's white space (\v and \f
# too), NEL, the no-break space and Unicode's other spaces; not U+200B or U+FEFF, and not \x1c-\x1f, which
# Python's str.isspace() counts
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True, kw_only=True)
class EnvFile:
    """One env file: the hashed source, its values in file order, and the line of every key."""

    source: Source
    values: dict[str, str]
    lines: dict[str, int]

    @property
    def display(self) -> str:
        return self.source.path


def parse_env(text: str, display: str) -> tuple[dict[str, str], dict[str, int]]:
    """``{key: value}`` and ``{key: line}`` of an env file's text; InputError naming the line otherwise."""
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    # Lines as `docker run --env-file` reads them (Go's bufio.ScanLines): split at "\n" only, one "\r"
    # before it dropped, a UTF-8 byte-order mark at the start dropped. str.splitlines() would also
    # split at form feeds, \x1c-\x1e, \x85 and U+2028, making variables docker never sees. Then its leading
    # white space dropped as docker drops it (a line indented with a no-break space, \v or \f was refused as no
    # variable name, or a comment so indented as a line without '=', where docker takes both)
    for n, raw in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = raw.removesuffix("\r").lstrip(GO_SPACE)
        where = f"{display}:{n}"
        found = BIDI_RE.search(line)
        if found and line.startswith("#"):  # a comment shown reordered ("Trojan Source"); in a value: said below
            raise InputError(f"{where}: holds {describe_character(found.group())} in a comment, which shows a reviewer "
                             "the line reordered; remove it")
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InputError(f"{where}: {key.strip()[:60]!r} has no '=VALUE'; docker would take it from the host's "
                             "environment, which an image cannot bake: give its value")
        if key.startswith("export "):
            raise InputError(f"{where}: 'export' is shell, not an env file; write {key[7:].strip()[:60]}=VALUE")
        if not ENV_KEY_RE.fullmatch(key):
            raise InputError(f"{where}: {key[:60]!r} is not a variable name like NCCL_ALGO")
        bad = next((c for c in value if ord(c) < 0x20 and c != "\t" or 0x7F <= ord(c) <= 0x9F), None)
        if bad is not None or "\t" in value:
            raise InputError(f"{where}: the value of {key} contains a control character "
                             f"({(bad or chr(9))!r}); tabs and other control characters are not allowed")
        hidden = hidden_character(value)
        if hidden is not None:  # a bidi override: the Dockerfile's ENV line a reviewer reads is shown reordered
            raise InputError(f"{where}: the value of {key} contains {describe_character(hidden)}, an invisible "
                             "format character that reorders or hides text where the value is shown (the "
                             "Dockerfile, the notes); remove it")
        if len(value) > MAX_VALUE_LEN:
            raise InputError(f"{where}: the value of {key} is {len(value)} characters long; the limit is "
                             f"{MAX_VALUE_LEN}")
        if key in values:
            raise InputError(f"{where}: {key} is set twice in this file (first on line {lines[key]})")
        values[key], lines[key] = value, n
    return values, lines


def read_env_file(root: Path, rel: str, where: str) -> EnvFile:
    """The env file ``rel`` under ``root`` (an input, hashed like any other), parsed."""
    source = read_source(root, rel, where, want="file")
    text = decode_text(read_hashed(source.files[0], MAX_ENV_FILE), source.files[0].absolute, InputError)
    values, lines = parse_env(text, source.path)
    return EnvFile(source=source, values=values, lines=lines)


def fingerprint(env: dict[str, str]) -> str:
    """The sha256 of an environment as sorted ``KEY=VALUE`` lines: equal envs, equal fingerprints."""
    return hashlib.sha256("".join(f"{k}={env[k]}\n" for k in sorted(env)).encode()).hexdigest()
