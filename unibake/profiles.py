"""Load, validate and merge the profile YAMLs.

``product.yaml`` holds what every profile shares; each other ``*.yaml`` in the folder is one
profile and may ``extends:`` another file (by default ``product.yaml``). Merging is the pure
function :func:`merge` and follows the per-key rules in :mod:`unibake.schema`:

* the child file's value wins over its parent's;
* maps and records merge key by key; lists replace, except ``sidecars``, which merge by name (a
  child's sidecar replaces the parent's of the same name, others are added after the parent's);
* ``profile`` and ``extends`` are never inherited.

Every error names the file and line and, for an unknown key, the closest valid one.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .envfile import EnvFile, read_env_file
from .errors import InputError
from .files import decode_text, read_small_file, visible_name
from .inputs import real_path
from .platforms import KNOWN
from .schema import (BIDI_RE, MAX_VALUE_LEN, NAME_MAX, NOT_INHERITED, PATH_PATTERNS, SCHEMA, Key, describe_character,
                     hidden_character)

PRODUCT_FILE = "product.yaml"
MAX_EXTENDS = 32  # files one profile's extends chain may go through (product.yaml not counted)
# ``--profile all`` selects every profile; a platform's architecture is the suffix of its releases' tags
RESERVED_PROFILE_NAMES = frozenset({"all"} | {p.architecture for p in KNOWN.values()})

Path_ = tuple  # a key path inside a document: ("tune_caches", "expect") or ("kernels", 0, "name")


@dataclass(frozen=True, kw_only=True)
class Document:
    """One YAML file: its data and the line of every key path."""

    file: Path
    display: str
    data: dict[str, Any]
    lines: dict[Path_, int]
    raw: bytes = b""  # the bytes parsed: what the provenance hashes and the kit holds, whatever an edit did since

    def where(self, path: Path_) -> str:
        """``file:line`` of a key path (or of its closest located parent)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return f"{self.display}:{self.lines[path[:n]]}"
        return self.display


@dataclass(frozen=True, kw_only=True)
class MergedProfile:
    """A profile after its ``extends`` chain is merged; ``origins`` locate every key path."""

    name: str
    file: str
    chain: tuple[str, ...]
    data: dict[str, Any]
    origins: dict[Path_, str]
    env_files: tuple[EnvFile, ...] = ()  # from product.yaml to the profile's file, in the order they apply
    raw: dict[str, bytes] = field(default_factory=dict, repr=False)  # each file of chain: the bytes parsed

    def where(self, path: Path_) -> str:
        for n in range(len(path), 0, -1):
            if path[:n] in self.origins:
                return self.origins[path[:n]]
        return self.file


def dotted(path: Path_) -> str:
    """A key path as one line: ``tune_caches.expect``, ``kernels[0].name``; odd characters escaped."""
    out = ""
    for part in path:
        text = str(part) if isinstance(part, int) or str(part).isprintable() else \
            str(part).encode("unicode_escape").decode("ascii")
        out += f"[{text}]" if isinstance(part, int) else (f".{text}" if out else text)
    return out


# ---------------------------------------------------------------------------------------------
# Reading YAML with line numbers


YAML_ONLY_BREAKS = {"\x85": "next line", "\u2028": "line separator", "\u2029": "paragraph separator"}
MAX_VALUES = 100_000  # a profile has hundreds; nested aliases can make billions out of a few lines
MAX_YAML_BYTES = 4 << 20
MAX_KEY_LEN = 128  # the longest a key pattern takes (an env or label key)
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\.ya?ml$")
# YAML 1.1 reads 010 as 8 (octal), 1:30 as 90 (base 60), 0x10 as 16 and 1_000 as 1000: a number written any
# other way than in plain decimal digits is refused, not baked as another number (gpus: 010 gave 8 GPUs)
DECIMAL_RE = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")


_YAML = "tag:yaml.org,2002:"
# the tags a key is read with when it carries none (a key is taken as the text written, whatever it resolves to)
PLAIN_KEY_TAGS = frozenset(_YAML + t for t in ("str", "int", "float", "bool", "null", "timestamp", "value", "merge"))


def _tag_refused(tag: str, line: int, display: str) -> InputError:
    shown = "!!" + tag[len(_YAML):] if tag.startswith(_YAML) else tag
    return InputError(f"{display}:{line}: the YAML tag {shown!r} is not supported; a profile holds plain mappings, "
                      "lists, strings, numbers and true/false: remove the tag")


def _refuse_tag(node: yaml.Node, plain: str | frozenset[str], display: str) -> None:
    """A mapping, list or key with an explicit tag (``!!python/object:os.system {...}``, ``!!set``,
    ``!!omap``, ``!custom``) was read as if it had none: the tag was dropped without a word, so the file
    meant one thing to YAML and another to unibake. Refused, naming the tag."""
    if node.tag == plain or node.tag in plain:
        return
    raise _tag_refused(node.tag, node.start_mark.line + 1, display)


