"""The one source of truth for every key a profile YAML may hold.

Each key has a type, whether it is required (after ``extends`` is merged), where it may be set
(``product``: only in ``product.yaml``, shared by every profile; ``profile``: in any file, the
profile file's value wins) and how a child file's value combines with its parent's:

* ``merge``   maps and records merge key by key (recursively);
* ``replace`` the child's value replaces the parent's (scalars and most lists);
* ``by_name`` lists of named records: a child's item replaces the parent's item of the same
  ``name`` in place; other items follow the parent's.

``profile`` and ``extends`` belong to the file that says them and are never inherited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .platforms import LIST_RE as PLATFORMS_RE

# Names that end up in image references, paths and shell words: conservative on purpose.
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
# A version is part of a Docker tag ([A-Za-z0-9_.-], at most 128 characters with the suffix).
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A repository-relative path: plain components only; '..' and absolute paths are refused apart.
PATH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)*/?$")
# An absolute path inside the image (mount points).
IMAGE_PATH_RE = re.compile(r"^/[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LABEL_KEY_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._/-]{0,126}[a-z0-9])?$")
# name[:tag][@sha256:digest], with an optional registry host[:port] first.
IMAGE_REF_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# One target platform, as a key of base.platforms and builder.platforms.
PLATFORM_KEY_RE = re.compile(r"^linux/(?:amd64|arm64)$")
# A compiler flag: no shell metacharacters, no spaces.
CFLAG_RE = re.compile(r"^-[A-Za-z0-9_=.,+:/-]{1,100}$")
# Set by the image itself: a YAML value may not take them over.
RESERVED_LABEL_PREFIXES = ("org.opencontainers.image.", "io.unibake.")
RESERVED_ENV = frozenset({"PROFILE", "PORT", "MODEL_NAME", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH",
                          "PYTHONDONTWRITEBYTECODE", "HOME", "HOSTNAME"})
RESERVED_ENV_PREFIX = "UNIBAKE_"
# A command word or argument of the engine: printable, no control characters.
MAX_VALUE_LEN = 4096
MAX_GPUS = 1024


@dataclass(frozen=True, kw_only=True)
class Key:
    """One key of the schema."""

    type: str  # str | int | bool | list | map | record
    doc: str
    required: bool = False
    scope: str = "profile"  # product | profile
    merge: str = "replace"  # merge | replace | by_name
    pattern: re.Pattern[str] | None = None
    pattern_doc: str = ""
    minimum: int | None = None
    maximum: int | None = None
    default: object = None  # the value when the key is absent: the one place each default lives
    choices: tuple[str, ...] = ()
    fields: dict[str, "Key"] = field(default_factory=dict)  # record
    item: "Key | None" = None  # list
    value: "Key | None" = None  # map (values); keys use key_pattern
    key_pattern: re.Pattern[str] | None = None
    key_doc: str = ""


def _str(doc: str, **kw) -> Key:
    return Key(type="str", doc=doc, **kw)


def _path(doc: str, **kw) -> Key:
    return Key(type="str", doc=doc, pattern=PATH_RE, pattern_doc="a relative path inside the repository", **kw)


def _platform_images(doc: str) -> Key:
    return Key(type="map", doc=doc, merge="merge", key_pattern=PLATFORM_KEY_RE,
               key_doc="a platform: linux/amd64 or linux/arm64",
               value=_str("image reference", pattern=IMAGE_REF_RE, pattern_doc="an image reference"))


def _kernel_fields() -> dict[str, Key]:
    return {
        "name": _str("kernel name; the library is lib<name>.so", required=True, pattern=NAME_RE,
                     pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
        "version": _str("kernel version, compiled into the library", required=True, pattern=VERSION_RE,
                        pattern_doc="letters, digits, '.', '_' and '-'"),
        "source": _path("directory of C sources compiled into lib<name>.so", required=True),
        "cflags": Key(type="list", doc="extra compiler flags",
                      item=_str("one flag", pattern=CFLAG_RE, pattern_doc="one flag like -O3 or -DNAME=1")),
    }


SCHEMA: dict[str, Key] = {
    "profile": _str("this file's profile name (never inherited)", pattern=NAME_RE,
                    pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
    "extends": _path("the file this one extends, relative to this file's folder (never inherited)"),
    "product": _str("product name: the image repository and the archive file name", required=True,
                    scope="product", pattern=NAME_RE,
                    pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
    "version": _str("release version; the image tag", required=True, scope="product", pattern=VERSION_RE,
                    pattern_doc="letters, digits, '.', '_' and '-', starting with a letter or digit"),
    "default_profile": _str("profile used when PROFILE is unset", required=True, scope="product",
                            pattern=NAME_RE, pattern_doc="a profile name"),
    "platform": _str("the platform(s) the image is built for; several comma-separated, each its own image and "
                     "release (default: the host's)", scope="product", pattern=PLATFORMS_RE,
                     pattern_doc="linux/amd64, linux/arm64, or both comma-separated"),
    "base": Key(type="record", doc="the runtime base image", required=True, scope="product", merge="merge",
                fields={
                    "image": _str("image reference; a registry image is pinned as name@sha256:...",
                                  required=True, pattern=IMAGE_REF_RE, pattern_doc="an image reference"),
                    "require_digest": Key(type="bool", doc="refuse a base given by tag alone"),
                    "platforms": _platform_images("the base image of one platform, when it is not image"),
                }),
    "builder": Key(type="record", doc="image of the stage that compiles kernels", scope="product",
                   merge="merge", fields={
                       "image": _str("image reference with a C compiler", required=True,
                                     pattern=IMAGE_REF_RE, pattern_doc="an image reference"),
                       "platforms": _platform_images("the builder of one platform, when it is not image: its cc "
                                                     "must compile for that platform (natively or as a cross "
                                                     "compiler)"),
                   }),
    "engine": Key(type="record", doc="the inference engine", required=True, scope="product", merge="merge",
                  fields={
                      "name": _str("engine name", required=True, pattern=NAME_RE,
                                   pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
                      "version": _str("engine version", required=True, pattern=VERSION_RE,
                                      pattern_doc="letters, digits, '.', '_' and '-'"),
                      "source": _path("directory baked as the engine", required=True),
                      "command": Key(type="list", doc="command that starts the engine; ${PORT}, "
                                     "${MODEL_NAME} and other ${VARS} are expanded when the container starts",
                                     required=True, item=_str("one word")),
                  }),
    "kernels": Key(type="list", doc="native kernels shared by every profile", scope="product",
                   item=Key(type="record", doc="a kernel", fields=_kernel_fields())),
    "overlays": Key(type="list", doc="files patched over the engine, in order", scope="product",
                    item=Key(type="record", doc="an overlay", fields={
                        "source": _path("the file to copy", required=True),
                        "target": _path("where it goes, relative to the engine folder", required=True),
                    })),
    "labels": Key(type="map", doc="extra image labels", scope="product", merge="merge",
                  key_pattern=LABEL_KEY_RE, key_doc="a label key like com.example.team",
                  value=_str("label value")),
    "checks": Key(type="list", doc="extra in-image checks run by self-check for every profile",
                  scope="product", item=Key(type="record", doc="a check", fields={
                      "name": _str("check name", required=True, pattern=NAME_RE,
                                   pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
                      "run": _str("shell command; exit 0 means pass", required=True),
                  })),
    "sanitise": Key(type="record", doc="the sanitisation gate", scope="product", merge="merge", fields={
        "allow": Key(type="list", doc="regular expressions for deliberate values the gate lets through",
                     item=_str("a regular expression")),
    }),
    "launch": Key(type="record", doc="run-time defaults", scope="product", merge="merge", fields={
        "port": Key(type="int", doc="default PORT", minimum=1, maximum=65535, default=30000),
        "model_name": _str("default MODEL_NAME (default: the product name)"),
        "mounts": Key(type="map", doc="weight mount points (never baked)", merge="merge",
                      key_pattern=NAME_RE, key_doc="a mount name like target",
                      value=_str("absolute path in the image", pattern=IMAGE_PATH_RE,
                                 pattern_doc="an absolute path like /models/target")),
    }),
    "gpus": Key(type="int", doc="GPUs this profile needs", required=True, minimum=1, maximum=MAX_GPUS),
    "devices": Key(type="record", doc="GPU device style for run.sh", merge="merge", fields={
        "vendor": _str("nvidia or amd", choices=("nvidia", "amd"), default="nvidia"),
    }),
    "args": Key(type="list", doc="extra engine arguments for this profile; ${VARS} expand at start",
                item=_str("one argument")),
    "env": Key(type="map", doc="environment; product.yaml's apply to every profile", merge="merge",
               key_pattern=ENV_KEY_RE, key_doc="a variable name like NCCL_ALGO",
               value=_str("value")),
    "sidecars": Key(type="list", doc="profile-only kernels; replace a shared kernel of the same name",
                    merge="by_name", item=Key(type="record", doc="a sidecar kernel", fields=_kernel_fields())),
    "tune_caches": Key(type="record", doc="this profile's autotune caches", merge="merge", fields={
        "source": _path("directory of *.json tune caches"),
        "expect": Key(type="int", doc="fail-closed count of JSON files", minimum=0, maximum=1_000_000),
    }),
    "smoke": Key(type="record", doc="the smoke gate", merge="merge", fields={
        "expect_reply": _str("text the chat completion must contain"),
        "prompt": _str("prompt sent to the engine", default="Say the smoke-test phrase."),
        "timeout": Key(type="int", doc="seconds to wait for /health", minimum=1, maximum=3600, default=60),
    }),
}

NOT_INHERITED = ("profile", "extends")


def default_of(*path: str) -> object:
    """The schema's default for a key path, e.g. ``default_of("launch", "port")``."""
    spec = SCHEMA[path[0]]
    for part in path[1:]:
        spec = spec.fields[part]
    if spec.default is None:
        raise KeyError(f"the schema gives no default for {'.'.join(path)}")
    return spec.default
