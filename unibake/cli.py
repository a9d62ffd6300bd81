"""The command line: ``python build.py [GLOBAL OPTIONS] [COMMAND] [OPTIONS]``; the only place that
catches errors and exits.

Commands: ``build`` (the default: ``python build.py --profile tp4`` builds and releases),
``hotfix``, ``archive``, ``repro``, ``verify``, ``releases``, ``lock``, ``prune``. Global options
(``--quiet``, ``--json``, ``--metadata-file``, ``--engine``) go before or after the command.
``--version V`` is the release version (as it always was); ``-V``/``--tool-version`` prints
unibake's own.

Exit codes: 0 success; 2 bad input; 3 verification failed; 1 anything else. Human output goes to
stderr; with ``--json`` stdout holds exactly one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import __version__
from .archive import DEFAULT_LEVEL
from .console import Reporter
from .errors import BuildFailed, CheckFailed, InputError, UnibakeError
from .files import write_atomic
from .schema import NAME_RE

STAGES = ("render", "build", "release")
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB|K|M|G)?$", re.IGNORECASE)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10, "m": 2**20, "g": 2**30,
         "kib": 2**10, "mib": 2**20, "gib": 2**30}
OUT_HELP = "the folder that holds the releases (default: release/ beside the profiles folder, i.e. ./release)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one "error:" line and exit 2, like every other bad input
        raise InputError(f"{message} (see: python {self.prog} --help)")


class _ToolVersion(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(f"unibake {__version__}")
        parser.exit(0)


def _global_options(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Accepted before or after the command; after it they only override what was given before."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    g = p.add_argument_group("global options")
    g.add_argument("--quiet", "-q", action="store_true", default=default(False),
                   help="print only errors, warnings and the final line")
    g.add_argument("--json", action="store_true", default=default(False),
                   help="print one JSON document on stdout (the release manifest, the verify report, the "
                        "releases table, ...); the human output stays on stderr")
    g.add_argument("--metadata-file", metavar="PATH", default=default(None),
                   help="also write that JSON document to PATH (for CI)")
    g.add_argument("--engine", metavar="URL", default=default(None),
                   help="Docker engine address: unix:///path, tcp://host:port or ssh://user@host "
                        "(default: DOCKER_HOST, else the local socket)")
    g.add_argument("-V", "--tool-version", action=_ToolVersion, nargs=0, help="print unibake's own version and exit")


def _profile_options(p: argparse.ArgumentParser, *, version_required: bool = False) -> None:
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="a profile to include; repeat for several; 'all' (the default) is the unified image")
    p.add_argument("--version", required=version_required, metavar="V",
                   help="the release version, the image's tag (default: product.yaml's version)")
    p.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")


def _release_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help=OUT_HELP)
    p.add_argument("--force", action="store_true", help="replace a finished release of the same tag")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL, help=f"zstd level, 1 to 19 (default {DEFAULT_LEVEL})")
    p.add_argument("--long", action="store_true", help="zstd long-distance matching (window 128 MiB)")
    p.add_argument("--split", metavar="SIZE", help="write the archive in parts of SIZE (e.g. 1900MiB)")
    p.add_argument("--no-roundtrip", action="store_true",
                   help="skip the load into a fresh engine and the smoke gates (the notes say so)")
    p.add_argument("--verify-engine", metavar="URL",
                   help="load into this engine (it must not have the image) instead of a scratch dockerd")
    p.add_argument("--scratch-dir", metavar="DIR", help="where the scratch engine keeps its data (default: $TMPDIR)")
    p.add_argument("--allow", action="append", default=[], metavar="REGEX",
                   help="let the sanitisation gate pass values matching REGEX (besides product.yaml's sanitise.allow)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py", allow_abbrev=False,
                description="Build, check and release a unified inference image from declarative profile YAMLs. "
                            "Without a command, 'build' runs: python build.py --profile tp4.",
                epilog="Exit codes: 0 success, 2 bad input, 3 a check failed, 1 anything else. "
                       "'build.py COMMAND --help' for a command's options.")
    _global_options(p, suppress=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=description, allow_abbrev=False)
        _global_options(sp, suppress=True)
        return sp

    b = command("build", "build, check and release the image of the profiles (the default command)",
                "Validate and render the profiles, build the unified image, normalise it, archive it, prove the "
                "round trip in a fresh engine, run every profile's smoke gate and write the release folder.")
    _profile_options(b)
    b.add_argument("--stage", choices=STAGES, default="release",
                   help="stop after this stage: render (validate and render only), build, or release (the default: "
                        "everything)")
    b.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    _release_options(b)

    h = command("hotfix", "a release that ships only the layers that changed since an earlier one",
                "Build the profiles again with an earlier release's SOURCE_DATE_EPOCH, so that every unchanged "
                "layer is identical, and release an archive that leaves those layers out.")
    h.add_argument("--from", dest="base", required=True, metavar="RELEASE",
                   help="the release it builds on: a folder name under --out (1.3.1) or its tag (demo-llm:1.3.1)")
    _profile_options(h, version_required=True)
    h.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    _release_options(h)

    a = command("archive", "release an image the engine already has",
                "Archive, round-trip, gate (for images unibake built) and publish an existing image.")
    a.add_argument("image", metavar="IMAGE", help="image reference, e.g. demo-llm:1.3.1")
    a.add_argument("--tag", help="the release's name (default: the image's tag)")
    a.add_argument("--product", help="product name for the archive file (default: the image's metadata or repository)")
    _release_options(a)

    r = command("repro", "build twice from cold and compare",
                "Build twice without the cache and compare image IDs, every diffID and the release archive's "
                "sha256; name the layer and files that differ. Exit 0 when identical, 3 when not.")
    _profile_options(r)

    v = command("verify", "check a release folder as a downloader would",
                "SHA256SUMS, sizes, zstd integrity and the archive's structure against manifest.json; with "
                "--load, a load into the engine and the image ID compared. Exit 0 when everything passes, 3 "
                "otherwise.")
    v.add_argument("folder", metavar="DIR", help="the release folder, e.g. release/1.3.1")
    v.add_argument("--load", action="store_true", help="also load the archive and compare the image ID")
    v.add_argument("--external", action="append", default=[], metavar="PATH",
                   help="check your copy of an artifact the release records but does not ship (weights, a patch "
                        "set): a file, or a folder holding them by name; repeat for several")

    rl = command("releases", "the releases in a folder, and whether each still verifies",
                 "List the releases with date, image ID, size, previous release and state (SHA256SUMS; --deep adds "
                 "zstd and structure).")
    rl.add_argument("--out", metavar="DIR", help=OUT_HELP)
    rl.add_argument("--deep", action="store_true", help="also check zstd integrity and the archive's structure")

    lk = command("lock", "rewrite inputs.lock from the inputs as they are now",
                 "Hash every input the profiles bake in and rewrite profiles/inputs.lock; lists what changed.")
    lk.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")

    pr = command("prune", "remove old release images and build cache from the engine",
                 "Keep the images of the newest --keep releases of each product under --out; remove the engine's "
                 "tags of older ones, unibake's build cache (unibake-cache/*) and dangling images unibake made. "
                 "Release folders are never touched.")
    pr.add_argument("--keep", type=int, default=3, metavar="N", help="releases to keep per product (default 3)")
    pr.add_argument("--out", metavar="DIR", help=OUT_HELP)
    pr.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    return p


COMMANDS = ("build", "hotfix", "archive", "repro", "verify", "releases", "lock", "prune")
VALUE_OPTIONS = {"--metadata-file", "--engine", "--profile", "--version", "--config", "--stage", "--out", "--level",
                 "--split", "--verify-engine", "--scratch-dir", "--allow", "--from", "--tag", "--product", "--keep",
                 "--external"}


def with_command(argv: list[str]) -> list[str]:
    """``build`` is the default command: ``build.py --profile tp4`` is ``build.py build --profile tp4``."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in VALUE_OPTIONS:
            skip = True
        elif token in ("-h", "--help", "-V", "--tool-version") and not any(a in COMMANDS for a in argv):
            return argv
        elif not token.startswith("-"):
            return argv if token in COMMANDS else ["build", *argv]
    return ["build", *argv]