class _ProfileLoader(yaml.SafeLoader):
    """PyYAML's safe composer, which refuses any tag written in the file and counts the values as it goes.

    A node keeps only its resolved tag, so a standard tag written out (``gpus: !!int "1"``, ``!!str``) could
    not be told from none once composed: it is refused here, where the parser still says it was written. The
    values written (not through aliases, which :func:`_construct` counts) are counted while the file is read:
    a map of 200,000 keys was composed whole (seconds) before the count refused it."""

    display = ""
    written = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if not isinstance(event, yaml.AliasEvent):
            if event.tag is not None:
                raise _tag_refused(event.tag, event.start_mark.line + 1, self.display)
            if not (isinstance(parent, yaml.MappingNode) and index is None):  # (a key is no value)
                self.written += 1
                if self.written > MAX_VALUES:
                    raise InputError(f"{self.display}:{event.start_mark.line + 1}: more than {MAX_VALUES} values; "
                                     "a profile holds hundreds")
        return super().compose_node(parent, index)


def _refuse_many_values(text: str, display: str) -> None:
    """A file of far more values than a profile holds, refused before PyYAML's pure-Python composer reads it
    whole (a map of 200,000 keys: seconds, once per read). libyaml's parser counts the nodes written (a key is
    one too, so over twice the limit means over the limit of values); a file it cannot parse is left to the
    composer, whose errors name the problem."""
    if not getattr(yaml, "__with_libyaml__", False):
        return  # (_ProfileLoader counts them as it goes)
    nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                nodes += 1
                if nodes > 2 * MAX_VALUES + 1:
                    raise InputError(f"{display}:{event.start_mark.line + 1}: more than {MAX_VALUES} values; a "
                                     "profile holds hundreds")
    except yaml.YAMLError:
        return


