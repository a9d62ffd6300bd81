"""The ``sha256sum`` format, read and written in one place: ``inputs.lock``, ``SHA256SUMS`` and
``checksums/<tag>.SHA256SUMS``.

Reading accepts what ``sha256sum -c`` accepts for plain names: the GNU text and binary forms
(``HASH  NAME``, ``HASH *NAME``) and the BSD tagged form (``SHA256 (NAME) = HASH``). A name
listed twice, an escaped name (a line starting with a backslash) and any other line are refused,
so that a file can never mean one thing to this reader and another to ``sha256sum``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import UnibakeError

GNU_RE = re.compile(r"^([0-9a-fA-F]{64}) ([ *])(.+)$")
BSD_RE = re.compile(r"^SHA256 \((.+)\) = ([0-9a-fA-F]{64})$")


@dataclass(frozen=True, kw_only=True)
class SumsEntry:
    name: str
    sha256: str  # lower-case hex
    line: int
    binary: bool = False  # 'HASH *NAME': sha256sum's binary mode (the same bytes on Linux)


def parse_sums(text: str, where: str, error: type[UnibakeError], *, comments: bool = False) -> tuple[SumsEntry, ...]:
    """The entries of a sums file, in order; ``error`` (with ``where:LINE``) for anything else.

    ``comments``: lines starting with ``#`` and blank lines are skipped (``inputs.lock``).
    """
    entries: list[SumsEntry] = []
    seen: dict[str, int] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    for n, line in enumerate(lines, 1):
        if line.endswith("\r"):
            raise error(f"{where}:{n}: a carriage return ends the line (a file edited on Windows?)")
        if comments and (not line or line.startswith("#")):
            continue
        if line.startswith("\\"):
            raise error(f"{where}:{n}: an escaped file name (backslash or newline in a name) is not accepted")
        gnu, bsd = GNU_RE.match(line), BSD_RE.match(line)
        binary = False
        if gnu:
            digest, name, binary = gnu.group(1), gnu.group(3), gnu.group(2) == "*"
        elif bsd:
            name, digest = bsd.group(1), bsd.group(2)
        else:
            raise error(f"{where}:{n}: not a 'sha256  name' line: {line[:80]!r}")
        if name in seen:
            raise error(f"{where}:{n}: {name!r} is listed twice (first on line {seen[name]})")
        seen[name] = n
        entries.append(SumsEntry(name=name, sha256=digest.lower(), line=n, binary=binary))
    return tuple(entries)


def render_sums(digests: Mapping[str, str], header: str = "", binary: frozenset[str] = frozenset()) -> str:
    """``HASH  NAME`` lines sorted by name, after ``header`` (``HASH *NAME`` for the names in ``binary``);
    names never hold a newline or backslash."""
    for name in digests:
        if "\n" in name or "\\" in name or not name:
            raise ValueError(f"cannot write {name!r} in the sha256sum format")
    return header + "".join(f"{digests[name]} {'*' if name in binary else ' '}{name}\n" for name in sorted(digests))
