"""The command line: ``python build.py ...``. The only place that catches errors and exits.

Exit codes: 0 success; 2 bad input; 3 verification failed; 1 anything else.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import BuildFailed, CheckFailed, InputError, UnibakeError
from .inputs import LOCK_FILE, read_lock, render_lock
from .log import Reporter
from .plan import display_path, make_plan

COMMANDS = ("lock",)
STAGES = ("render", "build")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one "error:" line and exit 2, like every other bad input
        raise InputError(f"{message} (see: python build.py --help)")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py", description="Build, check and release a unified inference image from "
                "declarative profile YAMLs. Commands: lock (rewrite profiles/inputs.lock).")
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="profile to include; repeat for several; 'all' (default) is the unified image")
    p.add_argument("--version", help="release version (default: product.yaml's)")
    p.add_argument("--stage", choices=STAGES, default="build", help="stop after this stage (default: build)")
    p.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")
    p.add_argument("--engine", metavar="URL", help="Docker engine address (default: DOCKER_HOST or the local socket)")
    p.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    p.add_argument("--quiet", action="store_true", help="print only errors and the summary")
    return p


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


def cmd_build(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    from .builder import build_image
    from .docker_engine import DockerEngine
    from .render import render, write_rendered

    args = _build_parser().parse_args(argv)
    reporter = Reporter(env=env, quiet=args.quiet)
    config = (cwd / args.config).resolve()
    with reporter.stage("plan", display_path(config, cwd)):
        plan = make_plan(config, profiles=args.profile, version=args.version, cwd=cwd)
    with reporter.stage("render", plan.tag):
        context = render(plan)
        out = write_rendered(context, plan.project_root)
    rows = [("image", plan.tag), ("profiles", ", ".join(plan.profile_names)),
            ("rendered", display_path(out, cwd))]
    if args.stage == "render":
        reporter.summary("unibake: rendered", rows)
        return 0
    engine = DockerEngine(args.engine)
    engine_version = engine.version()
    with reporter.stage("build", f"{plan.tag} on engine {engine_version}"):
        built = build_image(context, engine, revision=git_revision(plan.project_root),
                            epoch=source_date_epoch(plan.project_root, env), nocache=args.no_cache,
                            on_line=reporter.build_line)
    rows += [("image ID", built.image_id), ("layers", str(len(built.diff_ids))),
             ("size", f"{built.size / 2**30:.2f} GiB ({built.size} bytes)"),
             ("build cache", f"{built.cached_steps} of {len(built.cacheable_steps)} steps reused")]
    reporter.summary("unibake: built", rows)
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    try:
        if argv and argv[0] == "lock":
            return cmd_lock(argv[1:], env, cwd)
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


if __name__ == "__main__":
    sys.exit(main())