def _construct(node: yaml.Node, path: Path_, lines: dict[Path_, int], display: str, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise InputError(f"{display}: more than {MAX_VALUES} values once its aliases are expanded (nested aliases?)")
    if isinstance(node, yaml.MappingNode):
        _refuse_tag(node, _YAML + "map", display)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(f"{display}:{key_node.start_mark.line + 1}: a key must be a plain name")
            _refuse_tag(key_node, PLAIN_KEY_TAGS, display)
            key = key_node.value
            count[1] += len(key)
            if len(key) > MAX_KEY_LEN:  # every error about it quoted it whole: an error line of megabytes
                raise InputError(f"{display}:{key_node.start_mark.line + 1}: a key of {len(key)} characters "
                                 f"('{dotted((key[:40],))}...'); no key is longer than {MAX_KEY_LEN}")
            if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
                raise InputError(f"{display}:{key_node.start_mark.line + 1}: a key holds a lone surrogate")
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError(f"{display}:{key_node.start_mark.line + 1}: YAML merge keys ('<<') are not "
                                 "supported; a profile inherits with extends: FILE, and maps such as env merge "
                                 "key by key")
            if key in out:
                raise InputError(f"{display}:{key_node.start_mark.line + 1}: key '{dotted(path + (key,))}' "
                                 "appears twice")
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, path + (key,), lines, display, count)
        return out
    if isinstance(node, yaml.SequenceNode):
        _refuse_tag(node, _YAML + "seq", display)
        items = []
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            items.append(_construct(item, path + (i,), lines, display, count))
        return items
    line = node.start_mark.line + 1
    if node.tag == _YAML + "value":  # a bare "=" (YAML 1.1's value key): text, as it reads, not a constructor error
        return node.value
    try:
        value = yaml.SafeLoader("").construct_object(node, deep=True)
    except ValueError as exc:
        if node.tag == _YAML + "timestamp":  # 2024-02-30: YAML reads a date, and there is none
            raise InputError(f"{display}:{line}: {node.value!r} reads as a date, and there is no such date ({exc}); "
                             "put it in quotes if it is text") from None
        # an integer of more digits than Python converts (int_max_str_digits)
        raise InputError(f"{display}:{line}: a number too large to be a value") from None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
        # no key takes one; even printing it in an error can fail past 4300 digits
        raise InputError(f"{display}:{line}: a number too large to be a value") from None
    if isinstance(value, int) and not isinstance(value, bool) and not DECIMAL_RE.fullmatch(node.value):
        raise InputError(f"{display}:{line}: key '{dotted(path)}' is written {node.value!r}, which YAML reads as the "
                         f"number {value}; write {value} in plain decimal digits, or quote it if it is text")
    if isinstance(value, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):  # "\ud800" in YAML: no UTF-8 can carry it
            raise InputError(f"{display}:{line}: a string holds a lone surrogate ('\\u' escape of "
                             "U+D800..U+DFFF), which is not text")
        count[1] += len(value)
        if count[1] > MAX_YAML_BYTES:  # a big string behind many aliases: bounded as the file itself is
            raise InputError(f"{display}: more than {MAX_YAML_BYTES} characters once aliases are expanded")
    return value


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's problem with its context: the problem alone said "second occurrence" for an anchor
    defined twice, and "but found another document" for two documents in one file."""
    problem, context = exc.problem or "invalid YAML", exc.context
    if not context or not exc.problem:
        return problem if exc.problem else context or problem
    at = exc.context_mark.line + 1 if exc.context_mark else None
    other_line = at is not None and (exc.problem_mark is None or exc.problem_mark.line + 1 != at)
    if context.startswith("while "):  # what was being read when the problem was met: where it began
        return f"{problem} ({context}{f' that began on line {at}' if other_line else ''})"
    return f"{context}{f' (line {at})' if other_line else ''}, {problem}"


def read_document(file: Path, display: str) -> Document:
    """Parse one YAML file into a :class:`Document`; syntax errors name the file and line."""
    if not os.path.lexists(file):
        raise InputError(f"{display}: no such file")
    raw = read_small_file(file, InputError, limit=MAX_YAML_BYTES, shown=display)  # a FIFO, a device: refused unread
    text = decode_text(raw, file, InputError, shown=display)
    if "\x00" in text:
        raise InputError(f"{display}: contains a NUL character")
    # YAML 1.1 breaks lines at these too (PyYAML does), editors and diffs at "\n" alone: a key after one is read
    # on a line of its own, every error names a line the editor does not show, and inside a quoted value one is
    # folded into a space
    found = re.search("[\x85\u2028\u2029]", text)
    if found:
        at = found.start()
        raise InputError(f"{display}:{text.count(chr(10), 0, at) + 1}: holds U+{ord(text[at]):04X} ("
                         f"{YAML_ONLY_BREAKS[text[at]]}), which YAML reads as a line break and editors do not; remove "
                         f"it, or write it as the escape \\u{ord(text[at]):04x} in a double-quoted string")
    # a carriage return alone: a line break to YAML, none to git, grep and less; printed, the text after it is
    # written over the line's start ("base: {image: evil}\r# pinned below" shows as the comment alone)
    found = re.search("\r(?!\n)", text)
    if found:
        raise InputError(f"{display}:{text.count(chr(10), 0, found.start()) + 1}: holds a carriage return (\\r) not "
                         "followed by a line feed, which YAML reads as a line break and git, grep and a terminal do "
                         "not; save the file with \\n (or \\r\\n) line ends")
    try:
        _refuse_many_values(text, display)
        loader = _ProfileLoader(text)
        loader.display = display
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
        lines: dict[Path_, int] = {}
        data = {} if node is None else _construct(node, (), lines, display, [0, 0])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise InputError(f"{display}{line}: YAML syntax error: {_yaml_problem(exc)}") from None
    except yaml.reader.ReaderError as exc:  # its own words were PyYAML's internals over two lines: '"<unicode string>"'
        line = text[:exc.position].count("\n") + 1
        raise InputError(f"{display}:{line}: holds the character U+{exc.character:04X}, which YAML does not allow in a "
                         "file (a control character or a non-character); remove it, or write it as an escape "
                         "(\\u...) in a double-quoted string") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{display}: YAML error: {exc}") from None
    except RecursionError:
        raise InputError(f"{display}: YAML nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(f"{display}:1: the top level must be a mapping of keys")
    return Document(file=file, display=display, data=data, lines=lines, raw=raw)


# ---------------------------------------------------------------------------------------------
# Validation against the schema


_TYPE_NAMES = {"str": "a string", "int": "an integer", "bool": "true or false", "list": "a list",
               "map": "a mapping", "record": "a mapping"}


def _type_ok(spec: Key, value: Any) -> bool:
    if spec.type == "str":
        return isinstance(value, str) or (spec.takes_false and value is False)
    if spec.type == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if spec.type == "bool":
        return isinstance(value, bool)
    if spec.type == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def _check_value(spec: Key, value: Any, path: Path_, where) -> None:
    name = dotted(path)
    if not _type_ok(spec, value):
        hint = ""
        if spec.type == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
            hint = f"; put it in quotes, or YAML reads it as the number {value!r}"
        if spec.type == "str" and isinstance(value, datetime.date):  # version: 2024-06-01 said 'not date'
            hint = "; put it in quotes: YAML reads an unquoted YYYY-MM-DD as a date"
        if spec.type == "str" and isinstance(value, bool):  # env: {FLAG: on} said 'not bool' and no more
            hint = (f"; put it in quotes: YAML reads an unquoted {'true, yes or on' if value else 'false, no or off'} "
                    "as a boolean")
        if spec.takes_false:  # (null and true say nothing: what undoes an inherited value is false)
            hint += f"; or false, to undo a '{name}' the file it extends sets"
        raise InputError(f"{where(path)}: key '{name}' must be {_TYPE_NAMES[spec.type]}, "
                         f"not {type(value).__name__}{hint}")
    if value is False:  # (a key that takes false: nothing more to check)
        return
    if spec.type == "str":
        _check_text(value, path, where)
        if spec.pattern and not spec.pattern.fullmatch(value):
            raise InputError(f"{where(path)}: key '{name}' has an invalid value {value!r}: "
                             f"expected {spec.pattern_doc}")
        longest = max(value.split("/"), key=lambda part: len(part.encode()))
        if spec.pattern in PATH_PATTERNS and len(longest.encode()) > NAME_MAX:
            raise InputError(f"{where(path)}: key '{name}' names a file or folder of {len(longest.encode())} bytes "
                             f"('{longest[:40]}...'); a name is at most {NAME_MAX} bytes")
        if spec.choices and value not in spec.choices:
            raise InputError(f"{where(path)}: key '{name}' must be one of {', '.join(spec.choices)}, "
                             f"not {value!r}")
    elif spec.type == "int":
        if spec.minimum is not None and value < spec.minimum:
            raise InputError(f"{where(path)}: key '{name}' must be at least {spec.minimum}, not {value}")
        if spec.maximum is not None and value > spec.maximum:
            raise InputError(f"{where(path)}: key '{name}' must be at most {spec.maximum}, not {value}")
    elif spec.type == "list":
        assert spec.item is not None
        for i, item in enumerate(value):
            _check_value(spec.item, item, path + (i,), where)
    elif spec.type == "map":
        assert spec.value is not None and spec.key_pattern is not None
        for key, item in value.items():
            if not isinstance(key, str) or not spec.key_pattern.fullmatch(key):
                raise InputError(f"{where(path + (key,))}: key {key!r} in '{name}' is not valid: "
                                 f"expected {spec.key_doc}")
            _check_value(spec.value, item, path + (key,), where)
    elif spec.type == "record":
        _check_record(spec.fields, value, path, where, required=False)


def _check_text(value: str, path: Path_, where) -> None:
    """Values end up in a Dockerfile and a shell script: refuse what no escaping makes safe."""
    bad = hidden_character(value)
    if bad is not None and unicodedata.category(bad) == "Cc":
        # (a YAML block scalar, '>' or '|', keeps a newline at its end, and '|' one per line: the usual way to
        # write a long prompt or a build step, so said with the YAML that writes it on one line)
        hint = ("; a YAML block scalar ('>' or '|') keeps a newline at its end: write '>-' or '|-'"
                if bad == "\n" and value.count("\n") == 1 and value.endswith("\n") else
                "; a YAML '>-' block folds its lines into one line (join commands with &&)" if bad == "\n" else "")
        raise InputError(f"{where(path)}: key '{dotted(path)}' contains a control character "
                         f"({bad!r}); newlines, tabs and NUL are not allowed in values{hint}")
    if bad is not None:  # a bidi override: the Dockerfile and labels a reviewer reads show a reordered line
        raise InputError(f"{where(path)}: key '{dotted(path)}' contains {describe_character(bad)}, an invisible "
                         "format character that reorders or hides text where the value is shown (the Dockerfile, "
                         "labels, the notes); remove it")
    if len(value) > MAX_VALUE_LEN:
        raise InputError(f"{where(path)}: key '{dotted(path)}' is {len(value)} characters long; "
                         f"the limit is {MAX_VALUE_LEN}")


def _check_record(fields: dict[str, Key], data: dict, path: Path_, where, *, required: bool) -> None:
    for key, value in data.items():
        spec = fields.get(key) if isinstance(key, str) else None
        if spec is None:
            # a key of a record one level down, written at this one (nodes: 2 for topology.nodes), is pointed to
            # there, before any key of a close spelling here (nodes was "did you mean 'notes'?")
            below = sorted(f"{dotted(path + (name, key))}" for name, inner in fields.items()
                           if inner.type == "record" and inner.fields and key in inner.fields)
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = (f"; it belongs under {' or '.join(below)}" if below else f"; did you mean '{close[0]}'?"
                    if close else f"; valid keys: {', '.join(sorted(fields))}")
            raise InputError(f"{where(path + (key,))}: unknown key '{dotted(path + (key,))}'{hint}")
        _check_value(spec, value, path + (key,), where)
    if required:
        _check_required(fields, data, path, where)


def _check_required(fields: dict[str, Key], data: dict, path: Path_, where) -> None:
    for key, spec in fields.items():
        if key in data:
            value = data[key]
            if spec.type == "record" and isinstance(value, dict):
                _check_required(spec.fields, value, path + (key,), where)
            elif spec.type == "list" and spec.item is not None and spec.item.type == "record":
                for i, item in enumerate(value):
                    _check_required(spec.item.fields, item, path + (key, i), where)
        elif spec.required and key not in NOT_INHERITED:
            raise InputError(f"{where(path)}: required key '{dotted(path + (key,))}' is missing")


def _refuse_bidi_outside_values(doc: Document) -> None:
    """A bidi control left once every value and key is checked is in a comment: it shows a reviewer the
    line reordered (a value seen where a comment is), as in "Trojan Source"."""
    text = doc.raw.decode("utf-8", "replace")
    found = BIDI_RE.search(text)
    if found:
        raise InputError(f"{doc.display}:{text.count(chr(10), 0, found.start()) + 1}: holds "
                         f"{describe_character(found.group())} outside any value (in a comment), which shows a "
                         "reviewer the line reordered; remove it")


def validate_document(doc: Document, *, is_product: bool, is_fragment: bool = False) -> None:
    """Types, patterns and unknown keys of one file, and which keys it may set. A fragment (a file in a
    subfolder of the profiles folder, which profiles extend to share keys) is no profile: it names none."""
    _check_record(SCHEMA, doc.data, (), lambda p: doc.where(p), required=False)
    for key in doc.data:
        scope = SCHEMA[key].scope
        if not is_product and scope == "product":
            raise InputError(f"{doc.where((key,))}: key '{key}' can only be set in {PRODUCT_FILE} "
                             "(it is shared by every profile of the image)")
    if is_product:
        for key in NOT_INHERITED:
            if key in doc.data:
                raise InputError(f"{doc.where((key,))}: {PRODUCT_FILE} must not set '{key}'; "
                                 "it is the root every profile extends")
    elif is_fragment:
        if "profile" in doc.data:
            raise InputError(f"{doc.where(('profile',))}: a file in a subfolder of the profiles folder is a fragment "
                             "that profiles extend, not a profile: remove 'profile', or move the file to the top of "
                             "the profiles folder to make it a profile")
    elif "profile" not in doc.data:
        raise InputError(f"{doc.display}:1: required key 'profile' is missing (the profile's name)")


# ---------------------------------------------------------------------------------------------
# Merging


def merge(parent: dict, child: dict, fields: dict[str, Key] = SCHEMA) -> dict:
    """The child's document over its parent's, by the schema's per-key rules. Pure."""
    out = {k: v for k, v in parent.items() if k not in NOT_INHERITED or fields is not SCHEMA}
    for key, value in child.items():
        spec = fields.get(key)
        if key not in out or spec is None:
            out[key] = value
        elif spec.merge == "merge" and spec.type == "record":
            out[key] = merge(out[key], value, spec.fields)
        elif spec.merge == "merge" and spec.type == "map":
            out[key] = {**out[key], **value}
        elif spec.merge == "by_name":
            out[key] = merge_by_name(out[key], value)
        else:
            out[key] = value
    return out


