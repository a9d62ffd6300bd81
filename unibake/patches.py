"""Patch files applied to the engine's files when the image is planned.

Each patch (a unified diff: ``diff -u``, ``git diff`` or ``git format-patch`` output) is parsed with
``unidiff`` and applied in order, in memory, to the engine folder as hashed; the patched files then
go into the build context in place of the originals (so ``files.sha256`` and ``self-check`` know
them). A hunk applies exactly where it says, with its context lines equal to the file's (no offset,
no fuzz: a release applies what was reviewed); otherwise the plan is refused, naming the patch,
the file, the hunk and the first line that differs. unidiff only parses, and the one library that
also applies (whatthepatch) misreads git's deleted-file headers and format-patch signatures, so the
apply step is written here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import unidiff

from .errors import InputError
from .files import decode_text, open_regular
from .inputs import SKIPPED_DIRS, SKIPPED_SUFFIXES, InputFile, Source, read_hashed, read_source
from .schema import FILE_PATH_RE, default_of

MAX_PATCH = 16 << 20
GIT_MODE_RE = re.compile(r"^(?:new file mode|new mode) ([0-7]{6})$")  # git's header of a new or changed mode
GIT_MODES = {0o100644: 0o644, 0o100755: 0o755}  # the regular files' modes git records (only the x bit)


@dataclass(frozen=True, kw_only=True)
class Patch:
    """One patch file: where it is, how many leading components its paths carry, what it changes."""

    name: str
    file: InputFile
    strip: int
    diff: unidiff.PatchSet
    where: str

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({_target(f, self.strip, self.where) for f in self.diff}))


@dataclass(frozen=True, kw_only=True)
class PatchedFile:
    """An engine file after the patches: its new bytes, or None when a patch deletes it."""

    path: str  # relative to the engine folder
    data: bytes | None
    mode: int = 0o644

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data or b"").hexdigest()


def _strip(path: str, n: int, where: str) -> str:
    parts = path.split("/")
    if len(parts) <= n:
        raise InputError(f"{where}: the path {path!r} has fewer than {n + 1} components (strip: {n})")
    out = "/".join(parts[n:])
    # a file's path: one ending in '/' (a folder's) passed here and failed the build, the engine unable to put it
    # in the context ("filename may not have trailing slash"), naming no patch
    if out.endswith("\r") and FILE_PATH_RE.fullmatch(out[:-1]):  # (its lines end in \r\n: a Windows editor's)
        raise InputError(f"{where}: the patched path {out!r} ends in a carriage return: the patch's lines end in "
                         "\\r\\n (a Windows editor's); save it with \\n line ends")
    if not FILE_PATH_RE.fullmatch(out):
        parts = out.split("/")
        if out.startswith("/") or out.endswith("/") or any(part in ("", ".", "..") for part in parts):
            raise InputError(f"{where}: the patched path {out!r} is not the relative path of a file inside the engine "
                             "folder")
        # inside the folder, of characters a patched path may not hold (an adopter's file with a space, or one git
        # names in quotes, "a/caf\303\251.py", was said to be outside the folder)
        quoted = " (git writes a name of other characters in quotes, with octal escapes)" if '"' in path else ""
        raise InputError(f"{where}: the patched path {out!r} holds a character a patched path may not: each of its "
                         f"parts is letters, digits and . _ + - (no spaces, ASCII only){quoted}; rename the file, or "
                         "bake its new version with an overlay")
    # what a folder source leaves out, written by a patch instead (a hook under .git/hooks, a stale .pyc)
    folders, name = out.split("/")[:-1], out.split("/")[-1]
    skipped = next((part for part in folders if part in SKIPPED_DIRS), None)
    if skipped is not None or name.endswith(SKIPPED_SUFFIXES):
        what = f"a file inside a {skipped} folder" if skipped else f"a compiled Python file ({Path(name).suffix})"
        raise InputError(f"{where}: patches {out}, {what}, which is never baked (a folder source leaves .git and "
                         "__pycache__ folders and *.pyc files out); patch the source files only")
    return out


def _target(f: unidiff.PatchedFile, strip: int, where: str) -> str:
    return _strip(f.source_file if f.is_removed_file else f.target_file, strip, where)


def read_patch(root: Path, spec: dict, where) -> Patch:
    """A patch file of ``patches:``, hashed and parsed; ``where(path)`` locates its YAML keys."""
    source: Source = read_source(root, spec["file"], where(("file",)), want="file")
    f = source.files[0]
    text = decode_text(read_hashed(f, MAX_PATCH), f.absolute, InputError)
    try:
        diff = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise InputError(f"{f.path}: not a unified diff: {exc}") from None
    if not len(diff):
        raise InputError(f"{f.path}: holds no file changes")
    strip = spec.get("strip", default_of("patches", "strip"))
    for pf in diff:
        if pf.is_binary_file:
            raise InputError(f"{f.path}: changes the binary file {pf.path}; bake binaries with an overlay")
        _git_mode(pf, f.path)
        if pf.is_rename or (not pf.is_added_file and not pf.is_removed_file
                            and _strip(pf.source_file, strip, f.path) != _strip(pf.target_file, strip, f.path)):
            raise InputError(f"{f.path}: renames {pf.source_file} to {pf.target_file}; use a new file and a "
                             "deletion instead")
    return Patch(name=Path(f.path).name, file=f, strip=strip, diff=diff, where=f.path)


def _git_mode(pf: unidiff.PatchedFile, where: str) -> int | None:
    """The mode a git patch gives the file (``new file mode 100755``, ``new mode 100755``), or None."""
    for line in pf.patch_info or ():
        match = GIT_MODE_RE.match(str(line).rstrip("\r\n"))
        if match:
            mode = int(match.group(1), 8)
            if mode not in GIT_MODES:
                raise InputError(f"{where}: gives {pf.path} the mode {match.group(1)} (a symbolic link or a "
                                 "submodule); patch regular files only, bake the rest with an overlay")
            return GIT_MODES[mode]
    return None


def _lines(text: str) -> list[str]:
    """The lines of a file as diff and patch count them: ended by "\n" only (str.splitlines() also
    ends one at a form feed, a lone "\r", \x85 or U+2028, and every hunk below it would miss)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _sides(hunk: unidiff.Hunk) -> tuple[list[str], list[str]]:
    """A hunk's lines before and after; a line followed by "\\ No newline at end of file" ends the
    file without one, on its side (both sides for a context line)."""
    old: list[str] = []
    new: list[str] = []
    last = None
    for line in hunk:
        if line.line_type == "\\":
            for side in {"-": (old,), "+": (new,), " ": (old, new)}.get(last, ()):
                side[-1] = side[-1].removesuffix("\n")
            continue
        if line.line_type in (" ", "-"):
            old.append(line.value)
        if line.line_type in (" ", "+"):
            new.append(line.value)
        last = line.line_type
    return old, new


