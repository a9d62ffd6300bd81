"""The release folder's machine-readable files, typed: ``manifest.json`` (:class:`ReleaseManifest`)
and ``VALIDATION.json`` (:class:`Validation`).

The models are the schema: ``docs/manifest.schema.json`` is generated from
:class:`ReleaseManifest` (``python -m unibake.manifest > docs/manifest.schema.json``) and the
tests check both that it is current and that every manifest the pipeline writes validates against
it. A manifest read from a downloaded folder is parsed against the same model, strictly: a field
missing, of the wrong type or unknown is refused with one line naming it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from .archive import part_name
from .errors import UnibakeError, VerificationError
from .files import decode_text, read_small_file
from .metadata import (DIGEST, HEX64, Component, Digest, Document, ImageMetadata, LaunchMetadata, ProfileMetadata,
                       Record, first_error)
from .platforms import DEFAULT as DEFAULT_PLATFORM, RECORD_PATTERN as PLATFORM_PATTERN
from .schema import EXTERNAL_NAME_RE, IMAGE_REF_RE, NAME_RE, REPOSITORY_RE

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
VALIDATION = "VALIDATION.json"
MAX_MANIFEST_BYTES = 16 << 20
TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
# a time as unibake writes it (UTC, to the second): what releases are ranked by, compared as text
TIME_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"
FILE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$"  # a plain file inside the release folder
# The files every release folder has (the archive aside); an attachment may not take one of their names.
RELEASE_FILES = frozenset({MANIFEST, VALIDATION, "SHA256SUMS", "RELEASE_NOTES.md", "IMAGE_ID", "run.sh", "apply.sh",
                           "README-DIST.md"})



# a size is a Go int64 where an engine reads it, and a time one Python can write (9999-12-31T23:59:59Z): a
# manifest saying more (10**400 bytes) was a traceback in releases, kit and the notes (found by probing)
MAX_BYTES = 2**63 - 1
MAX_EPOCH = 253402300799

class ArchiveFile(Record):
    name: str = Field(pattern=FILE_NAME_PATTERN)
    bytes: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern=HEX64)


class Compression(Record):
    algorithm: Literal["zstd"]
    level: int = Field(ge=1, le=19)
    long_distance: bool


class ArchiveRecord(Record):
    """The archive as published: its file(s) and the digests of both streams."""

    name: str = Field(pattern=FILE_NAME_PATTERN)
    files: tuple[ArchiveFile, ...] = Field(min_length=1)
    bytes: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern=HEX64)  # of the whole compressed stream (all parts in order)
    uncompressed_bytes: int = Field(ge=0, le=MAX_BYTES)
    uncompressed_sha256: str = Field(pattern=HEX64)
    compression: Compression

    @model_validator(mode="after")
    def _files_are_the_named_archive(self) -> "ArchiveRecord":
        # the file the notes tell downloaders to load is NAME (or NAME.part-000, ... in order): the
        # files checked must be those, or a verifier would pass one file while users load another
        names = [f.name for f in self.files]
        if not self.name.endswith(".tar.zst"):  # (as the shell verifier takes it: the notes say NAME.tar.zst)
            raise ValueError(f"the archive {self.name[:80]} is not named NAME.tar.zst, as unibake names its archive")
        if names != [self.name] and names != [part_name(self.name, i) for i in range(len(names))]:
            raise ValueError(f"the archive {self.name} is recorded as the files {', '.join(names)[:200]}, not "
                             f"{self.name} or its parts {part_name(self.name, 0)}, ...")
        return self


class HotfixRecord(Record):
    base_release: str = Field(pattern=TAG_PATTERN)
    base_tag: str = Field(pattern=IMAGE_REF_RE.pattern, max_length=255)
    base_image_id: str = Field(pattern=DIGEST)
    base_archive_bytes: int = Field(ge=1, le=MAX_BYTES)
    omitted_diff_ids: tuple[Digest, ...]
    shipped_diff_ids: tuple[Digest, ...]


class AttachmentRecord(Record):
    """A file of the project copied into the release (results, tables), listed in SHA256SUMS."""

    name: str = Field(pattern=FILE_NAME_PATTERN)
    bytes: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern=HEX64)


class ExternalRecord(Record):
    """An artifact the release needs but does not ship (weights, a patch set): checked by
    ``build.py verify DIR --external PATH``."""

    name: str = Field(max_length=1024, pattern=EXTERNAL_NAME_RE.pattern)
    bytes: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern=HEX64)


class Tool(Record):
    name: Literal["unibake"]
    version: str = Field(max_length=64)


class RegistryRecord(Record):
    """Where ``build.py push`` put the image: pull ``reference`` (by digest) to get exactly this release."""

    reference: str = Field(max_length=512, pattern=REPOSITORY_RE.pattern[:-1] + r"@sha256:[0-9a-f]{64}$")
    repository: str = Field(max_length=255, pattern=REPOSITORY_RE.pattern)  # REGISTRY/REPO
    tag: str = Field(pattern=TAG_PATTERN)
    digest: str = Field(pattern=DIGEST)  # of this release's image manifest
    media_type: str = Field(max_length=128)
    layers: Literal["gzip", "zstd"]
    pushed: str = Field(max_length=64)
    # pushed with the releases of its other platforms: the image index ``tag`` names, which lists them all
    index: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")

    @model_validator(mode="after")
    def _pulled_by_its_digest(self) -> "RegistryRecord":
        # `pull` and the notes' pull line take the reference: one of another repository or image would be
        # pulled and shown as this push
        if self.reference != f"{self.repository}@{self.digest}":
            raise ValueError(f"reference {self.reference[:300]!r} is not repository@digest")
        return self



class SupplyFile(Record):
    """A supply-chain file of the release folder (SBOM, provenance, kit)."""

    name: str = Field(pattern=FILE_NAME_PATTERN)
    bytes: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern=HEX64)


class Signature(Record):
    """Detached signatures of one kind, by one key: of SHA256SUMS and of the provenance."""

    kind: Literal["openpgp", "minisign"]
    key: str = Field(pattern=r"^[0-9A-F]{1,64}$")  # the OpenPGP fingerprint or the minisign key ID
    files: tuple[Annotated[str, Field(pattern=FILE_NAME_PATTERN)], ...]  # files of the release folder


class SupplyChain(Record):
    """``sbom.cdx.json``, ``provenance.intoto.json``, the reconstruct kit and the signatures."""

    sbom: SupplyFile
    provenance: SupplyFile
    kit: SupplyFile | None
    signatures: tuple[Signature, ...]


class ReleaseManifest(Document):
    """``manifest.json``: everything a downloader, a later release or a tool needs to know."""

    schema_version: Literal[2] = Field(alias="schema")
    tool: Tool
    product: str = Field(pattern=NAME_RE.pattern)
    release: str = Field(pattern=TAG_PATTERN)
    version: str = Field(max_length=128)
    tag: str = Field(pattern=IMAGE_REF_RE.pattern, max_length=255)
    image_id: str = Field(pattern=DIGEST)
    image_size: int = Field(ge=0, le=MAX_BYTES)
    diff_ids: tuple[Digest, ...]
    save_layout: Literal["docker", "oci"]
    default_profile: str | None = Field(pattern=NAME_RE.pattern)
    profiles: dict[str, ProfileMetadata]
    launch: LaunchMetadata | None
    components: tuple[Component, ...]
    archive: ArchiveRecord
    labels: dict[str, str]
    revision: str = Field(max_length=256)
    created: str = Field(max_length=64)
    source_date_epoch: int | None = Field(ge=0, le=MAX_EPOCH)
    # what releases are ranked by (``first_published`` aside), compared as text: a UTC time in one form
    published: str = Field(pattern=TIME_PATTERN)
    # when this release was first published: ``published`` but for a --force re-release, which carries
    # over the replaced release's; None in releases made before it was recorded (then ``published``)
    first_published: str | None = Field(default=None, pattern=TIME_PATTERN)
    previous: str | None = Field(pattern=TAG_PATTERN)
    hotfix: HotfixRecord | None
    attachments: tuple[AttachmentRecord, ...] = ()
    external: tuple[ExternalRecord, ...] = ()
    registry: tuple[RegistryRecord, ...] = ()  # build.py push records each push here
    # os/architecture the image config records (None: it records none); releases made before were amd64
    platform: str | None = Field(default=DEFAULT_PLATFORM, pattern=PLATFORM_PATTERN)
    supply_chain: SupplyChain | None = None  # absent in releases made before the SBOM and provenance

    model_config = Record.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _first_published_before_published(self) -> "ReleaseManifest":
        # carried over by --force and ranked as text: one later than the folder's own publishing is no
        # first release (a hand-edited value would make its version the newest for ever)
        if self.first_published and self.first_published > self.published:
            raise ValueError(f"first_published {self.first_published} is later than published {self.published}")
        return self

    @model_validator(mode="after")
    def _profile_names(self) -> "ReleaseManifest":
        # as the image's own metadata names them (the shell verifier checks the same pattern): a name with a
        # quote, a slash or an escape would be read otherwise by a verifier that reads the file line by line
        for name in self.profiles:
            if not NAME_RE.fullmatch(name):
                raise ValueError(f"profile name {name[:40]!r} is not a profile name ({NAME_RE.pattern})")
        return self

    @property
    def metadata(self) -> ImageMetadata | None:
        """The image's own metadata, for an image unibake built."""
        if self.default_profile is None or self.launch is None:
            return None
        return ImageMetadata(product=self.product, version=self.version, tag=self.tag,
                             default_profile=self.default_profile, profiles=self.profiles,
                             components=self.components, launch=self.launch,
                             platform=self.platform or DEFAULT_PLATFORM)

    @property
    def first_release(self) -> str:
        """When this release was first published (a --force re-release keeps its place among the others)."""
        return self.first_published or self.published

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2) + "\n"