def parse_size(text: str) -> int:
    """``1900MiB``, ``2GiB``, ``500MB`` or a number of bytes."""
    match = SIZE_RE.match(text.strip())
    if not match:
        raise InputError(f"--split {text!r} is not a size like 1900MiB, 2GiB or 500MB")
    size = int(float(match.group(1)) * UNITS[(match.group(2) or "b").lower()])
    if size < 1 << 20:
        raise InputError(f"--split {text!r} is below 1 MiB")
    return size


# ---------------------------------------------------------------------------------------------
# What a command hands back


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """A command's result: the JSON document, the closing summary, and a failure that still has a
    document to show (verify)."""

    document: dict
    final: str
    title: str = ""
    rows: list[tuple[str, str]] = field(default_factory=list)
    error: UnibakeError | None = None


@dataclass(frozen=True, kw_only=True)
class Context:
    env: Mapping[str, str]
    cwd: Path
    reporter: Reporter


def _out(args: argparse.Namespace, cwd: Path) -> Path:
    """The one default for ``--out``: release/ beside the profiles folder."""
    if getattr(args, "out", None):
        return (cwd / args.out).resolve()
    config = getattr(args, "config", "profiles")
    return (cwd / config).resolve().parent / "release"


def _request(args: argparse.Namespace, ctx: Context, **extra):
    """The pipeline's request from the command line, every option checked before anything runs."""
    from .pipeline import Request, git_revision, source_date_epoch
    from .sanitise import builder_identity

    level = getattr(args, "level", DEFAULT_LEVEL)
    if not 1 <= level <= 19:
        raise InputError(f"--level {level} is out of range 1..19")
    for pattern in getattr(args, "allow", []):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(f"--allow {pattern!r} is not a regular expression: {exc}") from None
    config = Path(getattr(args, "config", "profiles"))
    root = (ctx.cwd / config).resolve().parent
    request = Request(
        env=ctx.env, cwd=ctx.cwd, config=config, profiles=tuple(getattr(args, "profile", ())),
        version=getattr(args, "version", None), out=_out(args, ctx.cwd), force=getattr(args, "force", False),
        level=level, long_distance=getattr(args, "long", False),
        split=parse_size(args.split) if getattr(args, "split", None) else None,
        roundtrip=not getattr(args, "no_roundtrip", False), verify_engine=getattr(args, "verify_engine", None),
        scratch_dir=Path(args.scratch_dir) if getattr(args, "scratch_dir", None) else None,
        allow=tuple(getattr(args, "allow", ())), identity=builder_identity(dict(ctx.env)),
        nocache=getattr(args, "no_cache", False), engine=args.engine,
        epoch=source_date_epoch(root, ctx.env), revision=git_revision(root))
    return replace(request, **extra)


