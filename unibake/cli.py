"""The command line: ``python build.py ...``. The only place that catches errors and exits.

Exit codes: 0 success; 2 bad input; 3 verification failed; 1 anything else.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import threading
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from contextlib import ExitStack

from .archive import DEFAULT_LEVEL
from .errors import BuildFailed, CheckFailed, InputError, UnibakeError
from .inputs import LOCK_FILE, read_lock, render_lock
from .log import Reporter
from .plan import display_path, make_plan
from .publish import ReleaseFolder, check_tag, release_tag
from .schema import NAME_RE
from .release import ReleaseOptions, parse_size, release_image, summary_rows

COMMANDS = ("lock", "archive", "verify", "releases", "hotfix", "repro")
STAGES = ("render", "build", "release")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one "error:" line and exit 2, like every other bad input
        raise InputError(f"{message} (see: python build.py --help)")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py", description="Build, check and release a unified inference image from "
                "declarative profile YAMLs. Other commands: 'lock' (rewrite profiles/inputs.lock), "
                "'archive IMAGE' (release an image the engine already has), 'verify DIR' (check a release "
                "folder), 'releases' (list them), 'hotfix --from TAG' (a delta release), 'repro' (two cold "
                "builds compared); see 'build.py COMMAND --help'.")
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="profile to include; repeat for several; 'all' (default) is the unified image")
    p.add_argument("--version", help="release version (default: product.yaml's)")
    p.add_argument("--stage", choices=STAGES, default="release",
                   help="stop after this stage (default: release, the whole pipeline)")
    _project_options(p, cache=True)
    _release_options(p, out_help="release folder parent (default: release/ next to the profiles folder)")
    return p


def _project_options(p: argparse.ArgumentParser, *, cache: bool) -> None:
    """The options of every command that builds from a profiles folder."""
    p.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")
    p.add_argument("--engine", metavar="URL", help="Docker engine address (default: DOCKER_HOST or the local socket)")
    if cache:
        p.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")


def _release_options(p: argparse.ArgumentParser, *, out_help: str) -> None:
    p.add_argument("--out", metavar="DIR", help=out_help)
    p.add_argument("--force", action="store_true", help="replace a finished release of the same tag")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL, help=f"zstd level (default {DEFAULT_LEVEL})")
    p.add_argument("--long", action="store_true", help="zstd long-distance matching (window 128 MiB)")
    p.add_argument("--split", metavar="SIZE", help="write the archive in parts of SIZE (e.g. 1900MiB)")
    p.add_argument("--no-roundtrip", action="store_true",
                   help="skip the load into a fresh engine and the smoke gates (the notes say so)")
    p.add_argument("--verify-engine", metavar="URL",
                   help="load into this engine (it must not have the image) instead of a scratch dockerd")
    p.add_argument("--scratch-dir", metavar="DIR", help="where the scratch engine keeps its data (default: $TMPDIR)")
    p.add_argument("--allow", action="append", default=[], metavar="REGEX",
                   help="let the sanitisation gate pass values matching REGEX (besides product.yaml's sanitise.allow)")
    p.add_argument("--quiet", action="store_true", help="print only errors and the summary")


def _archive_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py archive", description="Release an image that already exists in the engine: "
                "archive, round trip, smoke gates (for images built by unibake) and publish.")
    p.add_argument("image", metavar="IMAGE", help="image reference, e.g. demo-llm:1.3.1")
    p.add_argument("--tag", help="release tag (default: the image's tag)")
    p.add_argument("--product", help="product name for the archive file (default: the image's repository)")
    p.add_argument("--engine", metavar="URL", help="Docker engine address (default: DOCKER_HOST or the local socket)")
    _release_options(p, out_help="release folder parent (default: ./release)")
    return p


def _verify_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py verify", description="Check a release folder as a downloader would: SHA256SUMS, "
                "sizes, zstd integrity and the archive's structure against manifest.json; with --load, load "
                "it into the engine and compare the image ID. Exit 0 when everything passes, 3 otherwise.")
    p.add_argument("folder", metavar="DIR", help="the release folder, e.g. release/1.3.1")
    p.add_argument("--load", action="store_true", help="also load the archive and compare the image ID")
    p.add_argument("--engine", metavar="URL", help="Docker engine for --load (default: DOCKER_HOST or the local socket)")
    return p


def _releases_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py releases", description="The releases under a release folder, and whether each "
                "still verifies (SHA256SUMS and sizes; --deep adds zstd and structure).")
    p.add_argument("--out", default="release", metavar="DIR", help="the folder that holds the releases (default: release)")
    p.add_argument("--deep", action="store_true", help="also check zstd integrity and the archive's structure")
    return p


def _options(args: argparse.Namespace, out: Path, env: Mapping[str, str], plan_allow: tuple[str, ...] = ()) \
        -> ReleaseOptions:
    """The release options, checked; called before anything is planned, rendered or built."""
    from .sanitise import builder_identity

    if args.level < 1 or args.level > 19:
        raise InputError(f"--level {args.level} is out of range 1..19")
    for pattern in args.allow:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(f"--allow {pattern!r} is not a regular expression: {exc}") from None
    return ReleaseOptions(out=out, force=args.force, level=args.level, long_distance=args.long,
                          split=parse_size(args.split) if args.split else None, roundtrip=not args.no_roundtrip,
                          verify_engine=args.verify_engine,
                          scratch_dir=Path(args.scratch_dir) if args.scratch_dir else None,
                          allow=plan_allow + tuple(args.allow), identity=builder_identity(dict(env)))


def _lock_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py lock", description="Rewrite profiles/inputs.lock from the inputs as they are now.")
    p.add_argument("--config", default="profiles", metavar="DIR")
    return p


def git_revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def source_date_epoch(root: Path, env: Mapping[str, str]) -> int:
    """SOURCE_DATE_EPOCH if set, else the last commit's time, else 0: never the wall clock."""
    value = env.get("SOURCE_DATE_EPOCH")
    if value is not None:
        if not value.isdigit():
            raise InputError(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds")
        return int(value)
    try:
        out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True,
                             text=True, check=True).stdout.strip()
        return int(out) if out.isdigit() else 0
    except (OSError, subprocess.CalledProcessError):
        return 0


