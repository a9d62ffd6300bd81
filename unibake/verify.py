"""``build.py verify DIR``: what a downloader runs on a release folder.

One read of the archive does everything: each file's sha256 (against SHA256SUMS and the manifest),
the zstd frames' integrity (their checksums), the uncompressed stream's sha256, and the tar parsed
on the fly with every layer's diffID and the config digest recomputed against ``manifest.json``.
With ``--load`` the archive is then loaded into an engine and the image ID compared.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path


from .archive import ArchiveReader, ZstdDecodeError
from .engine import Engine
from .errors import InputError, VerificationError
from .publish import SUMS
from .savestream import ArchiveError, check_against, inspect_save_stream


@dataclass(kw_only=True)
class Check:
    name: str  # sha256 | size | zstd | structure | load
    target: str
    passed: bool
    detail: str = ""


@dataclass(kw_only=True)
class Report:
    folder: Path
    checks: list[Check] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)

    def add(self, name: str, target: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name=name, target=target, passed=passed, detail=detail))
        return passed

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def raise_if_failed(self) -> None:
        failed = self.failures
        if failed:
            first = failed[0]
            more = f" (and {len(failed) - 1} more failed checks)" if len(failed) > 1 else ""
            raise VerificationError(f"{first.target}: {first.name} check failed: {first.detail}{more}")


def read_sums(folder: Path) -> dict[str, str]:
    path = folder / SUMS
    if not path.is_file():
        raise VerificationError(f"{path}: missing; this is not a complete release folder")
    sums: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")
        if not sep or len(digest) != 64 or "/" in name or name in ("", ".", ".."):
            raise VerificationError(f"{path}:{n}: not a 'sha256  name' line")
        sums[name] = digest.lower()
    return sums


def check_sums(report: Report, sums: dict[str, str]) -> Report:
    """What ``sha256sum -c`` checks, for the files named in ``sums``, into ``report``."""
    for name in sorted(sums):
        path = report.folder / name
        if not path.is_file():
            report.add("sha256", name, False, "missing (listed in SHA256SUMS)")
            continue
        with open(path, "rb") as fh:
            ok = hashlib.file_digest(fh, "sha256").hexdigest() == sums[name]
        report.add("sha256", name, ok, "" if ok else "differs from SHA256SUMS")
    return report


def verify_folder(folder: Path) -> Report:
    """Sums, sizes, zstd integrity and structure of a release folder; never raises for a bad file."""
    report = Report(folder=folder)
    sums = read_sums(folder)
    if "manifest.json" not in sums or not (folder / "manifest.json").is_file():
        raise VerificationError(f"{folder}/manifest.json: missing; this is not a complete release folder")
    manifest_bytes = (folder / "manifest.json").read_bytes()
    manifest_ok = hashlib.sha256(manifest_bytes).hexdigest() == sums["manifest.json"]
    if not report.add("sha256", "manifest.json", manifest_ok, "" if manifest_ok else "differs from SHA256SUMS"):
        raise VerificationError("manifest.json: sha256 differs from SHA256SUMS; the folder cannot be trusted")
    try:
        manifest = json.loads(manifest_bytes)
        archive = manifest["archive"]
        parts = [f["name"] for f in archive["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise VerificationError(f"{folder}/manifest.json: not a unibake release manifest ({exc})") from None
    report.manifest = manifest

    check_sums(report, {n: d for n, d in sums.items() if n not in parts and n != "manifest.json"})

    readable = True
    for f in archive["files"]:
        name, path = f["name"], folder / f["name"]
        if name not in sums:
            report.add("sha256", name, False, "not listed in SHA256SUMS")
        if not path.is_file():
            report.add("size", name, False, "missing" + (" part" if len(parts) > 1 else "") + " (listed in manifest.json)")
            readable = False
            continue
        size = path.stat().st_size
        if size < f["bytes"]:
            report.add("size", name, False, f"truncated: {size} of {f['bytes']} bytes")
        elif size > f["bytes"]:
            report.add("size", name, False, f"{size} bytes, {size - f['bytes']} more than the {f['bytes']} recorded")
        else:
            report.add("size", name, True, f"{size} bytes")
    if not readable:
        report.add("structure", archive["name"], False, "not checked: a file of the archive is missing")
        return report

    reader = ArchiveReader(folder, parts)
    zstd_ok, structure = True, ""
    try:
        hotfix = manifest.get("hotfix") or {}
        saved = inspect_save_stream(reader.chunks(), frozenset(hotfix.get("omitted_diff_ids") or ()))
        check_against(saved, image_id=manifest["image_id"], diff_ids=manifest["diff_ids"], what="manifest.json")
    except ZstdDecodeError as exc:
        zstd_ok, structure = False, str(exc)
    except ArchiveError as exc:
        structure = str(exc)
    finally:
        reader.finish()
    if not structure and reader.decoded.hexdigest() != archive.get("uncompressed_sha256"):
        structure = "the uncompressed stream's sha256 differs from manifest.json"
    digests = reader.file_sha256()
    for name in parts:
        if name in sums:
            ok = digests[name] == sums[name]
            report.add("sha256", name, ok, "" if ok else "differs from SHA256SUMS")
    whole = reader.whole.hexdigest()
    if whole != archive.get("sha256", whole):
        report.add("sha256", archive["name"] + (" (all parts)" if len(parts) > 1 else ""), False,
                   "differs from manifest.json")
    report.add("zstd", archive["name"], zstd_ok, "frames and their checksums" if zstd_ok else structure)
    if zstd_ok:
        report.add("structure", archive["name"], not structure, structure or
                   f"config {manifest['image_id'][:19]}... and {len(manifest['diff_ids'])} diffIDs recomputed")
    return report


def load_and_compare(report: Report, engine: Engine) -> None:
    """Load the verified archive into ``engine`` and compare the image ID with the manifest's."""
    from .archive import read_archive

    manifest = report.manifest
    image_id = manifest["image_id"]
    hotfix = manifest.get("hotfix")
    if hotfix and engine.inspect_image(hotfix["base_image_id"]) is None:
        report.add("load", manifest["tag"], False, f"this hotfix needs image {hotfix['base_image_id']} "
                   f"({hotfix['base_tag']}) in the engine; load release {hotfix['base_release']} first "
                   "(nothing was loaded)")
        return
    if engine.inspect_image(image_id) is not None:
        report.add("load", manifest["tag"], True, f"the engine already has {image_id}; not loaded again")
        return
    outcome = engine.load(read_archive(report.folder, [f["name"] for f in manifest["archive"]["files"]]))
    loaded = engine.inspect_image(manifest["tag"])
    ok = loaded is not None and loaded.id == image_id
    report.add("load", manifest["tag"], ok, f"loaded as {image_id}" if ok else
               f"the engine loaded {loaded.id if loaded else 'nothing under that tag'} ({'; '.join(outcome.messages)})")


def check_folder_arg(path: Path) -> Path:
    if not path.is_dir():
        raise InputError(f"{path}: not a folder (give the release folder, e.g. release/1.3.1)")
    return path
