"""The build's lower part, memoised by the digest of its inputs.

The rendered Dockerfile has a marker line (:data:`MARKER`) after the layers that change least
(the builder stages, the base, the engine, the kernels, the sidecars, the prebuilt kernels). After
a build, the image of the last step above the marker and the last image of every builder stage are
recorded under the digest of everything those steps read: the instructions above the marker, the image IDs
of its ``FROM`` images, the build platform, and the name, mode and sha256 of every context file a
``COPY`` above the marker reads (every context file when a ``FROM`` image has ``ONBUILD`` triggers: a
trigger's ``COPY`` or ``ADD`` reads files no line of the Dockerfile names).

A later build whose inputs have the same digest, and whose engine still holds those images, builds
only the part below the marker: ``FROM`` the recorded image, ``COPY --from=`` the recorded stage
images, from a context holding only the files that part reads. The engine's classic builder then
does exactly what it does for the same steps of the whole Dockerfile (the recorded image is the
one the whole build committed for that step; its cache serves the steps below as before), so the
image is the same, but the big lower context (an engine folder of gigabytes) is neither sent nor
hashed again. ``--no-cache`` builds everything; a memo that does not match is ignored.

A memo file lives in the project (``.cache/build-memo/``), which a checkout could bring too: one naming
images of the engine's own choosing (an older release's image, whose ID its manifest says) would have
the build go on FROM that image. So each memo carries an HMAC of what it records under a key of this
user's own (:func:`secret`, in the user's cache folder, never the project): one without it is ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from .engine import BuildStep, Engine
from .errors import UnibakeError
from .files import linked_above, open_new, read_small_file, write_atomic
from .render import BuildContext, ContextFile

MARKER = "# --- unibake: the steps above are memoised by the digest of their inputs; those below run every build ---"
VERSION = 2  # 2: steps counted at "\n" only; a memo of 1 may name a step below the marker (a U+2028 in a value)
_ID = re.compile(r"sha256:[0-9a-f]{64}")
_FROM = re.compile(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?$", re.IGNORECASE)
_COPY_FROM = re.compile(r"^(COPY\s+--from=)(\S+)(\s)", re.IGNORECASE | re.MULTILINE)
_COPY_SOURCE = re.compile(r"^(?:COPY|ADD)\s+(?!--)(\S+)\s", re.IGNORECASE)
SECRET = "build-memo.key"
SECRET_BYTES = 32


def user_folder(env) -> Path | None:
    """This user's own unibake folder in their cache folder (``$XDG_CACHE_HOME``, else ``$HOME/.cache``, else the
    home the user database gives, then ``unibake/``), made on first use; None when there is none, or it is
    another user's or anyone may write in it (they could put files of theirs there)."""
    homes = [env.get("XDG_CACHE_HOME") or "", f"{env['HOME']}/.cache" if env.get("HOME") else ""]
    try:
        homes.append(f"{pwd.getpwuid(os.getuid()).pw_dir}/.cache")
    except KeyError:  # a uid the user database does not know (a container's)
        pass
    base = next((h for h in homes if h.startswith("/") and h != "/.cache"), "")  # (relative ones: not a place)
    if not base:
        return None
    folder = Path(base) / "unibake"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(folder)
    except OSError:
        return None
    if info.st_uid != os.geteuid() or info.st_mode & 0o002:
        return None
    return folder


def secret(env) -> bytes | None:
    """This user's key of the memos' HMAC, ``build-memo.key`` in :func:`user_folder`, made on first use; None (no
    memo used or recorded) when there is no such folder or the key can be neither read nor made."""
    folder = user_folder(env)
    if folder is None:
        return None
    key = _own_key(folder / SECRET)
    if key is not None:
        return key
    # none yet (or not a key, or one others can read): a new one, and the memos made with another are ignored
    key = os.urandom(SECRET_BYTES)
    temp = folder / f".{SECRET}.{os.getpid()}.tmp"
    try:
        with open_new(temp, 0o600) as fh:  # private from its first byte (the folder may be others' to enter)
            fh.write(key)
            fh.flush()
            os.fchmod(fh.fileno(), 0o600)
            os.fsync(fh.fileno())
        try:  # never over a key another run's first use made meanwhile: its memos would all be ignored
            os.link(temp, folder / SECRET)
        except FileExistsError:
            other = _own_key(folder / SECRET)
            if other is not None:
                return other
            os.replace(temp, folder / SECRET)  # a file that is no key of this user's alone: replaced
    except OSError:
        return None
    finally:
        temp.unlink(missing_ok=True)
    return key