def cmd_lock(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    args = _lock_parser().parse_args(argv)
    config = (cwd / args.config).resolve()
    plan = make_plan(config, cwd=cwd, verify_lock=False)
    lock_path = config / LOCK_FILE
    display = display_path(lock_path, cwd)
    before = read_lock(lock_path, display)
    after = {f.path: f.sha256 for f in plan.inputs}
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(after) & set(before) if after[p] != before[p])
    tmp = lock_path.with_name(f".{LOCK_FILE}.tmp")
    tmp.write_text(render_lock(list(plan.inputs)), encoding="utf-8")
    tmp.replace(lock_path)
    print(f"{display}: {len(after)} inputs ({len(added)} added, {len(changed)} changed, {len(removed)} removed)")
    for label, paths in (("added", added), ("changed", changed), ("removed", removed)):
        for path in paths:
            print(f"  {label}: {path}")
    return 0


def _plan_and_render(args: argparse.Namespace, reporter: Reporter, cwd: Path, env: Mapping[str, str],
                     version: str | None = None):
    from .render import context_texts, render, write_rendered
    from .sanitise import builder_identity, enforce, scan_context

    config = (cwd / args.config).resolve()
    with reporter.stage("plan", display_path(config, cwd)):
        plan = make_plan(config, profiles=args.profile, version=version or args.version, cwd=cwd)
    with reporter.stage("render", plan.tag):
        context = render(plan)
    with reporter.stage("sanitise", "the build context and the Dockerfile"):
        enforce(scan_context(context_texts(context), builder_identity(dict(env))),
                plan.sanitise_allow + tuple(getattr(args, "allow", None) or ()), "the build context")
    # the tracked copies under dockerfiles/rendered/ follow the YAML, not a --version given here
    out = write_rendered(context, plan.project_root) if not (version or args.version) else None
    return plan, context, out


def _build(plan, context, engine, reporter: Reporter, *, epoch: int, nocache: bool, allow: tuple[str, ...] = (),
           env: Mapping[str, str] | None = None):
    """Build, then normalise (the tag always names the reproducible image), then scan its config."""
    from .builder import build_image
    from .normalise import normalise_image
    from .plan import INSTALL_ROOT
    from .sanitise import builder_identity, enforce, scan_added

    with reporter.stage("build", f"{plan.tag} on engine {engine.version()}"):
        built = build_image(context, engine, revision=git_revision(plan.project_root), epoch=epoch,
                            nocache=nocache, on_line=reporter.build_line)
    with reporter.stage("normalise", f"times set to SOURCE_DATE_EPOCH={epoch}"):
        normalised = normalise_image(engine, built, epoch=epoch, base_image=plan.base_image, owned=INSTALL_ROOT,
                                     cache=plan.project_root / ".cache" / "normalised", reuse=not nocache)
    with reporter.stage("sanitise", "what the image config adds: env, labels, history"):
        enforce(scan_added(engine, plan.tag, plan.base_image, builder_identity(dict(env or {}))),
                allow, f"the image {plan.tag}")
    return normalised


