"""The release stages in order, shared by ``build.py`` (after a build) and ``build.py archive IMAGE``:

  archive    one pass: save -> zstd -> file(s), sha256 of both streams, diffIDs and config recomputed
  round trip load into an engine that never saw the image; same image ID and diffIDs
  smoke      every profile's gate on the loaded image
  publish    manifest, notes, validation, run.sh, IMAGE_ID, SHA256SUMS last; the folder renamed in place
"""

from __future__ import annotations

import re
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .archive import DEFAULT_LEVEL, Archive, DiskFull, write_archive
from .docker_engine import DockerEngine
from .engine import Engine
from .errors import InputError, VerificationError
from .log import Reporter
from .publish import ReleaseFolder, Validation, build_manifest, previous_release, publish, render_files
from .roundtrip import ReadBack, ScratchEngine, read_back, round_trip
from .sanitise import enforce, scan_release_texts
from .savestream import check_against
from .smoke import GateResult, image_metadata, run_gates

SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB|K|M|G)?$", re.IGNORECASE)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10, "m": 2**20, "g": 2**30,
         "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """``1900MiB``, ``2GiB``, ``500MB`` or a number of bytes."""
    match = SIZE_RE.match(text.strip())
    if not match:
        raise InputError(f"--split {text!r} is not a size like 1900MiB, 2GiB or 500MB")
    size = int(float(match.group(1)) * UNITS[(match.group(2) or "b").lower()])
    if size < 1 << 20:
        raise InputError(f"--split {text!r} is below 1 MiB")
    return size


@dataclass(frozen=True, kw_only=True)
class ReleaseOptions:
    out: Path
    force: bool = False
    level: int = DEFAULT_LEVEL
    long_distance: bool = False
    split: int | None = None
    roundtrip: bool = True
    verify_engine: str | None = None
    scratch_dir: Path | None = None
    allow: tuple[str, ...] = ()  # sanitisation: values let through
    identity: tuple[str, ...] = ()  # sanitisation: the builder's home and user name

    @property
    def checksums(self) -> Path:
        return self.out.parent / "checksums"


@dataclass(frozen=True, kw_only=True)
class Release:
    folder: Path
    archive: Archive
    validation: Validation
    manifest: dict


def _gate_line(reporter: Reporter, result: GateResult) -> None:
    steps = ", ".join(f"{s.name} {s.seconds:.2f} s{'' if s.passed else ' FAILED'}" for s in result.steps)
    reporter.info(f"    {result.profile}: {'passed' if result.passed else 'FAILED'} ({steps})")


def validate(archive: Archive, image_ref: str, metadata: dict | None, options: ReleaseOptions,
             reporter: Reporter, base: tuple[Path, list[str]] | None = None) -> tuple[Validation, ReadBack]:
    """Read the archive back (in the round trip's load when there is one), then every profile's smoke gate."""
    omitted = frozenset(archive.omitted)
    if not options.roundtrip:
        reporter.skipped("round trip", "--no-roundtrip")
        with reporter.stage("read back", "decompress, hash and check the archive written"):
            back = read_back(archive, omitted=omitted)
        return Validation(round_trip=None, round_trip_skipped="skipped with --no-roundtrip", gates=(),
                          gates_skipped="they run on the loaded image, and the round trip was skipped"), back
    with ExitStack() as stack:
        netns_pid = None
        if options.verify_engine:
            engine: Engine = DockerEngine(options.verify_engine)
            where = options.verify_engine
        else:
            with reporter.stage("scratch engine", "a dockerd in its own network namespace"):
                scratch = stack.enter_context(ScratchEngine(options.scratch_dir, on_line=reporter.info))
            engine, netns_pid, where = scratch.engine, scratch.pid, f"scratch dockerd {scratch.folder}"
        with reporter.stage("round trip", where + (" (the previous release first)" if base else "")):
            trip, back = round_trip(archive, engine, base=base)
        if options.verify_engine:
            stack.callback(engine.remove_image, archive.image.image_id)
        if metadata is None:
            reporter.skipped("smoke gates", "the image carries no unibake profiles")
            return Validation(round_trip=trip, round_trip_skipped="", gates=(),
                              gates_skipped="the image carries no unibake profiles"), back
        with reporter.stage("smoke gates", ", ".join(sorted(metadata.get("profiles") or {}))):
            gates = run_gates(engine, image_ref, metadata, netns_pid=netns_pid,
                              on_result=lambda r: _gate_line(reporter, r))
        return Validation(round_trip=trip, round_trip_skipped="", gates=tuple(gates), gates_skipped=""), back


def release_image(engine: Engine, image_ref: str, *, product: str, folder: ReleaseFolder, options: ReleaseOptions,
                  reporter: Reporter, hotfix: dict | None = None) -> Release:
    """Archive, round-trip, gate and publish ``image_ref`` into ``folder`` (entered by the caller).

    ``hotfix``: the manifest of the release this one builds on; the archive then leaves out the
    layers that release already shipped, and the round trip loads that release first.
    """
    info = engine.inspect_image(image_ref)
    if info is None:
        raise InputError(f"the engine at {engine.address} has no image {image_ref}")
    metadata = image_metadata(engine, image_ref)
    previous = hotfix or previous_release(options.out, product, folder.tag)
    omit, base = (), None
    if hotfix is not None:
        omit = hotfix_omits(hotfix["diff_ids"], info.diff_ids)
        if options.roundtrip:
            base = (hotfix["_folder"], [f["name"] for f in hotfix["archive"]["files"]])
            missing = [n for n in base[1] if not (base[0] / n).is_file()]
            if missing:
                raise InputError(f"the round trip of a hotfix loads release {hotfix['release']} first, but "
                                 f"{base[0] / missing[0]} is missing; restore it or use --no-roundtrip")
    name = f"{product}-{folder.tag}.tar.zst"
    with reporter.stage("archive", f"{image_ref} -> {name}"):
        with reporter.progress("archive", info.size) as advance:
            try:
                archive = write_archive(engine.save(image_ref), folder.staging, name, tag=image_ref,
                                        level=options.level, long_distance=options.long_distance,
                                        split=options.split, omit=omit, progress=advance)
            except DiskFull as exc:
                free = shutil.disk_usage(options.out).free
                raise DiskFull(f"{exc}: the release folder {options.out} has {free} bytes free; the image is "
                               f"{info.size} bytes uncompressed and its archive needs up to twice its compressed "
                               "size while it is written; free space or choose another --out (the partial files "
                               "were removed)") from None
        check_against(archive.image, image_id=info.id, diff_ids=info.diff_ids, what=f"the engine's {image_ref}")
        shipped = f"{len(archive.shipped)} of {len(archive.image.diff_ids)} layers shipped, " if omit else ""
        reporter.info(f"    {archive.compressed_bytes} bytes compressed in {archive.seconds:.1f} s; {shipped}config "
                      f"and {len(archive.image.diff_ids)} diffIDs recomputed and matched")
    validation, back = validate(archive, image_ref, metadata, options, reporter, base)
    archive = archive.with_digests(back)
    failed = [g for g in validation.gates if not g.passed]
    if failed:
        step = failed[0].failed
        raise VerificationError(f"smoke gate failed for profile {failed[0].profile} at step {step.name}: "
                                f"{step.detail}; nothing was published")
    manifest = build_manifest(product=product, tag=folder.tag, image_ref=image_ref, archive=archive,
                              metadata=metadata, labels=info.labels, previous=previous, hotfix=hotfix,
                              image_size=info.size)
    files = render_files(manifest, validation, previous)
    with reporter.stage("sanitise", "the release's text files"):
        enforce(scan_release_texts(files, options.identity), options.allow, f"release {folder.tag}")
    with reporter.stage("publish", str(folder.final)):
        final = publish(folder, archive, files, options.checksums)
    return Release(folder=final, archive=archive, validation=validation, manifest=manifest)


def hotfix_omits(base_diff_ids: list[str], diff_ids: tuple[str, ...]) -> tuple[str, ...]:
    """The layers a hotfix leaves out: the longest run, from the bottom, shared with the base release.

    An engine reuses a layer it has only when everything below it is the same too (its chain ID),
    so a layer above the first changed one ships again even when its content did not change.
    """
    shared = 0
    for mine, theirs in zip(diff_ids, base_diff_ids):
        if mine != theirs:
            break
        shared += 1
    return tuple(diff_ids[:shared])


def summary_rows(release: Release) -> list[tuple[str, str]]:
    a = release.archive
    rows = [("release", str(release.folder)),
            ("archive", ", ".join(f.name for f in a.files)),
            ("size", f"{a.compressed_bytes / 2**30:.2f} GiB ({a.compressed_bytes} bytes), "
                     f"ratio {a.ratio:.2f} of {a.uncompressed_bytes} bytes"),
            ("SHA256", a.compressed_sha256),
            ("image ID", a.image.image_id)]
    v = release.validation
    rows.append(("round trip", "passed" if v.round_trip else f"not run ({v.round_trip_skipped})"))
    rows.append(("smoke gates", ", ".join(f"{g.profile} {'passed' if g.passed else 'FAILED'}" for g in v.gates)
                 or f"not run ({v.gates_skipped})"))
    return rows