class RoundTripRecord(Record):
    engine: str
    engine_version: str
    # what the fresh engine loaded: the archive file itself (the sequential path, a hotfix), or the
    # normalised save stream as it was read (the one-pass export; the archive decoded to the same digests)
    method: Literal["archive", "stream"] = "archive"
    # the images the engine held before the load: none (an empty scratch engine), the base image the
    # product is built FROM (a seeded verify engine: only the layers the release adds were loaded),
    # and for a hotfix the release it builds on
    held_before: tuple[Digest, ...] = ()
    image_id: str = Field(pattern=DIGEST)
    diff_ids: tuple[Digest, ...]
    tags: tuple[str, ...]
    seconds: float


class GateStep(Record):
    name: str  # self-check | start | health | chat | stability | address (a --verify-engine's container asked from here)
    passed: bool
    seconds: float
    detail: str = ""


class ChatCheck(Record):
    """One prompt of a smoke gate: what was asked, what was expected, and what came back."""

    prompt: str
    match: Literal["exact", "contains", "regex"]
    expect: str | None
    reply: str
    passed: bool
    seconds: float


class GateResult(Record):
    profile: str
    steps: tuple[GateStep, ...]
    chats: tuple[ChatCheck, ...] = ()
    restart_count: int | None = None  # read from the container after the gate (None: it never started)
    oom_killed: bool | None = None
    skipped: str | None = Field(default=None, min_length=1)  # why it did not run (the profile's smoke.skip)

    @property
    def passed(self) -> bool:
        """Every step ran and passed: a skipped gate never counts as passed (nor as failed: see ``failed``)."""
        return self.skipped is None and all(s.passed for s in self.steps)

    @property
    def failed(self) -> GateStep | None:
        return next((s for s in self.steps if not s.passed), None)


