"""The one Jinja2 environment: the templates shipped in ``unibake/templates/`` and the filters
that escape a value for where it lands.

* ``dq``: a double-quoted Dockerfile word (ENV, LABEL): backslash, quote and ``$`` escaped;
* ``sh``: one POSIX shell word; ``sh_runtime``: a shell word in which ``${NAME}`` expands when the
  container starts and everything else is literal;
* ``md``: text from outside as inline Markdown (no markup, no HTML); ``code``: a value as a code
  span whatever backticks or pipes it holds;
* ``json``: a JSON value (exec form); ``gib``: bytes as GiB; ``dirname``: a path's folder;
* ``mount_var``: a weight mount's name as the suffix of its variables (``MODEL_<X>``).

``verify_release_sh()`` gives ``scripts/verify-release.sh`` (linked here as package data), which a
hotfix's ``apply.sh`` carries and runs: one copy of the downloader's checks and load.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import re
import shlex
import stat
from functools import cache
from pathlib import Path
from types import CodeType

import jinja2
from jinja2.bccache import bc_magic

from .errors import UnibakeError
from .files import private_folder, write_atomic

TEMPLATES = Path(__file__).resolve().parent / "templates"
RUNTIME_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def dq(value: object) -> str:
    """A double-quoted Dockerfile word (ENV, LABEL): backslash, quote and ``$`` escaped."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def sh(value: object) -> str:
    """A single POSIX shell word."""
    return shlex.quote(str(value))


def sh_runtime(value: object) -> str:
    """A shell word in which ``${NAME}`` is expanded when the container starts; all else is literal."""
    text = str(value)
    parts, last = [], 0
    for m in RUNTIME_VAR_RE.finditer(text):
        if m.start() > last:
            parts.append(shlex.quote(text[last:m.start()]))
        parts.append(f'"${{{m.group(1)}}}"')
        last = m.end()
    if last < len(text) or not parts:
        parts.append(shlex.quote(text[last:]))
    return "".join(parts)


MD_SPECIAL_RE = re.compile(r"([\\`*\[\]|])")  # what can make a link, code, emphasis or a new table cell


def inline_text(value: object) -> str:
    """``value`` as text for one line of the notes: a line break or tab as a space (it would end the table row),
    any other control character (an escape sequence drives the terminal that cats the notes), and every
    character that hides or reorders what is around it (``\\u202e``, as the console hides them), as U+FFFD."""
    from .console import replaced

    return replaced(str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " "))