def merge_by_name(parent: list, child: list) -> list:
    """Named records: the child's replace the parent's of the same name in place; new ones follow. A name the
    child lists twice is kept twice, for the plan to refuse as it does without a parent (the second replaced
    the first without a word when the parent listed records too)."""
    names = [item.get("name") if isinstance(item, dict) else None for item in parent]
    out = list(parent)
    own: set = set()
    for item in child:
        name = item.get("name") if isinstance(item, dict) else None
        twice = isinstance(name, str) and name in own
        if isinstance(name, str):
            own.add(name)
        if name is not None and name in names and not twice:
            out[names.index(name)] = item
        else:
            out.append(item)
            names.append(name)
    return out


def _merge_origins(parent: dict[Path_, str], child: dict[Path_, str], parent_data: dict,
                   child_data: dict) -> dict[Path_, str]:
    """Where each key path of the merged document was set (``file:line``)."""
    out = {p: w for p, w in parent.items() if p[0] not in NOT_INHERITED}
    for key, spec in SCHEMA.items():
        if spec.merge == "by_name" and key in child_data and key in parent_data:
            # positions move when named items merge: relocate the child's paths to their new index
            merged = merge_by_name(parent_data[key], child_data[key])
            names = [item.get("name") if isinstance(item, dict) else None for item in merged]
            remap = {}
            for i, item in enumerate(child_data[key]):
                name = item.get("name") if isinstance(item, dict) else None
                remap[i] = names.index(name) if name in names else len(parent_data[key]) + i
            child = {((key, remap[p[1]]) + p[2:] if p[0] == key and len(p) > 1 else p): w
                     for p, w in child.items()}
    out.update(child)
    return out