def _own_key(path: Path) -> bytes | None:
    """The key at ``path`` if it is one (a regular file of SECRET_BYTES, not a link) that this user owns
    and no one else may read or write; None otherwise (a key others can read is no secret: memos they
    sign with it would be taken)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077 \
                or info.st_size != SECRET_BYTES:
            return None
        key = os.read(fd, SECRET_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return key if len(key) == SECRET_BYTES else None


def _mac(secret_key: bytes, key: str, lower: str, stages: tuple[str, ...]) -> str:
    text = json.dumps({"version": VERSION, "key": key, "lower": lower, "stages": list(stages)}, sort_keys=True)
    return hmac.new(secret_key, text.encode(), hashlib.sha256).hexdigest()


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, one per entry (continuation lines joined), comments left out.
    Hand-written: the Dockerfiles read here are the ones unibake renders (no parser directives,
    no comments inside a continued instruction, no heredocs). Lines end at "\n" only, as the engine's
    parser reads them: str.splitlines() also ends one at U+2028 or U+0085 in a value (a build.run), so the
    steps were miscounted and the memo recorded the image of a step below the marker."""
    found, current = [], ""
    for line in text.split("\n"):
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        found.append((current + stripped).strip())
        current = ""
    if current.strip():
        found.append(current.strip())
    return found


@dataclass(frozen=True, kw_only=True)
class Split:
    """The Dockerfile cut at the marker."""

    lower: str
    upper: str
    lower_steps: int  # the classic builder's steps above the marker (FROM counts as one)
    stages: tuple[str, ...]  # the builder stages' names, in order
    bases: tuple[str, ...]  # every FROM image above the marker
    lower_sources: tuple[str, ...]  # the context paths the COPY lines above the marker read
    upper_sources: tuple[str, ...]


def split(dockerfile: str) -> Split | None:
    """The cut, or None when the Dockerfile has no single marker or the part below it is not plain
    (a FROM, or a COPY --from naming no builder stage, below the marker)."""
    if dockerfile.count(MARKER) != 1:
        return None
    lower, upper = dockerfile.split(MARKER)
    low, up = instructions(lower), instructions(upper)
    stages, bases = [], []
    for step in low:
        m = _FROM.match(step)
        if m:
            bases.append(m.group(1))
            if m.group(2):
                stages.append(m.group(2))
    if not bases or low[-1].upper().startswith("FROM ") or any(_FROM.match(s) for s in up):
        return None
    if len(stages) != len(bases) - 1 or len(set(stages)) != len(stages):
        return None
    if any(m.group(2) not in stages for m in _COPY_FROM.finditer("\n".join(up))):
        return None
    return Split(lower=lower, upper=upper, lower_steps=len(low), stages=tuple(stages), bases=tuple(bases),
                 lower_sources=tuple(m.group(1) for s in low for m in [_COPY_SOURCE.match(s)] if m),
                 upper_sources=tuple(m.group(1) for s in up for m in [_COPY_SOURCE.match(s)] if m))


def _reads(f: ContextFile, sources: tuple[str, ...]) -> bool:
    return any(f.name == s or (s.endswith("/") and f.name.startswith(s)) for s in sources)