def _release_outcome(results, title: str) -> Outcome:
    release = results["release"]
    m = release.manifest
    a = m.archive
    rows = [("image", m.tag), ("profiles", ", ".join(m.profiles) or "(none)"), ("release", str(release.folder)),
            ("archive", ", ".join(f.name for f in a.files)),
            ("size", f"{a.bytes / 2**30:.2f} GiB ({a.bytes} bytes), ratio {release.archive.ratio:.2f}"),
            ("SHA256", a.sha256), ("image ID", m.image_id)]
    v = release.validation
    rows.append(("round trip", "passed" if v.round_trip else f"not run ({v.round_trip_skipped})"))
    rows.append(("smoke gates", ", ".join(f"{g.profile} {'passed' if g.passed else 'FAILED'}" for g in v.smoke)
                 or f"not run ({v.smoke_skipped})"))
    if m.hotfix:
        h = m.hotfix
        rows.insert(1, ("base", f"{h.base_tag} ({h.base_image_id[:19]})"))
        rows.append(("layers shipped", f"{len(h.shipped_diff_ids)} of {len(m.diff_ids)}"))
        rows.append(("delta / full", f"{a.bytes} / {h.base_archive_bytes} bytes "
                                     f"({100 * a.bytes / h.base_archive_bytes:.2f} %)"))
    return Outcome(document=m.model_dump(mode="json", by_alias=True), title=title, rows=rows,
                   final=f"released {m.tag} in {release.folder}")


# ---------------------------------------------------------------------------------------------
# The commands


