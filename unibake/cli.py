"""The command line: ``python build.py [GLOBAL OPTIONS] [COMMAND] [OPTIONS]``; the only place that
catches errors and exits.

Commands: ``build`` (the default: ``python build.py --profile tp4`` builds and releases),
``hotfix``, ``archive``, ``repro``, ``verify``, ``releases``, ``lock``, ``prune``, ``kit``, ``rebuild``;
``push``, ``pull`` and ``deploy`` take a release beyond one machine. Global options
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
import posixpath
import re
import shlex
import signal
import ssl
import stat
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .archive import DEFAULT_LEVEL
from .console import Reporter, one_line
from .errors import (BuildFailed, CheckFailed, DocumentPlaceRefused, InputError, RoundTripUnavailable, UnibakeError,
                     VerificationError)
from .files import ATOMIC_TEMP_AGE, resolved, unwritable_reason, visible_name, write_atomic
from .schema import IMAGE_REF_RE, PRODUCT_RE

if TYPE_CHECKING:  # (imported where used: a command's start-up imports what it needs only)
    from .manifest import ReleaseManifest

# How long deploy waits on an engine that says nothing, per request (``--engine-timeout``): an engine
# that answered and then stopped answering was waited for an hour a request (docker_engine.TIMEOUT,
# for builds whose steps print nothing for minutes). A load asks for the engine's progress while it
# stores the layers it was sent (quiet, its default, it says nothing until the end).
ENGINE_TIMEOUT = 600

STAGES = ("render", "build", "release")
SIZE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) *(B|KB|MB|GB|KiB|MiB|GiB|K|M|G)?$", re.IGNORECASE)  # ASCII: \d takes ٣
MAX_SPLIT = 1 << 50
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10, "m": 2**20, "g": 2**30,
         "kib": 2**10, "mib": 2**20, "gib": 2**30}
OUT_HELP = "the folder that holds the releases (default: release/ beside the profiles folder, i.e. ./release)"
PLAIN_OUT_HELP = "the folder that holds the releases (default: ./release)"  # for commands without --config


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one "error:" line and exit 2, like every other bad input
        raise InputError(f"{message} (see: python {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        # an option the command does not know is found here, by the top parser: its help is the command's
        # (it named build.py --help, which lists the commands, not their options)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            if command == "build" and not extras[0].startswith("-") and extras[0] not in COMMANDS:
                # build takes no word of its own: a misspelt command (`verfy DIR`, `release`) is routed here
                import difflib

                near = difflib.get_close_matches(extras[0], COMMANDS, n=1)
                raise InputError(f"unrecognized arguments: {' '.join(extras)} ({extras[0]!r} is not a command"
                                 f"{f'; the nearest is {near[0]!r}' if near else ''}; the commands are "
                                 f"{', '.join(COMMANDS)}; see: python {self.prog} --help)")
            raise InputError(f"unrecognized arguments: {' '.join(extras)} (see: python "
                             f"{self.prog}{' ' + command if command else ''} --help)")
        return parsed


class _ToolVersion(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(f"unibake {__version__}")
        parser.exit(0)


class _Once(argparse.Action):
    """An option that names a key: given twice, the first would be silently dropped (a release signed
    or checked with one key where two were asked for)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = f"_{self.dest}_given"
        if getattr(namespace, given, False):
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)!r} and {values!r}): "
                         f"{self.help_once}")
        setattr(namespace, given, True)
        setattr(namespace, self.dest, values)

    @property
    def help_once(self) -> str:
        return {"key": "one public key is checked per run; run verify once for each key",
                "sign": "a release carries one OpenPGP signature; give the one key",
                "sign_minisign": "a release carries one minisign signature; give the one key"}[self.dest]