class Validation(Record):
    """``VALIDATION.json``: the round trip and the smoke gates, or why they did not run."""

    round_trip: RoundTripRecord | None
    round_trip_skipped: str | None
    smoke: tuple[GateResult, ...]
    smoke_skipped: str | None

    @property
    def passed(self) -> bool:
        """Every gate ran and passed (a release with a skipped gate is not said to have passed them all)."""
        return all(g.passed for g in self.smoke)

    def document(self) -> dict:
        """As written to ``VALIDATION.json``: with each gate's verdict and the overall one."""
        document = self.model_dump(mode="json")
        document["passed"] = self.passed
        for gate, result in zip(document["smoke"], self.smoke):
            gate["passed"] = result.passed
        return document

    def to_json(self) -> str:
        return json.dumps(self.document(), indent=2) + "\n"


def load_manifest(folder: Path, error: type[UnibakeError] = VerificationError) -> ReleaseManifest:
    """A release folder's ``manifest.json``, parsed against the schema; ``error`` for anything else."""
    return read_manifest(folder, error)[0]


def read_manifest(folder: Path, error: type[UnibakeError] = VerificationError) -> tuple[ReleaseManifest, bytes]:
    """:func:`load_manifest`, with the very bytes it was parsed from (to be checked against the folder's
    ``SHA256SUMS``: read once, so no other manifest can take its place between the parse and the check)."""
    path = folder / MANIFEST
    data = read_small_file(path, error, limit=MAX_MANIFEST_BYTES, what="this is not a complete release folder",
                           follow=False)
    return parse_manifest(decode_text(data, path, error), str(path), error), data