def inputs_digest(context: BuildContext, cut: Split, engine: Engine, platform: str | None) -> str | None:
    """The digest of everything the steps above the marker read; None when a FROM image is missing."""
    h = hashlib.sha256(f"unibake build memo {VERSION}\nplatform {platform or ''}\n".encode())
    h.update("\n".join(instructions(cut.lower)).encode())  # comments (the header names the version) left out
    triggers = False  # a base's ONBUILD COPY or ADD reads context files no COPY line above the marker names
    for ref in cut.bases:
        info = engine.inspect_image(ref)
        if info is None:
            return None
        h.update(f"\nFROM {ref} = {info.id}".encode())
        triggers = triggers or bool(info.onbuild)
    for f in context.files:
        if triggers or _reads(f, cut.lower_sources):
            h.update(f"\n{f.name}\0{f.mode:o}\0{f.sha256}".encode())
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Memo:
    """What a build recorded: the image of its last step above the marker, its stages' last images."""

    key: str
    lower: str
    stages: tuple[str, ...]


def _file(folder: Path, selection: str, platform: str | None) -> Path:
    return folder / (re.sub(r"[^A-Za-z0-9_.-]", "-", f"{selection}-{platform or 'native'}")[:120] + ".json")


def lookup(folder: Path, selection: str, platform: str | None, key: str, cut: Split, engine: Engine,
           secret_key: bytes) -> Memo | None:
    """The memo of these inputs, if it is well-formed, made by this user (its HMAC under ``secret_key``)
    and the engine still holds its images; else None (the whole Dockerfile is built). The file is never
    trusted further than that."""
    try:
        path = _file(folder, selection, platform)
        raw = json.loads(read_small_file(path, UnibakeError, limit=1 << 16, follow=False).decode("utf-8"))
        memo = Memo(key=raw["key"], lower=raw["lower"], stages=tuple(raw["stages"]))
        if raw.get("version") != VERSION or memo.key != key or len(memo.stages) != len(cut.stages):
            return None
        if not all(isinstance(i, str) and _ID.fullmatch(i) for i in (memo.lower, *memo.stages)):
            return None
        if not isinstance(raw.get("mac"), str) or \
                not hmac.compare_digest(raw["mac"], _mac(secret_key, memo.key, memo.lower, memo.stages)):
            return None  # not this user's: a memo a checkout brought
    except (UnibakeError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # (RecursionError: JSON nested deeper than the stack)
    for image_id in (memo.lower, *memo.stages):
        info = engine.inspect_image(image_id)
        if info is None or info.id != image_id:
            return None
    return memo


def record(folder: Path, selection: str, platform: str | None, key: str, cut: Split, steps: tuple[BuildStep, ...],
           stage_images: tuple[str, ...], engine: Engine, secret_key: bytes) -> Memo | None:
    """After a whole build: the image the engine committed for the last step above the marker, and the
    stages' last images, kept under ``key``. Nothing is recorded if the build's report does not line up
    with the Dockerfile (a step count that differs, an image not found)."""
    if len(steps) < cut.lower_steps or len(stage_images) != len(cut.stages):
        return None
    step = steps[cut.lower_steps - 1]
    if step.number != cut.lower_steps or not step.image:
        return None
    ids = []
    for ref in (step.image, *stage_images):
        info = engine.inspect_image(ref)
        if info is None:
            return None
        ids.append(info.id)
    memo = Memo(key=key, lower=ids[0], stages=tuple(ids[1:]))
    path = _file(folder, selection, platform)
    try:  # (a memo not kept costs the next build its steps, never this one: a folder left root's by a sudo run)
        if not linked_above(path.parent, 1):  # (.cache or its build-memo a checkout linked elsewhere)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path.parent, path.name, json.dumps({"version": VERSION, "key": key, "lower": memo.lower,
                                                             "stages": list(memo.stages),
                                                             "mac": _mac(secret_key, key, memo.lower, memo.stages)},
                                                            indent=2) + "\n")
    except (OSError, UnibakeError):
        pass
    return memo