def _with_env_file(doc: Document, origins: dict[Path_, str], root: Path,
                   env_cache: dict[str, EnvFile]) -> tuple[dict, dict[Path_, str], tuple[EnvFile, ...]]:
    """A file's data with its ``env_file`` read under its ``env`` (the file's own env wins), so that a
    child file's env file and env override its parent's, key by key."""
    rel = doc.data.get("env_file")
    if rel is None:
        return doc.data, origins, ()
    env_file = env_cache.get(rel)
    if env_file is None:
        env_file = env_cache[rel] = read_env_file(root, rel, doc.where(("env_file",)))
    own = doc.data.get("env", {})
    where = {("env", k): f"{env_file.display}:{env_file.lines[k]}" for k in env_file.values if k not in own}
    return {**doc.data, "env": {**env_file.values, **own}}, {**origins, **where}, (env_file,)


def resolve(config_dir: Path, file: Path, display_root: Path, cache: dict[Path, Document],
            stack: tuple[Path, ...] = (), env_cache: dict[str, EnvFile] | None = None
            ) -> tuple[dict, dict[Path_, str], tuple[str, ...], tuple[EnvFile, ...]]:
    """Merge ``file`` over its ``extends`` chain; returns data, origins, the chain of files and the env
    files read along it."""
    env_cache = {} if env_cache is None else env_cache
    file = file.resolve()
    display = _display(file, display_root)
    if file in stack:
        cycle = " -> ".join(_display(f, display_root) for f in stack + (file,))
        raise InputError(f"{display}: 'extends' forms a cycle: {cycle}")
    if len(stack) >= MAX_EXTENDS:  # each file is a recursion and a merge: 1000 was a RecursionError traceback
        raise InputError(f"{_display(stack[0], display_root)}: its 'extends' chain is more than {MAX_EXTENDS} files "
                         f"long ({_display(stack[0], display_root)} -> {_display(stack[1], display_root)} -> ... -> "
                         f"{display}); a profile extends a few files at most: shorten the chain")
    doc = cache.get(file)
    if doc is None:
        doc = read_document(file, display)
        validate_document(doc, is_product=file.name == PRODUCT_FILE and file.parent == config_dir,
                          is_fragment=file.parent != config_dir)
        _refuse_bidi_outside_values(doc)
        cache[file] = doc
    origins = {p: f"{doc.display}:{line}" for p, line in doc.lines.items()}
    data, origins, env_files = _with_env_file(doc, origins, config_dir.parent, env_cache)
    is_product = file.name == PRODUCT_FILE and file.parent == config_dir
    if is_product:
        return data, origins, (doc.display,), env_files
    # no 'extends' means the product file, also from a fragment in a subfolder (which cannot name it: '..'
    # is refused in a path); a named parent lies beside the file that names it
    parent_name = doc.data.get("extends")
    named = config_dir / PRODUCT_FILE if parent_name is None else file.parent / parent_name
    if parent_name == PRODUCT_FILE and file.parent != config_dir and not os.path.lexists(named):
        named = config_dir / PRODUCT_FILE  # a fragment spelling out its default: the product file (no '..' needed)
    parent_name = parent_name or PRODUCT_FILE
    parent = real_path(named, parent_name, doc.where(("extends",))) if os.path.lexists(named) else named.resolve()
    linked = _linked_part(file.parent, named)
    if linked is not None and parent.is_relative_to(config_dir):
        # found by probing: a fragment that was a link to a profile was read as that profile, and the kit, which
        # carries files, lost the link
        raise InputError(f"{doc.where(('extends',))}: 'extends' names {parent_name!r}, and "
                         f"{_display(linked, display_root)} is a symlink; extends names files and folders themselves, "
                         "as the release's reconstruct kit carries them (files, not links)")
    if not parent.is_relative_to(config_dir) or parent.suffix not in (".yaml", ".yml"):
        raise InputError(f"{doc.where(('extends',))}: 'extends' must name a .yaml file in "
                         f"{_display(config_dir, display_root)}/, not {parent_name!r}")
    if not parent.is_file():
        raise InputError(f"{doc.where(('extends',))}: 'extends' names {parent_name!r}, which does not exist"
                         + ("" if file.parent == config_dir else
                            f" beside {file.name} (a named parent lies beside the file that names it)"))
    p_data, p_origins, p_chain, p_env = resolve(config_dir, parent, display_root, cache, stack + (file,), env_cache)
    return (merge(p_data, data), _merge_origins(p_origins, origins, p_data, data),
            p_chain + (doc.display,), p_env + env_files)