def _once_each(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are each written once: of a key written twice, JSON readers keep
    either (Python's the last, the shell verifier's line-reading the first), so none is trusted."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {key[:40]!r} is written twice in one object")
        seen.add(key)
    return dict(pairs)


class _NotWhole:
    """A number read from JSON that is no whole number (a fraction, an exponent, NaN): json.dumps writes
    such a value in another form than it may have been read in, and unibake writes none in a manifest,
    an SBOM or a provenance."""


def _not_whole(text: str) -> _NotWhole:
    return _NotWhole()


# the most digits a whole number is read with (Python's own limit of int(), which refused it as no JSON,
# where the shell verifier, reading the line, took it): unibake writes none near it
MAX_DIGITS = 4300


def _whole(text: str) -> int | _NotWhole:
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else _NotWhole()


def read_json(text: str) -> object:
    """``text`` as JSON, a key written twice in one object refused (ValueError), each number that is no
    whole number (or one of more than MAX_DIGITS digits) read as :class:`_NotWhole`. Nested more than
    MAX_NESTING levels deep, it is refused (ValueError) before it is read: Python's reader gives up
    somewhere near 1000 levels, the shell verifier at MAX_NESTING, as for an image's metadata."""
    from .imagetar import MAX_NESTING, _nesting

    if _nesting(text) > MAX_NESTING:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep, which no release's JSON is")
    return json.loads(text, object_pairs_hook=_once_each, parse_float=_not_whole, parse_constant=_not_whole,
                      parse_int=_whole)


def off_form(text: str, value: object) -> str:
    """Where ``text`` first differs from ``value`` (read from it) written as unibake writes its JSON
    files (json.dumps, indent 2, a last newline): ``line N``, ``its end``; "" where it does not. The
    shell verifier reads such a file line by line, so both verifiers take only that one form (a value
    escaped otherwise, ``"linux\\/amd64"``, or the file reformatted, would be read otherwise)."""
    try:
        written = json.dumps(value, indent=2, default=lambda odd: None) + "\n"
    except (ValueError, RecursionError):
        return "line 1"
    if written == text:
        return ""
    for number, (line, want) in enumerate(zip(text.split("\n"), written.split("\n")), 1):
        if line != want:
            return f"line {number}"
    return "its end"


NOT_IN_FORM = "not written as unibake writes it (json.dumps, indent 2, every value in one form): its lines could be " \
    "read otherwise than its JSON"


def parse_manifest(text: str, where: str, error: type[UnibakeError] = VerificationError) -> ReleaseManifest:
    try:
        raw = read_json(text)
    except (ValueError, RecursionError) as exc:
        raise error(f"{where}: not valid JSON ({str(exc)[:100]})") from None
    if isinstance(raw, dict) and raw.get("schema") != SCHEMA_VERSION:
        found = raw.get("schema")
        shown = "a number written with a fraction or an exponent" if isinstance(found, _NotWhole) \
            else repr(str(found)[:20])
        raise error(f"{where}: manifest schema {shown}, not {SCHEMA_VERSION}: not a release "
                    "of this unibake (a foreign folder, or one made by another version)")
    if odd := off_form(text, raw):
        raise error(f"{where}: {odd}: {NOT_IN_FORM}")
    try:
        return ReleaseManifest.model_validate_json(text)
    except ValidationError as exc:
        raise error(f"{where}: not a valid release manifest: {first_error(exc)}") from None


def json_schema() -> dict:
    """The JSON Schema of ``manifest.json``, as published in ``docs/manifest.schema.json``."""
    schema = ReleaseManifest.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema,
            "title": "unibake release manifest (manifest.json)"}


# Python's look-ahead in the path patterns (a component that is not "." or ".."), as a second ERE not to match
_NO_DOT_COMPONENT = r"(?!\.{1,2}(?:/|$))"


def _posix_pattern(pattern: str) -> tuple[str, str]:
    """A schema pattern (Python's re) as a POSIX ERE, and an ERE the value must not match ("-": none)."""
    unlike = "-"
    if _NO_DOT_COMPONENT in pattern:
        pattern, unlike = pattern.replace(_NO_DOT_COMPONENT, ""), r"(^|/)\.{1,2}(/|$)"
    # (a bracket: a class of one in the ERE, as '\]' is not one there)
    ere = pattern.replace("(?:", "(").replace("\\[", "[[]").replace("\\]", "[]]")
    # what an ERE reads as Python does: no other group syntax, class escape or shorthand; anchored whole
    assert "(?" not in ere and not re.search(r"\\[^.]", ere) and ere.startswith("^") and ere.endswith("$"), pattern
    return "^(" + ere[1:-1] + ")$", unlike


