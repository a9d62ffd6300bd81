"""What a release's notes carry besides what unibake measures (``notes:`` in product.yaml).

* ``changelog`` and ``known_limits``: Markdown files written by people, included in the notes;
* ``attachments``: files copied into the release folder (results JSON, tables), listed in
  ``SHA256SUMS`` and the manifest, linked from the notes;
* ``external``: artifacts the release needs but does not ship (weights, a patch set), recorded by
  name, size and sha256; ``build.py verify DIR --external PATH`` checks a copy.

None of it is baked into the image, so none of it is in ``inputs.lock``: a new changelog is a new
release's notes, not a new image.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .files import decode_text, read_small_file
from .inputs import InputFile, read_hashed, read_source
from .manifest import FILE_NAME_PATTERN, RELEASE_FILES
from .schema import describe_character, hidden_character

MAX_TEXT = 1 << 20
MAX_ATTACHMENT = 64 << 20
# the supply chain's files in a release folder (sbom.SBOM, provenance.PROVENANCE: not imported, they are heavy)
SUPPLY_CHAIN_FILES = ("sbom.cdx.json", "provenance.intoto.json")


@dataclass(frozen=True, kw_only=True)
class Attachment:
    name: str  # its file name in the release folder
    file: InputFile

    def read(self) -> bytes:
        """Its bytes as the plan hashed them: an attachment rewritten during the build (a benchmark job
        writing results.json again) is refused, not published as another run's file."""
        data = read_small_file(self.file.absolute, InputError, limit=MAX_ATTACHMENT,
                               what="attachments are copied into the release whole")
        if hashlib.sha256(data).hexdigest() != self.file.sha256:
            raise InputError(f"attachment '{self.file.path}' changed after the plan read it (sha256 "
                             f"{self.file.sha256[:12]}, now {hashlib.sha256(data).hexdigest()[:12]}); the release "
                             "carries the files the plan read and scanned: run again")
        return data


@dataclass(frozen=True, kw_only=True)
class External:
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Notes:
    changelog: str | None = None
    known_limits: str | None = None
    attachments: tuple[Attachment, ...] = ()
    external: tuple[External, ...] = ()
    sources: tuple[Path, ...] = ()  # the files read: the changelog, the known limits, the attachments


def _taken(name: str) -> bool:
    """A name the release folder's own files have, or their signatures (``SHA256SUMS.asc``), in any letter case
    (a folder copied to a disk that does not tell case apart holds one of the two): published, the attachment
    replaced the SBOM or the provenance (summed and signed as the release's), or stood as a signature."""
    folded = name.casefold()
    for own in RELEASE_FILES | set(SUPPLY_CHAIN_FILES):
        if folded == own.casefold() or folded.startswith(own.casefold() + "."):
            return True
    return ".tar.zst" in folded


def _refuse_hidden(text: str, path: str, where: str) -> None:
    """A changelog or known-limits file goes into RELEASE_NOTES.md as it is: a control character (an escape
    sequence clears the screen of whoever cats the notes, a bare CR overwrites a line) or a character that
    hides or reorders the text around it ("Trojan Source") is refused, as in the YAML, naming its line."""
    for number, line in enumerate(text.split("\n"), 1):
        bad = hidden_character(line.removesuffix("\r").replace("\t", " "))  # (a CRLF file's line ends are fine)
        if bad is not None:
            raise InputError(f"{path}:{number}: holds {describe_character(bad)}, which would show the release's "
                             f"readers another text than the one written ({where}); remove it")


def read_notes(root: Path, data: dict, where) -> Notes:
    """``notes:`` of product.yaml, read and checked; ``where(path)`` locates its keys."""
    texts, sources = {}, []
    for key in ("changelog", "known_limits"):
        if key in data:
            f = read_source(root, data[key], where((key,)), want="file").files[0]
            sources.append(f.absolute)
            texts[key] = decode_text(read_hashed(f, MAX_TEXT), f.absolute, InputError).strip() + "\n"
            _refuse_hidden(texts[key], f.path, where((key,)))
    attachments: list[Attachment] = []
    for i, rel in enumerate(data.get("attachments", [])):
        f = read_source(root, rel, where(("attachments", i)), want="file").files[0]
        name = Path(f.path).name
        if not re.fullmatch(FILE_NAME_PATTERN, name) or _taken(name):
            raise InputError(f"{where(('attachments', i))}: an attachment cannot be named {name!r} in the release "
                             f"folder (not {', '.join(sorted(RELEASE_FILES | set(SUPPLY_CHAIN_FILES)))}, nor one of "
                             "them in other letter case or with a suffix (their signatures), no .tar.zst, plain "
                             "characters)")
        if len(os.fsencode(name)) > 250:  # written as .NAME.tmp first: 255 bytes is a file name's limit
            raise InputError(f"{where(('attachments', i))}: the attachment name {name[:40]!r}... is "
                             f"{len(os.fsencode(name))} bytes; at most 250")
        if any(a.name.casefold() == name.casefold() for a in attachments):  # one file, copied where case is not told
            raise InputError(f"{where(('attachments', i))}: two attachments are named {name} (letter case aside)")
        if f.size > MAX_ATTACHMENT:
            raise InputError(f"{where(('attachments', i))}: {f.path} is {f.size} bytes; attachments are at most "
                             f"{MAX_ATTACHMENT} (record a large file under notes.external instead)")
        attachments.append(Attachment(name=name, file=f))
    external = tuple(External(name=e["name"], bytes=e["bytes"], sha256=e["sha256"]) for e in data.get("external", []))
    names = [e.name for e in external]
    if len(set(names)) != len(names):
        raise InputError(f"{where(('external',))}: an external artifact is listed twice")
    return Notes(changelog=texts.get("changelog"), known_limits=texts.get("known_limits"),
                 attachments=tuple(attachments), external=external,
                 sources=(*sources, *(a.file.absolute for a in attachments)))
