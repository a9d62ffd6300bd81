"""The reconstruct kit: ``<product>-<tag>-kit.tar.zst``, everything needed to rebuild a release's
image and check that it is the one released.

    <product>-<tag>-kit/
      Dockerfile         the rendered Dockerfile (the one in context.tar: verify.sh and the rebuild check it)
      context.tar        the build context exactly as it was sent to the engine (same bytes)
      inputs.lock        the ledger of every baked input
      profiles/*.yaml    the profiles it was rendered from (their paths from the project root)
      tool/              unibake itself at the release's version: the package, build.py, the pins
      kit.json           the release: image ID, diffIDs, SOURCE_DATE_EPOCH, revision, base, builder and
                         the kernels' other builder images (toolchains) by ID
      README.md          what this is
      verify.sh          ./verify.sh checks every file against kit.sha256; --rebuild rebuilds and compares
      kit.sha256         the kit's own ledger (sha256sum format)

Why the tool travels with the kit: the image ID depends on the normalise stage, which rewrites the
built image (times set to ``SOURCE_DATE_EPOCH``, the config's build traces removed); a plain
``docker build`` of the context gives another ID every time. The rebuild (``build.py rebuild``,
run by ``verify.sh --rebuild`` from the kit's own copy of unibake in a virtual environment made from
its pins) builds ``context.tar`` on the engine at hand with the release's build arguments, without
the cache, normalises it with the release's epoch, and compares the image ID with ``kit.json``'s.
The base, builder and toolchain images must be in that engine with the IDs the release was built
on; the rebuild refuses before building when they are not.

The kit is deterministic (the folders, then ``Dockerfile`` and ``context.tar``, then the rest sorted;
fixed owners, times set to the epoch, zstd with workers, whose frames are the same bytes for any
number of workers from 1 up; each context file of 4 MiB or more a frame of its own, indexed at the
end in a skippable frame: ``kitframes.py``, through which a hotfix's kit copies its base release's
frames of the large files that did not change), so ``build.py kit RELEASE_DIR --out DIR`` writes, from the checkout,
a kit byte for byte equal to the one published, after checking the checkout's inputs and profiles
against the release's provenance.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import io
import os
import posixpath
import re
import secrets
import stat
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Literal

import zstandard
from pydantic import Field, ValidationError

from . import __version__
from .archive import LDM_WINDOW_LOG
from .builder import MAX_EPOCH, BuiltImage, Image, cache_ref, iso_time, keep_as_cache
from .engine import Engine
from .errors import BuildFailed, BuildInterrupted, DiskFull, HandoffAborted, InputError, UnibakeError, VerificationError
from .files import fsync_dir, open_new, read_small_file, read_small_text, visible_name
from .inputs import LOCK_FILE, sha256_file
from .kitframes import FRAME_MIN, Cut, Framer, Reusable, open_reusable
from .manifest import TAG_PATTERN, Tool
from .metadata import DIGEST, HEX64, Digest, Document, Record, first_error
from .plan import INSTALL_ROOT, ReleasePlan
from .publish import held_signals
from .render import (BuildContext, context_file_chunks, context_tar_layout, tar_header, tar_info, tar_padding,
                     tar_end)
from .schema import IMAGE_REF_RE, SHA256_RE as HEX64_RE
from .sbom import BaseImage
from .sums import parse_sums, render_sums
from .templates import render_template
from .threads import Thread

KIT_JSON = "kit.json"
LEDGER = "kit.sha256"
CONTEXT = "context.tar"
SCHEMA = 1
KIT_REPOSITORY = "unibake-kit"  # the rebuilt image's tag: never the release's own, which it must not move
PACKAGE = Path(__file__).resolve().parent
SKIPPED = ("__pycache__", ".venv")  # never copied into a kit
# a ledger line, as verify.sh checks it too: a relative path without control characters or backslashes
# (a "." or ".." part is refused apart, in both)
LEDGER_LINE_RE = re.compile(r"^[0-9a-f]{64}  [^/\\\x00-\x1f\x7f][^\\\x00-\x1f\x7f]*$")
DOT_PART_RE = re.compile(r"(?:^|/)\.\.?(?:/|$)|//|/$")


# ustar's size field: 11 octal digits. A bigger file gets a pax "size" record, which the kit's verify.sh and
# rebuild refuse in context.tar (busybox tar ignores one, and builds another file there)
CONTEXT_FILE_LIMIT = 8 ** 11


def check_context_sizes(context: BuildContext) -> None:
    """Refuse a build context the kit could not carry: a file of 8 GiB or more (its size read, never its
    bytes), named; InputError."""
    for f in context.files:
        size = f.size
        if size is not None and size >= CONTEXT_FILE_LIMIT:
            shown = f.source if f.source is not None else \
                f"{f.prebuilt.file.path}: {f.member.source}" if f.prebuilt and f.member else f"the generated {f.name}"
            raise InputError(f"{shown}: {size} bytes ({f.name} in the build context): a file of 8 GiB or more "
                             "would get a pax size record in the reconstruct kit's context.tar, which its verify.sh "
                             "and rebuild refuse; no kit can carry it: mount such a file at run time instead of "
                             "baking it")


def _ledger_line(line: str) -> bool:
    """A line the kit's ledger may hold (the rule verify.sh applies too)."""
    return bool(LEDGER_LINE_RE.fullmatch(line)) and not DOT_PART_RE.search(line[66:])


class KitImage(Record):
    # what the profiles allow (a hostile kit.json cannot aim the engine's API or the README elsewhere)
    ref: str = Field(max_length=512, pattern=IMAGE_REF_RE.pattern)
    image_id: str = Field(pattern=DIGEST)


class KitRecord(Document):
    """``kit.json``: the release a kit rebuilds, and everything the rebuild needs to be identical."""

    schema_version: Literal[1] = Field(alias="schema")
    product: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")
    release: str = Field(pattern=TAG_PATTERN)
    tag: str = Field(max_length=255)
    version: str = Field(max_length=128)
    profiles: tuple[str, ...]
    image_id: str = Field(pattern=DIGEST)
    diff_ids: tuple[Digest, ...]
    source_date_epoch: int = Field(ge=0, le=MAX_EPOCH)  # (past it: a traceback, or a build no tar header can hold)
    revision: str = Field(max_length=256)
    base: KitImage
    builder: KitImage | None
    tool: Tool
    install_root: Literal[INSTALL_ROOT]  # (the one this unibake builds: "/." was refused only after the build)
    context_sha256: str = Field(pattern=HEX64)
    dockerfile_sha256: str = Field(pattern=HEX64)
    # the target the release was built for (linux/arm64): the rebuild tells the engine and records it
    # in the config, as the build stage does; absent in kits written before it was recorded
    platform: str | None = Field(default=None, pattern=r"^[a-z0-9]+/[a-z0-9]+(/[a-z0-9]+)?$")
    # the images kernels are compiled in besides the builder (a build.image of their own); absent
    # in kits written before they were recorded
    toolchains: tuple[KitImage, ...] = Field(default=(), max_length=256)

    model_config = Record.model_config | {"populate_by_name": True}

    @property
    def build_args(self) -> dict[str, str]:
        """The build arguments the pipeline's build stage passes (``builder.build_image``)."""
        return {"UNIBAKE_REVISION": self.revision, "UNIBAKE_CREATED": iso_time(self.source_date_epoch)}


@dataclass(frozen=True, kw_only=True)
class WrittenKit:
    file: object  # manifest.SupplyFile
    context_sha256: str
    dockerfile_sha256: str
    files: int