def cmd_build(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import BUILD, run_stages, selection

    request = _request(args, ctx, require_lock=args.stage != "render")  # rendering needs no lock yet
    results = run_stages(selection(BUILD, args.stage), request, ctx.reporter)
    plan = results["plan"]
    if args.stage == "render":
        context, folder = results["context"], results["rendered"]
        return Outcome(document={"image": plan.tag, "profiles": list(plan.profile_names),
                                 "rendered": str(folder) if folder else None,
                                 "dockerfile_sha256": next(f.sha256 for f in context.files if f.name == "Dockerfile")},
                       title="unibake: rendered", rows=[("image", plan.tag), ("profiles", ", ".join(plan.profile_names)),
                                                        ("rendered", str(folder or "(not written)"))],
                       final=f"rendered {plan.tag}" + (f" in {folder}" if folder else ""))
    if args.stage == "build":
        built, image = results["built"], results["image"]
        rows = [("image", plan.tag), ("profiles", ", ".join(plan.profile_names)), ("image ID", image.image_id),
                ("layers", str(len(image.diff_ids))),
                ("build cache", f"{built.cached_steps} of {len(built.cacheable_steps)} steps reused"),
                ("image size", f"{image.size / 2**30:.2f} GiB ({image.size} bytes)")]
        return Outcome(document={"image": plan.tag, "image_id": image.image_id, "diff_ids": list(image.diff_ids),
                                 "size": image.size, "profiles": list(plan.profile_names),
                                 "cached_steps": built.cached_steps, "steps": len(built.cacheable_steps)},
                       title="unibake: built", rows=rows, final=f"built {plan.tag} as {image.image_id}")
    return _release_outcome(results, "unibake: released")


def cmd_hotfix(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import HOTFIX, run_stages, selection

    request = _request(args, ctx, base=args.base)
    results = run_stages(selection(HOTFIX), request, ctx.reporter)
    return _release_outcome(results, "unibake: hotfix released")


def cmd_archive(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import ARCHIVE, run_stages, selection
    from .publish import check_tag, release_tag

    by_digest = args.image.startswith("sha256:") or "@" in args.image
    if by_digest and not (args.tag and args.product):
        raise InputError(f"{args.image} is not a name:tag; give --tag and --product")
    check_tag(args.tag or release_tag(args.image))
    if args.product and not NAME_RE.fullmatch(args.product):
        raise InputError(f"--product {args.product!r} is not valid: lower-case letters, digits, '.', '_' and '-'")
    request = _request(args, ctx, image=args.image, tag=args.tag, product=args.product)
    results = run_stages(selection(ARCHIVE), request, ctx.reporter)
    return _release_outcome(results, "unibake: released")


def cmd_repro(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import reproduce

    request = _request(args, ctx, nocache=True, roundtrip=False, write_rendered=False)
    report = reproduce(request, ctx.reporter)
    ctx.reporter.table(f"repro {report.tag}: two cold builds", ["what", "first build", "second build", ""],
                       report.rows())
    if report.layer is not None:
        ctx.reporter.table(f"layer {report.layer.index + 1}: entries that differ", ["path", "difference"],
                           [list(e) for e in report.layer.entries[:50]])
    error = None
    try:
        report.raise_if_different()
    except UnibakeError as exc:
        error = exc
    final = (f"reproducible: {report.tag} is {report.first.image_id} both times, archive sha256 "
             f"{report.first.archive_sha256}") if error is None else f"not reproducible: {report.tag}"
    return Outcome(document=report.document(), final=final, error=error)


def cmd_verify(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .plan import display_path
    from .verify import check_external, check_folder_arg, load_and_compare, verify_folder

    folder = check_folder_arg((ctx.cwd / args.folder).resolve())
    report = verify_folder(folder)
    if args.external:
        report = check_external(report, [(ctx.cwd / p).resolve() for p in args.external])
    if args.load and not report.failures:
        from .docker_engine import DockerEngine
        engine = DockerEngine(args.engine, ctx.env)
        with ctx.reporter.progress("load", report.manifest.archive.uncompressed_bytes) as advance:
            report = load_and_compare(report, engine, progress=advance)
    ctx.reporter.table(f"verify {display_path(folder, ctx.cwd)}", ["check", "file", "result", "detail"],
                       [[c.name, c.target, "ok" if c.passed else "FAILED", c.detail] for c in report.checks])
    error = None
    try:
        report.raise_if_failed()
    except UnibakeError as exc:
        error = exc
    passed = len(report.checks) - len(report.failures)
    final = f"verified {display_path(folder, ctx.cwd)}: {passed} checks passed" if error is None else \
        f"{display_path(folder, ctx.cwd)} does not verify: {len(report.failures)} of {len(report.checks)} checks failed"
    return Outcome(document=report.document(), final=final, error=error)


def cmd_releases(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .plan import display_path
    from .publish import find_releases
    from .verify import sums_report, verify_folder

    out = _out(args, ctx.cwd)
    rows, document = [], []
    for found in find_releases(out):
        m = found.manifest
        if m is None:
            rows.append([found.folder.name, "", "", "", "", f"UNREADABLE: {found.problem}"])
            document.append({"release": found.folder.name, "state": "unreadable", "problem": found.problem})
            continue
        if not all((found.folder / f.name).is_file() for f in m.archive.files):
            state = "archive absent"
        else:
            try:
                report = verify_folder(found.folder) if args.deep else sums_report(found.folder)
                state = "verifies" if not report.failures else "FAILS: " + "; ".join(
                    f"{c.target} {c.detail}" for c in report.failures[:2])
            except UnibakeError as exc:
                state = f"FAILS: {exc}"
        rows.append([m.release, m.published, m.image_id[:19], f"{m.archive.bytes / 2**30:.2f} GiB",
                     m.previous or "", state])
        document.append({"release": m.release, "product": m.product, "tag": m.tag, "published": m.published,
                         "image_id": m.image_id, "archive_bytes": m.archive.bytes, "previous": m.previous,
                         "state": state})
    where = display_path(out, ctx.cwd)
    if rows:
        ctx.reporter.table(f"releases in {where}", ["release", "published", "image ID", "archive", "previous",
                                                    "state"], rows)
    failing = sum(1 for r in document if r["state"] != "verifies")
    final = f"no releases under {where}" if not rows else \
        f"{len(rows)} releases under {where}; {len(rows) - failing} verify"
    return Outcome(document={"folder": str(out), "releases": document}, final=final)


def cmd_lock(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .inputs import LOCK_FILE, read_lock, render_lock
    from .plan import display_path, make_plan

    config = (ctx.cwd / args.config).resolve()
    plan = make_plan(config, cwd=ctx.cwd, verify_lock=False)
    lock_path = config / LOCK_FILE
    display = display_path(lock_path, ctx.cwd)
    before = read_lock(lock_path, display)
    after = {f.path: f.sha256 for f in plan.inputs}
    changed = {"added": sorted(set(after) - set(before)), "removed": sorted(set(before) - set(after)),
               "changed": sorted(p for p in set(after) & set(before) if after[p] != before[p])}
    write_atomic(config, LOCK_FILE, render_lock(list(plan.inputs)))
    for label in ("added", "changed", "removed"):
        for path in changed[label]:
            ctx.reporter.info(f"  {label}: {path}")
    final = (f"{display}: {len(after)} inputs ({len(changed['added'])} added, {len(changed['changed'])} changed, "
             f"{len(changed['removed'])} removed)")
    return Outcome(document={"lock": str(lock_path), "inputs": len(after), **changed}, final=final)


def cmd_prune(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .docker_engine import DockerEngine
    from .prune import prune

    if args.keep < 0:
        raise InputError(f"--keep {args.keep} must be 0 or more")
    out = _out(args, ctx.cwd)
    removed = prune(DockerEngine(args.engine, ctx.env), out, keep=args.keep, dry_run=args.dry_run,
                    on_line=ctx.reporter.info)
    verb = "would remove" if args.dry_run else "removed"
    return Outcome(document={"dry_run": args.dry_run, "removed": [{"image": r.ref, "why": r.why} for r in removed]},
                   final=f"{verb} {len(removed)} images or tags")


HANDLERS: dict[str, Callable[[argparse.Namespace, Context], Outcome]] = {
    "build": cmd_build, "hotfix": cmd_hotfix, "archive": cmd_archive, "repro": cmd_repro, "verify": cmd_verify,
    "releases": cmd_releases, "lock": cmd_lock, "prune": cmd_prune}


# ---------------------------------------------------------------------------------------------
# main


def _terminate(signum, frame):  # SIGTERM and SIGHUP clean up like Ctrl-C: scratch engine stopped, partial files removed
    raise KeyboardInterrupt


def _emit_document(args: argparse.Namespace | None, document: dict, cwd: Path) -> None:
    if args is None:
        return
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    if getattr(args, "json", False):
        sys.stdout.write(text)
        sys.stdout.flush()
    if getattr(args, "metadata_file", None):
        path = (cwd / args.metadata_file).resolve()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path.parent, path.name, text)
        except OSError as exc:
            raise UnibakeError(f"--metadata-file {args.metadata_file}: cannot write ({exc.strerror})") from None


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _terminate)
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    args = None
    reporter = Reporter(env=env)
    try:
        try:
            args = build_parser().parse_args(with_command(argv))
        except SystemExit as exc:  # --help and -V print and end here
            return int(exc.code or 0)
        reporter = Reporter(env=env, quiet=args.quiet)
        outcome = HANDLERS[args.command](args, Context(env=env, cwd=cwd, reporter=reporter))
        if outcome.title:
            reporter.summary(outcome.title, outcome.rows, outcome.final)
        elif outcome.error is None:
            reporter.final(outcome.final)
        _emit_document(args, outcome.document, cwd)
        if outcome.error is not None:  # the document (a failed verify's report) is out; then the verdict
            print(f"error: {outcome.error}", file=sys.stderr)
            return outcome.error.exit_code
        return 0
    except UnibakeError as exc:
        if isinstance(exc, (BuildFailed, CheckFailed)) and exc.output and not reporter.quiet:
            print("    " + "\n    ".join(exc.output), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        if args is not None and getattr(args, "json", False):
            sys.stdout.write(json.dumps({"error": str(exc), "exit_code": exc.exit_code}) + "\n")
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head: not an error of ours
        sys.stdout = open(os.devnull, "w")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
