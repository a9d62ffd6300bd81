"""Small ``docker save`` archives built in the tests, in both layouts, byte for byte like an engine's."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import zstandard


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_of(entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    """A tar of (name, data or None for a folder, TarInfo fields) entries, as a build writes them:
    a build time and a builder's owner names unless the fields say otherwise."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data, fields in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname, info.uid, info.gid = 1234567, "builder", "staff", 1000, 1000
            for key, value in (fields or {}).items():
                setattr(info, key, value)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_for(layers: list[bytes], labels: dict[str, str] | None = None, architecture: str = "amd64") -> bytes:
    return json.dumps({
        "architecture": architecture, "os": "linux", "config": {"Env": ["PATH=/bin"], **({"Labels": labels} if labels else {})},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha(x)}" for x in layers]},
        "history": [{"created_by": "test"} for _ in layers],
    }, sort_keys=True).encode()


DEFAULT_LAYERS = [
    layer_tar({"bin/tool": b"\x7fELF" + b"\0" * 3000}),
    layer_tar({"opt/app/model.json": b'{"a": 1}\n' * 200}),
    layer_tar({"opt/app/tune/x.json": b"{}\n"}),
]


def _archive(entries: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """A tar of (name, data, symlink target) entries, in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs = set()
        for name, data, link in entries:
            parent = name.rsplit("/", 1)[0] if "/" in name else ""
            if parent and parent not in dirs:
                dirs.add(parent)
                info = tarfile.TarInfo(parent)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def docker_layout(layers: list[bytes] = DEFAULT_LAYERS, tag: str = "demo:1", *, duplicate_as_link: bool = False,
                  extra: list[tuple[str, bytes | None, str | None]] = (),
                  labels: dict[str, str] | None = None, architecture: str = "amd64") -> tuple[bytes, str, list[str]]:
    """Engine 20.10's layout: layer dirs first, the config, manifest.json and repositories last."""
    config = config_for(layers, labels, architecture)
    entries, names, seen = [], [], {}
    for i, layer in enumerate(layers):
        layer_id = sha(f"{i}".encode() + layer)
        name = f"{layer_id}/layer.tar"
        if duplicate_as_link and sha(layer) in seen:
            entries.append((name, None, f"../{seen[sha(layer)]}"))
        else:
            entries.append((name, layer, None))
            seen[sha(layer)] = name
        entries += [(f"{layer_id}/VERSION", b"1.0", None), (f"{layer_id}/json", b"{}", None)]
        names.append(name)
    entries.append((f"{sha(config)}.json", config, None))
    manifest = [{"Config": f"{sha(config)}.json", "RepoTags": [tag], "Layers": names}]
    entries.append(("manifest.json", json.dumps(manifest).encode(), None))
    entries.append(("repositories", json.dumps({tag.split(":")[0]: {tag.split(":")[1]: "x"}}).encode(), None))
    entries += list(extra)
    return _archive(entries), f"sha256:{sha(config)}", [f"sha256:{sha(x)}" for x in layers]


def oci_layout(layers: list[bytes] = DEFAULT_LAYERS, tag: str = "demo:1", *, gzip_layers: bool = False,
               with_docker_manifest: bool = True, zstd_layers: bool = False) -> tuple[bytes, str, list[str]]:
    """Engine 25+'s layout: blobs/sha256/<hex>, index.json, oci-layout, and a compatibility manifest.json
    (its layers stored as they are, gzip, or zstd as an Engine 25+ keeps a zstd pull)."""
    config = config_for(layers)
    stored = [gzip.compress(x, mtime=0) if gzip_layers else zstandard.ZstdCompressor().compress(x) if zstd_layers
              else x for x in layers]
    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "+zstd" if zstd_layers else "")
    oci_manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{sha(config)}",
                   "size": len(config)},
        "layers": [{"mediaType": media, "digest": f"sha256:{sha(x)}", "size": len(x)} for x in stored],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{sha(oci_manifest)}",
        "size": len(oci_manifest), "annotations": {"io.containerd.image.name": f"docker.io/library/{tag}"}}]}).encode()
    entries = [(f"blobs/sha256/{sha(x)}", x, None) for x in stored]
    entries += [(f"blobs/sha256/{sha(config)}", config, None), (f"blobs/sha256/{sha(oci_manifest)}", oci_manifest, None),
                ("index.json", index, None), ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}', None)]
    if with_docker_manifest:
        manifest = [{"Config": f"blobs/sha256/{sha(config)}", "RepoTags": [tag],
                     "Layers": [f"blobs/sha256/{sha(x)}" for x in stored]}]
        entries.append(("manifest.json", json.dumps(manifest).encode(), None))
    return _archive(entries), f"sha256:{sha(config)}", [f"sha256:{sha(x)}" for x in layers]
