"""What an attacker who controls a downloaded release folder can do: rewrite the archive's tar and
then make every checksum and size in the folder agree with it, so only the verifier's own rules
stand between the forged archive and a load."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import zstandard

Entry = tuple[tarfile.TarInfo, bytes | None]


def read_entries(folder: Path) -> list[Entry]:
    manifest = json.loads((folder / "manifest.json").read_text())
    raw = b"".join((folder / f["name"]).read_bytes() for f in manifest["archive"]["files"])
    data = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar.getmembers():
            out.append((info, tar.extractfile(info).read() if info.isfile() else None))
    return out


def write_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
        end = tar.offset
    # ended as unibake's writer ends it (two zero blocks, no padding to a 10 KiB record): a forger
    # matches the canonical form wherever only the verifier's own rules can tell the difference
    return buf.getvalue()[:end] + bytes(1024)


def member(name: str, data: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info, data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def forge(folder: Path, change: Callable[[list[Entry]], list[Entry]] | None = None, *, stream: bytes | None = None,
          compressed: tuple[bytes, int, str] | None = None, manifest_change: Callable[[dict], None] | None = None) -> None:
    """Rewrite the archive (its tar changed by ``change``, or replaced by ``stream``, or by
    ``compressed``: the zstd bytes with the size and sha256 of what they decode to), then the
    manifest's sizes and digests and SHA256SUMS to match."""
    manifest = json.loads((folder / "manifest.json").read_text())
    if compressed is not None:
        compressed, size, sha = compressed
    else:
        tar = stream if stream is not None else write_tar(change(read_entries(folder)))
        compressed = zstandard.ZstdCompressor(write_checksum=True).compress(tar)
        size, sha = len(tar), hashlib.sha256(tar).hexdigest()
    for f in manifest["archive"]["files"]:
        (folder / f["name"]).unlink()
    name = manifest["archive"]["name"]
    (folder / name).write_bytes(compressed)
    digest = hashlib.sha256(compressed).hexdigest()
    manifest["archive"].update(files=[{"name": name, "bytes": len(compressed), "sha256": digest}],
                               bytes=len(compressed), sha256=digest, uncompressed_bytes=size, uncompressed_sha256=sha)
    if manifest_change:
        manifest_change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


def resum(folder: Path) -> None:
    """SHA256SUMS rewritten over every file of the folder, as a forger would."""
    lines = []
    for path in sorted(folder.iterdir()):
        if path.name != "SHA256SUMS" and path.is_file() and not path.is_symlink():
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    (folder / "SHA256SUMS").write_text("".join(lines))


def json_member(entries: list[Entry], name: str) -> object:
    return json.loads(next(d for i, d in entries if i.name == name))


def replace_member(entries: list[Entry], name: str, data: bytes) -> list[Entry]:
    return [member(name, data) if i.name == name else (i, d) for i, d in entries]


def also_tagging_the_victim(entries: list[Entry]) -> list[Entry]:
    """The archive's manifest.json with a second tag, ``victim:1``: a load would move that tag."""
    manifest = json_member(entries, "manifest.json")
    manifest[0]["RepoTags"].append("victim:1")
    return replace_member(entries, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def replace_config(folder: Path, make: Callable[[dict], bytes]) -> str:
    """The image config replaced by ``make(config)`` and every name of it made to agree (the archive's
    manifest.json, its image manifest and index.json, the release's manifest.json and IMAGE_ID), as a
    forger would; returns the new image ID."""
    old = (folder / "IMAGE_ID").read_text().strip().removeprefix("sha256:")
    made = {}

    def change(entries: list[Entry]) -> list[Entry]:
        data = make(json_member(entries, f"blobs/sha256/{old}"))
        new = made["id"] = hashlib.sha256(data).hexdigest()
        entries = [(i, d) for i, d in entries if i.name != f"blobs/sha256/{old}"] + [member(f"blobs/sha256/{new}", data)]
        manifest = json_member(entries, "manifest.json")
        manifest[0]["Config"] = f"blobs/sha256/{new}"
        entries = replace_member(entries, "manifest.json", compact(manifest))
        index = json_member(entries, "index.json")
        old_oci = index["manifests"][0]["digest"].removeprefix("sha256:")
        oci = json_member(entries, f"blobs/sha256/{old_oci}")
        oci["config"].update(digest=f"sha256:{new}", size=len(data))
        oci_data = compact(oci)
        new_oci = hashlib.sha256(oci_data).hexdigest()
        index["manifests"][0].update(digest=f"sha256:{new_oci}", size=len(oci_data))
        entries = [(i, d) for i, d in entries if i.name != f"blobs/sha256/{old_oci}"]
        return replace_member(entries + [member(f"blobs/sha256/{new_oci}", oci_data)], "index.json", compact(index))

    forge(folder, change, manifest_change=lambda manifest: manifest.update(image_id=f"sha256:{made['id']}"))
    (folder / "IMAGE_ID").write_text(f"sha256:{made['id']}\n")
    resum(folder)
    return f"sha256:{made['id']}"


def cut_archive(folder: Path, name: str, drop: int) -> None:
    """The archive file ``name`` (the only one) cut by ``drop`` bytes, its record in manifest.json and
    SHA256SUMS made to agree: only the stream itself tells it is cut."""
    archive = folder / name
    archive.write_bytes(archive.read_bytes()[:-drop])
    manifest = json.loads((folder / "manifest.json").read_text())
    cut = {"bytes": archive.stat().st_size, "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}
    manifest["archive"].update(cut)
    manifest["archive"]["files"][0].update(cut)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