def _built_rows(built) -> list[tuple[str, str]]:
    return [("image ID", built.image_id), ("layers", str(len(built.diff_ids))),
            ("build cache", f"{built.cached_steps} of {len(built.cacheable_steps)} steps reused")]


def cmd_build(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    from .docker_engine import DockerEngine

    args = _build_parser().parse_args(argv)
    reporter = Reporter(env=env, quiet=args.quiet)
    _options(args, cwd, env)  # refuse bad release options before anything is written
    plan, context, out = _plan_and_render(args, reporter, cwd, env)
    rows = [("image", plan.tag), ("profiles", ", ".join(plan.profile_names))]
    if out is not None:
        rows.append(("rendered", display_path(out, cwd)))
    if args.stage == "render":
        reporter.summary("unibake: rendered", rows)
        return 0
    options = _options(args, (cwd / args.out).resolve() if args.out else plan.project_root / "release", env,
                       plan.sanitise_allow)
    with ExitStack() as stack:
        if args.stage == "release":  # refuse an existing release, or a concurrent run, before building
            folder = stack.enter_context(ReleaseFolder(options.out, release_tag(plan.tag), force=options.force))
        engine = DockerEngine(args.engine)
        built = _build(plan, context, engine, reporter, epoch=source_date_epoch(plan.project_root, env),
                       nocache=args.no_cache, allow=options.allow, env=env)
        rows += _built_rows(built)
        if args.stage == "build":
            rows.append(("image size", f"{built.size / 2**30:.2f} GiB ({built.size} bytes)"))
            reporter.summary("unibake: built", rows)
            return 0
        release = release_image(engine, plan.tag, product=plan.product, folder=folder, options=options,
                                reporter=reporter)
    reporter.summary("unibake: released", rows[:2] + summary_rows(release))
    return 0


def _hotfix_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py hotfix", description="A release that ships only the layers that changed since "
                "an earlier release: built from the same profiles with that release's SOURCE_DATE_EPOCH, so "
                "every unchanged layer is identical and stays out of the archive.")
    p.add_argument("--from", dest="base", required=True, metavar="TAG", help="the release it builds on (release/TAG/)")
    p.add_argument("--version", required=True, help="the hotfix's version")
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="profiles (default: those of the base release)")
    _project_options(p, cache=True)
    _release_options(p, out_help="release folder parent (default: release/ next to the profiles folder)")
    return p


def cmd_hotfix(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    import json

    from .docker_engine import DockerEngine

    args = _hotfix_parser().parse_args(argv)
    reporter = Reporter(env=env, quiet=args.quiet)
    _options(args, cwd, env)  # refuse bad release options before anything is written
    config = (cwd / args.config).resolve()
    out = (cwd / args.out).resolve() if args.out else config.parent / "release"
    base_path = out / release_tag_arg(args.base) / "manifest.json"
    try:
        base = json.loads(base_path.read_text())
    except FileNotFoundError:
        raise InputError(f"--from {args.base}: {base_path} does not exist; name a published release") from None
    except ValueError as exc:
        raise InputError(f"--from {args.base}: {base_path} is not valid JSON ({exc})") from None
    base["_folder"] = base_path.parent
    if not base.get("source_date_epoch"):
        raise InputError(f"--from {args.base}: that release records no SOURCE_DATE_EPOCH (made before normalising "
                         "existed); a hotfix needs it to rebuild identical layers")
    if not args.profile:
        args.profile = list(base.get("profiles") or []) or ["all"]
    epoch = int(base["source_date_epoch"])
    if env.get("SOURCE_DATE_EPOCH") not in (None, str(epoch)):
        reporter.warn(f"SOURCE_DATE_EPOCH={env['SOURCE_DATE_EPOCH']} is ignored: the hotfix uses {epoch}, the "
                      f"epoch of {args.base}, so that unchanged layers stay identical")
    plan, context, _ = _plan_and_render(args, reporter, cwd, env)
    if plan.tag == base.get("tag"):
        raise InputError(f"--version {args.version} gives {plan.tag}, the tag of the base release; choose a new version")
    options = _options(args, out, env, plan.sanitise_allow)
    with ReleaseFolder(options.out, release_tag(plan.tag), force=options.force) as folder:
        engine = DockerEngine(args.engine)
        built = _build(plan, context, engine, reporter, epoch=epoch, nocache=args.no_cache, allow=options.allow,
                       env=env)
        release = release_image(engine, plan.tag, product=plan.product, folder=folder, options=options,
                                reporter=reporter, hotfix=base)
    h = release.manifest["hotfix"]
    rows = [("image", plan.tag), ("base", f"{base['tag']} ({base['image_id'][:19]})"),
            ("layers shipped", f"{len(h['shipped_diff_ids'])} of {len(built.diff_ids)}"),
            ("delta / full", f"{release.archive.compressed_bytes} / {h['base_archive_bytes']} bytes "
                             f"({100 * release.archive.compressed_bytes / h['base_archive_bytes']:.2f} %)")]
    reporter.summary("unibake: hotfix released", rows + summary_rows(release))
    return 0


def release_tag_arg(tag: str) -> str:
    """``--from`` takes a release folder's name (1.3.1) or an image reference (demo-llm:1.3.1)."""
    return release_tag(tag) if ":" in tag else tag


def _repro_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py repro", description="Build twice from cold (no cache) and compare image IDs, every "
                "diffID and the release archive's sha256; name the layer and files that differ. Exit 0 when "
                "both builds are identical, 3 when not.")
    p.add_argument("--profile", action="append", default=[], metavar="NAME")
    p.add_argument("--version", help="release version (default: product.yaml's)")
    _project_options(p, cache=False)
    p.add_argument("--quiet", action="store_true", help="print only errors and the summary")
    return p


