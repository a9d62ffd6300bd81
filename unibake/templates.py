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

import json
import re
import shlex
from functools import cache
from pathlib import Path

import jinja2

from .errors import UnibakeError

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
    """A value as a Markdown code span whatever it holds: a fence longer than its own backticks,
    pipes escaped so it stays in its table cell, and no HTML even for renderers that are not CommonMark."""
    text = inline_text(value)  # a line break would end the table row
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
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


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(mount_var=mount_var, dq=dq, sh=sh, sh_runtime=sh_runtime, json=json.dumps, gib=gib, md=md, code=code,
                       dirname=lambda v: str(v).rsplit("/", 1)[0])
    env.globals.update(verify_release_sh=verify_release_sh, verifier_end=VERIFIER_END, verifier_split=VERIFIER_SPLIT)
    return env


def render_template(name: str, **values: object) -> str:
    return environment().get_template(name).render(**values)