def upper_context(context: BuildContext, cut: Split, memo: Memo) -> BuildContext:
    """The context of the part below the marker: FROM the recorded image, COPY --from the recorded
    stage images, and only the files that part reads."""
    stage_ids = dict(zip(cut.stages, memo.stages))
    body = _COPY_FROM.sub(lambda m: f"{m.group(1)}{stage_ids[m.group(2)]}{m.group(3)}", cut.upper)
    dockerfile = f"# the steps above the marker: image {memo.lower} (build memo)\nFROM {memo.lower}\n{body}"
    data = dockerfile.encode()
    files = [f for f in context.files if _reads(f, cut.upper_sources)]
    files.append(ContextFile(name="Dockerfile", mode=0o644, sha256=hashlib.sha256(data).hexdigest(), data=data))
    return replace(context, dockerfile=dockerfile, files=tuple(sorted(files, key=lambda f: f.name)))


LOWER_RECORDS = 16  # the (image, epoch) pairs a selection's record of normalised lower layers keeps, newest first


def _lower_file(folder: Path, selection: str, platform: str | None) -> Path:
    path = _file(folder, selection, platform)
    return path.with_name(path.stem + ".lower.json")


def _lower_mac(secret_key: bytes, lower: str, epoch: int, diff_ids: tuple[str, ...]) -> str:
    text = json.dumps({"lower": lower, "epoch": epoch, "diff_ids": list(diff_ids)}, sort_keys=True)
    return hmac.new(secret_key, f"unibake normalised lower {VERSION}\n{text}".encode(), hashlib.sha256).hexdigest()


def _lower_entries(path: Path) -> list[dict]:
    try:
        raw = json.loads(read_small_file(path, UnibakeError, limit=1 << 20, follow=False).decode("utf-8"))
        entries = raw["entries"] if raw.get("version") == VERSION else []
        return [e for e in entries if isinstance(e, dict)][:LOWER_RECORDS] if isinstance(entries, list) else []
    except (UnibakeError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []  # (RecursionError: JSON nested deeper than the stack)


def remember_lower(folder: Path, selection: str, platform: str | None, lower: str, epoch: int,
                   diff_ids: tuple[str, ...], secret_key: bytes) -> None:
    """After an image built FROM the memo's ``lower`` image was normalised with ``epoch``: the diffIDs its
    layers got (the first ``len(diff_ids)`` of the release), so that a hotfix can tell, without exporting
    anything, whether an earlier release's bottom layers are what this memo's image gives (see
    :mod:`unibake.assemble`). Signed like the memo: a record a checkout brought is not taken."""
    path = _lower_file(folder, selection, platform)
    entry = {"lower": lower, "epoch": epoch, "diff_ids": list(diff_ids),
             "mac": _lower_mac(secret_key, lower, epoch, diff_ids)}
    kept = [e for e in _lower_entries(path) if (e.get("lower"), e.get("epoch")) != (lower, epoch)]
    if linked_above(path.parent, 1):  # (.cache or its build-memo: the project's own folder may be a link)
        return  # (not kept: written wherever a checkout's link points)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path.parent, path.name, json.dumps({"version": VERSION, "entries": [entry, *kept][:LOWER_RECORDS]},
                                                    indent=2) + "\n")


def remembered_lower(folder: Path, selection: str, platform: str | None, lower: str, epoch: int,
                     secret_key: bytes) -> tuple[str, ...] | None:
    """The diffIDs :func:`remember_lower` recorded for ``lower`` normalised with ``epoch``, if this user's
    key signed them; None otherwise."""
    for e in _lower_entries(_lower_file(folder, selection, platform)):
        diff_ids = e.get("diff_ids")
        if e.get("lower") != lower or e.get("epoch") != epoch or not isinstance(diff_ids, list) \
                or not all(isinstance(d, str) and _ID.fullmatch(d) for d in diff_ids):
            continue
        mac = e.get("mac")
        # (compare_digest takes ASCII text alone: a mac of other text is a TypeError, so no record of this key)
        if isinstance(mac, str) and mac.isascii() \
                and hmac.compare_digest(mac, _lower_mac(secret_key, lower, epoch, tuple(diff_ids))):
            return tuple(diff_ids)
    return None