def _linked_part(start: Path, named: Path) -> Path | None:
    """The first of ``named``'s parts below ``start`` (a real folder) that is a symlink, if any."""
    try:
        parts = named.relative_to(start).parts
    except ValueError:
        return None
    at = start
    for part in parts:
        at = at / part
        if at.is_symlink():
            return at
    return None


def _check_profile_file(file: Path, config_dir: Path, display_root: Path) -> None:
    """A profile's file name reaches the Dockerfile's header and the notes: plain names only; and the
    file itself must be a regular file inside the profiles folder."""
    if not FILE_NAME_RE.fullmatch(file.name):
        raise InputError(f"{_display(config_dir, display_root)}: the profile file name {file.name!r} is not a plain "
                         "name (letters, digits, '.', '_', '-', ending .yaml); rename it")
    real = real_path(file, "", _display(file, display_root))  # a link that loops: a RuntimeError traceback
    if not real.is_relative_to(config_dir):
        raise InputError(f"{_display(file, display_root)}: a symlink that points outside the profiles folder "
                         f"(to {real}); profiles must live in the folder")


def _check_fragments(config_dir: Path, display_root: Path, cache: dict[Path, Document],
                     env_cache: dict[str, EnvFile]) -> None:
    """Every YAML file in a subfolder of the profiles folder is a fragment, read and checked whether a profile
    extends it or not: one that set ``profile:`` (a profile put in a subfolder), or did not parse, was skipped
    without a word, and the image had one profile fewer than the folder showed."""
    try:
        _walk_fragments(config_dir, display_root, cache, env_cache)
    except RecursionError:  # (os.walk recurses once a folder: a tree deeper than the stack was a traceback)
        raise InputError(f"{_display(config_dir, display_root)}: its subfolders are nested deeper than any profiles "
                         "folder needs (hundreds of levels); flatten them") from None


