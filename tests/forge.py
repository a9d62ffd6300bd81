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

from unibake.platforms import of_config

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
        try:  # the index names the new config's platform, as the writer takes it (a config no JSON reader takes: as it was)
            platform = of_config(json.loads(data))
        except (ValueError, RecursionError):
            pass
        else:
            index["manifests"][0].pop("platform", None)
            index["manifests"][0].update({"platform": platform} if platform else {})
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


def _entry_bytes(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512)


def smuggle(folder: Path) -> tuple[str, str]:
    """A hostile publisher's archive that holds two images: image A for a reader that cuts a header's
    number at its first NUL (Python's ``tarfile``), image B for one that trims NULs first (Go's
    archive/tar, the engine's; GNU tar). A is the release's image with two layers more: an empty one whose
    size field is NUL + "0000001000" + NUL (0 to the first reader, 512 to the second), then one whose
    bytes are B's config and a manifest.json naming it under the release's tag, and two zero blocks. The
    second reader takes the next header as the empty layer's content, reads B's members and stops at their
    zero blocks. Every checksum and name of the folder is made to agree with A. Returns (A's ID, B's ID)."""
    entries = read_entries(folder)
    data = {i.name: d for i, d in entries if d is not None}
    manifest = json.loads(data["manifest.json"])[0]
    config = json.loads(data[manifest["Config"]])
    evil = dict(config, config={**config.get("config", {}), "Entrypoint": ["/bin/sh", "-c", "echo PWNED"]})
    evil_data = compact(evil)
    evil_id = hashlib.sha256(evil_data).hexdigest()
    hidden = (_entry_bytes(f"blobs/sha256/{evil_id}", evil_data)
              + _entry_bytes("manifest.json", compact([dict(manifest, Config=f"blobs/sha256/{evil_id}")]))
              + bytes(1024))
    empty, carrier = hashlib.sha256(b"").hexdigest(), hashlib.sha256(hidden).hexdigest()
    checked = json.loads(json.dumps(config))
    checked["rootfs"]["diff_ids"] += [f"sha256:{empty}", f"sha256:{carrier}"]
    checked_data = compact(checked)
    checked_id = hashlib.sha256(checked_data).hexdigest()
    layers = manifest["Layers"] + [f"blobs/sha256/{empty}", f"blobs/sha256/{carrier}"]
    index = json.loads(data["index.json"])
    oci_name = "blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:")
    oci = json.loads(data[oci_name])
    oci["config"].update(digest=f"sha256:{checked_id}", size=len(checked_data))
    oci["layers"] += [{"mediaType": oci["layers"][-1]["mediaType"], "digest": f"sha256:{d}", "size": n}
                      for d, n in ((empty, 0), (carrier, len(hidden)))]
    oci_data = compact(oci)
    index["manifests"][0].update(digest=f"sha256:{hashlib.sha256(oci_data).hexdigest()}", size=len(oci_data))
    odd = bytearray(tarfile.TarInfo(f"blobs/sha256/{empty}").tobuf(format=tarfile.USTAR_FORMAT))
    odd[124:136] = b"\x000000001000\x00"
    odd[148:156] = b" " * 8
    odd[148:155] = b"%06o\0" % sum(odd)
    pieces = [info.tobuf(format=tarfile.PAX_FORMAT) for info, d in entries if d is None]  # the folders
    pieces += [_entry_bytes(name, data[name]) for name in manifest["Layers"]]
    pieces += [bytes(odd), _entry_bytes(f"blobs/sha256/{carrier}", hidden),
               _entry_bytes(f"blobs/sha256/{checked_id}", checked_data),
               _entry_bytes(f"blobs/sha256/{hashlib.sha256(oci_data).hexdigest()}", oci_data),
               _entry_bytes("index.json", compact(index)),
               _entry_bytes("manifest.json", compact([dict(manifest, Config=f"blobs/sha256/{checked_id}",
                                                           Layers=layers)])),
               _entry_bytes("oci-layout", data["oci-layout"]), bytes(1024)]

    def recorded(release: dict) -> None:
        release.update(image_id=f"sha256:{checked_id}", diff_ids=checked["rootfs"]["diff_ids"])

    forge(folder, stream=b"".join(pieces), manifest_change=recorded)
    (folder / "IMAGE_ID").write_text(f"sha256:{checked_id}\n")
    resum(folder)
    return f"sha256:{checked_id}", f"sha256:{evil_id}"
