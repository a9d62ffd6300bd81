"""An engine's image storage written in the tests, as Engine 20.10's overlay2 keeps it on disk: the config
under ``image/overlay2/imagedb``, each layer's record under ``image/overlay2/layerdb`` (its diffID, its
cache ID, its tar-split record) and its files under ``overlay2/<cache-id>/diff``.

The tar-split record is written as vbatts/tar-split's packer writes it (one JSON object a line, gzip): the
tar's bytes between the files' contents as raw segments (headers, PAX records, padding, the end blocks),
every entry as a file entry, by name, with its size when it has content. Python's ``tarfile`` finds the
offsets, an implementation independent of the reader under test (``unibake.layerstore``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from unibake.layerstore import chain_ids


def tar_split(layer: bytes) -> list[dict]:
    """The layer's tar-split entries, and (by their names) what each file holds."""
    entries: list[dict] = []
    done = 0

    def segment(data: bytes) -> None:
        if data:
            entries.append({"type": 2, "payload": base64.b64encode(data).decode(), "position": len(entries)})

    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:") as tar:
        for member in tar:
            segment(layer[done:member.offset_data])
            raw = member.name.encode("utf-8", "surrogateescape")
            entry: dict = {"type": 1, "payload": None, "position": len(entries)}
            try:
                entry["name"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                entry["name_raw"] = base64.b64encode(raw).decode()
            if member.isreg() and member.size:
                entry["size"] = member.size
                entry["payload"] = base64.b64encode(b"\0" * 8).decode()  # (its crc64: not read)
            entries.append(entry)
            done = member.offset_data + (member.size if member.isreg() else 0)
    segment(layer[done:])
    return entries


def write_store(root: Path, config: bytes, layers: list[bytes]) -> str:
    """The image (its config and layer tars) in an engine's storage at ``root``; returns its image ID."""
    images = root / "image" / "overlay2"
    image_id = hashlib.sha256(config).hexdigest()
    content = images / "imagedb" / "content" / "sha256"
    content.mkdir(parents=True, exist_ok=True)
    (content / image_id).write_bytes(config)
    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    for n, (layer, diff_id, chain) in enumerate(zip(layers, diff_ids, chain_ids(diff_ids))):
        cache_id = hashlib.sha256(f"cache {n} {chain}".encode()).hexdigest()
        record = images / "layerdb" / "sha256" / chain.removeprefix("sha256:")
        record.mkdir(parents=True, exist_ok=True)
        (record / "diff").write_text(diff_id)
        (record / "cache-id").write_text(cache_id)
        with gzip.open(record / "tar-split.json.gz", "wt") as fh:
            for entry in tar_split(layer):
                fh.write(json.dumps(entry, separators=(",", ":")) + "\n")
        files = root / "overlay2" / cache_id / "diff"
        files.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(layer), mode="r:") as tar:
            for member in tar:
                path = os.path.join(os.fsencode(files), member.name.encode("utf-8", "surrogateescape"))
                if member.isdir():
                    os.makedirs(path, exist_ok=True)
                elif member.isreg():
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as fh:
                        fh.write(tar.extractfile(member).read())
                elif member.issym():
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    os.symlink(member.linkname, path)
    return f"sha256:{image_id}"


def layer_files(root: Path, diff_ids: list[str], index: int) -> Path:
    """The files folder of the ``index``-th layer (of an image with ``diff_ids``) in the storage at ``root``."""
    chain = chain_ids(diff_ids)[index].removeprefix("sha256:")
    cache_id = (root / "image" / "overlay2" / "layerdb" / "sha256" / chain / "cache-id").read_text()
    return root / "overlay2" / cache_id / "diff"