def _unreadable(exc: OSError) -> None:
    """os.walk's onerror: a subfolder that cannot be listed is named (skipped, its fragments went unchecked)."""
    raise InputError(f"{exc.filename}: a folder in the profiles folder that cannot be read ({exc.strerror}); its "
                     "fragments cannot be checked: fix its permissions, or move it out of the profiles folder")


def _walk_fragments(config_dir: Path, display_root: Path, cache: dict[Path, Document],
                    env_cache: dict[str, EnvFile]) -> None:
    for folder, dirs, names in os.walk(config_dir, onerror=_unreadable):  # (a linked folder is not entered)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # an editor's or git's, as at the top
        if Path(folder) == config_dir:
            continue  # the profiles and product.yaml: read above
        for name in sorted(names):
            file = Path(folder) / name
            if name.startswith(".") or file.suffix.lower() not in (".yaml", ".yml"):
                continue
            if file.suffix not in (".yaml", ".yml"):
                raise InputError(f"{_display(file, display_root)}: fragments end in .yaml (or .yml), in lower case; "
                                 f"rename it to {file.stem}.yaml, or move it out of the profiles folder")
            real = real_path(file, "", _display(file, display_root))
            if not real.is_relative_to(config_dir):
                raise InputError(f"{_display(file, display_root)}: a symlink that points outside the profiles folder "
                                 f"(to {real}); fragments must live in the folder")
            if file.is_symlink():  # read as the file it names (a profile, skipping the fragments' rules)
                raise InputError(f"{_display(file, display_root)}: a symlink (to {_display(real, display_root)}); a "
                                 "fragment must be the file itself, as the release's reconstruct kit carries files, "
                                 "not links")
            if real not in cache:
                resolve(config_dir, file, display_root, cache, env_cache=env_cache)


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def load_profiles(config_dir: Path, display_root: Path) -> tuple[Document, dict[str, MergedProfile]]:
    """Every profile of a config folder, merged and checked for required keys, by name."""
    config_dir = config_dir.resolve()
    if not os.path.isdir(config_dir):  # (Path.is_dir raised EACCES under a folder this user cannot enter)
        try:
            os.lstat(config_dir)
        except PermissionError:
            raise InputError(f"{config_dir}: cannot read the profiles folder (Permission denied)") from None
        except OSError:
            raise InputError(f"{config_dir}: the profiles folder does not exist") from None
        raise InputError(f"{config_dir}: not a folder (--config names the profiles folder)")
    if not os.access(config_dir, os.R_OK | os.X_OK):  # its product.yaml was "no such file"
        raise InputError(f"{config_dir}: cannot read the profiles folder (Permission denied)")
    # its name heads the Dockerfile (the files it was rendered from): a newline there began an instruction
    # ("p\nRUN ..."), a name that is not UTF-8 was a UnicodeEncodeError traceback
    def shown(path: str) -> str:
        text = visible_name(path)
        return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")

    name = config_dir.name
    if visible_name(name) != name or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise InputError(f"the profiles folder '{shown(name)}' (in {shown(str(config_dir.parent))}) has a name that is "
                         "not UTF-8 or holds a control character; rename it: its name is written into the Dockerfile")
    cache: dict[Path, Document] = {}
    env_cache: dict[str, EnvFile] = {}
    product_file = config_dir / PRODUCT_FILE
    if os.path.lexists(product_file):
        _check_profile_file(product_file, config_dir, display_root)
        if product_file.is_symlink():  # read as the file it names, a profile setting product keys: misleading
            raise InputError(f"{_display(product_file, display_root)}: a symlink (to "
                             f"{_display(product_file.resolve(), display_root)}); product.yaml must be the file "
                             "itself: the profiles extend it by name, and the release's reconstruct kit carries files, "
                             "not links")
    resolve(config_dir, product_file, display_root, cache, env_cache=env_cache)
    product = cache[product_file.resolve()]
    shared = {k: v for k, v in SCHEMA.items() if v.scope == "product"}
    _check_required(shared, product.data, (), lambda p: product.where(p) if p else product.display)
    profiles: dict[str, MergedProfile] = {}
    # hidden files are an editor's (Emacs locks a file being edited as a link .#NAME), not profiles
    files = sorted(p for p in config_dir.iterdir()
                   if p.suffix in (".yaml", ".yml") and p.name != PRODUCT_FILE and not p.name.startswith("."))
    # tp5.YAML was silently no profile: another case of the suffix is refused, not left out
    for file in sorted(config_dir.iterdir()):
        if file.suffix.lower() in (".yaml", ".yml") and file.suffix not in (".yaml", ".yml") \
                and not file.name.startswith("."):
            raise InputError(f"{_display(file, display_root)}: profile files end in .yaml (or .yml), in lower case; "
                             f"rename it to {file.stem}.yaml, or move it out of the profiles folder")
    # a link to another file of the folder would be that file twice (a link to product.yaml was read as a
    # profile with no name: a KeyError traceback)
    reals = {product_file.resolve(): product_file}
    for file in files:
        _check_profile_file(file, config_dir, display_root)
        real = file.resolve()
        if real in reals:
            link, other = (file, reals[real]) if file.is_symlink() else (reals[real], file)
            raise InputError(f"{_display(link, display_root)}: a symlink to {_display(other, display_root)}, so the "
                             "same file twice; a profile file is a file of its own: share keys with extends: FILE")
        reals[real] = file
    for file in files:  # a link to a file that is no profile of the folder (tp8.yaml -> tp8.txt, -> .tp8.yaml):
        if file.is_symlink():  # the plan named the target, and the kit, carrying that, knew no profile tp8
            raise InputError(f"{_display(file, display_root)}: a symlink (to {_display(file.resolve(), display_root)}); "
                             "a profile file must be the file itself, as product.yaml: the release's reconstruct kit "
                             "carries files, not links")
    for file in files:
        data, origins, chain, env_files = resolve(config_dir, file, display_root, cache, env_cache=env_cache)
        doc = cache[file.resolve()]
        name = doc.data["profile"]
        if name in RESERVED_PROFILE_NAMES or any(name.endswith(p.suffix) for p in KNOWN.values() if p.suffix):
            raise InputError(f"{doc.where(('profile',))}: '{name}' cannot name a profile: --profile all means every "
                             "profile, and a platform's architecture ends its release's tag (so tp1-arm64 is tp1 "
                             "for arm64); choose another name")
        if name in profiles:
            raise InputError(f"{doc.where(('profile',))}: profile '{name}' is also defined in "
                             f"{profiles[name].file}; profile names must be unique")
        parsed = {d.display: d.raw for d in cache.values()}
        merged = MergedProfile(name=name, file=doc.display, chain=chain, data=data, origins=origins,
                               env_files=env_files, raw={f: parsed[f] for f in chain})
        _check_required(SCHEMA, data, (), lambda p, m=merged: m.where(p) if p else m.file)
        profiles[name] = merged
    _check_fragments(config_dir, display_root, cache, env_cache)
    if not profiles:
        raise InputError(f"{_display(config_dir, display_root)}: no profile files (*.yaml besides "
                         f"{PRODUCT_FILE})")
    default = product.data["default_profile"]
    if default not in profiles:
        raise InputError(f"{product.where(('default_profile',))}: default_profile '{default}' is not a "
                         f"profile; known: {', '.join(sorted(profiles))}")
    return product, profiles