# what the models check in code, not in the schema, that the shell verifier can check as a pattern: a map's
# keys ("+": ProfileMetadata's env names, LaunchMetadata's mount names) and values (their length, the mount
# paths), the profiles' names; kept beside those validators by hand (the regexes of a smoke gate are not checked in sh)
def _in_code() -> dict[str, tuple[str, str]]:
    from .schema import ENV_KEY_RE, IMAGE_PATH_RE, NAME_RE

    return {'"profiles"/+': ("-", NAME_RE.pattern),
            '"profiles"/*/"env"/+': ("-", ENV_KEY_RE.pattern), '"profiles"/*/"env"/*': ("4096", ""),
            '"launch"/"mounts"/+': ("-", NAME_RE.pattern), '"launch"/"mounts"/*': ("-", IMAGE_PATH_RE.pattern)}


def shell_shape() -> str:
    """The schema's shape as ``scripts/verify-release.sh`` checks it (what POSIX sh and awk can check of
    it: each key's JSON types, whether it is required, an integer's bounds, a string's length, a list's
    items, the values it may take, a string's pattern). One line a key path, tab-separated: the path (each
    key in its JSON text, ``*`` each list item or map value, ``/`` between), its types (``object``,
    ``map``, ``array``, ``string``, ``integer``, ``boolean``, ``null``), ``1`` if required, the least
    and the most (``-`` for none), the values it may take (JSON texts, ``|`` between; ``-``: any), the
    pattern as a POSIX ERE (``grep -E``) and an ERE it must not match (for Python's look-ahead that
    refuses a ``.`` or ``..`` component; ``-``: none)."""
    schema = ReleaseManifest.model_json_schema(by_alias=True)
    definitions = schema.get("$defs", {})
    coded = _in_code()
    lines: list[str] = []

    def resolved(node: dict) -> dict:
        while "$ref" in node:
            node = {**definitions[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        return node

    def walk(path: str, node: dict, required: bool) -> None:
        alternatives = [resolved(a) for a in node.get("anyOf", [node])]
        types, least, most, values, below, pattern, unlike = [], "-", "-", "-", None, "-", "-"
        for alternative in alternatives:
            kind = alternative["type"]
            if kind == "object" and "properties" in alternative:
                types.append("object")
                below = ("object", alternative)
            elif kind == "object":
                types.append("map")
                below = ("map", alternative["additionalProperties"])
            elif kind == "array":
                types.append("array")
                below = ("array", alternative["items"])
                least = str(alternative.get("minItems", "-"))
                most = str(alternative.get("maxItems", "-"))
            else:
                types.append(kind)
                if kind == "integer":
                    least = str(alternative.get("minimum", "-"))
                    most = str(alternative.get("maximum", "-"))
                elif kind == "string":
                    least = str(alternative.get("minLength", "-"))
                    most = str(alternative.get("maxLength", "-"))
                    if "pattern" in alternative:
                        pattern, unlike = _posix_pattern(alternative["pattern"])
                if "const" in alternative or "enum" in alternative:
                    values = "|".join(json.dumps(v) for v in alternative.get("enum", [alternative.get("const")]))
        if path in coded:
            most = coded[path][0] if coded[path][0] != "-" else most
            pattern, unlike = _posix_pattern(coded[path][1]) if coded[path][1] else (pattern, unlike)
        if path:
            lines.append("\t".join((path, ",".join(types), "1" if required else "0", least, most, values, pattern,
                                    unlike)))
        if below is None:
            return
        kind, inner = below
        prefix = f"{path}/" if path else ""
        if kind == "map" and prefix + "+" in coded:  # its keys
            keys = _posix_pattern(coded[prefix + "+"][1])
            lines.append("\t".join((prefix + "+", "string", "0", "-", "-", "-", *keys)))
        if kind == "object":
            for key, child in inner["properties"].items():
                walk(prefix + json.dumps(key), child, key in inner.get("required", ()))
        else:
            walk(prefix + "*", inner, False)

    walk("", schema, True)
    assert all(any(line.startswith(path + "\t") for line in lines) for path in coded), coded
    text = "".join(line + "\n" for line in lines)
    assert "'" not in text  # the script holds it in single quotes
    return text


if __name__ == "__main__":
    sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
