"""``build.py repro``: build twice from cold and compare, layer by layer and file by file.

Two builds without the engine's cache, each normalised; then the image IDs, every diffID and the
sha256 of the release archive each would ship are compared. When a layer differs, both copies of
it are listed entry by entry (content digest, mode, owner, time, size, link) and the entries that
differ are named, like diffoci does.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass

from .archive import ChunkReader
from .engine import Engine
from .savestream import CHUNK, interpret, read_members

Entry = tuple  # (type, mode, uid, gid, mtime, size, sha256, linkname)


@dataclass(frozen=True, kw_only=True)
class LayerDiff:
    index: int
    diff_ids: tuple[str, str]
    entries: tuple[tuple[str, str], ...]  # (path, what differs)


def layer_member(engine: Engine, image: str, index: int) -> str:
    """The save stream's member that holds layer ``index`` of ``image``."""
    saved = interpret(read_members(engine.save(image)))
    return saved.layer_members[index].name


def list_layer(engine: Engine, image: str, member: str) -> dict[str, Entry]:
    """Every entry of one layer of ``image``, with the digest of its content."""
    listing: dict[str, Entry] = {}
    with tarfile.open(fileobj=ChunkReader(engine.save(image)), mode="r|", bufsize=CHUNK) as outer:
        for info in outer:
            if info.name.removeprefix("./") != member or not info.isreg():
                continue
            with tarfile.open(fileobj=outer.extractfile(info), mode="r|") as layer:
                for entry in layer:
                    digest = ""
                    if entry.isreg():
                        h = hashlib.sha256()
                        stream = layer.extractfile(entry)
                        for block in iter(lambda: stream.read(CHUNK), b""):
                            h.update(block)
                        digest = h.hexdigest()
                    listing[entry.name] = (entry.type.decode(), oct(entry.mode), entry.uid, entry.gid,
                                           int(entry.mtime), entry.size, digest, entry.linkname)
            break
    return listing


FIELDS = ("type", "mode", "uid", "gid", "mtime", "size", "content", "link")


def compare_listings(a: dict[str, Entry], b: dict[str, Entry]) -> list[tuple[str, str]]:
    out = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            out.append((path, "only in the second build"))
        elif path not in b:
            out.append((path, "only in the first build"))
        elif a[path] != b[path]:
            what = [f"{f} {x!r} -> {y!r}" for f, x, y in zip(FIELDS, a[path], b[path]) if x != y]
            out.append((path, ", ".join(what)))
    return out


def diff_layer(engine: Engine, first: str, second: str, index: int, diff_ids: tuple[str, str]) -> LayerDiff:
    a = list_layer(engine, first, layer_member(engine, first, index))
    b = list_layer(engine, second, layer_member(engine, second, index))
    return LayerDiff(index=index, diff_ids=diff_ids, entries=tuple(compare_listings(a, b)))