def _global_options(p: argparse.ArgumentParser, *, suppress: bool, engine: bool = True) -> None:
    """Accepted before or after the command; after it they only override what was given before."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    g = p.add_argument_group("global options")
    g.add_argument("--quiet", "-q", action="store_true", default=default(False),
                   help="print only errors, warnings and the final line")
    g.add_argument("--json", action="store_true", default=default(False),
                   help="print one JSON document on stdout (the release manifest, the verify report, the "
                        "releases table, ...); the human output stays on stderr")
    g.add_argument("--metadata-file", metavar="PATH", default=default(None),
                   help="also write that JSON document to PATH (for CI); '-' is stdout (not with --json, which "
                        "writes it there already)")
    if engine:  # deploy has its own, repeatable --engine
        g.add_argument("--engine", metavar="URL", default=default(None),
                       help="Docker engine address, for a command that reaches one: unix:///path, tcp://host:port "
                            "or ssh://user@host (default: DOCKER_HOST, else the local socket)")
    g.add_argument("-V", "--tool-version", action=_ToolVersion, nargs=0, help="print unibake's own version and exit")


def _profile_options(p: argparse.ArgumentParser, *, version_required: bool = False, hotfix: bool = False) -> None:
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="a profile to include; repeat for several; 'all' is the unified image" +
                        (" (default: the base release's profiles)" if hotfix else " (the default)"))
    p.add_argument("--version", required=version_required, metavar="V",
                   help="the release version, the image's tag" + (" (required: the new release's own, e.g. 1.3.2)"
                                                                    if version_required else
                                                                    " (default: product.yaml's version)"))
    p.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")
    p.add_argument("--platform", action="append", default=[], metavar="OS/ARCH",
                   help="the platform to build for: linux/amd64 or linux/arm64 (default: " +
                        ("the base release's)" if hotfix else
                         "product.yaml's platform, else the host's); build takes several (repeat, or "
                         "comma-separated): one image and one release each"))


def _release_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help=OUT_HELP)
    p.add_argument("--force", action="store_true", help="replace a finished release of the same tag")
    p.add_argument("--level", type=whole_number, default=DEFAULT_LEVEL, help=f"zstd level, 1 to 19 (default {DEFAULT_LEVEL})")
    p.add_argument("--long", action="store_true", help="zstd long-distance matching (window 128 MiB)")
    p.add_argument("--split", metavar="SIZE", help="write the archive in parts of SIZE (e.g. 1900MiB)")
    p.add_argument("--engine-save", action="store_true",
                   help="read the image through the engine's save (docker save) even where its storage can be read "
                        "directly (the default there: the same bytes, checked against the same digests, without the "
                        "save's wait before its first byte), and build an assembled release on a small base, not on "
                        "the build memo's image")
    p.add_argument("--no-roundtrip", action="store_true",
                   help="skip the load into a fresh engine and the smoke gates (the notes say so)")
    p.add_argument("--no-smoke", action="store_true",
                   help="skip the smoke gates only; the round trip still runs (the notes say so)")
    p.add_argument("--verify-engine", metavar="URL",
                   help="load into this engine (it must not have the image) instead of a scratch dockerd")
    p.add_argument("--scratch-dir", metavar="DIR",
                   help="where the scratch engine keeps its data (default: /var/tmp/unibake-UID)")
    p.add_argument("--no-seed", action="store_true",
                   help="start the one-pass round trip's scratch engine empty, instead of the verify engine kept in "
                        "the scratch folder that holds only the base image (slower: the whole image is loaded); build "
                        "and hotfix only: archive's round trip never uses that engine")
    p.add_argument("--allow", action="append", default=[], metavar="REGEX",
                   help="let the sanitisation gate pass values matching REGEX (besides product.yaml's sanitise.allow); "
                        "repeat for several")
    _signing_options(p, "sign SHA256SUMS and the provenance with")


def _signing_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--sign", metavar="KEYID", action=_Once,
                   help=f"{what} this OpenPGP key of the GNUPGHOME keyring (gpg; passphrase from "
                        "UNIBAKE_GPG_PASSPHRASE): SHA256SUMS.asc")
    p.add_argument("--sign-minisign", metavar="KEYFILE", action=_Once,
                   help=f"{what} this minisign secret key too (password from UNIBAKE_MINISIGN_PASSWORD): "
                        "SHA256SUMS.minisig")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="build.py", allow_abbrev=False,
                description="Build, check and release a unified inference image from declarative profile YAMLs. "
                            "Without a command, 'build' runs: python build.py --profile tp4.",
                epilog="Exit codes: 0 success, 2 bad input, 3 a check failed, 1 anything else, 130 interrupted. "
                       "'build.py COMMAND --help' for a command's options. An option that takes a value is given "
                       "once (twice is exit 2), except those whose help says to repeat it.")
    _global_options(p, suppress=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str, description: str, engine: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=description, allow_abbrev=False)
        _global_options(sp, suppress=True, engine=engine)
        return sp

    b = command("build", "build, check and release the image of the profiles (the default command)",
                "Validate and render the profiles, build the unified image, normalise it, archive it, prove the "
                "round trip in a fresh engine, run every profile's smoke gate and write the release folder.")
    _profile_options(b)
    b.add_argument("--stage", choices=STAGES, default="release",
                   help="stop after this stage: render (validate and render only), build, or release (the default: "
                        "everything)")
    b.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    b.add_argument("--sequential", action="store_true",
                   help="normalise, archive and round trip in three passes (two exports) instead of one")
    b.add_argument("--from", dest="base", metavar="RELEASE",
                   help="make this release on an earlier one under --out (1.3.1, or its tag demo-llm:1.3.1): built "
                        "with its SOURCE_DATE_EPOCH and its profiles (unless --profile names others), so that unchanged "
                        "layers stay identical; assembled on its layers when the build memo allows, as a hotfix is, "
                        "and its archive's frames copied for the layers the two share instead of compressed again. "
                        "The release is whole (every layer shipped, no base needed), the same bytes a release "
                        "without --from gives with that SOURCE_DATE_EPOCH")
    b.add_argument("--no-from", action="store_true",
                   help="make the release alone: by default a release is made on the newest release under --out of "
                        "the same product, platform and profiles at its SOURCE_DATE_EPOCH (for one platform at a "
                        "time; as --from it would be, the same "
                        "bytes: its layers and archive frames reused, the round trip's verify engine holding it), "
                        "unless --no-cache, --sequential, --no-seed, --verify-engine or --no-roundtrip")
    _release_options(b)

    h = command("hotfix", "a release that ships only the layers that changed since an earlier one",
                "Build the profiles again with an earlier release's SOURCE_DATE_EPOCH, so that every unchanged "
                "layer is identical, and release an archive that leaves those layers out.")
    h.add_argument("--from", dest="base", required=True, metavar="RELEASE",
                   help="the release it builds on: a folder name under --out (1.3.1) or its tag (demo-llm:1.3.1)")
    _profile_options(h, version_required=True, hotfix=True)
    h.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    h.add_argument("--sequential", action="store_true",
                   help="normalise, archive and round trip in three passes (two exports) instead of one")
    h.add_argument("--full-build", action="store_true",
                   help="build and export the whole image, as a release does, instead of assembling it from the "
                        "steps below the build memo's marker on top of the base release (the default when the "
                        "build memo and this user's records allow it)")
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
                "--load, a load into the engine and the image ID compared. Exit 0 when everything passes, 3 when a "
                "check fails (2: bad input; 1: anything else, an unreachable engine).")
    v.add_argument("folder", metavar="DIR", help="the release folder, e.g. release/1.3.1")
    v.add_argument("--load", action="store_true", help="also load the archive and compare the image ID")
    v.add_argument("--external", action="append", default=[], metavar="PATH",
                   help="check your copy of an artifact the release records but does not ship (weights, a patch "
                        "set): a file, or a folder holding them by name; repeat for several")
    v.add_argument("--key", metavar="PUBKEY", action=_Once,
                   help="the publisher's public key (armoured OpenPGP or minisign): SHA256SUMS's signature is checked "
                        "before anything else; absent or wrong is exit 3")

    k = command("kit", "write the reconstruct kit of an existing release again",
                "Render the release's profiles from the checkout, check its inputs, profiles and build context against "
                "the release's provenance, and write <product>-<tag>-kit.tar.zst into --out.")
    k.add_argument("folder", metavar="RELEASE_DIR", help="the release folder, e.g. release/1.3.1")
    k.add_argument("--out", required=True, metavar="DIR", help="where to write the kit")
    k.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")
    _key_option(k)

    rb = command("rebuild", "rebuild an unpacked reconstruct kit and compare the image ID",
                 "Check the kit's files against its ledger, build its context without the cache on the engine, "
                 "normalise it with the release's SOURCE_DATE_EPOCH and compare the image ID with the release's. "
                 "Exit 0 when identical, 3 when not. (The kit's verify.sh --rebuild runs this.)")
    rb.add_argument("folder", metavar="KIT_DIR", help="the unpacked kit, e.g. demo-llm-1.3.1-kit")
    rb.add_argument("--release", metavar="DIR",
                    help="the release folder the kit is said to rebuild: the kit must name its image (the kit checks "
                         "only itself; this unibake, not the kit's tool/, then compares with the release's image ID)")
    _key_option(rb)

    rl = command("releases", "the releases in a folder, and whether each still verifies",
                 "List the releases with date, image ID, size, previous release and state (SHA256SUMS; --deep adds "
                 "zstd and structure).")
    rl.add_argument("--out", metavar="DIR", help=PLAIN_OUT_HELP)
    rl.add_argument("--deep", action="store_true", help="also check zstd integrity and the archive's structure")
    rl.add_argument("--check", action="store_true",
                    help="exit 3 when a release does not verify (its state is not 'verifies'), after the list; for "
                         "scripts and CI (without it the list is exit 0 whatever the states)")

    lk = command("lock", "rewrite inputs.lock from the inputs as they are now",
                 "Hash every input the profiles bake in and rewrite profiles/inputs.lock; lists what changed.")
    lk.add_argument("--config", default="profiles", metavar="DIR", help="the profiles folder (default: profiles)")

    pr = command("prune", "remove old release images and build cache from the engine, and the seeded verify engines",
                 "Keep the images of the newest --keep versions of each product under --out (by when each "
                 "version was first released; all platforms and profiles of a version) and the base of every "
                 "kept hotfix; remove the engine's tags of older ones, unibake's "
                 "build cache (unibake-cache/*) and dangling images unibake made, never forced: an image a "
                 "container uses is kept. "
                 "Also remove the seeded verify engines kept in the scratch folder (each a copy of a base image; "
                 "the next release on that base seeds one again), except one a run is using; and what a killed "
                 "run left under --out (.TAG.partial, .TAG.amend, .TAG.old beside TAG), except under a run; and the "
                 "temporary files of writes a killed run left (.inputs.lock.XXXXXXXX.tmp in the profiles folder, "
                 "the rendered copies', the memos' in .cache/ and the user's cache), this user's, unchanged for "
                 f"{ATOMIC_TEMP_AGE // 60} minutes. Release folders are never touched.")
    pr.add_argument("--keep", type=whole_number, default=3, metavar="N", help="versions to keep per product (default 3)")
    pr.add_argument("--out", metavar="DIR", help=OUT_HELP)
    pr.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    pr.add_argument("--scratch-dir", metavar="DIR",
                    help="the scratch folder whose seeded verify engines to remove (default: /var/tmp/unibake-UID)")
    pr.add_argument("--config", metavar="DIR",
                    help="the profiles folder of the project whose temporary files killed writes left to remove "
                         "(default: profiles)")

    ps = command("push", "push a release's image to a registry and record its digest in the release",
                 "Check the release folder, upload its image from the archive over the registry API (no engine needed) "
                 "and record the manifest digest in manifest.json and the notes (a pull line with @sha256:). Pushing "
                 "the same release again uploads nothing and changes nothing.")
    ps.add_argument("folder", metavar="DIR", nargs="+",
                    help="the release folder, e.g. release/1.3.1; several (release/1.3.1 release/1.3.1-arm64: one "
                         "product and version, each of another platform) push each image by its digest and tag an "
                         "OCI image index of them all, from which docker pull takes the engine's own platform")
    ps.add_argument("--to", required=True, metavar="REGISTRY/REPO[:TAG]",
                    help="where to push, e.g. registry.example:5000/team/demo-llm (default tag: the release's name; "
                         "with several folders, their version)")
    ps.add_argument("--compression", choices=("gzip", "zstd"), default="gzip",
                    help="layer compression: gzip (the default; every engine pulls it) or zstd (OCI tar+zstd: "
                         "Docker 23+ and containerd pull it, Engine 20.10 does not)")
    ps.add_argument("--temp-dir", metavar="DIR",
                    help="where compressed layers wait for upload (default: $TMPDIR; room for the compressed image)")
    _signing_options(ps, "a signed release: record the push and sign its new SHA256SUMS again with")
    _registry_options(ps)

    pl = command("pull", "pull a release's image by digest and check its image ID",
                 "Check the registry's manifest for REF@sha256:... against the release (its digest and image ID), let "
                 "the engine pull it by digest, compare the image ID and tag it as the release's tag.")
    pl.add_argument("ref", metavar="REF@sha256:DIGEST", help="what the release's notes give, e.g. "
                                                            "registry.example:5000/demo-llm@sha256:...")
    pl.add_argument("--release", metavar="DIR", help="the release folder to check against (default: the release "
                                                     "under --out whose manifest records this digest)")
    pl.add_argument("--temp-dir", metavar="DIR",
                    help="where the release's layers are compressed again when the registry holds an unrecorded "
                         "push of it (default: $TMPDIR; room for the compressed image)")
    pl.add_argument("--out", metavar="DIR", help=PLAIN_OUT_HELP)
    _pull_deadline_option(pl, "the pull fails (exit 1)")
    _key_option(pl)
    _registry_options(pl)

    d = command("deploy", "load a release onto many engines at once, each checked",
                "Load the release onto every engine in parallel, from its archive or by a pull of its pushed digest; "
                "compare the image ID on each; an engine that already holds it is skipped. Prints a table; goes on past "
                "a failing engine; exit 3 if any failed. The engines are every --engine (before or after the command) "
                "and --hosts; with none of them, DOCKER_HOST.", engine=False)
    d.add_argument("folder", metavar="DIR", help="the release folder, e.g. release/1.3.1")
    d.add_argument("--engine", dest="engines", action="append", default=[], metavar="URL",
                   help="an engine: unix:///path, tcp://host:port or ssh://user@host (repeat for several; one given "
                        "before the command is one of them too; default: DOCKER_HOST when no --engine or --hosts)")
    d.add_argument("--hosts", metavar="FILE", help="a file of engine addresses, one a line (# comments)")
    d.add_argument("--from", dest="source", choices=("archive", "registry"), default="archive",
                   help="load the archive (the default) or pull the digest the release recorded at its push")
    d.add_argument("--ref", metavar="REF@sha256:DIGEST",
                   help="with --from registry: which push to pull (default: the release's latest)")
    d.add_argument("--jobs", type=whole_number, default=4, metavar="N", help="engines worked on at once (default 4)")
    d.add_argument("--engine-timeout", type=whole_number, default=ENGINE_TIMEOUT, metavar="SECONDS",
                   help="how long an engine may say nothing (its answer to a request, the next piece of a load's or "
                        f"a pull's progress) before its row fails (default {ENGINE_TIMEOUT})")
    d.add_argument("--temp-dir", metavar="DIR",
                   help="with --ref: where the release's layers are compressed again when it names a push the release "
                        "does not record (default: $TMPDIR; room for the compressed image)")
    _pull_deadline_option(d, "that engine's row fails (with --from registry)")
    _key_option(d)
    _registry_options(d)
    return p


def _pull_deadline_option(p: argparse.ArgumentParser, then: str) -> None:
    """``--pull-deadline``: an engine's pull held to a time in all (a registry that trickles keeps each of
    its reads within any per-read timeout)."""
    p.add_argument("--pull-deadline", type=whole_number, metavar="SECONDS",
                   help="how long an engine's pull from the registry may take in all (default: no limit; each "
                        "wait for the engine's next word is limited anyway); past it the pull is broken off, nothing "
                        f"is tagged, and {then}")


def _check_pull_deadline(args: argparse.Namespace) -> float | None:
    if args.pull_deadline is not None and not 1 <= args.pull_deadline <= 7 * 86400:
        raise InputError(f"--pull-deadline {args.pull_deadline} is out of range 1..{7 * 86400} (seconds)")
    return args.pull_deadline


def _key_option(p: argparse.ArgumentParser) -> None:
    """``--key`` of a command that reads a downloaded release folder: its SHA256SUMS signed."""
    p.add_argument("--key", metavar="PUBKEY", action=_Once,
                   help="the publisher's public key (armoured OpenPGP or minisign): the release's SHA256SUMS is checked "
                        "against its signature first, as verify --key checks it; absent or wrong is exit 3")


def _registry_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--auth-file", metavar="FILE",
                   help="registry credentials in a Docker config file (default: $DOCKER_CONFIG/config.json, else "
                        "~/.docker/config.json, with its credential helpers)")
    p.add_argument("--ca-file", metavar="FILE", help="the CA certificate of a private registry (TLS is always verified)")
    p.add_argument("--retries", type=whole_number, default=4, metavar="N",
                   help="retries of a registry request after its first attempt, on a connection error, a timeout or a "
                        "5xx answer, waiting 1, 2, 4 ... s before each (default 4: 5 attempts in all; 0: none)")


COMMANDS = ("build", "hotfix", "archive", "repro", "verify", "releases", "lock", "prune", "push", "pull", "deploy",
            "kit", "rebuild")
GLOBAL_OPTIONS = {"--quiet", "-q", "--json", "--metadata-file", "--engine", "-V", "--tool-version"}
VALUE_OPTIONS = {"--metadata-file", "--engine", "--profile", "--version", "--config", "--stage", "--out", "--level",
                 "--split", "--verify-engine", "--scratch-dir", "--allow", "--from", "--tag", "--product", "--keep",
                 "--to", "--compression", "--temp-dir", "--auth-file", "--ca-file", "--retries", "--release", "--hosts",
                 "--ref", "--jobs", "--platform", "--sign", "--sign-minisign", "--key",
                 "--external", "--engine-timeout", "--pull-deadline"}


def with_command(argv: list[str]) -> list[str]:
    """``build`` is the default command: ``build.py --profile tp4`` is ``build.py build --profile tp4``."""
    skip = False
    build_option = False  # an option of build's own before --help: the help asked for is build's
    for token in argv:
        if skip:
            skip = False
        elif token in VALUE_OPTIONS:
            skip = True
            build_option = build_option or token not in GLOBAL_OPTIONS
        elif token in ("-h", "--help", "-V", "--tool-version") and not any(a in COMMANDS for a in argv):
            return ["build", *argv] if build_option and token in ("-h", "--help") else argv
        elif token.startswith("-"):
            build_option = build_option or token.split("=", 1)[0] not in GLOBAL_OPTIONS
        else:
            return argv if token in COMMANDS else ["build", *argv]
    return ["build", *argv]


def check_command_options_after_it(argv: list[str], parser: argparse.ArgumentParser) -> None:
    """A command's own option written before the command (``build.py --keep 2 prune``): argparse would take
    its value for the command and say ``invalid choice: '2'``. Said as what it is; the global options
    (``--json``, ``--engine``, ...) go anywhere."""
    skip, before = False, []
    for token in argv:
        if skip:
            skip = False
        elif token == "--":
            return
        elif token.startswith("-"):
            name = token.split("=", 1)[0]
            if name in ("-h", "--help", "-V", "--tool-version"):
                return
            skip = name in VALUE_OPTIONS and "=" not in token
            if name not in GLOBAL_OPTIONS:
                before.append(name)
        else:
            if token in COMMANDS and before:
                options = {command: {name for action in choice._actions for name in action.option_strings}
                           for sub in parser._actions if isinstance(sub, argparse._SubParsersAction)
                           for command, choice in sub.choices.items()}
                ours = options.get(token, set())
                known = [name for name in before if name in ours]
                if known:
                    raise InputError(f"{known[0]} is an option of '{token}', given before the command: write it "
                                     f"after it, as in: build.py {token} {known[0]} ...")
                # another command's (argparse said "invalid choice: '2'", the option's value taken for the command)
                for name in before:
                    owners = sorted(command for command, names in options.items() if name in names)
                    if owners:
                        raise InputError(f"{name} is not an option of '{token}' (it is an option of "
                                         f"{', '.join(repr(o) for o in owners[:4])}{', ...' if len(owners) > 4 else ''})")
            return


def whole_number(text: str) -> int:
    """argparse's type for a number option: ASCII digits, perhaps a minus (int() took ' 2 ', '1_0' and an
    Arabic-Indic three; the ranges are each option's own check)."""
    if not re.fullmatch(r"-?[0-9]{1,18}", text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number in digits 0-9")
    return int(text)


def parse_size(text: str) -> int:
    """``1900MiB``, ``2GiB``, ``500MB`` or a number of bytes."""
    match = SIZE_RE.match(text.strip())
    if not match:
        raise InputError(f"--split {text!r} is not a size like 1900MiB, 2GiB or 500MB")
    # (Decimal, compared before it is made a whole number: float() made a number of 400 digits infinity, and int()
    # of it an OverflowError's traceback)
    size = Decimal(match.group(1)) * UNITS[(match.group(2) or "b").lower()]
    if size < 1 << 20:
        raise InputError(f"--split {text[:40]!r} is below 1 MiB")
    if size > MAX_SPLIT:
        raise InputError(f"--split {text[:40]!r} is more than 1 PiB, past any archive's size: leave --split out for "
                         "one file")
    return int(size)


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


def _out(args: argparse.Namespace, cwd: Path, *, existing: bool = False) -> Path:
    """The one default for ``--out``: release/ beside the profiles folder. ``existing``: an --out given
    must be a folder (a typo is not "no releases", which would keep no release's image from prune)."""
    if getattr(args, "out", None):
        out = resolved(cwd / args.out)
        if existing and not os.path.isdir(out):  # (Path.is_dir raised EACCES under a folder this user cannot enter)
            # (a file there, or the release folder itself given for its parent, is no typo of a name)
            raise InputError(f"--out {args.out}: " + ("not a folder" if os.path.lexists(out) else
                                                       "cannot read it (Permission denied)" if _unsearchable(out)
                                                       else "no such folder"))
        if existing and not os.access(out, os.R_OK | os.X_OK):  # (a release in it would be silently unlisted)
            raise InputError(f"--out {args.out}: cannot read it (Permission denied)")
        if os.path.isfile(out / "manifest.json") and os.path.isfile(out / "SHA256SUMS"):  # (False when unreadable)
            # a release written in it would sit inside that release (push then refuses it); listed or pruned,
            # "no releases"
            given = posixpath.normpath(args.out)
            parent = (posixpath.dirname(given) or ".") if posixpath.basename(given) not in (".", "..") else \
                str(out.parent)
            raise InputError(f"--out {args.out}: a release folder (it holds manifest.json and SHA256SUMS), not the "
                             f"folder that holds the releases: give its parent, --out {parent}")
        return out
    config = getattr(args, "config", None) or "profiles"  # (prune's is None when not given)
    return resolved(cwd / config).parent / "release"


def _unsearchable(path: Path) -> bool:
    """Whether ``path`` is under a folder this user cannot enter (so whether it exists is unknown)."""
    try:
        os.lstat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _request(args: argparse.Namespace, ctx: Context, **extra):
    """The pipeline's request from the command line, every option checked before anything runs."""
    from .pipeline import Request, git_revision, source_date_epoch
    from .provenance import builder_id
    from .render import RENDERED
    from .sanitise import builder_identity, check_allow

    level = getattr(args, "level", DEFAULT_LEVEL)
    if not 1 <= level <= 19:
        raise InputError(f"--level {level} is out of range 1..19")
    for pattern in getattr(args, "allow", []):
        check_allow(pattern, "--allow")
    builder_id(ctx.env)  # what the provenance will name as its builder: a URI, checked before any work
    if getattr(args, "stage", "release") != "render":  # (the engine is reached first at the build, after the plan)
        from .docker_engine import refuse_docker_context
        refuse_docker_context(getattr(args, "engine", None), ctx.env)
    if getattr(args, "verify_engine", None):  # reached only at the round trip, after the build and the export
        from .deploy import check_address
        check_address(args.verify_engine, "--verify-engine")
        if args.no_roundtrip:  # the one option said to load there, the other that nothing is loaded
            raise InputError("--verify-engine names the engine of the round trip, which --no-roundtrip skips: give "
                             "one of them")
    scratch_dir = ctx.cwd / args.scratch_dir if getattr(args, "scratch_dir", None) else None
    if scratch_dir is not None and not args.no_roundtrip and not args.verify_engine \
            and getattr(args, "stage", "release") == "release":
        _check_scratch_dir(scratch_dir, args.scratch_dir)
    config = Path(getattr(args, "config", "profiles"))
    root = resolved(ctx.cwd / config).parent
    out = _out(args, ctx.cwd)
    if args.command in ("build", "hotfix", "archive") and getattr(args, "stage", "release") == "release":
        problem = unwritable_reason(out, folder=True)
        if problem:  # said before any work (it was found at the release folder, after the plan: exit 1 for most)
            raise InputError(f"--out {args.out}: cannot write the release there ({problem})" if args.out else
                             f"cannot write the release in {out} (the default --out: release/ beside the profiles "
                             f"folder) ({problem}); give --out a folder this user can write")
    request = Request(
        env=ctx.env, cwd=ctx.cwd, config=config, profiles=tuple(getattr(args, "profile", ())),
        version=getattr(args, "version", None), out=out, force=getattr(args, "force", False),
        level=level, long_distance=getattr(args, "long", False),
        split=parse_size(args.split) if getattr(args, "split", None) else None,
        roundtrip=not getattr(args, "no_roundtrip", False), smoke=not getattr(args, "no_smoke", False),
        verify_engine=getattr(args, "verify_engine", None),
        # made absolute from the run's folder: dockerd given a relative --data-root never answers
        scratch_dir=scratch_dir,
        seed=not getattr(args, "no_seed", False),
        engine_save=getattr(args, "engine_save", False),
        allow=tuple(getattr(args, "allow", ())), identity=builder_identity(dict(ctx.env)),
        nocache=getattr(args, "no_cache", False), engine=args.engine,
        epoch=source_date_epoch(root, ctx.env),
        # what runs write: the releases, their sums and the rendered copies (the build renders its own)
        revision=git_revision(root, outputs=(out, out.parent / "checksums", root / RENDERED)),
        platform=_one_platform(args), sign=getattr(args, "sign", None) or None,
        sign_minisign=(ctx.cwd / args.sign_minisign) if getattr(args, "sign_minisign", None) else None,
        metadata_file=_document_file(args, ctx.cwd))
    # (a release made --from an earlier one records that one's epoch, as a hotfix does: no 1970 to warn of)
    if args.command in ("build", "repro") and request.revision == "unknown" and "SOURCE_DATE_EPOCH" not in ctx.env \
            and not extra.get("base"):
        ctx.reporter.warn(f"{root} is not in a git checkout: the image records the time 1970-01-01 "
                          "(SOURCE_DATE_EPOCH=0) and the revision 'unknown'; commit the product to git, or set "
                          "SOURCE_DATE_EPOCH")
    return replace(request, **extra)


def _check_scratch_dir(path: Path, value: str) -> None:
    """``--scratch-dir`` is first used at the round trip, after the build and the export: a file, a
    folder that is not this user's private one (``/tmp``) or one that cannot be made is said now."""
    from .scratch import check_private, open_above

    if os.path.lexists(path):
        try:
            check_private(path)
        except RoundTripUnavailable as exc:  # names the folder: to remove it, or to choose another
            raise InputError(f"--scratch-dir {value}: {exc}") from None
        return
    problem = unwritable_reason(path, folder=True)
    if problem:
        raise InputError(f"--scratch-dir {value}: cannot make it there ({problem})")
    above = open_above(path)
    if above is not None:
        raise InputError(f"--scratch-dir {value}: it would lie under {above}, which another user may write (neither "
                         "this user's nor root's, or open to others without the sticky bit): they could put a folder "
                         "of theirs in its place, where the scratch engine (root's daemon) then writes; choose one "
                         "under folders only this user and root can write")


def _document_file(args: argparse.Namespace, cwd: Path) -> Path | None:
    """The file ``--metadata-file`` names, resolved (None: none, stdout, or a stream written in place)."""
    value = getattr(args, "metadata_file", None)
    if not value or value == "-" or _a_stream(cwd / value):
        return None
    return resolved(cwd / value)


def _one_platform(args: argparse.Namespace) -> str | None:
    """The ``--platform`` of a command that builds one image; None when not given."""
    from .platforms import parse_options

    given = parse_options(getattr(args, "platform", ()))
    if len(given) > 1 and args.command != "build":
        raise InputError(f"--platform: {args.command} builds for one platform, not {len(given)}")
    return given[0].name if len(given) == 1 else None


def _release_outcome(results, title: str) -> Outcome:
    from .templates import gib

    release = results["release"]
    m = release.manifest
    a = m.archive
    rows = [("image", m.tag), ("profiles", ", ".join(m.profiles) or "(none)"), ("platform", m.platform or "(none)"),
            ("release", str(release.folder)),
            ("archive", ", ".join(f.name for f in a.files)),
            ("size", f"{gib(a.bytes)} ({a.bytes} bytes), ratio {release.archive.ratio:.2f}"),
            ("SHA256", a.sha256), ("image ID", m.image_id)]
    v = release.validation
    rows.append(("round trip", "passed" if v.round_trip else f"not run ({v.round_trip_skipped})"))
    rows.append(("smoke gates", ", ".join(f"{g.profile} SKIPPED ({g.skipped})" if g.skipped is not None
                                          else f"{g.profile} {'passed' if g.passed else 'FAILED'}" for g in v.smoke)
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
    from .pipeline import BUILD, SEQUENTIAL, on_earlier, run_stages, selection
    from .plan import product_platforms
    from .platforms import parse_options
    from .targets import run_platforms

    names = SEQUENTIAL if args.sequential else BUILD
    lock = args.stage != "render"  # rendering needs no lock yet
    platforms = parse_options(args.platform)
    if args.base:  # a whole release made on an earlier one: that one is checked and read first
        if args.stage != "release":
            raise InputError(f"--from makes a release on an earlier one; it goes with --stage release, not "
                             f"--stage {args.stage}")
        if len(platforms) > 1:
            raise InputError("--from makes one release on an earlier one of the same platform; give one --platform "
                             "(or none: the earlier release's)")
        request = _request(args, ctx, base=args.base, whole=True, sequential=args.sequential, require_lock=lock)
        return _built_outcome(args, run_stages(selection(("hotfix base",) + names), request, ctx.reporter))
    if not platforms:
        try:
            platforms = product_platforms(resolved(ctx.cwd / args.config), ctx.cwd)
        except InputError:
            platforms = ()  # the plan stage reports it, as for any bad YAML
    if len(platforms) > 1:
        runs = run_platforms(selection(names, args.stage),
                             _request(args, ctx, sequential=args.sequential, require_lock=lock), platforms, ctx.reporter)
        return _several(args, [_built_outcome(args, results) for results in runs])
    request = _request(args, ctx, sequential=args.sequential, require_lock=lock)
    if args.stage == "release" and not args.no_from:
        request, names = on_earlier(request, names)
    return _built_outcome(args, run_stages(selection(names, args.stage), request, ctx.reporter))


def _several(args: argparse.Namespace, outcomes: list[Outcome]) -> Outcome:
    """One outcome of a build for several platforms: every release's rows, and a list of documents."""
    rows = [row for outcome in outcomes for row in outcome.rows]
    key = {"render": "rendered", "build": "images"}.get(args.stage, "releases")
    return Outcome(document={key: [o.document for o in outcomes]}, title=outcomes[0].title, rows=rows,
                   final="; ".join(o.final for o in outcomes))


def _built_outcome(args: argparse.Namespace, results) -> Outcome:
    from .templates import gib

    plan = results["plan"]
    if args.stage == "render":
        context, folder = results["context"], results["rendered"]
        return Outcome(document={"image": plan.tag, "profiles": list(plan.profile_names),
                                 "rendered": str(folder) if folder else None,
                                 "dockerfile_sha256": next(f.sha256 for f in context.files if f.name == "Dockerfile")},
                       title="unibake: rendered", rows=[("image", plan.tag), ("profiles", ", ".join(plan.profile_names)),
                                                        ("platform", plan.platform.name),
                                                        ("rendered", str(folder or "(not written)"))],
                       final=f"rendered {plan.tag}" + (f" in {folder}" if folder else ""))
    if args.stage == "build":
        built, image = results["built"], results["image"]
        rows = [("image", plan.tag), ("profiles", ", ".join(plan.profile_names)), ("platform", image.platform),
                ("image ID", image.image_id),
                ("layers", str(len(image.diff_ids))),
                ("build cache", f"{built.cached_steps} of {len(built.cacheable_steps)} steps reused"),
                ("image size", f"{gib(image.size)} ({image.size} bytes)")]
        return Outcome(document={"image": plan.tag, "image_id": image.image_id, "diff_ids": list(image.diff_ids),
                                 "size": image.size, "profiles": list(plan.profile_names), "platform": image.platform,
                                 "cached_steps": built.cached_steps, "steps": len(built.cacheable_steps)},
                       title="unibake: built", rows=rows, final=f"built {plan.tag} as {image.image_id}")
    return _release_outcome(results, "unibake: released")


def cmd_hotfix(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import HOTFIX, HOTFIX_SEQUENTIAL, run_stages, selection

    request = _request(args, ctx, base=args.base, sequential=args.sequential, assemble=not args.full_build)
    results = run_stages(selection(HOTFIX_SEQUENTIAL if args.sequential else HOTFIX), request, ctx.reporter)
    return _release_outcome(results, "unibake: hotfix released")


def cmd_archive(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .pipeline import ARCHIVE, run_stages, selection
    from .publish import check_tag, release_tag

    by_digest = args.image.startswith("sha256:") or "@" in args.image
    if not (IMAGE_REF_RE.fullmatch(args.image) or re.fullmatch(r"sha256:[0-9a-f]{12,64}", args.image)):
        raise InputError(f"{args.image[:200]!r} is not an image reference (name[:tag][@sha256:digest] or sha256:ID)")
    if by_digest and not (args.tag and args.product):
        raise InputError(f"{args.image} is not a name:tag; give --tag and --product")
    check_tag(args.tag or release_tag(args.image))
    if args.product and not PRODUCT_RE.fullmatch(args.product):  # as product.yaml's product: an image repository's
        raise InputError(f"--product {args.product[:100]!r} is not a product name: lower-case letters and digits, "
                         "with one '.', '_' or '-' between them (an image repository name), at most 64 characters")
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


def _unchecked_signatures(report):
    """A folder that carries signatures, verified without ``--key``: said in the table, so that a
    passed verify is never read as a checked signature."""
    from .publish import SUMS
    from .verify import Check, Report

    present = [n for n in (SUMS + ".asc", SUMS + ".minisig") if (report.folder / n).is_file()]
    if not present:
        return report
    note = Check(name="signature", target=", ".join(present), passed=True,
                 detail="present, not checked: give the publisher's public key with --key")
    return Report(folder=report.folder, checks=(note, *report.checks), manifest=report.manifest)


def cmd_verify(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .plan import display_path
    from .verify import (check_external, check_folder_arg, load_and_compare, verify_folder, verify_signatures,
                         with_signatures)

    folder = check_folder_arg(resolved(ctx.cwd / args.folder))
    if args.load:  # before the folder is read (gigabytes): the engine it would load into is not docker's
        from .docker_engine import refuse_docker_context
        refuse_docker_context(args.engine, ctx.env)
    signed = verify_signatures(folder, ctx.cwd / args.key, ctx.env) if args.key else None
    if signed is not None and signed.failures:
        report = signed
    else:
        report = with_signatures(signed, verify_folder(folder, signed.signed_sums if signed else None,
                                                        progress=ctx.reporter.progress))
        if signed is None:
            report = _unchecked_signatures(report)
    if args.external and not (signed is not None and signed.failures):
        report = check_external(report, [resolved(ctx.cwd / p) for p in args.external])
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
    # what the folder's checks cannot show: a profile released ungated (its smoke.skip; or every profile, when
    # no gate ran, as VALIDATION.json says: --no-smoke, --no-roundtrip)
    not_run = _gates_not_run(folder, signed.signed_sums if signed else None) \
        if report.manifest and report.manifest.profiles else None
    skipped = {name: not_run for name in sorted(report.manifest.profiles)} if not_run else \
        {name: p.smoke.skip for name, p in sorted(report.manifest.profiles.items())
         if p.smoke.skip is not None} if report.manifest else {}
    for name, reason in skipped.items():
        ctx.reporter.warn(f"profile {name} was released without its smoke gate "
                          f"({'no gate ran: ' if not_run else 'smoke.skip: '}{reason})")
    what = f" ({report.manifest.tag}, image {report.manifest.image_id[:19]})" if report.manifest else ""
    final = f"verified {display_path(folder, ctx.cwd)}{what}: {passed} checks passed" if error is None else \
        f"{display_path(folder, ctx.cwd)} does not verify: {len(report.failures)} of {len(report.checks)} checks failed"
    document = report.document()
    if skipped:
        document["smoke_skipped"] = skipped
    return Outcome(document=document, final=final, error=error)


def counted(n: int, one: str, many: str = "") -> str:
    """``1 engine``, ``2 engines``: a count with its noun in the number it needs."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def _gates_not_run(folder: Path, signed_sums: bytes | None = None) -> str | None:
    """Why no smoke gate of a release ran, as its VALIDATION.json says (``smoke_skipped``); None when they
    ran, or the file does not say (absent, unlisted, unreadable: the state column tells of a folder that
    fails). Read as the shell verifier reads it (see :func:`unibake.verify.gates_not_run`)."""
    from .verify import gates_not_run

    return gates_not_run(folder, signed_sums)


def cmd_releases(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .plan import display_path
    from .publish import find_releases
    from .templates import gib
    from .verify import sums_report, verify_folder

    out = _out(args, ctx.cwd, existing=True)
    rows, document = [], []
    releases = find_releases(out)
    states: dict[Path, str] = {}
    for found in releases:
        m = found.manifest
        if m is None:
            continue
        odd = [f.name for f in m.archive.files if not (found.folder / f.name).is_file()]
        if odd and not all(os.path.lexists(found.folder / name) for name in odd):
            states[found.folder] = "archive absent"
        elif odd:  # a FIFO, a folder, a dangling link in its place: there, and not an archive (never opened)
            states[found.folder] = f"FAILS: {odd[0]} is not a regular file"
        else:
            try:
                report = verify_folder(found.folder) if args.deep else sums_report(found.folder, m)
                states[found.folder] = "verifies" if not report.failures else "FAILS: " + "; ".join(
                    f"{c.target} {c.detail}" for c in report.failures[:2])
            except UnibakeError as exc:
                states[found.folder] = f"FAILS: {exc}"
    for found in releases:
        m = found.manifest
        if m is None:
            rows.append([found.folder.name, "", "", "", "", "", f"UNREADABLE: {found.problem}", ""])
            # every row has every key (a script reads r["image_id"] of each): null where unreadable
            document.append({"release": found.folder.name, "folder": found.folder.name, "product": None,
                             "tag": None, "published": None, "first_published": None, "image_id": None,
                             "archive_bytes": None, "previous": None, "state": "unreadable", "smoke_skipped": {},
                             "problem": found.problem})
            continue
        state = states[found.folder]
        if state == "verifies" and m.hotfix is not None:
            # apply.sh and verify --load need the base release's image: without its folder here (or
            # with that folder made again, another image), the hotfix cannot be proven or applied; nor
            # when that folder lacks its archive or fails its checks (the hotfix's archive lacks the
            # base's layers)
            bases = [r.folder for r in releases
                     if r.manifest is not None and r.manifest.image_id == m.hotfix.base_image_id]
            unreadable = next((r for r in releases if r.manifest is None and r.folder.name == m.hotfix.base_release),
                              None)
            if not bases and unreadable is not None:
                state = (f"base does not verify: release {m.hotfix.base_release} ({unreadable.folder.name}/): "
                         f"UNREADABLE: {unreadable.problem}")
            elif not bases:
                state = (f"base absent: no release here holds {m.hotfix.base_release}'s image "
                         f"{m.hotfix.base_image_id[:19]}")
            elif all(states[b] != "verifies" for b in bases):
                state = f"base does not verify: release {m.hotfix.base_release} ({bases[0].name}/): {states[bases[0]]}"
        # a profile released without its gate (its smoke.skip, in the manifest; or every profile, when no gate
        # ran: --no-smoke, --no-roundtrip, as VALIDATION.json records): what the folder's own checks cannot show
        not_run = _gates_not_run(found.folder) if m.profiles else None
        skipped = {name: not_run for name in sorted(m.profiles)} if not_run else \
            {name: p.smoke.skip for name, p in sorted(m.profiles.items()) if p.smoke.skip is not None}
        for name, reason in skipped.items():
            ctx.reporter.warn(f"release {m.release}: profile {name} was released without its smoke gate "
                              f"({'no gate ran: ' if not_run else 'smoke.skip: '}{reason})")
        named = m.release
        if found.folder.name != m.release:  # a folder copied or renamed: two rows of one release, or a name that
            # --from, push and kit take for another release
            named = f"{m.release} (in {found.folder.name}/)"
            ctx.reporter.warn(f"release folder {found.folder.name}/ holds release {m.release} (its manifest.json): "
                              f"what takes a release by its folder's name (--from {found.folder.name}) takes "
                              f"{m.release}; name the folder {m.release}, or remove it")
        rows.append([named, m.product, m.published, m.image_id[:19], gib(m.archive.bytes),
                     m.previous or "", state, ", ".join(skipped)])
        document.append({"release": m.release, "folder": found.folder.name, "product": m.product, "tag": m.tag,
                         "published": m.published,
                         "first_published": m.first_release, "image_id": m.image_id,
                         "archive_bytes": m.archive.bytes, "previous": m.previous, "state": state,
                         "smoke_skipped": skipped, "problem": None})
    where = display_path(out, ctx.cwd)
    columns = ["release", "product", "published", "image ID", "archive", "previous", "state", "gates skipped"]
    if not any(r.get("smoke_skipped") for r in document):  # every gate ran (the usual case): no empty column
        columns.pop()
        rows = [row[:7] for row in rows]
    if len({r["product"] for r in document if r["product"]}) < 2:
        # one product under --out (the usual case): its name would repeat on every row
        columns.pop(1)
        rows = [row[:1] + row[2:] for row in rows]
    if rows:
        ctx.reporter.table(f"releases in {where}", columns, rows)
    # (named as the table names them: two folders of one release are told apart)
    failing = [r["release"] if r["folder"] == r["release"] else f"{r['release']} (in {r['folder']}/)"
               for r in document if r["state"] != "verifies"]
    final = f"no releases under {where}" if not rows else \
        f"{counted(len(rows), 'release')} under {where}; {len(rows) - len(failing)} " \
        f"{'verifies' if len(rows) - len(failing) == 1 else 'verify'}"
    error = VerificationError(f"{counted(len(failing), 'release')} under {where} "
                              f"{'does' if len(failing) == 1 else 'do'} not verify: {', '.join(failing[:5])}"
                              + (", ..." if len(failing) > 5 else "")) if args.check and failing else None
    return Outcome(document={"folder": str(out), "releases": document}, final=final, error=error)


def cmd_lock(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .inputs import LOCK_FILE, read_lock, render_lock
    from .plan import display_path, make_plan, product_platforms
    from .platforms import KNOWN, host

    config = resolved(ctx.cwd / args.config)
    # every platform's inputs: a prebuilt kernel may be another file on another platform. The
    # platforms the product builds must plan; another one that cannot (its base given by tag while
    # base.require_digest is set, say) is left out of the lock with a warning, not a failure.
    declared = product_platforms(config, ctx.cwd, declared=True)
    builds = declared or (host(),)
    inputs = {}
    for platform in sorted(KNOWN.values(), key=lambda p: p not in builds):
        try:
            plan = make_plan(config, cwd=ctx.cwd, verify_lock=False, platform=platform)
        except InputError as exc:
            if platform in builds:
                raise
            if not declared:  # (a product that names its platforms is not built for another: nothing to say)
                ctx.reporter.warn(f"{platform.name} is not locked (the product does not build it by default): {exc}")
            continue
        inputs.update({f.path: f for f in plan.inputs})
    lock_path = config / LOCK_FILE
    display = display_path(lock_path, ctx.cwd)
    try:
        old = read_lock(lock_path, display)
    except InputError as exc:  # a lock left conflicted by a merge: this command is how it is made again
        if not lock_path.is_file():  # a folder or a FIFO in its place: not ours to replace
            raise
        ctx.reporter.warn(f"the old lock cannot be read, so it is written anew: {exc}")
        old = None
    before = old.digests if old else {}
    after = {path: f.sha256 for path, f in inputs.items()}
    changed = {"added": sorted(set(after) - set(before)), "removed": sorted(set(before) - set(after)),
               # a file made (not) executable changed too, when the old lock recorded modes
               "changed": sorted(p for p in set(after) & set(before)
                                 if after[p] != before[p] or old.mode_differs(inputs[p]))}
    folder, name = config, LOCK_FILE
    if lock_path.is_symlink():  # a lock kept elsewhere in the folder and linked: written there, the link kept
        real = lock_path.resolve()
        if not real.is_relative_to(config.resolve()):
            raise InputError(f"{display}: a symlink that points outside the profiles folder (to {real}); the lock "
                             "must live in the folder")
        # found by probing: a link to tp1.yaml (which reads as no lock) had the lock written over the profile
        if old is None or real.suffix.lower() in (".yaml", ".yml"):
            raise InputError(f"{display}: a symlink to {display_path(real, ctx.cwd)}, which is not a lock (it does "
                             "not read as one); nothing written: remove the link, then run build.py lock again")
        folder, name = real.parent, real.name
    try:  # the lock's own mode kept (a read-only lock stays read-only); a new one is 0644
        mode = os.stat(folder / name).st_mode & 0o777 if old is not None else 0o644
    except OSError:
        mode = 0o644
    write_atomic(folder, name, render_lock(sorted(inputs.values(), key=lambda f: f.path)), mode=mode)
    for label in ("added", "changed", "removed"):
        for path in changed[label]:
            ctx.reporter.info(f"  {label}: {path}")
    final = (f"{display}: {len(after)} inputs ({len(changed['added'])} added, {len(changed['changed'])} changed, "
             f"{len(changed['removed'])} removed)")
    return Outcome(document={"lock": str(lock_path), "inputs": len(after), **changed}, final=final)


def _temporary_places(config: Path, given: bool, env: Mapping[str, str]):
    """Where unibake writes files through a temporary one (files.write_atomic), and which: the project's (when
    ``config`` is a profiles folder; one ``given`` that is not is exit 2) and the user's cache."""
    from .assemble import CONFIGS, FOLDERS, RECORDS
    from .digestmemo import FOLDER as DIGESTS
    from .framememo import FOLDER as FRAMES
    from .inputs import LOCK_FILE
    from .pipeline import BUILD_MEMO, NORMALISED, sanitise_cache
    from .profiles import PRODUCT_FILE
    from .prune import Place
    from .render import RENDERED, RENDERED_FILES

    places = []
    if os.path.isfile(config / PRODUCT_FILE):
        root = config.parent
        places.append(Place(folder=config, top=config, names=frozenset({LOCK_FILE})))
        try:
            selections = sorted(os.listdir(root / RENDERED)) if not os.path.islink(root / RENDERED) else []
        except OSError:  # none rendered yet
            selections = []
        places += [Place(folder=root / RENDERED / name, top=root, names=frozenset(RENDERED_FILES))
                   for name in selections]
        places += [Place(folder=root / memo, top=root) for memo in (BUILD_MEMO, NORMALISED)]
        # (the layers' records and the configs an assembled hotfix takes: unibake.assemble)
        places += [Place(folder=root / BUILD_MEMO / records, top=root)
                   for records in (RECORDS, CONFIGS, FOLDERS, DIGESTS, FRAMES)]
    elif given:
        raise InputError(f"--config {config}: no {PRODUCT_FILE} there: give the profiles folder of the project")
    cache = sanitise_cache(env)
    if cache is not None:  # the sanitisation gate's memos, and the build memos' key (written under its pid's name)
        places.append(Place(folder=cache, top=cache.parent.parent))
        places.append(Place(folder=cache.parent, top=cache.parent.parent,
                            pattern=re.compile(r"^\.(?P<name>build-memo\.key)\.[0-9]+\.tmp$")))
    return places


def cmd_prune(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .docker_engine import DockerEngine
    from .prune import prune, remove_leftovers, remove_temporary_files
    from .scratch import check_private, prune_seeds

    if args.keep < 0:
        raise InputError(f"--keep {args.keep} must be 0 or more")
    out = _out(args, ctx.cwd, existing=True)
    places = _temporary_places(resolved(ctx.cwd / (args.config or "profiles")), args.config is not None,
                               ctx.env)  # before any work
    scratch = (ctx.cwd / args.scratch_dir) if args.scratch_dir else Path("/var/tmp") / f"unibake-{os.geteuid()}"
    try:
        if scratch.exists() or scratch.is_symlink():
            check_private(scratch)  # before any work
    except RoundTripUnavailable as exc:  # names the folder and says to remove it or choose --scratch-dir
        raise InputError(str(exc)) from None
    removed = prune(DockerEngine(args.engine, ctx.env), out, keep=args.keep, dry_run=args.dry_run,
                    on_line=ctx.reporter.info, on_warning=ctx.reporter.warn)
    seeds = prune_seeds(scratch, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    leftovers = remove_leftovers(out, dry_run=args.dry_run)
    for folder in leftovers:
        ctx.reporter.info(f"    {verb} {folder} (left by a run that was killed before it ended)")
    temporary = remove_temporary_files(places, dry_run=args.dry_run)
    for path in temporary:
        ctx.reporter.info(f"    {verb} {path} (the temporary file of a write a killed run left, unchanged for "
                          f"{ATOMIC_TEMP_AGE // 60} minutes or more)")
    for seed in seeds:
        held = f"holds the base image {seed.base_id}" if seed.base_id else "never seeded to the end"
        ctx.reporter.info(f"    {'kept (a run is using it)' if seed.busy else verb} the seeded verify engine "
                          f"{seed.folder} ({held})")
    gone = [s for s in seeds if not s.busy]
    kept, removed = [r for r in removed if r.kept], [r for r in removed if not r.kept]
    return Outcome(document={"dry_run": args.dry_run, "removed": [{"image": r.ref, "why": r.why} for r in removed],
                             "kept": [{"image": r.ref, "why": r.why, "kept": r.kept} for r in kept],
                             "seeds": [{"folder": str(s.folder), "base_image": s.base_id or None, "removed": not s.busy
                                        and not args.dry_run} for s in seeds],
                             "leftovers": [str(f) for f in leftovers],
                             "temporary_files": [str(f) for f in temporary]},
                   final=f"{verb} {counted(len(removed), 'image or tag', 'images or tags')} and "
                         f"{counted(len(gone), 'seeded verify engine')}"
                         + (f" and {counted(len(leftovers), 'folder')} left by killed runs" if leftovers else "")
                         + (f" and {counted(len(temporary), 'temporary file')} left by killed writes" if temporary
                            else "")
                         + (f"; kept {len(kept)} that a container, another image or a run uses" if kept else ""))


def _check_signed_by(folder: Path, signer, ctx: Context, what: str, manifest) -> tuple[bytes, tuple[str, ...]]:
    """A signed release is signed again (push recording its digest) only over a good signature by
    the very keys given: otherwise a folder changed after it was signed (its sums rewritten to
    match) would come out freshly signed, and verify. Returns SHA256SUMS as its signatures were
    checked (what the amend then reads, not the file again) and the keys of its co-signatures by
    keys not given (signing it again drops them: only the given keys sign the new one)."""
    import tempfile

    from .signing import public_keys
    from .verify import comment_checks, verify_signatures

    checked: set[bytes] = set()
    cosigners: list[str] = []
    with tempfile.TemporaryDirectory(prefix="unibake-keys-") as temp:
        for key in public_keys(signer, Path(temp)):
            signed = verify_signatures(folder, key, ctx.env)
            bad = signed.failures or [c for c in comment_checks(signed, manifest) if not c.passed]
            if bad:
                raise VerificationError(f"{bad[0].target}: {bad[0].detail}; {what} is signed again only over a good "
                                        "signature by the same key (was the folder changed after it was signed?)")
            checked.add(signed.signed_sums or b"")
            cosigners += [k for k in signed.cosigners if k not in cosigners]
    if len(checked) != 1:
        raise VerificationError(f"{folder}/SHA256SUMS changed while its signatures were checked")
    return checked.pop(), tuple(cosigners)


@dataclass
class _PushFolder:
    """One release folder of a push, checked before anything leaves it."""

    folder: Path
    named: Path  # the folder as given (a link's own name: its lock, its record)
    manifest: ReleaseManifest
    signed: list[str]  # its signature files
    signed_sums: bytes | None = None
    cosigners: tuple[str, ...] = ()


def _push_folder(given_arg: str, signer, ctx: Context) -> _PushFolder:
    from .amend import check_keepable
    from .publish import SUMS
    from .signing import ASC, MINISIG, check_signer
    from .verify import check_folder_arg, verify_folder

    given = ctx.cwd / given_arg
    folder = check_folder_arg(resolved(given))
    # a link (release/1.0 -> /mnt/big/1.0): the release is the name given too (its lock, its record)
    named = resolved(given.parent) / given.name if given.name not in ("", ".", "..") and given.is_symlink() else folder
    with ctx.reporter.stage("verify", f"{given_arg}, before anything leaves it"):
        report = verify_folder(folder, progress=ctx.reporter.progress)
        report.raise_if_failed()
        check_keepable(folder)  # before the upload: recording it would drop what is not a file
    m = report.manifest
    found = _PushFolder(folder=folder, named=named, manifest=m,
                        signed=[n for n in (SUMS + ASC, SUMS + MINISIG) if (folder / n).exists()])
    if signer is not None:
        check_signer(signer, m.supply_chain.signatures if m.supply_chain else (), f"release {m.release}")
        found.signed_sums, found.cosigners = _check_signed_by(folder, signer, ctx, f"release {m.release}", m)
    return found


def _same_product_other_platforms(found: list[_PushFolder], args: argparse.Namespace) -> None:
    """Several folders make one image index: the same product and version, each of another platform."""
    first = found[0].manifest
    for f in found[1:]:
        m = f.manifest
        if (m.product, m.version) != (first.product, first.version):
            raise InputError(f"{args.folder[0]} is {first.product} {first.version} and {f.named} is {m.product} "
                             f"{m.version}: one push of several folders makes one image index, of the releases of "
                             "one product and version for several platforms")
    platforms = [f.manifest.platform for f in found]
    twice = next((p for p in platforms if platforms.count(p) > 1), None)
    if twice:
        named = [str(f.named) for f in found if f.manifest.platform == twice]
        raise InputError(f"{named[0]} and {named[1]} are both {twice}: an image index holds one image per platform")


def _index_tag(target, found: list[_PushFolder]) -> str:
    """The tag of the image index several folders make: ``--to``'s, else the releases' version, which must then be a
    tag (a version from an image's label is free text: ``1.0 beta`` was refused by the record, after the upload)."""
    from .manifest import TAG_PATTERN

    tag = target.tag or found[0].manifest.version
    if not re.fullmatch(TAG_PATTERN, tag):
        raise InputError(f"the image index would be tagged {tag!r}, the releases' version, which is no registry tag: "
                         f"give one, as --to {target.repository}:TAG")
    return tag


def _refuse_a_folder_twice_or_another_release(args: argparse.Namespace, ctx: Context, target) -> None:
    """Before the folders are verified (minutes for big archives): one given twice, and, as their manifests say
    before they are checked, another product, version or the same platform (checked again once they verify)."""
    from .manifest import load_manifest
    from .verify import check_folder_arg

    seen: dict[Path, str] = {}
    for given in args.folder:
        folder = check_folder_arg(resolved(ctx.cwd / given))
        if folder in seen:
            raise InputError(f"push: the release folder {folder} is given twice ({seen[folder]} and {given})")
        seen[folder] = given
    try:
        manifests = [load_manifest(folder) for folder in seen]
    except (UnibakeError, ValueError, OSError):
        return  # (the verify that follows says what is wrong with it)
    unchecked = [_PushFolder(folder=f, named=f, manifest=m, signed=[]) for f, m in zip(seen, manifests)]
    _same_product_other_platforms(unchecked, args)
    _index_tag(target, unchecked)


def cmd_push(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .amend import amend_release
    from .registry import RegistryClient, merge_record, parse_reference, push_index, push_release
    from .publish import SUMS
    from .signing import ASC, check_keys
    from .verify import read_sums

    target = parse_reference(args.to, what="--to", digest=False)
    settings = _registry_settings(args, ctx, target.host)
    temp_dir = _existing_dir(ctx.cwd, args.temp_dir, "--temp-dir")
    signer = check_keys(args.sign, (ctx.cwd / args.sign_minisign) if args.sign_minisign else None, ctx.env)
    several = len(args.folder) > 1
    if several:
        _refuse_a_folder_twice_or_another_release(args, ctx, target)
    found = [_push_folder(given, signer, ctx) for given in args.folder]
    _temp_dir_outside(temp_dir, args.temp_dir, [f.folder for f in found])
    if several:
        _same_product_other_platforms(found, args)
    index_tag = _index_tag(target, found) if several else None
    # where a push cannot be recorded (a read-only share, another user's folder): said now, and the push goes on
    # without its record (it uploaded first, then failed to record, naming only a lock file)
    # (the real folder's parent: its lock and the new folder made beside it, then exchanged; a link's own folder, a
    # shared link farm, may be another user's)
    unrecordable = {f.folder: why for f in found if (why := unwritable_reason(f.folder.parent, folder=True))}
    for f in found:
        if f.folder in unrecordable:
            ctx.reporter.warn(f"release {f.manifest.release}: the push cannot be recorded in {f.named} "
                              f"({unrecordable[f.folder]}); it is pushed, and its reference said, without its record")
    results, index = [], ""
    with RegistryClient(target, push=True, on_retry=ctx.reporter.warn, **settings) as client:
        for f in found:
            m = f.manifest
            where = f"{target.repository}@sha256:... ({m.platform}; the index {index_tag} after)" if several else \
                f"{target.repository}:{target.tag or m.release}"
            with ctx.reporter.stage("push", f"{m.tag} to {where}, {args.compression} layers"):
                results.append(push_release(f.folder, m, target, client, compression=args.compression,
                                            temp_dir=temp_dir, index_tag=index_tag, on_line=ctx.reporter.info,
                                            on_warning=ctx.reporter.warn, progress=ctx.reporter.progress))
        if several:
            with ctx.reporter.stage("index", f"{target.repository}:{index_tag}, naming "
                                             f"{', '.join(str(f.manifest.platform) for f in found)}"):
                index, _ = push_index(client, target, index_tag, results, ctx.reporter.warn)
    documents, rows = [], []
    for f, result in zip(found, results):
        m = f.manifest
        record = result.record.model_copy(update={"index": index}) if index else result.record
        updated = merge_record(m, record)
        if updated is not None and f.signed and signer is None:
            # recording would change SHA256SUMS under its signatures: the folder stays as it was signed
            ctx.reporter.warn(f"release {m.release} is signed ({', '.join(f.signed)}): the push is not recorded in it, "
                              f"so its SHA256SUMS and signatures stay valid; pull it by {record.reference} (to record "
                              "it, push again with the keys it was signed with: --sign / --sign-minisign)")
            updated = None
        if updated is not None and f.folder in unrecordable:
            updated = None
            ctx.reporter.warn(f"release {m.release}: not recorded ({unrecordable[f.folder]}); pull it by "
                              f"{record.reference}")
        if updated is not None:
            sign = (lambda path, data, m=m: signer.sign(path, f"{m.product} {m.release} {path.name}", data)) \
                if signer else None
            if sign and f.cosigners:  # they signed the old SHA256SUMS: the new one is signed by the keys given alone
                ctx.reporter.warn(f"{SUMS}{ASC} of release {m.release} is co-signed by {', '.join(f.cosigners)}, whose "
                                  f"key was not given: recording the push signs the new {SUMS} with the keys given "
                                  "only, so that co-signature is dropped; ask its holder to sign the new one again")
            with ctx.reporter.stage("record", f"the digest in {m.release}'s manifest.json, notes and SHA256SUMS" +
                                    (", signed again" if sign else "")):
                try:
                    amend_release(f.folder, updated, read_sums(f.folder, f.signed_sums if signer else None),
                                  f.named.parent.parent / "checksums", sign=sign, was=m, named=f.named,
                                  on_warning=ctx.reporter.warn)
                except OSError as exc:  # (the upload is done: what to pull it by is said with the failure)
                    raise UnibakeError(f"pushed as {record.reference}, but not recorded in {f.named}: "
                                       f"{exc.filename or f.named}: {exc.strerror}") from None
        else:
            ctx.reporter.skipped("record", f"release {m.release} already records this push")
        rows += [("image", m.tag), ("image ID", m.image_id), ("pushed to", f"{record.repository}:{record.tag}"
                                                                           + (" (the index)" if index else "")),
                 ("digest", record.digest), ("layers", f"{record.layers}: {result.uploaded} uploaded "
                                                       f"({result.uploaded_bytes} bytes), {result.present} already "
                                                       "there"),
                 ("pull", record.reference)]
        documents.append({"release": m.release, "folder": str(f.folder), "image_id": m.image_id,
                          **record.model_dump(mode="json"), "uploaded": result.uploaded,
                          "already_present": result.present, "uploaded_bytes": result.uploaded_bytes,
                          "tag_names": result.tagged, "recorded": updated is not None,
                          "signed_again": updated is not None and signer is not None})
    if not several:
        m = found[0].manifest
        return Outcome(document=documents[0], title="unibake: pushed", rows=rows,
                       final=f"pushed {m.tag} as {documents[0]['reference']}")
    rows.append(("index", f"{target.repository}:{index_tag} = {target.repository}@{index} "
                          f"({', '.join(str(f.manifest.platform) for f in found)})"))
    return Outcome(document={"index": {"reference": f"{target.repository}@{index}", "repository": target.repository,
                                       "tag": index_tag, "digest": index}, "releases": documents},
                   title="unibake: pushed", rows=rows,
                   final=f"pushed {', '.join(f.manifest.tag for f in found)} as {target.repository}:{index_tag} "
                         f"(image index {index})")


def _own_platform(ref, m, ctx: Context):
    """``ref``, or, where it is the image index ``m``'s release was pushed under with the releases of its other
    platforms, the digest of ``m``'s own image in it (``pull`` and ``deploy --from registry --ref``)."""
    from .registry import parse_reference

    if any(r.digest == ref.digest for r in m.registry):
        return ref
    record = next((r for r in reversed(m.registry) if r.index == ref.digest and r.repository == ref.repository), None)
    if record is None:
        return ref
    ctx.reporter.info(f"{ref.pinned} is the image index release {m.release} was pushed under with the releases of its "
                      f"other platforms: pulling its {m.platform} image {record.digest}")
    return parse_reference(record.reference, what=f"release {m.release}'s record", digest=True)


def cmd_pull(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .docker_engine import DockerEngine, refuse_docker_context
    from .registry import (RegistryClient, check_remote, find_release_by_digest, find_release_by_index,
                           parse_reference, pull_into)
    from .verify import check_folder_arg, check_signed, trusted_manifest

    ref = parse_reference(args.ref, what="the reference", digest=True)
    deadline = _check_pull_deadline(args)
    refuse_docker_context(args.engine, ctx.env)  # before the registry is asked
    engine = None
    if args.release:
        folder = check_folder_arg(resolved(ctx.cwd / args.release))
    else:
        out = _out(args, ctx.cwd)
        folder = find_release_by_digest(out, ref.digest)
        if folder is None:
            # an image index several platforms' releases were pushed under: the release of the engine's platform
            def engine_platform() -> tuple[str, str]:  # asked only when a release records that index
                nonlocal engine
                engine = DockerEngine(args.engine, ctx.env)
                return engine.platform(), engine.address
            folder = find_release_by_index(out, ref, engine_platform)
        if folder is None:
            raise InputError(f"no release under {out} records a push of {ref.digest}; name the release it should be "
                             "with --release DIR")
    m = check_signed(folder, ctx.cwd / args.key, ctx.env)[1] if args.key else trusted_manifest(folder)
    ref = _own_platform(ref, m, ctx)
    temp_dir = _existing_dir(ctx.cwd, args.temp_dir, "--temp-dir")
    _temp_dir_outside(temp_dir, args.temp_dir, [folder])
    settings = _registry_settings(args, ctx, ref.host)

    def engine_first() -> None:  # an engine that is not there is said before minutes of compression, not after
        nonlocal engine
        engine = engine or DockerEngine(args.engine, ctx.env)

    with ctx.reporter.stage("check", f"{ref.pinned} against release {m.release}"):
        with RegistryClient(ref, on_retry=ctx.reporter.warn, **settings) as client:
            info = check_remote(ref, m, client, folder=folder, temp_dir=temp_dir, progress=ctx.reporter.progress,
                                before_recompress=engine_first)
    engine = engine or DockerEngine(args.engine, ctx.env)
    with ctx.reporter.stage("pull", f"into the engine at {engine.address}"), \
            ctx.reporter.progress(f"pull {m.tag}", info.layer_bytes or None) as advance:
        image_id = pull_into(engine, ref, m, info, settings["credentials"], warn=ctx.reporter.warn,
                             deadline=deadline, progress=advance, on_clear=ctx.reporter.warn)
    return Outcome(document={"reference": ref.pinned, "release": m.release, "folder": str(folder), "image_id": image_id,
                             "tag": m.tag, "engine": engine.address},
                   title="unibake: pulled", rows=[("pulled", ref.pinned), ("engine", engine.address),
                                                  ("image ID", f"{image_id} (release {m.release}: the same)"),
                                                  ("tagged", m.tag)],
                   final=f"pulled {ref.pinned}: image {image_id}, as release {m.release} records; tagged {m.tag}")


def cmd_deploy(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .deploy import Plan, check_address, deploy, engines_of, raise_if_failed, read_hosts, same_engine
    from .docker_engine import DockerEngine, docker_context
    from .plan import display_path
    from .registry import RegistryClient, check_remote, parse_reference, pull_into
    from .verify import (check_folder_arg, check_signed, trusted_manifest, verify_folder, verify_signatures,
                         with_signatures)

    folder = check_folder_arg(resolved(ctx.cwd / args.folder))
    if args.jobs < 1:
        raise InputError(f"--jobs {args.jobs} must be 1 or more")
    if not 1 <= args.engine_timeout <= 86400:
        raise InputError(f"--engine-timeout {args.engine_timeout} is out of range 1..86400 (seconds)")
    deadline = _check_pull_deadline(args)
    # (as given: resolved, `--hosts <(...)`'s /dev/fd/63 became /proc/PID/fd/pipe:[N], said to be missing)
    hosts = read_hosts(ctx.cwd / args.hosts) if args.hosts else []
    # every engine named is a target: an --engine before the command (the global option) as well as
    # those after it, the same engine once (tcp://h:1 and tcp://h:1/ are one); DOCKER_HOST, as for
    # every command, only when none is named
    named: dict[str, str] = {}
    for address in [*([args.engine] if getattr(args, "engine", None) else []), *args.engines]:
        named.setdefault(same_engine(check_address(address, "--engine")), address)
    named = list(named.values())
    from_env = not named and not hosts and bool(ctx.env.get("DOCKER_HOST"))
    if from_env:
        named = [check_address(ctx.env["DOCKER_HOST"], "DOCKER_HOST")]
    elif not named and not hosts and docker_context(ctx.env):  # docker's engine is the context's: not read here
        raise InputError(f"deploy needs at least one engine: --engine URL (repeat it), --hosts FILE or DOCKER_HOST; "
                         f"{docker_context(ctx.env)} is docker's, and unibake reads no docker contexts (docker "
                         "context inspect shows its address)")
    addresses = engines_of(named, hosts, args.hosts)
    if args.source == "archive":
        if args.ref or args.temp_dir or deadline is not None:
            given = '--ref' if args.ref else '--temp-dir' if args.temp_dir else '--pull-deadline'
            raise InputError(f"{given} goes with --from registry")
        with ctx.reporter.stage("verify", "the folder, before any engine loads it"):
            signed = verify_signatures(folder, ctx.cwd / args.key, ctx.env) if args.key else None
            if signed is not None:
                signed.raise_if_failed()
            report = with_signatures(signed, verify_folder(folder, signed.signed_sums if signed else None,
                                                           progress=ctx.reporter.progress))
            report.raise_if_failed()
        plan = Plan(folder=folder, manifest=report.manifest, source="archive", counter=ctx.reporter.counter)
    else:
        m = check_signed(folder, ctx.cwd / args.key, ctx.env)[1] if args.key else trusted_manifest(folder)
        if args.ref:
            ref = _own_platform(parse_reference(args.ref, what="--ref", digest=True), m, ctx)
        elif m.registry:
            last = m.registry[-1]
            ref = parse_reference(last.reference, what=f"{folder}/manifest.json registry", digest=True)
        else:
            raise InputError(f"release {m.release} records no push: run 'build.py push {args.folder} --to "
                             "REGISTRY/REPO' first, or deploy --from archive")
        settings = _registry_settings(args, ctx, ref.host)
        temp_dir = _existing_dir(ctx.cwd, args.temp_dir, "--temp-dir")
        _temp_dir_outside(temp_dir, args.temp_dir, [folder])
        with ctx.reporter.stage("check", f"{ref.pinned} against release {m.release}"):
            with RegistryClient(ref, on_retry=ctx.reporter.warn, **settings) as client:
                # one it did not record: as pull
                info = check_remote(ref, m, client, folder=folder, temp_dir=temp_dir, progress=ctx.reporter.progress)
        plan = Plan(folder=folder, manifest=m, source="registry", counter=ctx.reporter.counter,
                    pull_bytes=info.layer_bytes or None,
                    pull=lambda engine, stop, advance: pull_into(engine, ref, m, info, settings["credentials"],
                                                                 stop=stop, deadline=deadline, progress=advance,
                                                                 on_clear=ctx.reporter.warn))
    m = plan.manifest
    with ctx.reporter.stage("deploy", f"{m.tag} to {counted(len(addresses), 'engine')} from the {args.source}"):
        # DOCKER_HOST's engine is reached with its TLS settings (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) too
        results = deploy(plan, addresses, lambda address: DockerEngine(None if from_env else address, ctx.env,
                                                                       timeout=args.engine_timeout,
                                                                       timeout_option="--engine-timeout"),
                         jobs=args.jobs,
                         on_result=lambda r: ctx.reporter.info(f"    {r.engine}: {r.result}"))
    ctx.reporter.table(f"deploy {m.tag} ({m.image_id[:19]}...) from the {args.source}",
                       ["engine", "time", "result", "detail"],
                       [[r.engine, f"{r.seconds:.1f} s", r.result.upper() if r.failed else r.result, r.detail]
                        for r in results])
    error = None
    try:
        raise_if_failed(results)
    except UnibakeError as exc:
        error = exc
    failed = sum(r.failed for r in results)
    document = {"release": m.release, "folder": str(folder), "image_id": m.image_id, "tag": m.tag,
                "source": args.source, "failed": failed,
                "engines": [{"engine": r.engine, "result": r.result, "seconds": r.seconds, "detail": r.detail,
                             "image_id": r.image_id} for r in results]}
    where = display_path(folder, ctx.cwd)
    final = f"deployed {where} to {counted(len(results), 'engine')}" if not failed else \
        f"deploy of {where}: {failed} of {len(results)} engines failed"
    return Outcome(document=document, final=final, error=error)


def _existing_dir(cwd: Path, value: str | None, option: str) -> Path | None:
    if not value:
        return None
    path = resolved(cwd / value)
    if not os.path.isdir(path):  # (Path.is_dir raised a name too long: exit 1, "File name too long")
        raise InputError(f"{option} {value[:200]}: not a folder")
    return path


def _temp_dir_outside(temp_dir: Path | None, value: str | None, folders: Sequence[Path]) -> None:
    """A ``--temp-dir`` in a release folder the command reads is refused: the compressed layers waited in it, and
    after a kill they stayed there, a folder the release does not list, which every later push refused."""
    for folder in folders:
        if temp_dir is not None and (temp_dir == folder or folder in temp_dir.parents):
            raise InputError(f"--temp-dir {value}: inside the release folder {folder}, which holds only the "
                             "release's files; give a folder outside it")


def _registry_settings(args: argparse.Namespace, ctx: Context, host: str) -> dict:
    """The credentials, CA and retries for one registry host, from the command line and the Docker config."""
    from .registry import Retry, load_credentials

    if args.retries < 0 or args.retries > 20:
        raise InputError(f"--retries {args.retries} is out of range 0..20")
    auth_file = ca_file = None
    if args.auth_file:
        auth_file = resolved(ctx.cwd / args.auth_file)
    if args.ca_file:
        ca_file = resolved(ctx.cwd / args.ca_file)
        if not ca_file.is_file():
            raise InputError(f"--ca-file {args.ca_file}: no such file")
        try:  # a file that holds no certificate verifies nothing: said so here, not as the registry's fault
            ssl.create_default_context(cafile=str(ca_file))
        except (ssl.SSLError, ValueError) as exc:
            raise InputError(f"--ca-file {args.ca_file}: no CA certificate in it (PEM, what 'openssl x509' writes): "
                             f"{one_line(str(getattr(exc, 'reason', None) or exc))[:100]}") from None
    # without --ca-file, requests takes the CA bundle these name (the first set): one that is not there was said
    # only after the compression, as 'a file: Could not find a suitable TLS CA certificate bundle'
    variable = next((v for v in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if os.environ.get(v)), None)
    if ca_file is None and variable is not None:
        bundle = os.environ[variable]
        if not os.path.isfile(bundle) and not os.path.isdir(bundle):
            raise InputError(f"{variable}={one_line(bundle)[:200]} (from the environment): no such file or folder; "
                             f"unset it, or give --ca-file")
    return {"credentials": load_credentials(host, ctx.env, auth_file), "ca_file": ca_file,
            "retry": Retry(attempts=1 + args.retries)}  # --retries counts the tries after the first


def cmd_kit(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .kit import kit_for_release
    from .plan import display_path
    from .verify import check_folder_arg, check_signed

    folder = check_folder_arg(resolved(ctx.cwd / args.folder))
    out = resolved(ctx.cwd / args.out)
    problem = unwritable_reason(out, folder=True)
    if problem:  # before the kit is rendered and checked, and named as the option, not as an OSError
        raise InputError(f"--out {args.out}: cannot write the kit there ({problem})")
    # a downloaded folder's SHA256SUMS is what vouches for its manifest and provenance: signed, with --key
    signed_sums = check_signed(folder, ctx.cwd / args.key, ctx.env)[0] if args.key else None
    written, published = kit_for_release(folder, resolved(ctx.cwd / args.config), out, ctx.cwd, signed_sums)
    same = published == written.file.sha256  # one that is not was refused before it took the kit's name
    verdict = "identical to the published kit" if same else "the release published none"
    path = display_path(out / written.file.name, ctx.cwd)
    return Outcome(document={"kit": str(out / written.file.name), "sha256": written.file.sha256,
                             "bytes": written.file.bytes, "context_sha256": written.context_sha256,
                             "published_sha256": published, "identical": same},
                   title="unibake: kit", rows=[("kit", path), ("sha256", written.file.sha256),
                                               ("build context", f"{written.context_sha256} (the release's)"),
                                               ("published", verdict)],
                   final=f"wrote {path}: {verdict}")


def _published_after() -> str:
    """What an error after the commit adds to its line: the release published whole stands (a clean-up that
    failed after it, a scratch engine's stop, is no failure of the release). Empty when nothing was committed."""
    from .publish import COMMITTED

    if not COMMITTED:
        return ""
    if len(COMMITTED) == 1:
        return f" after {COMMITTED[0]} was published whole (check it: python build.py verify {COMMITTED[0]})"
    return (f" after {' and '.join(str(path) for path in COMMITTED)} were published whole (check them: "
            f"{'; '.join(f'python build.py verify {path}' for path in COMMITTED)})")


def _other_version(folder: str, made_by: str) -> InputError:
    """A kit another unibake made: its normalise is not this one's, so another image ID would say nothing of the
    release."""
    return InputError(f"{folder}: a kit made by unibake {made_by}, this is {__version__}: rebuild it with its own copy "
                      "(./verify.sh --rebuild runs tool/), as `build.py kit` needs the release's version too")


def cmd_rebuild(args: argparse.Namespace, ctx: Context) -> Outcome:
    from .docker_engine import DockerEngine, refuse_docker_context
    from .errors import VerificationError
    from .kit import check_kit, check_kit_of_release, read_kit, rebuild
    from .plan import display_path

    from .verify import check_folder_arg, check_signed, trusted_manifest

    folder = resolved(ctx.cwd / args.folder)
    if not folder.is_dir():
        raise InputError(f"{args.folder}: not a folder (give the unpacked kit)")
    if (folder / "manifest.json").is_file() and not (folder / "kit.json").exists():
        kits = sorted(p.name for p in folder.glob("*-kit.tar.zst"))
        # unpacked beside it, as the notes say (a folder in a release folder is refused by push)
        # quoted: the names are the folder's (a downloaded release's), and the command is there to be pasted
        unpack = (f"unpack its kit (`mkdir kit && zstd -dc {shlex.quote(posixpath.join(args.folder, kits[0]))} | "
                  f"tar -x -C kit`) and rebuild {shlex.quote('kit/' + kits[0].removesuffix('.tar.zst'))}") if kits else \
            f"write its kit with `build.py kit {args.folder} --out DIR`, unpack it there and rebuild the folder that gives"
        raise InputError(f"{args.folder}: a release folder, not a kit: {unpack}")
    if not (folder / "kit.json").exists():
        # the folder a -kit.tar.zst was unpacked in: the tarball holds one folder, <product>-<release>-kit/
        inner = sorted(p.name for p in folder.glob("*-kit") if p.is_dir() and (p / "kit.json").is_file())
        if inner:
            raise InputError(f"{args.folder}: the folder a kit was unpacked in, not the kit: its tarball holds the "
                             f"folder {inner[0]}/; rebuild {display_path(folder / inner[0], ctx.cwd)}")
        # the folder `build.py kit --out DIR` wrote: the kit's tarball, not yet unpacked
        packed = sorted(p.name for p in folder.glob("*-kit.tar.zst") if p.is_file())
        if packed:
            tarball = posixpath.join(args.folder, packed[0])
            inside = posixpath.join(args.folder, packed[0].removesuffix(".tar.zst"))
            raise InputError(f"{args.folder}: holds the kit's tarball, not an unpacked kit: unpack it (`zstd -dc "
                             f"{shlex.quote(tarball)} | tar -x -C {shlex.quote(args.folder)}`) and rebuild "
                             f"{shlex.quote(inside)}")
        if not os.path.lexists(folder / "kit.sha256"):  # no kit at all (an empty folder, a typo): the wrong argument,
            raise InputError(f"{args.folder}: not a kit (it holds neither kit.json nor kit.sha256); give the folder "
                             "of an unpacked kit (<product>-<release>-kit/)")  # not a kit that fails its check
    if args.key and not args.release:
        raise InputError("--key goes with --release DIR: a kit is not signed, its release's SHA256SUMS is")
    refuse_docker_context(args.engine, ctx.env)  # (before the kit is hashed whole)
    released, signed_sums = None, None
    if args.release:  # what the kit says it rebuilds must be the release's image, by the release's own word
        where = check_folder_arg(resolved(ctx.cwd / args.release))
        signed_sums, released = check_signed(where, ctx.cwd / args.key, ctx.env) if args.key else \
            (None, trusted_manifest(where))
    try:  # refused before its files are hashed (a context of many GB): kit.json alone says which tool made it
        made_by = read_kit(folder).tool.version
    except UnibakeError:
        made_by = __version__  # (what is wrong with it, check_kit says)
    if made_by != __version__:
        raise _other_version(args.folder, made_by)
    kit = check_kit(folder)
    if released is not None and (kit.product, kit.release, kit.image_id) != \
            (released.product, released.release, released.image_id):
        raise VerificationError(f"{args.folder}: a kit of {kit.product} {kit.release}, image {kit.image_id}; the "
                                f"release in {args.release} is {released.product} {released.release}, image "
                                f"{released.image_id}: not its kit")
    if released is not None:  # and built from the release's own context, as its provenance records it
        check_kit_of_release(folder, kit, where, released, signed_sums)
    if kit.tool.version != __version__:  # (checked: the kit.json read above may have changed since)
        raise _other_version(args.folder, kit.tool.version)
    engine = DockerEngine(args.engine, ctx.env)
    with ctx.reporter.stage("rebuild", f"{display_path(folder, ctx.cwd)} on engine {engine.version()} at "
                                       f"{engine.address}"):
        result = rebuild(folder, engine, record=kit, on_line=ctx.reporter.build_line,
                         progress=ctx.reporter.progress)
    record = result.record
    expected = released.image_id if released is not None else record.image_id
    matches = result.matches and result.image.image_id == expected
    error = None if matches else VerificationError(
        f"the kit of {record.tag} rebuilt to {result.image.image_id}, not the released {expected}")
    verdict = "identical" if matches else "DIFFERENT"
    # what the rebuild leaves in the engine, said: the rebuilt tag and its build cache (`prune` removes both)
    cache = [("build cache", f"{', '.join(result.cached)} (build.py prune removes it)")] if result.cached else []
    return Outcome(document={"release": record.release, "tag": record.tag, "released": expected,
                             "rebuilt": result.image.image_id, "rebuilt_ref": result.ref, "identical": matches,
                             "build_cache": list(result.cached)},
                   title="unibake: rebuild", rows=[("release", f"{record.tag} ({record.release})"),
                                                   ("released", expected), ("rebuilt", result.image.image_id),
                                                   ("tagged", result.ref), *cache, ("image ID", verdict)],
                   final=f"rebuilt {record.tag}: {verdict} image ID", error=error)


HANDLERS: dict[str, Callable[[argparse.Namespace, Context], Outcome]] = {
    "build": cmd_build, "hotfix": cmd_hotfix, "archive": cmd_archive, "repro": cmd_repro, "verify": cmd_verify,
    "releases": cmd_releases, "lock": cmd_lock, "prune": cmd_prune, "push": cmd_push, "pull": cmd_pull,
    "deploy": cmd_deploy, "kit": cmd_kit, "rebuild": cmd_rebuild}


# ---------------------------------------------------------------------------------------------
# main


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_interrupts: list[int] = []  # the signals this run has had
_argv: list[str] = []  # the command line, for the error document of one the parser refused


def _terminate(signum, frame):
    """The first SIGINT, SIGTERM or SIGHUP ends the run as Ctrl-C does: the scratch engine stopped,
    partial files removed, the tag put back. The second arrives while that clean-up runs (a held
    Ctrl-C, a supervisor's second TERM): cut short, it would leave the scratch engine running, so
    it is let be, and said so. A third stops the clean-up too (a wait that would not end: a load
    into a slow engine), as SIGKILL would, leaving what it had not removed yet."""
    _interrupts.append(signum)
    if len(_interrupts) == 2:
        print("warning: still cleaning up after the interrupt (the scratch engine, partial files); interrupt "
              "once more to stop at once and leave them", file=sys.stderr)
        return
    raise KeyboardInterrupt


def _refused_line_options() -> tuple[bool, str | None, str]:
    """``--json``, a well-formed ``--metadata-file`` and ``--config`` of a command line the parser refused,
    read from the options themselves (after "--", a value, not an option; the last one counts, as
    argparse has it)."""
    options = _argv[:_argv.index("--")] if "--" in _argv else _argv
    given: dict[str, str | None] = {"--metadata-file": None, "--config": None}
    for i, token in enumerate(options):
        for option in given:
            if token == option:
                given[option] = options[i + 1] if i + 1 < len(options) else None
            elif token.startswith(f"{option}="):
                given[option] = token.split("=", 1)[1]
    metadata, config = given["--metadata-file"], given["--config"]
    if metadata is not None and (not metadata or metadata.startswith("-") and metadata != "-"):
        metadata = None  # missing or an option in its place: what the parser refused, not a path to write
    return "--json" in options, metadata, config if config and not config.startswith("-") else "profiles"


def _emit_error(args: argparse.Namespace | None, message: str, code: int, cwd: Path) -> None:
    """A failed run's document, ``{"error": ..., "exit_code": ...}``: on stdout with ``--json``, in
    the ``--metadata-file`` too (never a failure of its own: the run's error is the one to report)."""
    if args is None:  # the command line itself was refused: its --json and --metadata-file still count
        as_json, metadata_file, config = _refused_line_options()
    else:
        as_json, metadata_file = getattr(args, "json", False), getattr(args, "metadata_file", None)
        config = getattr(args, "config", None) or "profiles"  # (resolved where a failure is caught)
    text = json.dumps({"error": visible_name(message), "exit_code": code}, indent=2) + "\n"
    if metadata_file and not (metadata_file == "-" and as_json) and \
            not (as_json and _is_stdout(cwd / metadata_file)):  # (stdout holds one document)
        try:
            # an error said before the file was checked (a refused option, an engine address): a tune cache the
            # lock pins, given for it, was replaced by the error's document, and the next build refused
            _write_metadata(metadata_file, text, cwd, resolved(cwd / config))
        except (UnibakeError, BrokenPipeError):
            pass
    if as_json:
        try:
            _write_stdout(text)  # its failure is not the run's: that error is said already
        except BrokenPipeError:
            pass


def _write_stdout(text: str) -> str | None:
    """``text`` written to stdout and flushed; why it could not be (stdout closed, a full disk), or None.
    A pipe closed by its reader (head) is not an error of ours: BrokenPipeError goes on up."""
    if sys.stdout is None:  # started with stdout closed (>&-)
        return "stdout is closed"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:  # (ValueError: a stdout closed by a library)
        try:  # what its buffer still holds goes nowhere, not into a second failure (and a traceback) at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            sys.stdout = open(os.devnull, "w")
        if isinstance(exc, BrokenPipeError):
            raise
        return getattr(exc, "strerror", None) or str(exc)
    return None


def _check_metadata_file(args: argparse.Namespace, cwd: Path) -> None:
    """A ``--metadata-file`` that cannot be written is said before any work: found only at the end,
    it would fail a run that had published its release."""
    value = getattr(args, "metadata_file", None)
    if value == "-" and getattr(args, "json", False):  # two documents on stdout, one after the other
        args.metadata_file = None  # (the error's document goes to stdout once, as --json has it)
        raise InputError("--metadata-file - writes the document to stdout, where --json writes it too: give one of "
                         "them")
    if value == "-":
        return  # stdout, as docker buildx --metadata-file - has it
    if value and getattr(args, "json", False) and _is_stdout(cwd / value):  # /dev/stdout, /dev/fd/1: the same
        args.metadata_file = None
        raise InputError(f"--metadata-file {value} is stdout, where --json writes the document too: give one of "
                         "them")
    if value and _a_stream(cwd / value):
        return  # /dev/stdout, a pipe: written as it is, at the end
    problem = unwritable_reason(resolved(cwd / value)) if value else None
    if problem:
        args.metadata_file = None  # the failure's document is not tried there either
        raise InputError(f"--metadata-file {value}: cannot write it there ({problem})")
    kept = _not_a_document(resolved(cwd / value), _config_folder(args, cwd)) if value else None
    if kept:
        args.metadata_file = None
        raise InputError(f"--metadata-file {value}: {kept}")


DOCUMENT_LIMIT = 64 << 20


def _not_a_document(path: Path, config: Path | None = None) -> str | None:
    """Why the file at ``path`` is not replaced by the run's document, or None: a file there is replaced only
    when empty or an earlier document (a JSON object). `--metadata-file profiles/tp1.yaml` replaced the
    profile with the run's document (a failed run's error too), as it did the inputs lock or a baked source.
    A JSON object is no earlier document either where it is a release's file (listed in the ``SHA256SUMS``
    beside it: the release's manifest.json) or an input the lock of ``config`` (the profiles folder) pins
    (a tune cache)."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # none there (or unreadable: written, or said as it fails)
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return None
    try:
        if info.st_size > DOCUMENT_LIMIT:
            raise ValueError
        with open(path, "rb") as f:
            document = json.loads(f.read(DOCUMENT_LIMIT + 1))
    except (OSError, ValueError, RecursionError):
        document = None
    if not isinstance(document, dict):
        return ("a file there holds no JSON document, so it is no earlier run's document and is not replaced "
                "(an input, a profile or a lock would be lost); give another path, or remove that file first")
    if _listed_in_sums(path):
        return ("a file there is a release's file (listed in the SHA256SUMS beside it), so it is no earlier run's "
                "document and is not replaced (the release would no longer verify); give another path")
    pinned = _pinned_input(path, config) if config is not None else None
    if pinned:
        return (f"a file there is an input {pinned} pins (baked into the image), so it is no earlier run's document "
                "and is not replaced; give another path")
    return None


def _listed_in_sums(path: Path) -> bool:
    """Whether a ``SHA256SUMS`` beside ``path`` lists it (read as sha256sum reads it; one that does not read
    lists nothing)."""
    from .sums import parse_sums
    try:
        with open(path.parent / "SHA256SUMS", "rb") as f:
            text = f.read(DOCUMENT_LIMIT).decode("utf-8")
        return any(e.name == path.name for e in parse_sums(text, "SHA256SUMS", UnibakeError))
    except (OSError, ValueError, UnibakeError):
        return False


def _pinned_input(path: Path, config: Path) -> str | None:
    """The inputs lock of ``config`` (shown as the user would name it), when it pins ``path``; else None."""
    from .inputs import LOCK_FILE, read_lock
    try:
        rel = path.relative_to(config.parent).as_posix()
        digests = read_lock(config / LOCK_FILE, LOCK_FILE).digests
    except (ValueError, OSError, UnibakeError):
        return None  # outside the project, or no lock that reads: nothing it pins
    return f"{config.name}/{LOCK_FILE}" if rel in digests else None


def _config_folder(args: argparse.Namespace, cwd: Path) -> Path:
    """The profiles folder a command names (``--config``; default ``profiles``), resolved."""
    return resolved(cwd / (getattr(args, "config", None) or "profiles"))


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` is the file stdout writes to (``/dev/stdout``, ``/dev/fd/1``, the pipe or the file
    stdout is)."""
    try:
        here, out = os.stat(path), os.fstat(1)
    except (OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def _a_stream(path: Path) -> bool:
    """Whether ``path`` is a character device or a pipe (``/dev/stdout``, ``/dev/stderr``, a FIFO):
    written in place, not replaced by a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _write_metadata(value: str, text: str, cwd: Path, config: Path | None = None) -> None:
    if value == "-":  # stdout (a file named "-" is ./-)
        problem = _write_stdout(text)
        if problem:
            raise UnibakeError(f"--metadata-file -: cannot write the document to stdout ({problem})")
        return
    try:
        if _a_stream(cwd / value):
            with open(cwd / value, "w") as out:
                out.write(text)
        else:
            path = resolved(cwd / value)
            kept = _not_a_document(path, config)  # (the file may have come since the run's start)
            if kept:
                raise UnibakeError(f"--metadata-file {value}: {kept}")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path.parent, path.name, text)
    except OSError as exc:
        raise UnibakeError(f"--metadata-file {value}: cannot write ({exc.strerror})") from None


def _visible(value):
    """``value`` (a document) with every text as every JSON reader takes it: a name the file system gave
    that is not UTF-8 (a folder ``caf\\xe9``) would be a lone surrogate escape (``\\udce9``), which
    strict readers refuse."""
    if isinstance(value, str):
        return visible_name(value)
    if isinstance(value, dict):
        return {_visible(k): _visible(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_visible(v) for v in value]
    return value


def _emit_document(args: argparse.Namespace, document: dict, cwd: Path) -> None:
    """The run's document: the --metadata-file first, so that a failure to write it leaves stdout
    with only the error's document (one JSON document, always)."""
    text = json.dumps(_visible(document), indent=2, sort_keys=False) + "\n"
    if getattr(args, "metadata_file", None):
        _write_metadata(args.metadata_file, text, cwd, _config_folder(args, cwd))
    if getattr(args, "json", False):
        problem = _write_stdout(text)
        if problem:
            raise UnibakeError(f"--json: cannot write the JSON document to stdout ({problem})")


def _check_empty_values(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """A value given empty (an unset CI variable: ``--key "$PUBKEY"``) is refused: several options
    would take it as not given (no signature check, an unsigned release, the default folder) and
    paths would mean the current folder."""
    actions = list(parser._actions)  # argparse has no public list of a parser's arguments
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and args.command in action.choices:
            actions += action.choices[args.command]._actions
    for action in actions:
        value = getattr(args, action.dest, None)
        if value == "" or (isinstance(value, list) and "" in value):
            name = max(action.option_strings, key=len) if action.option_strings else action.metavar or action.dest
            raise InputError(f"{name} given empty (an unset variable?): give a value, or leave it out")


def _given_options(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action, str]]:
    """Every option of a parsed command line as it was given, in order: (its name, its action, its value or "").
    The top parser's options before the command, the command's after it; nothing after "--"."""
    def by_name(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
        return {name: action for action in p._actions for name in action.option_strings}

    options, command = by_name(parser), None
    given: list[tuple[str, argparse.Action, str]] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            break
        name, _, value = token.partition("=") if token.startswith("--") else (token, "", "")
        action = options.get(name)
        if action is None:
            if command is None and not token.startswith("-"):  # the command: its own options from here
                for sub in parser._actions:
                    if isinstance(sub, argparse._SubParsersAction) and token in sub.choices:
                        command, options = token, by_name(sub.choices[token])
            continue
        if action.nargs != 0 and "=" not in token:  # (argparse took the next token as its value)
            value = next(tokens, "")
        given.append((max(action.option_strings, key=len), action, value))
    return given


def _check_given_once(given: list[tuple[str, argparse.Action, str]]) -> None:
    """An option that takes one value, given twice, is refused: argparse keeps the last silently (a CI
    line that adds ``--out`` to one that has it, ``--stage`` twice, ``--engine`` before and after the
    command). Options said to repeat (``--profile``, ``--allow``, ...) and flags are not concerned."""
    seen: dict[str, tuple[str, str]] = {}
    for name, action, value in given:
        if action.nargs == 0 or isinstance(action, (argparse._AppendAction, argparse._ExtendAction)):
            continue
        if action.dest in seen:
            first = seen[action.dest][1]
            raise InputError(f"{name} given twice ({first[:100]!r} and {value[:100]!r}): the first would be ignored "
                             "without a word; give it once (only an option whose help says to repeat it takes several)")
        seen[action.dest] = (name, value)


# build's options that only a run writing a release uses (what --stage render|build leaves out: the archive,
# the round trip, the smoke gates, the signatures), and those --stage render leaves unused too (it builds nothing)
RELEASE_ONLY = {"--sign": "signs the release", "--sign-minisign": "signs the release",
                "--split": "shapes the release's archive", "--level": "shapes the release's archive",
                "--long": "shapes the release's archive", "--no-roundtrip": "skips the release's round trip",
                "--no-smoke": "skips the release's smoke gates", "--no-seed": "chooses the round trip's engine",
                "--verify-engine": "chooses the round trip's engine",
                "--sequential": "chooses how the release's archive and round trip are made",
                "--no-from": "chooses what the release is made on",
                "--engine-save": "chooses how the release's archive reads the image",
                "--scratch-dir": "is where the round trip's scratch engine keeps its data"}
BUILD_ONLY = {"--force": "lets a run replace a release or move a released tag", "--no-cache": "is the build's",
              "--engine": "names the engine that builds the image",
              "--out": "is the folder of the releases (--stage build checks there that it moves no released tag)"}
# the commands that reach no engine: the global --engine, taken and ignored there, would let a CI line believe it
# worked on that engine (verify reaches one only with --load; build's --stage render is said with the stages)
NO_ENGINE = {"releases": "it reads the release folders", "lock": "it hashes the profiles' inputs",
             "kit": "it writes the kit from the release folder and the checkout",
             "push": "it uploads the image from the release's archive over the registry's API"}


def _check_unused_options(args: argparse.Namespace, given: list[tuple[str, argparse.Action, str]]) -> None:
    """An option the run would take and then not use is refused, naming what it contradicts (a CI line
    with ``--stage build --sign KEY`` signed nothing, without a word)."""
    names = [name for name, _, _ in given]
    if "--engine" in names and args.command in NO_ENGINE:
        raise InputError(f"--engine with {args.command}: {args.command} reaches no engine ({NO_ENGINE[args.command]}); "
                         "leave out --engine")
    if "--engine" in names and args.command == "verify" and not args.load:
        raise InputError("--engine with verify: verify reaches an engine only with --load (the archive loaded there "
                         "and its image ID compared); add --load, or leave out --engine")
    if args.command == "build" and args.stage != "release":
        unused = {**RELEASE_ONLY, **(BUILD_ONLY if args.stage == "render" else {})}
        name = next((n for n in names if n in unused), None)
        if name is not None:
            what = "writes no release" if args.stage == "build" else "builds nothing"
            raise InputError(f"{name} with --stage {args.stage}: {name} {unused[name]}, and --stage {args.stage} "
                             f"{what}; leave out one of them")
    if getattr(args, "no_from", False) and args.base:
        raise InputError(f"--no-from with --from {args.base}: --from names the release this one is made on, --no-from "
                         "makes it on none; leave out one of them")
    if getattr(args, "no_seed", False):  # the seeded verify engine is the one-pass round trip's (export) alone
        if args.command == "archive":
            raise InputError("--no-seed with archive: archive's round trip always loads the archive into an empty "
                             "engine, never a seeded one; leave out --no-seed")
        other = "--no-roundtrip" if args.no_roundtrip else "--verify-engine" if args.verify_engine else \
            "--sequential" if args.sequential else None
        if other:
            raise InputError(f"--no-seed with {other}: --no-seed chooses the one-pass round trip's engine, and with "
                             f"{other} " + ("no round trip runs" if other == "--no-roundtrip" else
                                            "it loads into that engine" if other == "--verify-engine" else
                                            "the round trip always starts an empty engine") +
                             "; leave out one of them")
    if getattr(args, "scratch_dir", None) and args.command != "prune":  # (prune's is the seeded engines' folder)
        other = "--no-roundtrip" if args.no_roundtrip else "--verify-engine" if args.verify_engine else None
        if other:  # (--stage render|build is said above)
            raise InputError(f"--scratch-dir with {other}: --scratch-dir is where the round trip's scratch engine "
                             f"keeps its data, and with {other} " +
                             ("no round trip runs" if other == "--no-roundtrip" else
                              "the round trip loads into that engine, none is started") + "; leave out one of them")
    registry = next((n for n in names if n in ("--auth-file", "--ca-file", "--retries")), None)
    if args.command == "deploy" and args.source == "archive" and registry:  # (the default --from)
        raise InputError(f"{registry} with --from archive: {registry} is for the registry a pull reaches, and --from "
                         "archive loads the release's archive, asking no registry; leave out one of them (or give "
                         "--from registry)")
    if args.command == "deploy" and args.source == "registry" and args.temp_dir and not args.ref:
        raise InputError("--temp-dir with --from registry goes with --ref: the release's own recorded push is "
                         "pulled as it is, nothing is compressed again; leave out --temp-dir")
    if args.command == "pull" and args.release and args.out:
        raise InputError("--out with --release: --out is where pull looks for the release recording the digest, and "
                         "--release names that release; leave out one of them")


def _check_engine_address(address: str) -> None:
    """The global ``--engine``, as docker-py would read it (what :class:`DockerEngine` checks when made)."""
    from .docker_engine import parse_address

    problem = parse_address(address)
    if problem:
        raise InputError(f"--engine {address[:100]!r} is not an engine address: {problem}")


class _StderrThatCannotFail:
    """The process's stderr, whose failure to take a line (a full disk, ``2>/dev/full``) is not the run's: from
    then on fd 2 is /dev/null and the run ends with its own exit code (before: the OSError of a warning or of the
    error line itself became a traceback no one saw, and exit 1)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._to_null()

    def _to_null(self) -> None:
        try:  # what the stream's buffer still holds is flushed at exit: into /dev/null, not a second failure
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            self._stream = open(os.devnull, "w")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _stderr_that_cannot_fail() -> None:
    """A run started with stderr closed (``2>&-``) or full: its human output, the error line too, goes to
    /dev/null, and the run goes on to its own exit code (2 for bad input, not 1: Python's ``sys.stderr`` was
    None, and the reporter failed on it) and its ``--json`` document. A closed fd 2 is taken by /dev/null, not
    left to a file opened later (whatever a child process writes to its stderr would go into it). Only the
    process's own stderr: a caller's (pytest's capture) is left as it is."""
    if sys.stderr is None:
        try:
            os.fstat(2)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            if null != 2:
                os.dup2(null, 2, inheritable=True)
                os.close(null)
            else:
                os.set_inheritable(2, True)
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)
    elif sys.stderr is sys.__stderr__:
        sys.stderr = _StderrThatCannotFail(sys.stderr)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
    from .publish import COMMITTED

    _stderr_that_cannot_fail()

    argv = list(sys.argv[1:] if argv is None else argv)
    _argv[:] = argv
    COMMITTED.clear()
    previous = {}
    cwd = cwd or Path.cwd()
    args = None
    reporter = None
    try:  # from the handlers on: an interrupt while the rest is imported is "error: interrupted" too
        if threading.current_thread() is threading.main_thread():
            _interrupts.clear()
            for sig in _SIGNALS:  # SIGINT too: a run started with it ignored (a CI's background job) still stops
                previous[sig] = signal.signal(sig, _terminate)
        if env is None:
            from .signing import SECRETS

            env = dict(os.environ)
            for name in SECRETS:  # every child we start inherits os.environ: the secrets reach only the signing tools
                os.environ.pop(name, None)
        reporter = Reporter(env=env)
        parser = build_parser()
        check_command_options_after_it(list(argv), parser)
        try:
            args = parser.parse_args(with_command(argv))
        except SystemExit as exc:  # --help and -V print and end here
            return int(exc.code or 0)
        reporter = Reporter(env=env, quiet=args.quiet)
        given = _given_options(with_command(argv), parser)
        _check_given_once(given)
        _check_unused_options(args, given)
        _check_empty_values(args, parser)  # before any work
        if getattr(args, "engine", None):  # said now, not once the engine is reached (verify --load: after the
            _check_engine_address(args.engine)  # whole archive was read; pull: after the registry was asked)
        _check_metadata_file(args, cwd)
        outcome = HANDLERS[args.command](args, Context(env=env, cwd=cwd, reporter=reporter))
        if outcome.title:
            reporter.summary(outcome.title, outcome.rows, outcome.final)
        elif outcome.error is None:
            reporter.final(outcome.final)
        document = outcome.document
        if outcome.error is not None:  # a failed check's report, with what every failure's document holds
            document = {**document, "error": one_line(str(outcome.error)), "exit_code": outcome.error.exit_code}
        try:
            _emit_document(args, document, cwd)
        except BrokenPipeError:  # stdout's reader has gone (head): not an error of ours, and the verdict stands
            sys.stdout = open(os.devnull, "w")
        except UnibakeError as exc:  # the work is done (a release published, a push recorded): said, not left unsaid
            if len(COMMITTED) == 1:
                done = f"{COMMITTED[0]} was published whole (check it: python build.py verify {COMMITTED[0]})"
            elif COMMITTED:
                done = f"{' and '.join(str(path) for path in COMMITTED)} were published whole"
            elif outcome.error is not None:  # its verdict kept, and its exit code
                done = f"the {args.command} command itself failed: {outcome.error}"
            else:
                done = f"the {args.command} command itself succeeded (said above)"
            error = UnibakeError(f"{exc}; {done}")
            error.exit_code = outcome.error.exit_code if outcome.error is not None else exc.exit_code
            error.said_published = True  # (the line below adds it once)
            raise error from None
        if outcome.error is not None:  # the document (a failed verify's report) is out; then the verdict
            print(f"error: {one_line(str(outcome.error))}", file=sys.stderr)
            return outcome.error.exit_code
        return 0
    except UnibakeError as exc:
        # the tail of the build's output, which a terminal's progress bar hid (plain output printed it line by
        # line as it came: twice would bury the error under a copy of the log)
        if isinstance(exc, (BuildFailed, CheckFailed)) and exc.output and reporter is not None and \
                not reporter.quiet and not reporter.plain:
            print("    " + "\n    ".join(one_line(line) for line in exc.output), file=sys.stderr)
        # a clean-up's error after the commit (a scratch engine's stop): the release stands, said
        message = str(exc) + ("" if getattr(exc, "said_published", False) else _published_after())
        print(f"error: {one_line(message)}", file=sys.stderr)
        if isinstance(exc, DocumentPlaceRefused):
            args.metadata_file = None  # (the file it names is one the run must not replace: the failure's neither)
        _emit_error(args, message, exc.exit_code, cwd)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        message = "interrupted" + (f": {exc}" if str(exc) else "")  # what it had done (deploy says so)
        # the commit held the signal until it was whole: the release stands, say so
        message += _published_after()
        print(f"error: {one_line(message)}", file=sys.stderr)
        _emit_error(args, message, 130, cwd)
        return 130
    except BrokenPipeError:  # output piped into head: not an error of ours
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as exc:  # a file or folder the stages did not expect to fail: named, never a traceback
        message = f"{exc.filename or 'a file'}: {exc.strerror or exc}" + _published_after()
        print(f"error: {one_line(message)}", file=sys.stderr)
        _emit_error(args, message, 1, cwd)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