def md(value: object) -> str:
    """Text from outside (an image's labels, an engine's version) as inline Markdown: no markup, no
    HTML, no table cell it could break out of, no control or bidirectional character."""
    text = inline_text(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return MD_SPECIAL_RE.sub(r"\\\1", text)


def code(value: object) -> str:
    """A value as a Markdown code span whatever it holds: a fence longer than its own backticks, pipes
    escaped so it stays in its table cell. ``&``, ``<`` and ``>`` are left as they are: inside a code span no
    renderer reads HTML or an entity (CommonMark, GitHub's, Markdown.pl encode them themselves), and encoded here
    they were shown as written, ``a&amp;b`` for the env value ``a&b`` (copied from the notes: the wrong value)."""
    text = inline_text(value).replace("|", "\\|")  # a line break would end the table row
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def mount_var(name: str) -> str:
    """The suffix of a weight mount's variables (run.sh's ``MODEL_<X>``, the image's
    ``UNIBAKE_MOUNT_<X>``): upper case, '-' and '.' as '_', so it is a shell variable name."""
    return name.upper().replace("-", "_").replace(".", "_")


def gib(size: int) -> str:
    """Bytes as GiB; a size under 0.01 GiB (that would read "0.00 GiB", as if empty) in MiB or KiB."""
    if size >= 2**30 / 100:
        return f"{size / 2**30:.2f} GiB"
    if size >= 2**20:
        return f"{size / 2**20:.2f} MiB"
    return f"{size / 2**10:.2f} KiB"


VERIFIER_END = "END_OF_VERIFY_RELEASE_SH"  # ends the here-document apply.sh carries the verifier in
# the line of the verifier where its signature check has ended and its reading of the folder begins:
# apply.sh runs its own engine checks there (with --key, the engine is asked only once the signature is good)
VERIFIER_SPLIT = "# --- 1. SHA256SUMS, read as unibake's own verifier reads it"


@cache
def verify_release_sh(path: Path = TEMPLATES / "verify-release.sh") -> str:
    """The text of scripts/verify-release.sh, for a template to carry in a quoted here-document."""
    text = path.read_text(encoding="utf-8")
    # a checkout that makes links plain files holds the link's target instead: apply.sh would run that
    if (not text.startswith("#!/bin/sh\n") or VERIFIER_END in text  # (which would end the here-document)
            or not any(line.startswith(VERIFIER_SPLIT) for line in text.splitlines())):
        raise UnibakeError(f"{path} is not scripts/verify-release.sh, which a hotfix's apply.sh carries (a link "
                           "checked out as a file?); nothing was published")
    return text.rstrip("\n")


COMPILED = "templates"  # in this user's own unibake folder (buildmemo.user_folder): the compiled templates


class _CompiledTemplates(jinja2.BytecodeCache):
    """jinja2's compiled templates kept in this user's own unibake folder (``templates/``, mode 0700), each under
    its name's key and checked against the sha1 jinja2 gives its source: a run renders its
    texts without compiling them (0.13-0.22 s on this machine kind for a release's, every run, before).

    Written over jinja2's ``BytecodeCache`` hooks, not its ``FileSystemBytecodeCache``: that one reads a pickle
    (code run as it loads) from any file it finds by name, and lets an OSError (a full disk, a folder made
    read-only) fail the render. Here a compiled template is read only from a folder no one else may write in, only
    from a file this user owns that no one else may write, not through a link, with nothing pickled (the source's
    sha1 and what made the environment as text, then the code marshalled); one that cannot be read or written is
    compiled again, silently."""

    def __init__(self, folder: Path):
        self.folder = folder
        # what a compiled template depends on besides its source: the environment's settings, made in this file
        # (jinja2's own key leaves them out: a template compiled under other settings was taken), and jinja2's version
        self.made_by = hashlib.sha256(Path(__file__).read_bytes() + jinja2.__version__.encode()).hexdigest()

    def _head(self, bucket) -> bytes:
        return bc_magic + f"{bucket.checksum} {self.made_by}\n".encode()

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        """By the template's name alone (jinja2's key adds its file's path): one file per template, not one more
        for every checkout a CI runner clones anew; a checkout of other templates compiles its own again."""
        return hashlib.sha256(name.encode()).hexdigest()

    def load_bytecode(self, bucket) -> None:
        try:
            fd = os.open(self.folder / f"{bucket.key}.cache",
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return
        with os.fdopen(fd, "rb") as fh:
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022 \
                        or info.st_size > COMPILED_LIMIT:
                    return
                data = fh.read(COMPILED_LIMIT + 1)
            except OSError:
                return
        head = self._head(bucket)
        if not data.startswith(head):  # (another jinja2, Python or environment, or the template changed since)
            return
        try:
            code = marshal.loads(data[len(head):])
        except (EOFError, ValueError, TypeError):
            return
        if isinstance(code, CodeType):
            bucket.code = code

    def dump_bytecode(self, bucket) -> None:
        try:
            write_atomic(self.folder, f"{bucket.key}.cache", self._head(bucket) + marshal.dumps(bucket.code),
                         mode=0o600)
        except (OSError, ValueError):  # (ValueError: marshal's, never expected)
            pass


COMPILED_LIMIT = 8 << 20  # a compiled template's file (a release's biggest, run.sh.j2's: about 0.2 MB)


def _compiled_templates() -> _CompiledTemplates | None:
    """Where compiled templates are kept: ``templates/`` in this user's own unibake folder, when it is this user's
    and no one else may write in it (made so on first use); None otherwise (every template compiled each run)."""
    from .buildmemo import user_folder  # (here: buildmemo imports render, which imports this module)

    home = user_folder(os.environ)
    if home is None:
        return None
    folder = home / COMPILED
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return _CompiledTemplates(folder) if private_folder(folder) else None


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, bytecode_cache=_compiled_templates())
    env.filters.update(mount_var=mount_var, dq=dq, sh=sh, sh_runtime=sh_runtime, json=json.dumps, gib=gib, md=md, code=code,
                       dirname=lambda v: str(v).rsplit("/", 1)[0])
    env.globals.update(verify_release_sh=verify_release_sh, verifier_end=VERIFIER_END, verifier_split=VERIFIER_SPLIT)
    return env


def render_template(name: str, **values: object) -> str:
    return environment().get_template(name).render(**values)