def cmd_repro(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    import tempfile

    from .archive import write_archive
    from .docker_engine import DockerEngine
    from .errors import VerificationError
    from .repro import diff_layer
    from .roundtrip import read_back

    args = _repro_parser().parse_args(argv)
    reporter = Reporter(env=env, quiet=args.quiet)
    plan, context, _ = _plan_and_render(args, reporter, cwd, env)
    engine = DockerEngine(args.engine)
    epoch = source_date_epoch(plan.project_root, env)
    builds, archives = [], []
    with tempfile.TemporaryDirectory(prefix="unibake-repro-") as tmp:
        for n in (1, 2):
            built = _build(plan, context, engine, reporter, epoch=epoch, nocache=True, allow=plan.sanitise_allow,
                           env=env)
            with reporter.stage(f"archive {n}", "the archive this build would ship"):
                folder = Path(tmp) / str(n)
                folder.mkdir()
                archive = write_archive(engine.save(built.image_id), folder, "image.tar.zst", tag=plan.tag)
                archives.append(archive.with_digests(read_back(archive)))
            builds.append(built)
    a, b = builds
    rows = [["image ID", a.image_id, b.image_id, "same" if a.image_id == b.image_id else "DIFFERENT"]]
    for i, (x, y) in enumerate(zip(a.diff_ids, b.diff_ids)):
        rows.append([f"layer {i + 1}", x, y, "same" if x == y else "DIFFERENT"])
    sha_a, sha_b = archives[0].compressed_sha256, archives[1].compressed_sha256
    rows.append(["archive sha256", sha_a, sha_b, "same" if sha_a == sha_b else "DIFFERENT"])
    reporter.table(f"repro {plan.tag}: two cold builds", ["what", "first build", "second build", ""], rows)
    if a.image_id == b.image_id and sha_a == sha_b:
        reporter.info(f"reproducible: {plan.tag} is {a.image_id} both times, archive sha256 {sha_a}")
        return 0
    differing = [i for i, (x, y) in enumerate(zip(a.diff_ids, b.diff_ids)) if x != y]
    if not differing:
        raise VerificationError(f"the builds differ only in their config ({a.image_id} against {b.image_id}): "
                                "labels, environment or history")
    diff = diff_layer(engine, a.image_id, b.image_id, differing[0], (a.diff_ids[differing[0]], b.diff_ids[differing[0]]))
    reporter.table(f"layer {diff.index + 1}: entries that differ", ["path", "difference"],
                   [list(e) for e in diff.entries[:50]])
    first = diff.entries[0] if diff.entries else ("(no entry)", "the layer tars differ in order or padding")
    raise VerificationError(f"not reproducible: layer {diff.index + 1} differs ({len(diff.entries)} entries), "
                            f"first {first[0]}: {first[1]}")


def cmd_archive(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    from .docker_engine import DockerEngine

    args = _archive_parser().parse_args(argv)
    reporter = Reporter(env=env, quiet=args.quiet)
    options = _options(args, (cwd / (args.out or "release")).resolve(), env)
    by_digest = args.image.startswith("sha256:") or "@" in args.image
    if by_digest and not (args.tag and args.product):
        raise InputError(f"{args.image} is not a name:tag; give --tag and --product")
    tag = check_tag(args.tag or release_tag(args.image))
    if args.product and not NAME_RE.fullmatch(args.product):
        raise InputError(f"--product {args.product!r} is not valid: lower-case letters, digits, '.', '_' and '-'")
    engine = DockerEngine(args.engine)
    engine.version()
    info = engine.inspect_image(args.image)
    if info is None:
        raise InputError(f"the engine at {engine.address} has no image {args.image!r}")
    if by_digest:
        repository = args.product
    else:
        repository = args.image.rsplit(":", 1)[0] if ":" in args.image.rsplit("/", 1)[-1] else args.image
    product = args.product or info.labels.get("org.opencontainers.image.title") or repository.rsplit("/", 1)[-1]
    from .sanitise import enforce, scan_added
    with reporter.stage("sanitise", "the image config: env, labels, history"):
        enforce(scan_added(engine, args.image, None, options.identity), options.allow, f"the image {args.image}")
    with ReleaseFolder(options.out, tag, force=options.force) as folder:
        release = release_image(engine, args.image, product=product, folder=folder, options=options,
                                reporter=reporter)
    reporter.summary("unibake: released", summary_rows(release))
    return 0


def _verify_rows(report) -> list[list[str]]:
    return [[c.name, c.target, "ok" if c.passed else "FAILED", c.detail] for c in report.checks]


def cmd_verify(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    from .verify import check_folder_arg, load_and_compare, verify_folder

    args = _verify_parser().parse_args(argv)
    reporter = Reporter(env=env)
    folder = check_folder_arg((cwd / args.folder).resolve())
    report = verify_folder(folder)
    if args.load and not report.failures:
        from .docker_engine import DockerEngine
        load_and_compare(report, DockerEngine(args.engine))
    reporter.table(f"verify {display_path(folder, cwd)}", ["check", "file", "result", "detail"], _verify_rows(report))
    report.raise_if_failed()
    return 0


def cmd_releases(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    from .publish import find_releases
    from .verify import Report, check_sums, read_sums, verify_folder

    args = _releases_parser().parse_args(argv)
    reporter = Reporter(env=env)
    out = (cwd / args.out).resolve()
    rows = []
    for manifest in find_releases(out):
        folder = manifest["_folder"]
        parts = [f["name"] for f in manifest["archive"]["files"]]
        if not all((folder / p).is_file() for p in parts):
            state = "archive absent"
        else:
            try:
                report = verify_folder(folder) if args.deep else check_sums(Report(folder=folder), read_sums(folder))
                state = "verifies" if not report.failures else "FAILS: " + "; ".join(
                    f"{c.target} {c.detail}" for c in report.failures[:2])
            except UnibakeError as exc:
                state = f"FAILS: {exc}"
        size = manifest["archive"]["bytes"]
        rows.append([manifest.get("release", folder.name), manifest.get("published", ""),
                     manifest.get("image_id", "")[:19], f"{size / 2**30:.2f} GiB", manifest.get("previous") or "",
                     state])
    if not rows:
        reporter.info(f"no releases under {display_path(out, cwd)}")
        return 0
    reporter.table(f"releases in {display_path(out, cwd)}", ["release", "published", "image ID", "archive",
                                                            "previous", "state"], rows)
    return 0


def _terminate(signum, frame):  # SIGTERM cleans up like Ctrl-C: scratch engine stopped, partial files removed
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    try:
        if argv and argv[0] == "lock":
            return cmd_lock(argv[1:], env, cwd)
        if argv and argv[0] == "archive":
            return cmd_archive(argv[1:], env, cwd)
        if argv and argv[0] == "verify":
            return cmd_verify(argv[1:], env, cwd)
        if argv and argv[0] == "releases":
            return cmd_releases(argv[1:], env, cwd)
        if argv and argv[0] == "hotfix":
            return cmd_hotfix(argv[1:], env, cwd)
        if argv and argv[0] == "repro":
            return cmd_repro(argv[1:], env, cwd)
        return cmd_build(argv, env, cwd)
    except UnibakeError as exc:
        if isinstance(exc, (BuildFailed, CheckFailed)) and exc.output:
            print("    " + "\n    ".join(exc.output), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head: not an error of ours
        sys.stdout = open(os.devnull, "w")
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