def kit_name(product: str, release: str) -> str:
    return f"{product}-{release}-kit.tar.zst"


def _tool_files() -> dict[str, tuple[bytes | Path, int]]:
    """unibake as it runs now: its package, build.py, pyproject.toml and pins (``tool/...``), read once, as the
    draft begins (read at its end, and again after they were hashed, a checkout changed during a long build put
    other sources in the kit than the ones that made the image, or files its ledger does not describe)."""
    out: dict[str, tuple[bytes | Path, int]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        rel = path.relative_to(PACKAGE)
        if path.is_file() and not any(part in SKIPPED for part in rel.parts) and path.suffix in (".py", ".j2"):
            out[f"tool/unibake/{rel.as_posix()}"] = (path.read_bytes(), 0o644)
    checkout = PACKAGE.parent
    for name in ("build.py", "pyproject.toml", "requirements.txt"):
        if (checkout / name).is_file():
            out[f"tool/{name}"] = ((checkout / name).read_bytes(), 0o755 if name == "build.py" else 0o644)
    if "tool/requirements.txt" not in out:  # installed from a wheel: pin what runs now
        pins = sorted({f"{d.metadata['Name']}=={d.version}\n" for d in importlib.metadata.distributions()
                       if d.metadata["Name"] and d.metadata["Name"].lower() != "unibake"})
        out["tool/requirements.txt"] = (("# the environment unibake ran in\n" + "".join(pins)).encode(), 0o644)
    if "tool/build.py" not in out:
        out["tool/build.py"] = (b"#!/usr/bin/env python3\nimport sys\nfrom unibake.cli import main\nsys.exit(main())\n",
                                0o755)
    return out


class _TarOut:
    """The kit's tar as tarfile writes one (render's headers, padding and end), into the framer."""

    def __init__(self, sink: Framer):
        self.sink, self.offset = sink, 0

    def write(self, data) -> None:
        self.sink.write(data)
        self.offset += len(data)

    def folder(self, name: str, epoch: int) -> None:
        self.write(tar_header(tar_info(name, 0o755, epoch, folder=True)))

    def file(self, name: str, content: bytes | Path, mode: int, epoch: int) -> None:
        """One file: root-owned, its time the epoch."""
        if isinstance(content, bytes):
            self.write(tar_header(tar_info(name, mode, epoch, len(content))))
            self.write(content)
            self.write(tar_padding(len(content)))
            return
        with open(content, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.write(tar_header(tar_info(name, mode, epoch, size)))
            left = size
            while left:
                chunk = fh.read(min(1 << 20, left))
                if not chunk:
                    raise UnibakeError(f"{content}: shorter than its size while the kit was written; run again")
                self.write(chunk)
                left -= len(chunk)
        self.write(tar_padding(size))

    def close(self) -> None:
        self.write(tar_end(self.offset))


# Written first, after the folders: they depend on the build context alone, so a kit can be begun
# (the context tar written, hashed and compressed: nearly all of its cost) before the image is known.
EARLY = ("Dockerfile", CONTEXT)
NEEDED = (*EARLY, KIT_JSON)  # what verify.sh and the rebuild read besides the ledger: listed in every kit's


class KitDraft:
    """A kit being written into ``out/.name.tmp``: :meth:`begin` writes the part that depends on the
    build context alone (the folders, the Dockerfile, ``context.tar``), :meth:`finish` the entries
    that name the image, and renames the file into place. The pipeline begins it in a thread while
    the image is exported (:meth:`begin_in_thread`); :meth:`abandon` stops it and removes the file.
    The bytes are the same whichever way it is written: one zstd stream of one tar."""

    def __init__(self, out: Path, name: str, *, plan: ReleasePlan, context: BuildContext, release: str, epoch: int,
                 expect_context: str | None = None, reuse: tuple[Path, str, int] | None = None,
                 vouched: dict[str, tuple[str, int, int]] | None = None):
        self.out, self.name, self.plan, self.context, self.epoch = out, name, plan, context, epoch
        # an earlier kit (its path, recorded sha256 and size) whose frames of the same large files are copied
        self.reuse = reuse
        self.vouched = vouched  # the frames this user's kits made or decoded (:meth:`made_frames`), signed
        self.reuse_note = ""  # what came of it, for the kit stage's line
        self.release = release
        self.expect_context = expect_context
        self.top = name.removesuffix(".tar.zst")
        self.temp = out / f".{name}.tmp"
        self.tool = _tool_files()
        self.context_sha = ""
        self._stop = threading.Event()
        self._thread: Thread | None = None
        self._error: BaseException | None = None
        self._fh = self._framer = self._tar = None
        self._lender: Reusable | None = None
        self._folder: int | None = None  # the folder's descriptor, flock-ed while the kit is written
        self._begun = self._done = False

    def names(self) -> list[str]:
        """Every entry the kit will hold (the ledger's own included)."""
        return [*EARLY, LOCK_FILE, KIT_JSON, "README.md", "verify.sh", LEDGER, *self.plan.config_files, *self.tool]

    def begin(self) -> None:
        check_context_sizes(self.context)
        pieces, size = context_tar_layout(self.context, mtime=self.epoch)  # the build stage's: the same bytes
        if self.expect_context is not None:  # (build.py kit) refused before anything is written in --out
            self.context_sha = _context_sha(pieces)
            if self.context_sha != self.expect_context:
                raise VerificationError(f"the build context of {self.plan.tag} rendered here (sha256 "
                                        f"{self.context_sha[:16]}...) differs from the one release {self.release} "
                                        f"was built from ({self.expect_context[:16]}...); no kit was written")
        if self._stop.is_set():
            raise HandoffAborted()
        target = self.out / self.name
        if target.is_dir() and not target.is_symlink():  # the rename would fail naming the temporary file
            raise InputError(f"{target}: a folder where the kit would be written; move it away or write the kit "
                             "elsewhere")
        self._hold_folder()
        with held_signals():  # made and recorded as one step: an interrupt as it was made left .KIT.tmp in --out
            self._fh = open_new(self.temp)  # never through a link planted under its name in --out
        self._framer = Framer(self._fh, self._stop, self.vouched)
        self._tar = tar = _TarOut(self._framer)
        folders = {self.top}
        for rel in self.names():
            parts = rel.split("/")[:-1]
            folders.update(f"{self.top}/{'/'.join(parts[:i])}" for i in range(1, len(parts) + 1))
        for folder in sorted(folders):
            tar.folder(folder, self.epoch)
        tar.file(f"{self.top}/Dockerfile", self.context.dockerfile.encode(), 0o644, self.epoch)
        tar.write(tar_header(tar_info(f"{self.top}/{CONTEXT}", 0o644, self.epoch, size)))
        cuts = _cuts(pieces, tar.offset)
        self._framer.cut(cuts, self._lend(cuts))
        sha = hashlib.sha256()  # context.tar's, from the bytes written
        for chunk in _context_bytes(pieces):
            sha.update(chunk)
            tar.write(chunk)
        if self.expect_context is not None and sha.hexdigest() != self.expect_context:
            raise VerificationError(f"the build context of {self.plan.tag} changed while its kit was written; "
                                    "no kit was written")
        self.context_sha = sha.hexdigest()
        tar.write(tar_padding(size))
        self._begun = True

    def _lend(self, cuts: list[Cut]) -> int | None:
        """The earlier kit (``reuse``) opened and checked, each cut given its frame of the same bytes;
        its descriptor, or None (and why not, in ``reuse_note``)."""
        if self.reuse is None or not cuts:
            return None
        path, sha, size = self.reuse
        lender = open_reusable(path, sha, size)
        if isinstance(lender, str):
            self.reuse_note = f"large context files compressed anew, none copied from {path.name}: {lender}"
            return None
        self._lender = lender
        for cut in cuts:
            cut.reuse = lender.frames.get((cut.sha256, cut.size))
        return lender.fd

    def _hold_folder(self) -> None:
        """The folder held (``flock`` on the folder itself, no file left in it) while the kit is written: a
        second run writing a kit there at once would remove this one's temporary file and begin its own, and
        this one would then rename that half-written file into place as the kit."""
        try:
            self._folder = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except PermissionError:  # a folder this user may write but not read: left unheld
            return
        try:
            fcntl.flock(self._folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UnibakeError(f"another run is writing a kit in {self.out}: wait for it, then run again") from None
        except OSError:  # a file system that cannot lock a folder opened to read (NFS: EBADF): left unheld
            pass

    def begin_in_thread(self) -> None:
        def run() -> None:
            try:
                self.begin()
            except BaseException as exc:  # raised in the caller's thread by wait()
                self._error = exc

        # (joined truly after an interrupt cut a join short: abandon() then waits for it, and removes what it wrote)
        self._thread = Thread(target=run, name="kit", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """The thread begun by :meth:`begin_in_thread` done; what it raised, raised here."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error

    def finish(self, *, image_id: str, diff_ids: tuple[str, ...], revision: str, base: BaseImage,
               builder: BaseImage | None, toolchains: tuple[BaseImage, ...] = (),
               expect_sha256: str | None = None) -> WrittenKit:
        """The kit completed and renamed into place; with ``expect_sha256``, only when its bytes have
        that sha256 (VerificationError otherwise, and a file already in place is left as it was)."""
        from .manifest import SupplyFile

        self.wait()
        if not self._begun:
            self.begin()
        plan, dockerfile = self.plan, self.context.dockerfile.encode()
        record = KitRecord(
            schema_version=SCHEMA, product=plan.product, release=self.release, tag=plan.tag,
            version=plan.version, profiles=plan.profile_names, image_id=image_id, diff_ids=diff_ids,
            source_date_epoch=self.epoch, revision=revision, base=KitImage(ref=base.ref, image_id=base.image_id),
            builder=KitImage(ref=builder.ref, image_id=builder.image_id) if builder else None,
            tool=Tool(name="unibake", version=__version__), install_root=INSTALL_ROOT,
            context_sha256=self.context_sha, dockerfile_sha256=hashlib.sha256(dockerfile).hexdigest(),
            platform=plan.platform.name,
            toolchains=tuple(KitImage(ref=t.ref, image_id=t.image_id) for t in toolchains))
        later: dict[str, tuple[bytes | Path, int]] = {
            LOCK_FILE: (plan.config_data((plan.config_dir / LOCK_FILE).relative_to(plan.project_root).as_posix()),
                        0o644),
            # no toolchains: kit.json as before they were recorded (the same kit bytes for such products)
            KIT_JSON: ((record.model_dump_json(by_alias=True, indent=2,
                                               exclude=None if record.toolchains else {"toolchains"}) + "\n").encode(),
                       0o644),
            # the profiles folder by its own name (llm-conf/, not always profiles/)
            "README.md": (render_template("kit-README.md.j2", k=record, kit=self.name, top=self.top,
                                          config=plan.config_dir.relative_to(plan.project_root).as_posix(),
                                          ref=f"{KIT_REPOSITORY}/{record.product}:{record.release}",
                                          cache=cache_ref(record.product, f"kit-{record.release}", "build"),
                                          stage=cache_ref(record.product, f"kit-{record.release}", "stage1")
                                          ).encode(),
                          0o644),
            "verify.sh": (render_template("kit-verify.sh.j2", k=record, kit=self.name).encode(), 0o755),
        }
        for rel in plan.config_files:  # as planned from: the context was rendered from them
            later[rel] = (plan.config_data(rel), 0o644)
        later.update(self.tool)
        digests = {"Dockerfile": record.dockerfile_sha256, CONTEXT: self.context_sha}
        for rel, (content, _) in later.items():
            digests[rel] = hashlib.sha256(content).hexdigest() if isinstance(content, bytes) else sha256_file(content)
        for rel, sha in digests.items():  # never a kit its own checks refuse
            if not _ledger_line(f"{sha}  {rel}"):
                raise InputError(f"{rel}: a name the kit's ledger cannot hold (a control character, a backslash or "
                                 "a '.' part); rename it")
        later[LEDGER] = (render_sums(digests).encode(), 0o644)
        for rel in sorted(later):
            content, mode = later[rel]
            self._tar.file(f"{self.top}/{rel}", content, mode, self.epoch)
        self._tar.close()
        self._framer.close_stream()
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        out = self._framer.out
        sha = out.sha.hexdigest()
        if self.reuse is not None and not self.reuse_note and self._framer.cuts:
            trusted = self._framer.trusted
            self.reuse_note = (f"{self._framer.reused} of {len(self._framer.cuts)} large context files copied from the "
                               f"frames of {self.reuse[0].name} (not compressed again" + (
                                   f"; {trusted} of them not decoded either: their compressed bytes are the ones this "
                                   "user's record of earlier kits names)" if trusted else ")"))
        # compared before the rename: the published kit may be the very file at out/name (--out the release)
        if expect_sha256 is not None and sha != expect_sha256:
            raise VerificationError(f"the kit written from this checkout is sha256:{sha}, not the "
                                    f"sha256:{expect_sha256} release {self.release} published (the inputs matched: "
                                    "unibake's own sources or the kit's templates differ); nothing written")
        os.replace(self.temp, self.out / self.name)
        fsync_dir(self.out)
        self._done = True
        self._release()
        return WrittenKit(file=SupplyFile(name=self.name, bytes=out.bytes, sha256=sha),
                          context_sha256=self.context_sha, dockerfile_sha256=record.dockerfile_sha256,
                          files=len(digests))

    def made_frames(self) -> list[tuple[str, str, int, int]]:
        """Once finished: each large file's frame in the kit as (the sha256 of the bytes it decodes to, its compressed
        bytes' sha256, its length, their size), every one of them compressed from the file's bytes read and found
        to be the plan's, or decoded and found so, or copied under the same record: what :mod:`unibake.framememo`
        keeps for the next kit (``vouched``)."""
        if not self._done or self._framer is None:
            return []
        return [(f.sha256, f.zsha256, f.length, f.size) for f in self._framer.frames]

    def abandon(self) -> None:
        """Stop (the release failed, or the draft cannot be used): the thread waited for, the
        temporary file removed. Nothing once finished."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._release()
        if not self._done and self._fh is not None:  # its own only: not another run's, when it was refused
            self.temp.unlink(missing_ok=True)

    def _release(self) -> None:
        for fh in (self._fh, self._lender):
            if fh is not None:
                try:
                    fh.close()  # (bytes still buffered are written as it closes: a full disk fails it again)
                except OSError:
                    if self._done:  # (a kit that was written whole closed its file before: nothing buffered)
                        raise
        self._lender = None
        if self._folder is not None:
            os.close(self._folder)  # (its flock goes with it)
            self._folder = None


def write_kit(out: Path, name: str, *, plan: ReleasePlan, context: BuildContext, release: str, image_id: str,
              diff_ids: tuple[str, ...], epoch: int, revision: str, base: BaseImage,
              builder: BaseImage | None, expect_context: str | None = None,
              toolchains: tuple[BaseImage, ...] = (), expect_sha256: str | None = None) -> WrittenKit:
    """Write ``out/name`` (via a temporary name): the kit of the release of ``plan``, in one go.
    ``expect_context``, ``expect_sha256``: the sha256 the build context and the kit must have;
    nothing is written (and nothing at ``out/name`` touched) otherwise."""
    draft = KitDraft(out, name, plan=plan, context=context, release=release, epoch=epoch,
                     expect_context=expect_context)
    try:
        return draft.finish(image_id=image_id, diff_ids=diff_ids, revision=revision, base=base,
                            builder=builder, toolchains=toolchains, expect_sha256=expect_sha256)
    finally:
        draft.abandon()


def _cuts(pieces: list, at: int) -> list[Cut]:
    """Each large context file's bytes in the kit's tar stream (a frame of its own): ``at``, where
    context.tar's data begins, plus where the file's data lies in context.tar."""
    cuts = []
    for piece in pieces:
        if isinstance(piece, bytes):
            at += len(piece)
            continue
        f, size = piece
        if size >= FRAME_MIN:
            cuts.append(Cut(start=at, size=size, sha256=f.sha256))
        at += size + len(tar_padding(size))
    return cuts


def _context_bytes(pieces: list) -> Iterator[bytes]:
    """context.tar's bytes, from its layout: headers as laid out, each file's bytes and their padding."""
    for piece in pieces:
        if isinstance(piece, bytes):
            yield piece
            continue
        f, size = piece
        yield from context_file_chunks(f, size)
        yield tar_padding(size)


def _context_sha(pieces: list) -> str:
    sha = hashlib.sha256()
    for chunk in _context_bytes(pieces):
        sha.update(chunk)
    return sha.hexdigest()


# ---------------------------------------------------------------------------------------------
# An unpacked kit: its ledger, and the rebuild


def read_kit(folder: Path) -> KitRecord:
    text = read_small_text(folder / KIT_JSON, VerificationError, limit=1 << 20, what="not a reconstruct kit folder",
                           follow=False)
    try:
        return KitRecord.model_validate_json(text)
    except ValidationError as exc:
        raise VerificationError(f"{folder / KIT_JSON}: not a valid kit record: {first_error(exc)}") from None


def check_ledger(folder: Path) -> list[str]:
    """Every file against ``kit.sha256``: what differs, is missing, or is not listed."""
    return _ledger(folder)[0]


def _ledger(folder: Path) -> tuple[list[str], dict[str, str]]:
    """:func:`check_ledger`'s problems, and the sha256 the ledger lists for each file (with no problems, each the
    sha256 of the file as it was just read)."""
    text = read_small_text(folder / LEDGER, VerificationError, limit=16 << 20, what="not a reconstruct kit folder",
                           follow=False)
    listed = {e.name: e.sha256 for e in parse_sums(text, str(folder / LEDGER), VerificationError)}
    problems = [f"{LEDGER}:{n}: not 'SHA256  PATH' (a plain path inside the kit)"
                for n, line in enumerate(text.removesuffix("\n").split("\n"), 1)  # lines as parse_sums has them
                if not _ledger_line(line)][:1]
    # the files the checks below and verify.sh read: a ledger that leaves one out (the file gone too) would
    # otherwise pass here, and fail later as a file not found
    problems += [f"{LEDGER}: does not list {name}, which every kit holds" for name in NEEDED if name not in listed]
    for rel, sha in sorted(listed.items()):
        path = folder / rel
        if ".." in Path(rel).parts or rel.startswith("/"):
            problems.append(f"{rel}: a path outside the kit")
        elif any(os.path.islink(folder.joinpath(*Path(rel).parts[:n])) for n in range(1, len(Path(rel).parts))):
            # (hashed through the link, p -> /proc/self and p/pagemap listed: 256 GB read before the walk below
            # refused the link)
            problems.append(f"{rel}: lies under a link in the kit, which the kit does not hold")
        elif not os.path.lexists(path):
            problems.append(f"{rel}: missing")
        elif not path.is_file() or path.is_symlink():  # (was "missing": a link or a FIFO is there, to be seen)
            problems.append(f"{rel}: not a regular file (a link, a FIFO or a folder), which the kit does not hold")
        elif sha256_file(path, VerificationError) != sha:
            problems.append(f"{rel}: differs from {LEDGER}")
    # nothing skipped: a __pycache__ or a .venv in the kit holds code the rebuild would run (the kit's
    # verify.sh makes its venv in the user's cache folder, and the tool writes no bytecode in a kit)
    tree = sorted(_tree(folder))
    for path in tree:
        rel = path.relative_to(folder).as_posix()
        if rel != LEDGER and (path.is_symlink() or not path.is_dir()) and rel not in listed:
            problems.append(f"{rel}: not listed in {LEDGER}")
    # nothing another user can write: each file is checked here, then read again (tool/ runs as you, context.tar
    # is built), and one who can write a file or a folder of the kit could change it in between
    for path in [folder, *tree]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode) and mode & 0o022:
            rel = path.relative_to(folder).as_posix()
            problems.append(f"{'the kit folder' if rel == '.' else rel}: writable by other users (its group or "
                            "everyone), who could change it between its check and its use; `chmod -R go-w` the kit")
    return problems, listed


def _tree(folder: Path) -> list[Path]:
    """Everything under ``folder``, links not followed, walked with a list of its own (pathlib's rglob and os.walk
    recurse once per folder: 1500 folders nested in a kit were a RecursionError traceback)."""
    found, todo = [], [folder]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                found.append(Path(entry.path))
                if entry.is_dir(follow_symlinks=False):
                    todo.append(Path(entry.path))
    return found


def check_kit(folder: Path) -> KitRecord:
    """An unpacked kit, checked against its ledger and its record; VerificationError otherwise."""
    problems, listed = _ledger(folder)
    if problems:
        raise VerificationError(f"{folder}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                                               else ""))
    record = read_kit(folder)
    # (the ledger has just hashed context.tar: its sha256 is the one listed; rebuild hashes the file it builds)
    if listed[CONTEXT] != record.context_sha256:
        raise VerificationError(f"{folder / CONTEXT}: its sha256 differs from kit.json's context_sha256")
    with _open_context(folder) as context:
        _check_dockerfile(folder, context, record)
    return record


def _open_context(folder: Path) -> BinaryIO:
    """``context.tar``, opened once for its checks and its build: the file checked is the file built (one
    opened again by name could have been replaced in between). A link or a FIFO is refused without waiting."""
    path = folder / CONTEXT
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise VerificationError(f"{path}: cannot be read ({reason})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise VerificationError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _check_context(folder: Path, context: BinaryIO, record: KitRecord) -> None:
    """The open ``context.tar``: building the kit's Dockerfile alone. Its sha256 is not taken here: the ledger's
    check took it by name, and the bytes sent are hashed as they go (:class:`_SentAsChecked`), so that a file put in
    its place after the ledger's check is refused before the engine has all of it, at one read fewer of a context
    that may be gigabytes."""
    _check_dockerfile(folder, context, record)
    context.seek(0)


class _SentAsChecked:
    """``context.tar`` as it is sent to the engine, hashed on the way: its owner could still rewrite it in place
    after its checks (the same file, the same descriptor). Its last bytes are handed over only once the bytes
    before them are kit.json's, so the engine never has all of another context and never builds it. ``__len__``
    gives the request its length, as the file's own would."""

    def __init__(self, fh: BinaryIO, path: Path, sha256: str):
        self.fh, self.path, self.expected = fh, path, sha256
        self.size = os.fstat(fh.fileno()).st_size
        self.sha = hashlib.sha256()
        self.sent = 0
        self.verified = False

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        left = self.size - self.sent
        block = self.fh.read(left if n is None or n < 0 else min(n, left))
        self.sha.update(block)
        self.sent += len(block)
        if (self.sent == self.size or not block) and not self.verified:
            if self.sent != self.size or self.sha.hexdigest() != self.expected:
                raise VerificationError(f"{self.path}: changed since its check (the bytes sent to the engine are "
                                        "not kit.json's context_sha256); nothing was built from it")
            self.verified = True
        return block


PAX_LIMIT = 1 << 16  # a pax header of a build context: one long name's record
_PAX_PATH = re.compile(rb"([1-9][0-9]{0,5}) path=")


def pax_as_unibake_writes(data: bytes) -> bool:
    """Whether a pax header's data holds only the records unibake writes, each ``LENGTH path=NAME\\n`` with its
    length exact and in plain digits. Written by hand because the readers differ on anything else: Go's
    archive/tar (the engine) reads a length of ``+20`` or ``020`` as 20, and a ``path`` record then renames the
    member, where Python's ``tarfile`` stops reading the header and keeps the member's own name, and GNU and
    busybox tar say "malformed" and go on with it: a second Dockerfile would pass for another file."""
    at = 0
    if not data or len(data) > PAX_LIMIT:
        return False
    while at < len(data):
        m = _PAX_PATH.match(data, at)
        if m is None:
            return False
        end = at + int(m[1])
        if end > len(data) or data[end - 1:end] != b"\n" or b"\0" in data[m.end():end]:
            return False
        at = end
    return True


# what the engine's build takes as a compressed context, by its first bytes (moby's pkg/archive
# DetectCompression: gzip, bzip2, xz, zstd, and a zstd skippable frame on newer engines)
COMPRESSED_MAGIC = (b"\x1f\x8b\x08", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
ZSTD_SKIPPABLE = re.compile(rb"[\x50-\x5f]\x2a\x4d\x18")


def _check_dockerfile(folder: Path, context: BinaryIO, record: KitRecord) -> None:
    """The Dockerfile a reader of the kit checks is the one the engine builds: kit.json's, and the one
    file of ``context.tar`` the engine reads as its Dockerfile (the context holds no links, as
    unibake writes it, so no other entry can land there)."""
    dockerfile = read_small_file(folder / "Dockerfile", VerificationError, limit=64 << 20, follow=False)
    if hashlib.sha256(dockerfile).hexdigest() != record.dockerfile_sha256:
        raise VerificationError(f"{folder / 'Dockerfile'}: its sha256 differs from kit.json's dockerfile_sha256")
    inside = []
    try:
        # a plain tar, as unibake writes it and verify.sh reads it (the engine takes a compressed context too: one
        # was built here, and refused by verify.sh). The engine goes by the first bytes: a tar whose first name
        # begins as a compressed stream would be decompressed, and what that gives built (a gzip header's extra
        # field can cover a whole plain tar, read here, and a deflate stream of another context follow it)
        start = context.read(len(max(COMPRESSED_MAGIC, key=len)))
        if any(start.startswith(magic) for magic in COMPRESSED_MAGIC) or ZSTD_SKIPPABLE.match(start):
            raise VerificationError(f"{folder / CONTEXT}: it begins as a compressed stream ({start[:6].hex()}), "
                                    "which the engine would decompress and build instead of the tar read here; a "
                                    "build context unibake writes begins with a plain tar header")
        context.seek(0)
        with tarfile.open(fileobj=context, mode="r:") as tar:
            headers = []
            for member in tar:
                # its pax header (when it has one) and its own
                headers.append((member.offset, member.offset_data - tarfile.BLOCKSIZE, member.name))
                # the records verify.sh refuses: a size busybox ignores; a GNU.sparse.name this reader (and GNU
                # tar) takes as the name and the engine ignores (it reads one only for a sparse file)
                if any(key == "size" or key.startswith("GNU.sparse") for key in member.pax_headers):
                    raise VerificationError(f"{folder / CONTEXT}: {visible_name(member.name)!r} has a pax header that "
                                            "sets a size or a GNU sparse field; a build context unibake writes has none")
                if member.isdir() and member.size:  # (its "content": headers to the engine, skipped by verify.sh)
                    raise VerificationError(f"{folder / CONTEXT}: the folder {visible_name(member.name)!r} has a size "
                                            "in its header; a build context unibake writes has none")
                if not (member.isfile() or member.isdir()):
                    raise VerificationError(f"{folder / CONTEXT}: {visible_name(member.name)!r} is a link or a "
                                            "special file; a build context unibake writes holds files and folders")
                # the name as the engine unpacks it (Go's filepath.Clean from the root: "sub/../Dockerfile" and
                # "/../Dockerfile" land on the Dockerfile too)
                if member.isfile() and posixpath.normpath("/" + member.name.lstrip("/")) == "/Dockerfile":
                    # another size is another file: not read (it may be huge)
                    inside.append(tar.extractfile(member).read() if member.size == len(dockerfile) else None)
            # a global extended header renames every later member here (and for GNU tar), not for the
            # engine, which ignores it: a second Dockerfile would pass for another file and be built
            if tar.pax_headers:
                raise VerificationError(f"{folder / CONTEXT}: a global extended header (pax 'g'), which the engine "
                                        "ignores and this reader does not; a build context unibake writes has none")
            # this reader stops at a header it cannot read (a checksum written "\0NNNNNN ", which Go and GNU tar
            # read) as at the end: the engine would read on, and build a second Dockerfile after it
            tar.fileobj.seek(tar.offset)
            if tar.fileobj.read(2 * tarfile.BLOCKSIZE) != bytes(2 * tarfile.BLOCKSIZE):
                raise VerificationError(f"{folder / CONTEXT}: a header at byte {tar.offset} that this reader cannot "
                                        "read (not its end-of-archive blocks); a build context unibake writes has none")
            # after them at most the zeros up to the end of a 10 kB record, as unibake writes: bytes there are read by
            # no reader here, and may be what a decompressing reader takes (the rest of a compressed stream)
            most = len(tar_end(tar.offset)) - 2 * tarfile.BLOCKSIZE
            rest = tar.fileobj.read(most + 1)
            if len(rest) > most or rest.strip(b"\0"):
                raise VerificationError(f"{folder / CONTEXT}: bytes after its end-of-archive blocks (at byte "
                                        f"{tar.offset + 2 * tarfile.BLOCKSIZE}), which a build context unibake writes "
                                        "does not have: zeros to the end of its last 10 kB record at most")
            # every header POSIX ustar with nothing after its magic but names (no prefix: unibake puts a long
            # name in a pax header): readers differ on the fields there. Under GNU magic the engine (and GNU
            # tar) read a name without the prefix field when that field reads as a time, this reader with it;
            # with a star trailer ("tar" at byte 508) the engine reads a prefix of 131 bytes, this reader and
            # GNU tar of 155: "0" + "Dockerfile", or a prefix "x/.." cut there, would pass here for another
            # file and be built as the Dockerfile
            for first, own, name in headers:
                for offset in sorted({first, own}):
                    tar.fileobj.seek(offset)
                    header = tar.fileobj.read(tarfile.BLOCKSIZE)
                    if header[257:265] != tarfile.POSIX_MAGIC or header[345:].strip(b"\0"):
                        raise VerificationError(f"{folder / CONTEXT}: a header at byte {offset} that is not POSIX "
                                                "ustar as unibake writes it (a prefix, other magic: the engine and tar "
                                                "programs read its name differently)")
                # one pax header at most, right before the member's own: of two, this reader takes the first's
                # path, the engine (and tar programs) the second's
                if first != own:
                    tar.fileobj.seek(first + 124)
                    size = tar.fileobj.read(12).strip(b"\0 ")
                    length = int(size or b"0", 8) if set(size) <= set(b"01234567") else -1
                    if length < 0 or first + tarfile.BLOCKSIZE * (1 + (length + 511) // 512) != own:
                        raise VerificationError(f"{folder / CONTEXT}: {visible_name(name)!r} has more than one "
                                                "pax header; a build context unibake writes has one at most")
                    tar.fileobj.seek(first + tarfile.BLOCKSIZE)
                    if not pax_as_unibake_writes(tar.fileobj.read(min(length, PAX_LIMIT + 1))):
                        raise VerificationError(f"{folder / CONTEXT}: {visible_name(name)!r} has a pax header that is "
                                                "not one unibake writes (each record 'LENGTH path=NAME', its length "
                                                "exact, in plain digits): the engine and tar programs read its name "
                                                "differently")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise VerificationError(f"{folder / CONTEXT}: not a readable tar ({exc})") from None
    if inside != [dockerfile]:
        raise VerificationError(f"{folder / CONTEXT}: its Dockerfile is not the kit's Dockerfile (the one built must "
                                "be the one checked)")


@dataclass(frozen=True, kw_only=True)
class Rebuilt:
    record: KitRecord
    image: Image
    ref: str
    cached: tuple[str, ...] = ()  # the build cache tags the rebuild left (its stages, the image before normalising)

    @property
    def matches(self) -> bool:
        return self.image.image_id == self.record.image_id


def rebuild(folder: Path, engine: Engine, *, record: KitRecord | None = None,
            on_line: Callable[[str], None] = lambda line: None,
            progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None = None
            ) -> Rebuilt:
    """Build the kit's context on ``engine`` as the release was built (no cache), normalise it, and
    return the result for comparison; tags it ``unibake-kit/<product>:<release>``. ``progress`` (the
    reporter's) shows the normalise step, a save and a load of the whole image (minutes for an image
    of many gigabytes). ``record``: the kit's, from :func:`check_kit` (run here when not given); context.tar is
    hashed again as it is sent to be built."""
    from .platforms import KNOWN
    from .provenance import TOOLCHAIN_ROLE

    record = record or check_kit(folder)
    platform = KNOWN.get(record.platform) if record.platform else None
    if record.platform and platform is None:
        raise InputError(f"{folder / KIT_JSON}: platform {record.platform} is not one this unibake builds for "
                         f"({', '.join(sorted(KNOWN))})")
    images = [("base image", record.base), ("builder image", record.builder)]
    images += [(TOOLCHAIN_ROLE, image) for image in record.toolchains]
    for role, image in images:
        if image is None:
            continue
        info = engine.inspect_image(image.ref)
        if info is None or info.id != image.image_id:
            have = f"is {info.id}" if info else "is missing"
            raise InputError(f"the {role} {image.ref} {have} in the engine at {engine.address}; release "
                             f"{record.release} was built on {image.image_id}: load that image, then rebuild")
    ref = f"{KIT_REPOSITORY}/{record.product}:{record.release}"
    selection = f"kit-{record.release}"
    # built, checked and normalised under a tag of this run's own, and only then named ref: another rebuild of
    # the release on the engine moved ref meanwhile, and the image it named was judged (and called identical)
    building = cache_ref(record.product, selection, f"rebuild{os.getpid()}x{secrets.token_hex(3)}")
    # one descriptor for the checks and the build: a context.tar replaced after its check is not the one built
    with _open_context(folder) as context:
        _check_context(folder, context, record)
        try:
            return _rebuild_as(building, ref, record, _SentAsChecked(context, folder / CONTEXT, record.context_sha256),
                               engine, platform, on_line, progress)
        finally:
            try:  # (the image goes with it, unless it is kept: the release's kit tag, or build cache)
                engine.untag(building)
            except UnibakeError as err:
                on_line(f"warning: the rebuild's own tag {building} was not removed: {err}")


def _rebuild_as(building: str, ref: str, record: KitRecord, context: _SentAsChecked, engine: Engine, platform,
                on_line: Callable[[str], None],
                progress: Callable[[str, int | None], AbstractContextManager[Callable[[int], None]]] | None
                ) -> Rebuilt:
    """:func:`rebuild`'s build and normalise under the tag ``building``, the result then tagged ``ref``; the build
    before its normalise kept as build cache when the normalise fails or is interrupted."""
    from .normalise import normalise_image
    from .platforms import EXEC_FORMAT, emulation_hint

    selection = f"kit-{record.release}"
    try:
        outcome = engine.build(context, tag=building, buildargs=record.build_args, nocache=True, on_line=on_line,
                               platform=record.platform)
    except BuildInterrupted as exc:  # what finished stays as build cache, named, as a failed build's, not dangling
        try:
            for n, stage in enumerate(exc.stage_images, 1):
                keep_as_cache(engine, cache_ref(record.product, selection, f"stage{n}"), stage)
            keep_as_cache(engine, cache_ref(record.product, selection, "failed"), exc.last_image)
        except UnibakeError as err:  # the engine going down with us: the interrupt is what to report
            on_line(f"warning: the interrupted rebuild's finished steps were not kept as cache: {err}")
        raise
    except BuildFailed as exc:
        for n, stage in enumerate(exc.stage_images, 1):
            keep_as_cache(engine, cache_ref(record.product, selection, f"stage{n}"), stage)
        keep_as_cache(engine, cache_ref(record.product, selection, "failed"), exc.last_image)
        if record.platform and any(EXEC_FORMAT in text for text in (str(exc), *exc.output)):
            raise BuildFailed(f"{exc}; {emulation_hint(record.platform)}", step=exc.step, output=exc.output,
                              last_image=exc.last_image, stage_images=exc.stage_images) from None
        raise
    if not context.verified:  # (an engine that built before reading the whole context: not the kit's build)
        raise VerificationError(f"{context.path}: the engine built {outcome.image_id} before it had read the "
                                "whole build context; its bytes were not checked")
    cached = []
    for n, stage in enumerate(outcome.stage_images, 1):  # as the build stage keeps them: cache, never dangling
        keep_as_cache(engine, cache_ref(record.product, selection, f"stage{n}"), stage)
        cached.append(cache_ref(record.product, selection, f"stage{n}"))
    info = engine.inspect_image(building)
    if info is None or info.id != outcome.image_id:
        raise UnibakeError(f"the rebuild finished but {building} does not point at {outcome.image_id}")
    built = BuiltImage(image_id=info.id, tag=building, diff_ids=info.diff_ids, steps=outcome.steps,
                       stage_images=outcome.stage_images, seconds=0.0, size=info.size)
    shown = progress or (lambda what, total: nullcontext(lambda n: None))
    try:
        with shown("normalise", built.size or None) as advance:
            image = normalise_image(engine, built, epoch=record.source_date_epoch, base_image=record.base.ref,
                                    owned=record.install_root, cache=None, progress=advance, platform=platform)
    except BaseException:  # (an interrupt too) the build is kept as build cache, named, as a failed build's is
        try:
            keep_as_cache(engine, cache_ref(record.product, selection, "failed"), built.image_id)
        except UnibakeError as err:
            on_line(f"warning: the rebuilt image before its normalise was not kept as cache: {err}")
        raise
    if image.image_id != built.image_id:
        keep_as_cache(engine, cache_ref(record.product, selection, "build"), built.image_id)
        cached.append(cache_ref(record.product, selection, "build"))
    keep_as_cache(engine, ref, image.image_id)  # (the image ref named before is removed, unless still needed)
    return Rebuilt(record=record, image=replace(image, ref=ref), ref=ref, cached=tuple(cached))


def check_kit_of_release(kit: Path, record: KitRecord, release: Path, manifest, signed_sums: bytes | None) -> None:
    """``rebuild KIT --release DIR``: the build context and Dockerfile the kit builds must be the ones the
    release was built from, as its provenance records them (its byproducts; the provenance read once and
    checked against the release's SHA256SUMS, as its signature was checked). A kit whose files, ledger and
    kit.json were rewritten alike around another context (``FROM`` the release's own image) could otherwise
    rebuild to the release's image ID and be called identical. VerificationError otherwise."""
    from .provenance import PROVENANCE_LIMIT, byproducts_of, materials_of, parse_provenance
    from .verify import read_sums

    supply = manifest.supply_chain
    if supply is None:
        raise VerificationError(f"{release}: release {manifest.release} records no provenance, so nothing says "
                                f"which build context it was built from: {kit} cannot be shown to be its kit")
    path = release / supply.provenance.name
    data = read_small_file(path, VerificationError, limit=PROVENANCE_LIMIT, follow=False)
    if hashlib.sha256(data).hexdigest() != read_sums(release, signed_sums).get(supply.provenance.name):
        raise VerificationError(f"{path}: differs from SHA256SUMS; the release cannot be trusted")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VerificationError(f"{path}: not UTF-8 text") from None
    document = parse_provenance(text, str(path))
    recorded = byproducts_of(document)
    for name, have in ((CONTEXT, record.context_sha256), ("Dockerfile", record.dockerfile_sha256)):
        want = recorded.get(name)
        if want != have:
            said = f"sha256 {want[:16]}..." if isinstance(want, str) else "none recorded"
            raise VerificationError(f"{kit}: its {name} (sha256 {have[:16]}..., {KIT_JSON}) is not the one release "
                                    f"{manifest.release} was built from ({said} in its {supply.provenance.name}): "
                                    "not its kit")
    # the kit's record of what was baked (its lock) and of the profiles, which a reader of the kit reviews: the
    # ones the provenance records as the release's materials (a forged lock or profile passed, the image identical)
    ledger = {e.name: e.sha256 for e in parse_sums(read_small_text(kit / LEDGER, VerificationError, limit=16 << 20,
                                                                   follow=False), str(kit / LEDGER), VerificationError)}
    locks = list(materials_of(document, "lock").values())
    profiles = materials_of(document, "profile")
    kept = [(LOCK_FILE, ledger.get(LOCK_FILE), locks[0] if len(locks) == 1 else None)]
    kept += [(name, ledger.get(name), sha) for name, sha in sorted(profiles.items())]
    kept += [(name, sha, None) for name, sha in sorted(ledger.items())  # a YAML the release was not made from
             if name.endswith((".yaml", ".yml")) and not name.startswith("tool/") and name not in profiles]
    for name, have, want in kept:
        if have != want:
            said = f"sha256 {want[:16]}..." if want else "none recorded"
            held = f"sha256 {have[:16]}..." if have else "none"
            raise VerificationError(f"{kit}: its {name} ({held}) is not the one release {manifest.release} was made "
                                    f"from ({said} in its {supply.provenance.name}): not its kit")
    # the rest of the kit (its tool/, which ./verify.sh --rebuild runs, verify.sh, README, kit.json's images): its
    # ledger is the one in the release's kit tarball, which SHA256SUMS lists (a kit whose tool was rewritten, its
    # ledger redone, was "identical", and its --rebuild ran that tool)
    if supply.kit is not None:
        published = release / supply.kit.name
        sums = read_sums(release, signed_sums)
        if supply.kit.name not in sums:
            raise VerificationError(f"{release}: SHA256SUMS does not list {supply.kit.name}, the release's kit")
        if read_small_file(kit / LEDGER, VerificationError, limit=16 << 20, follow=False) \
                != _published_ledger(published, sums[supply.kit.name]):
            raise VerificationError(f"{kit}: its files are not those of the release's kit {supply.kit.name} (its "
                                    f"{LEDGER} differs from the one in that tarball: its tool, verify.sh, README or "
                                    f"{KIT_JSON} were changed): not its kit")


class _Hashing(io.RawIOBase):
    """A file read through, its bytes hashed as they are read."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.sha = fh, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.fh.read(len(buffer))
        self.sha.update(data)
        buffer[:len(data)] = data
        return len(data)


def _published_ledger(path: Path, sha256: str) -> bytes:
    """The ledger in a release's kit tarball, read in one pass that hashes the whole file: its sha256 must be
    ``sha256`` (SHA256SUMS's), else nothing in it is trusted. VerificationError otherwise."""
    ledger = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            hashed = _Hashing(fh)
            decoder = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
            with decoder.stream_reader(hashed, read_across_frames=True, closefd=False) as stream:
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for member in tar:
                        if member.isfile() and member.name.count("/") == 1 and member.name.endswith(f"/{LEDGER}") \
                                and member.size <= 16 << 20 and ledger is None:
                            ledger = tar.extractfile(member).read()
                while stream.read(1 << 20):  # (past the tar's end)
                    pass
            while hashed.read(1 << 20):  # (past the last frame: hashed, as sha256sum hashes the file)
                pass
    except FileNotFoundError:
        raise VerificationError(f"{path}: missing: the release's kit, whose files a kit must be") from None
    except (OSError, tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise VerificationError(f"{path}: cannot be read as the release's kit ({exc})") from None
    if hashed.sha.hexdigest() != sha256:
        raise VerificationError(f"{path}: differs from SHA256SUMS; the release cannot be trusted")
    if ledger is None:
        raise VerificationError(f"{path}: holds no {LEDGER}: not a reconstruct kit")
    return ledger


# ---------------------------------------------------------------------------------------------
# The kit of an existing release, again


def checkout_hint(revision: str, when: str) -> str:
    """What to check out to write a release's kit again: its commit (a ``-dirty`` revision is no name
    git knows: the commit, plus the changes it was built with), or, with none recorded, its inputs."""
    commit, dirty = revision.removesuffix("-dirty"), revision.endswith("-dirty")
    if revision == "unknown" or not commit:
        return "the release records no git revision: restore the inputs its provenance lists"
    if dirty:
        return (f"check out the revision {when} ({commit}) with the uncommitted changes it was built with (it was "
                "built from a checkout with changes: its provenance lists every input's sha256)")
    return f"check out the revision {when} ({commit})"


def kit_for_release(release: Path, config: Path, out: Path, cwd: Path,
                    signed_sums: bytes | None = None) -> tuple[WrittenKit, str | None]:
    """Write the kit of the release in ``release`` again, into ``out``, from the checkout's profiles
    and inputs, after checking them against the release's provenance; returns the kit and the
    sha256 the release published for it (None when it has none). The context rendered now must be
    the one the release was built from (its sha256 is a byproduct in the provenance), and the kit the
    published one: otherwise nothing is written and a file already at its name is left as it was.
    ``signed_sums``: the release's SHA256SUMS as its signature was checked (``--key``)."""
    from .plan import make_plan
    from .provenance import (PROVENANCE, PROVENANCE_LIMIT, TOOLCHAIN_ROLE, byproducts_of, listed_materials,
                             materials_of, parse_provenance)
    from .render import render
    from .verify import read_sums, trusted_manifest

    manifest = trusted_manifest(release, signed_sums)  # what kit.json will say comes from it: it must be the release's
    where = f"release {manifest.release} ({release})"
    if manifest.supply_chain is None or manifest.source_date_epoch is None:
        raise InputError(f"{where} has no provenance (it was made before unibake wrote one): its inputs cannot be "
                         "checked, so no kit is written")
    if manifest.tool.version != __version__:
        raise InputError(f"{where} was made by unibake {manifest.tool.version}, this is {__version__}: run the kit "
                         f"command of that version (revision {manifest.revision})")
    text = read_small_text(release / PROVENANCE, VerificationError, limit=PROVENANCE_LIMIT, follow=False)
    if hashlib.sha256(text.encode()).hexdigest() != read_sums(release, signed_sums).get(PROVENANCE):
        raise VerificationError(f"{release / PROVENANCE}: differs from SHA256SUMS; the release cannot be trusted")
    document = parse_provenance(text, str(release / PROVENANCE))
    if not materials_of(document, "lock") and materials_of(document, "image"):
        # `archive IMAGE`: released from an image the engine had, so no inputs to check a checkout against
        raise InputError(f"{where} was released with `archive` from the image {manifest.tag}, not built from profiles: "
                         "its provenance lists no inputs, so it has no kit (a build from profiles has one)")
    from .platforms import KNOWN

    def same_product(data: dict) -> None:  # before the plan selects: an unknown profile would hide this
        if data.get("product") != manifest.product:
            raise InputError(f"the profiles in {config} are of the product {data.get('product')}, not {where}'s "
                             f"{manifest.product}: give the release's own profiles folder with --config")

    # the release's platform: its base, builder and prebuilt kernels are that platform's
    plan = make_plan(config, profiles=list(manifest.profiles), version=manifest.version, cwd=cwd,
                     platform=KNOWN.get(manifest.platform or ""), on_product=same_product)
    inside = plan.input_folder_holding(out)
    if inside:  # as a release's --out: the kit there would be an input of the next build
        raise InputError(f"--out {out}: inside {inside}, so the kit would be an input of the next build; give --out "
                         "a folder outside the folders the image bakes")
    if plan.tag != manifest.tag:
        raise InputError(f"the profiles in {config} give the image {plan.tag}, not {where}'s {manifest.tag}: a "
                         "profile added or removed since changes which selection is 'all'; "
                         f"{checkout_hint(manifest.revision, 'the release was made at')}")
    checks = (("input", {f.path: f.sha256 for f in plan.inputs}),
              ("profile", {rel: hashlib.sha256(plan.config_data(rel)).hexdigest() for rel in plan.config_files}),
              ("lock", {(lock := (plan.config_dir / LOCK_FILE).relative_to(plan.project_root).as_posix()):
                        hashlib.sha256(plan.config_data(lock)).hexdigest()}))
    for role, ours in checks:
        theirs: dict[str, str] = {}
        for path, sha in listed_materials(document, role):
            if path in theirs:  # which of the two a reader takes would be its own choice
                raise VerificationError(f"{release / PROVENANCE}: lists the {role} {visible_name(path)[:200]} more "
                                        "than once; a release made by unibake lists each once")
            theirs[path] = sha
        for path in sorted(set(ours) | set(theirs)):
            if ours.get(path) != theirs.get(path):
                state = (f"is not one {where} was built from" if path not in theirs else
                         f"of {where} is missing here" if path not in ours else
                         f"differs from the one {where} was built from")
                raise InputError(f"{role} {path} {state} (its provenance lists them); "
                                 f"{checkout_hint(manifest.revision, 'it was built from')}")

    def image(role: str, ref: str, sha: str) -> BaseImage:  # as kit.json will hold it: checked here, by name
        if not (IMAGE_REF_RE.fullmatch(ref) and len(ref) <= 512 and HEX64_RE.fullmatch(sha)):
            raise VerificationError(f"{release / PROVENANCE}: its {role} {ref[:80]!r} is not an image reference "
                                    "with a sha256 digest")
        return BaseImage(ref=ref, image_id=f"sha256:{sha}")

    # the images the profiles build on (checked above against the provenance's) are the ones kit.json
    # names: the provenance gives their IDs, each once, and names no other (the rebuild checks only
    # those it names before building; a second base would leave which one to the order of its lines)
    wanted = {"base image": (plan.base_image,), "builder image": (plan.builder_image,) if plan.builder_image else (),
              TOOLCHAIN_ROLE: plan.toolchain_images}
    images: dict[str, dict[str, BaseImage]] = {}
    for role, refs in wanted.items():
        listed = [image(role, ref, sha) for ref, sha in listed_materials(document, role)]
        names = [i.ref for i in listed]
        for ref in dict.fromkeys(names):
            if names.count(ref) > 1:
                raise VerificationError(f"{release / PROVENANCE}: names the {role} {ref} {names.count(ref)} times; "
                                        "a release made by unibake names each image once")
        if role != TOOLCHAIN_ROLE and len(names) > 1:
            raise VerificationError(f"{release / PROVENANCE}: names {len(names)} {role}s ({', '.join(names)}): a "
                                    "release is built on one, so which one the kit needs cannot be told")
        for ref in names:
            if ref not in refs:
                raise VerificationError(f"{release / PROVENANCE}: names the {role} {ref}, which the profiles do not "
                                        f"build on ({', '.join(refs) or 'none'})")
        for ref in refs:
            if ref not in names:
                raise VerificationError(f"{release / PROVENANCE}: names no {role} {ref}, which the profiles build on")
        images[role] = {i.ref: i for i in listed}
    base = images["base image"][plan.base_image]
    builder = images["builder image"].get(plan.builder_image) if plan.builder_image else None
    toolchains = tuple(images[TOOLCHAIN_ROLE][ref] for ref in plan.toolchain_images)
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # removed again if no kit is written
    out.mkdir(parents=True, exist_ok=True)
    name = kit_name(manifest.product, manifest.release)
    kit = manifest.supply_chain.kit
    try:
        written = write_kit(out, name, plan=plan, context=render(plan), release=manifest.release,
                            image_id=manifest.image_id, diff_ids=manifest.diff_ids, epoch=manifest.source_date_epoch,
                            revision=manifest.revision, base=base, builder=builder,
                            expect_context=byproducts_of(document).get(CONTEXT, "none recorded"),
                            toolchains=toolchains,
                            expect_sha256=kit.sha256 if kit else None)  # not the release's kit: nothing may pass for it
    except BaseException as exc:
        for folder in made:  # innermost first; only as they were made, empty
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, OSError) and (exc.filename is None or Path(exc.filename).parent == out):
            # a write that failed (a full disk, a folder made read-only meanwhile): --out named, not "a file"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left in {out} while writing the kit {name}; nothing written") from None
            raise UnibakeError(f"cannot write the kit {name} in {out} ({exc.strerror or exc}); nothing written") \
                from None
        raise
    return written, kit.sha256 if kit else None