def _apply_hunks(lines: list[str], pf: unidiff.PatchedFile, patch: Patch, path: str) -> list[str]:
    out = list(lines)
    delta = after = 0
    for number, hunk in enumerate(pf, 1):
        old, new = _sides(hunk)
        first = hunk.source_start if hunk.source_length == 0 else hunk.source_start - 1
        if first < after:
            # each hunk's place is counted after the ones above it are applied (``delta``): one listed after a
            # hunk below it, or overlapping it, would land elsewhere than it says where lines repeat (GNU patch:
            # "misordered hunks")
            raise InputError(f"{patch.where}: hunk #{number} (@@ -{hunk.source_start},{hunk.source_length} @@) of "
                             f"{path} starts inside or above the hunk before it (which ends at line {after}): "
                             "hunks must be in the file's order and must not overlap")
        after = first + len(old)
        start = first + delta
        found = out[start:start + len(old)]
        if found != old:
            header = f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
            bad = next((i for i, (a, b) in enumerate(zip(found, old)) if a != b), min(len(found), len(old)))
            want = old[bad].rstrip("\n") if bad < len(old) else "(end of hunk)"
            got = found[bad].rstrip("\n") if bad < len(found) else "(end of file)"
            raise InputError(f"{patch.where}: hunk #{number} ({header}) does not apply to {path}: line "
                             f"{hunk.source_start + bad} is {got[:120]!r}, the patch expects {want[:120]!r}")
        out[start:start + len(old)] = new
        delta += len(new) - len(old)
    return out


MAX_PATCHED = 64 << 20  # a file a patch changes is held whole, as text: a source file, not a 10 GB blob


def _original(f: InputFile, path: str, where: str) -> bytes:
    """An engine file a patch changes, as it was hashed: read again, so one edited since (or grown to
    gigabytes) would have been patched unchecked (or read whole into memory)."""
    if f.size > MAX_PATCHED:
        raise InputError(f"{where}: changes {path}, a file of {f.size} bytes; patches apply to text files of at most "
                         f"{MAX_PATCHED >> 20} MiB")
    with open_regular(f.absolute) as fh:
        data = fh.read(MAX_PATCHED + 1)
    if hashlib.sha256(data).hexdigest() != f.sha256:
        raise InputError(f"{where}: {f.path} changed after it was hashed (while the plan was made); run again")
    return data


def apply_patches(engine: Source, patches: tuple[Patch, ...]) -> dict[str, PatchedFile]:
    """The engine files the patches change (``data`` None: deleted), by path in the engine folder."""
    originals = {engine.relative(f): f for f in engine.files}
    current: dict[str, PatchedFile] = {}
    for patch in patches:
        for pf in patch.diff:
            path = _target(pf, patch.strip, patch.where)
            exists = path in current and current[path].data is not None or \
                path not in current and path in originals
            if pf.is_added_file and exists:
                raise InputError(f"{patch.where}: creates {path}, which the engine already has")
            if not pf.is_added_file and not exists:
                raise InputError(f"{patch.where}: changes {path}, which is not in the engine folder "
                                 f"{engine.path} (strip: {patch.strip})")
            if path in current:
                before, mode = (current[path].data or b""), current[path].mode
            elif path in originals:
                before, mode = _original(originals[path], path, patch.where), originals[path].mode
            else:
                before, mode = b"", 0o644
            try:
                text = before.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{patch.where}: {path} is not UTF-8 text; patch text files only") from None
            original = _lines(text)
            lines = _apply_hunks(original, pf, patch, path)
            if pf.is_removed_file and lines:
                # (GNU patch: "Not deleting file ... as content differs from patch"): a deletion shows the whole
                # file, so whoever reviews it sees every line that goes
                raise InputError(f"{patch.where}: deletes {path}, but its hunks show {len(original) - len(lines)} "
                                 f"of its {len(original)} lines: a deletion must show the whole file")
            mode = _git_mode(pf, patch.where) or mode  # git's "new mode 100755": the file is executable now
            current[path] = PatchedFile(path=path, data=None if pf.is_removed_file else "".join(lines).encode(),
                                        mode=mode)
    return current
