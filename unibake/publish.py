"""Stage 7: the release folder: manifest, notes, validation, run.sh, sums; nothing half-written.

Everything is written into ``<out>/.<tag>.partial/`` under temporary names, each file renamed
when complete and fsynced, ``SHA256SUMS`` last; the folder then takes its final name in one
rename. A lock (``<out>/.<tag>.lock``) refuses a second run on the same tag; a finished release is
replaced only with ``--force``; what an interrupted run left is removed by the next one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2

from .archive import Archive
from .errors import InputError, UnibakeError
from .roundtrip import RoundTrip
from .smoke import GateResult

TEMPLATES = Path(__file__).resolve().parent.parent / "release" / "templates"
SUMS = "SHA256SUMS"
TAG_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True, kw_only=True)
class Validation:
    round_trip: RoundTrip | None
    round_trip_skipped: str  # why, when round_trip is None
    gates: tuple[GateResult, ...]
    gates_skipped: str  # why, when there are no gates

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    def as_json(self) -> dict:
        rt = self.round_trip
        return {
            "round_trip": None if rt is None else {
                "engine": rt.engine, "engine_version": rt.engine_version, "image_id": rt.image_id,
                "diff_ids": list(rt.diff_ids), "tags": list(rt.tags), "seconds": round(rt.seconds, 3),
                "passed": True},
            "round_trip_skipped": self.round_trip_skipped or None,
            "smoke": [{"profile": g.profile, "passed": g.passed,
                       "steps": [{"name": s.name, "passed": s.passed, "seconds": round(s.seconds, 3),
                                  "detail": s.detail} for s in g.steps]} for g in self.gates],
            "smoke_skipped": self.gates_skipped or None,
            "passed": self.passed,
        }


def release_tag(image_ref: str) -> str:
    tag = image_ref.rsplit(":", 1)[1] if ":" in image_ref.rsplit("/", 1)[-1] else "latest"
    return tag


def check_tag(tag: str) -> str:
    if not tag or not set(tag) <= TAG_CHARS or tag.startswith((".", "-")) or len(tag) > 128:
        raise InputError(f"release tag {tag!r} is not valid: letters, digits, '.', '_' and '-', not starting "
                         "with '.' or '-'")
    return tag


class ReleaseFolder:
    """``<out>/<tag>/``, staged and locked; a context manager that never leaves a half release."""

    def __init__(self, out: Path, tag: str, *, force: bool):
        self.out, self.tag, self.force = out, check_tag(tag), force
        self.final = out / tag
        self.staging = out / f".{tag}.partial"
        self._lock = None

    def __enter__(self) -> "ReleaseFolder":
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            lock = open(self.out / f".{self.tag}.lock", "a+")
        except OSError as exc:
            raise UnibakeError(f"cannot use the release folder {self.out}: {exc.strerror}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise UnibakeError(f"another run is writing release {self.final} (pid {holder}); wait for it or "
                               "choose another version") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock = lock
        if self.final.exists() and not self.force:
            self._unlock()
            raise InputError(f"release {self.final} already exists; use --force to replace it, or a new --version")
        for leftover in (self.staging, self.out / f".{self.tag}.old"):
            shutil.rmtree(leftover, ignore_errors=True)
        self.staging.mkdir()
        return self

    def commit(self) -> Path:
        old = self.out / f".{self.tag}.old"
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.staging, self.final)
        _fsync_dir(self.out)
        shutil.rmtree(old, ignore_errors=True)
        return self.final

    def _unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._unlock()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(folder: Path, name: str, text: str, *, mode: int = 0o644) -> str:
    """Write ``folder/name`` via a temporary name, fsynced; returns its sha256."""
    data = text.encode("utf-8")
    temp = folder / f".{name}.tmp"
    with open(temp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(temp, mode)
    os.replace(temp, folder / name)
    return hashlib.sha256(data).hexdigest()


def find_releases(out: Path) -> list[dict]:
    """Every published release under ``out`` (folders with a manifest.json), oldest first."""
    found = []
    if not out.is_dir():
        return found
    for folder in sorted(out.iterdir()):
        manifest = folder / "manifest.json"
        if folder.name.startswith(".") or not manifest.is_file():
            continue
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        data["_folder"] = folder
        found.append(data)
    return sorted(found, key=lambda m: str(m.get("published", "")))


def previous_release(out: Path, product: str, tag: str) -> dict | None:
    candidates = [m for m in find_releases(out) if m.get("product") == product and m.get("release") != tag]
    return candidates[-1] if candidates else None


def changes(previous: dict | None, manifest: dict) -> list[dict]:
    """Components that differ from the previous release: added, removed or changed."""
    if previous is None:
        return []

    def key(c):
        return (c["kind"], c.get("profile", ""), c["name"])

    before = {key(c): c for c in previous.get("components", [])}
    after = {key(c): c for c in manifest["components"]}
    out = []
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b and a and (b["version"], b["digest"]) == (a["version"], a["digest"]):
            continue
        out.append({"kind": k[0], "profile": k[1], "name": k[2],
                    "before": f"{b['version']} {b['digest'][:12]}".strip() if b else "",
                    "after": f"{a['version']} {a['digest'][:12]}".strip() if a else ""})
    return out


def build_manifest(*, product: str, tag: str, image_ref: str, archive: Archive, metadata: dict | None,
                   labels: dict[str, str], previous: dict | None, hotfix: dict | None = None,
                   image_size: int = 0) -> dict:
    meta = metadata or {}
    profiles = meta.get("profiles") or {}
    manifest = {
        "schema": 1,
        "product": product,
        "release": tag,
        "version": labels.get("org.opencontainers.image.version", tag),
        "tag": image_ref,
        "image_id": archive.image.image_id,
        "image_size": image_size,
        "diff_ids": list(archive.image.diff_ids),
        "save_layout": archive.image.layout,
        "profiles": sorted(profiles),
        "default_profile": meta.get("default_profile"),
        "profile_details": {name: {"gpus": p.get("gpus"), "vendor": p.get("vendor"), "kernels": p.get("kernels", []),
                                   "sidecars": p.get("sidecars", []), "tune_caches": p.get("tune_caches", 0),
                                   "args": p.get("args", []), "expect_reply": (p.get("smoke") or {}).get("expect_reply")}
                            for name, p in sorted(profiles.items())},
        "launch": meta.get("launch") or {},
        "archive": {
            "name": archive.name,
            "files": [{"name": f.name, "bytes": f.bytes, "sha256": f.sha256} for f in archive.files],
            "bytes": archive.compressed_bytes,
            "sha256": archive.compressed_sha256,
            "uncompressed_bytes": archive.uncompressed_bytes,
            "uncompressed_sha256": archive.uncompressed_sha256,
            "compression": {"algorithm": "zstd", "level": archive.level, "long_distance": archive.long_distance},
        },
        "components": [dict(c) for c in meta.get("components", [])],
        "labels": dict(sorted(labels.items())),
        "revision": labels.get("org.opencontainers.image.revision", ""),
        "created": labels.get("org.opencontainers.image.created", ""),
        "source_date_epoch": labels.get("io.unibake.source-date-epoch"),
        "published": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "previous": previous.get("release") if previous else None,
        "hotfix": None,
    }
    if hotfix is not None:
        manifest["hotfix"] = {
            "base_release": hotfix["release"], "base_tag": hotfix["tag"], "base_image_id": hotfix["image_id"],
            "base_archive_bytes": hotfix["archive"]["bytes"],
            "omitted_diff_ids": list(archive.omitted), "shipped_diff_ids": list(archive.shipped),
        }
    return manifest


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["gib"] = lambda n: f"{n / 2**30:.2f} GiB"
    env.filters["sh"] = __import__("shlex").quote
    return env


def render_files(manifest: dict, validation: Validation, previous: dict | None) -> dict[str, str]:
    """The text files of a release folder, by name (the archive and SHA256SUMS aside)."""
    env = _templates()
    values = dict(m=manifest, v=validation.as_json(), previous=previous, changes=changes(previous, manifest))
    files = {
        "manifest.json": json.dumps(manifest, indent=2) + "\n",
        "VALIDATION.json": json.dumps(validation.as_json(), indent=2) + "\n",
        "RELEASE_NOTES.md": env.get_template("RELEASE_NOTES.md.j2").render(**values),
        "IMAGE_ID": manifest["image_id"] + "\n",
    }
    if manifest["profiles"]:  # an image built elsewhere has no profiles to start
        files["run.sh"] = env.get_template("run.sh.j2").render(**values)
    if manifest["hotfix"]:
        files["apply.sh"] = env.get_template("apply.sh.j2").render(**values)
    files["README-DIST.md"] = env.get_template("README-DIST.md.j2").render(**values)
    return files


def publish(folder: ReleaseFolder, archive: Archive, files: dict[str, str], checksums_dir: Path) -> Path:
    """Write the text files, then SHA256SUMS (last), then give the folder its final name."""
    sums = {f.name: f.sha256 for f in archive.files}
    for name, text in files.items():
        sums[name] = write_atomic(folder.staging, name, text, mode=0o755 if name.endswith(".sh") else 0o644)
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items()))
    write_atomic(folder.staging, SUMS, listing)
    _fsync_dir(folder.staging)
    final = folder.commit()
    checksums_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(checksums_dir, f"{folder.tag}.{SUMS}", listing)
    return final
