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
import unicodedata
from dataclasses import dataclass, field

from .platforms import KEY_RE as PLATFORM_KEY_RE, LIST_RE as PLATFORMS_RE

# Names that end up in image references, paths and shell words: conservative on purpose.
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
# The product is the image's repository: a name the engine takes, so no two separators in a row
# ('a-.b', 'a..b', 'a__b' passed NAME_RE and failed later, as a traceback, when the tag was made).
PRODUCT_RE = re.compile(r"^(?=.{1,64}$)[a-z0-9]+(?:[._-][a-z0-9]+)*$")
# A version is part of a Docker tag ([A-Za-z0-9_.-], at most 128 characters with the suffix).
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A component's version as its package spells it: PEP 440 local parts (2.8.3+das.opt1.dtk2604), Debian's
# '~' and epochs (1:2.3~rc1). It reaches labels, compiler defines and notes, always escaped; never a tag.
COMPONENT_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~:-]{0,127}$")
# A kernel's or engine's name as upstream spells it (tp2_row_LDSx, flash_attn-2.6.3): a path component
# and part of a label key, so no '/', no space.
UPSTREAM_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_])?$")
# One path component: dot-files are fine, '.' and '..' never are.
_COMPONENT = r"(?!\.{1,2}(?:/|$))[A-Za-z0-9_.][A-Za-z0-9._+-]*"
# A repository-relative path: plain components only (dot-files included); '..' and absolute paths refused.
PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*/?$")
# A prebuilt file: inside the repository (relative), or outside it for large binaries (absolute).
PREBUILT_RE = re.compile(rf"^/?{_COMPONENT}(?:/{_COMPONENT})*$")
# An image ID: what `docker image inspect --format '{{.Id}}'` prints; pins a local image exactly.
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAKE_TARGET_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+/-]{0,127}$")
# A device node passed to the container: no ':' (it would read as host:container) and no '..'.
DEVICE_RE = re.compile(r"^/dev(?:/(?!\.{1,2}(?:/|$))[A-Za-z0-9_.][A-Za-z0-9_.+-]*)+$")
GROUP_RE = re.compile(r"^(?:[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10})$")
SHM_SIZE_RE = re.compile(r"^[1-9][0-9]{0,9}[bkmg]?$")


def shm_bytes(size: str) -> int:
    """A ``topology.shm_size`` (SHM_SIZE_RE) in bytes, as docker reads it (no unit: bytes; k, m, g: KiB, MiB, GiB)."""
    number, unit = (size[:-1], size[-1]) if size[-1].isalpha() else (size, "b")
    return int(number) << {"b": 0, "k": 10, "m": 20, "g": 30}[unit]
# A file named in a release's notes but not shipped (weights, a patch set): a relative name.
EXTERNAL_NAME_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
FILE_PATH_RE = EXTERNAL_NAME_RE  # a file's relative path (a patched one): PATH_RE without a folder's trailing '/'
# An absolute path inside the image (mount points).
IMAGE_PATH_RE = re.compile(r"^/[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
# An overlay's target: a relative path inside the engine folder, or '.' for the folder itself.
OVERLAY_TARGET_RE = re.compile(rf"^(?:\.|{_COMPONENT}(?:/{_COMPONENT})*/?)$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LABEL_KEY_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._/-]{0,126}[a-z0-9])?$")
# name[:tag][@sha256:digest], with an optional registry host[:port] first.
IMAGE_REF_RE = re.compile(
    # the registry host: dot-separated labels (no "..", no leading "." or "-"), an optional port
    r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# A registry's repository, REGISTRY/REPO: the grammar of the distribution project's reference package, as
# registry.py reads `--to` and a pull's reference, and as a release's manifest records a push (a POSIX ERE too:
# verify-release.sh checks the record with it). REGISTRY_HOST is the host without its port.
_REGISTRY_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
REGISTRY_HOST = rf"(?:{_REGISTRY_LABEL}(?:\.{_REGISTRY_LABEL})*|\[[0-9a-fA-F:]+\])"
REGISTRY_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
REPOSITORY_RE = re.compile(rf"^{REGISTRY_HOST}(?::[0-9]{{1,5}})?/{REGISTRY_PATH}$")
# A compiler flag: no shell metacharacters, no spaces.
CFLAG_RE = re.compile(r"^-[A-Za-z0-9_=.,+:/-]{1,100}$")
# Set by the image itself: a YAML value may not take them over. Of the OCI keys, only the four the Dockerfile
# sets: a product's own org.opencontainers.image.source, .licenses, .vendor, ... are its to give.
RESERVED_LABEL_PREFIXES = ("io.unibake.",)
RESERVED_LABELS = frozenset(f"org.opencontainers.image.{k}" for k in ("title", "version", "revision", "created"))
RESERVED_ENV = frozenset({"PROFILE", "PORT", "MODEL_NAME", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH",
                          "PYTHONDONTWRITEBYTECODE", "HOME", "HOSTNAME"})
RESERVED_ENV_PREFIX = "UNIBAKE_"
# Set from topology: on a profile of several nodes (run.sh passes them per node, the entrypoint
# defaults them first), so a value in env would never take effect; a single-node profile sets neither.
TOPOLOGY_ENV = {"NNODES": "topology.nodes", "NODE_RANK": "run.sh's NODE_RANK on each node",
                "MASTER_ADDR": "run.sh's MASTER_ADDR on each node", "MASTER_PORT": "topology.master_port"}
# Values that are paths (in the project, on the host or in the image): no part of one may be longer than a
# file name can be (a 300-byte overlay target passed the plan and failed as the engine unpacked the context).
PATH_PATTERNS = frozenset({PATH_RE, PREBUILT_RE, EXTERNAL_NAME_RE, IMAGE_PATH_RE, DEVICE_RE, OVERLAY_TARGET_RE})
NAME_MAX = 255
# A command word or argument of the engine: printable, no control characters.
MAX_VALUE_LEN = 4096
# Joiners that scripts (Persian, Indic) and emoji sequences need; every other format character is invisible
ALLOWED_FORMAT = frozenset("\u200c\u200d")


def hidden_character(value: str) -> str | None:
    """The first character of ``value`` that shows a reviewer another text than the one baked: a control
    character (C0, DEL, C1: U+009B begins a terminal escape), or an invisible format character (the bidi
    embeddings, overrides and isolates U+202A..U+202E and U+2066..U+2069, the marks U+200E and U+200F, the
    zero-width space U+200B, a byte-order mark, a soft hyphen): in a Dockerfile, a label or the notes, a line
    shown reordered or with an invisible difference. None when there is none."""
    for c in value:
        if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            return c
        if ord(c) > 0x9F and c not in ALLOWED_FORMAT and unicodedata.category(c) == "Cf":
            return c
    return None


# the bidi controls: embeddings, overrides, isolates and marks ("Trojan Source", CVE-2021-42574)
BIDI_RE = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def describe_character(c: str) -> str:
    """A character as an error names it: ``'\\n'`` for a control character, ``U+202E (RIGHT-TO-LEFT
    OVERRIDE)`` for a format character."""
    if unicodedata.category(c) == "Cc":
        return repr(c)
    return f"U+{ord(c):04X} ({unicodedata.name(c, 'unnamed')})"
MAX_GPUS = 1024
MATCHES = ("exact", "contains", "regex")


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
    # ``false`` is taken too (a str key): set in a file, it undoes what the file it extends set (a child's
    # gate that runs where its parent's is skipped); merged, it is the key's absence
    takes_false: bool = False


def _str(doc: str, **kw) -> Key:
    return Key(type="str", doc=doc, **kw)


# what PATH_RE takes, in words: a folder named with a space is inside the repository all the same
PATH_DOC = ("a relative path inside the repository, each part of letters, digits, '.', '_', '+' and '-', not "
            "beginning with '+' or '-' (no spaces, no '.' or '..' parts)")


def _path(doc: str, pattern_doc: str = PATH_DOC, **kw) -> Key:
    return Key(type="str", doc=doc, pattern=PATH_RE, pattern_doc=pattern_doc, **kw)


PREBUILT_DOC = ("a path like images/prebuilt/x.whl or /srv/big/x.whl, each part of letters, digits, '.', '_', "
                "'+' and '-', not beginning with '+' or '-' (no spaces, no '..')")
UPSTREAM_NAME_DOC = ("letters, digits, '.', '_' and '-', as upstream spells it, starting with a letter or digit and "
                     "ending with a letter, digit or '_'")
COMPONENT_VERSION_DOC = "letters, digits, '.', '_', '-', '+', '~' and ':', as the package spells it"
IMAGE_ID_DOC = "an image ID like sha256:<64 hex digits> (docker image inspect --format '{{.Id}}')"


def _platform_images(doc: str) -> Key:
    return Key(type="map", doc=doc, merge="merge", key_pattern=PLATFORM_KEY_RE,
               key_doc="a platform: linux/amd64 or linux/arm64 (or linux/arm64/v8)",
               value=_str("image reference", pattern=IMAGE_REF_RE, pattern_doc="an image reference"))


def _kernel_fields() -> dict[str, Key]:
    return {
        "name": _str("kernel name; by default the library is lib<name>.so", required=True,
                     pattern=UPSTREAM_NAME_RE, pattern_doc=UPSTREAM_NAME_DOC),
        "version": _str("kernel version, compiled into the library", required=True, pattern=COMPONENT_VERSION_RE,
                        pattern_doc=COMPONENT_VERSION_DOC),
        "source": _path("directory of the sources it is built from (without build: C sources, compiled with cc)"),
        "cflags": Key(type="list", doc="compiler flags: given to cc, or as $CFLAGS to build.run and build.make",
                      item=_str("one flag", pattern=CFLAG_RE, pattern_doc="one flag like -O3 or -DNAME=1")),
        "build": Key(type="record", doc="how it is built when not with cc: a builder image and a shell command or "
                     "a Makefile target, run in the source folder with $OUT, $SRC, $CFLAGS set", fields={
                         "image": _str("builder image with its toolchain (default: builder.image)",
                                       pattern=IMAGE_REF_RE, pattern_doc="an image reference"),
                         "id": _str("that builder image pinned by image ID", pattern=IMAGE_ID_RE,
                                    pattern_doc=IMAGE_ID_DOC),
                         "run": _str("shell command that writes the outputs into $OUT"),
                         "make": _str("Makefile target (make -C $SRC TARGET OUT=..., CFLAGS=... with cflags)",
                                      pattern=MAKE_TARGET_RE, pattern_doc="a make target like all or kernels"),
                     }),
        "outputs": Key(type="list", doc="the .so files it gives, relative to its folder (default lib<name>.so; "
                       "for a prebuilt archive: every .so in it)",
                       item=_path("a .so path like lib/libfoo.so",
                                  pattern_doc="a path inside the kernel's folder like lib/libfoo.so, each part of "
                                              "letters, digits, '.', '_', '+' and '-', not beginning with '+' or "
                                              "'-' (no spaces, no '.' or '..' parts, not absolute)")),
        "prebuilt": _str("a prebuilt .so, tarball or wheel taken as it is: a path in the repository, or an "
                         "absolute path outside it for large binaries; pinned by sha256 in inputs.lock",
                         pattern=PREBUILT_RE, pattern_doc=PREBUILT_DOC),
        "platforms": Key(type="map", doc="the prebuilt file of one platform, when it is not prebuilt (a wheel per "
                         "CPU); pinned in inputs.lock like prebuilt", key_pattern=PLATFORM_KEY_RE,
                         key_doc="a platform: linux/amd64 or linux/arm64 (or linux/arm64/v8)",
                         value=_str("a prebuilt file", pattern=PREBUILT_RE,
                                    pattern_doc=PREBUILT_DOC)),
    }


SCHEMA: dict[str, Key] = {
    "profile": _str("this file's profile name (never inherited)", pattern=NAME_RE,
                    pattern_doc="lower-case letters, digits, '.', '_' and '-'"),
    "extends": _path("the file this one extends, relative to this file's folder (never inherited)",
                     pattern_doc="a .yaml file beside this one or in a subfolder of its folder, like tp2.yaml or "
                                 "shared/rocm.yaml (no spaces, no '.' or '..' parts, not absolute)"),
    "product": _str("product name: the image repository and the archive file name", required=True,
                    scope="product", pattern=PRODUCT_RE,
                    pattern_doc="lower-case letters and digits, with one '.', '_' or '-' between them (an image "
                                "repository name), at most 64 characters"),
    "version": _str("release version; the image tag", required=True, scope="product", pattern=VERSION_RE,
                    pattern_doc="letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 "
                                "characters"),
    "default_profile": _str("profile used when PROFILE is unset", required=True, scope="product",
                            pattern=NAME_RE, pattern_doc="a profile name"),
    "platform": _str("the platform(s) the image is built for; several comma-separated, each its own image and "
                     "release (default: the host's)", scope="product", pattern=PLATFORMS_RE,
                     pattern_doc="linux/amd64, linux/arm64, or both comma-separated"),
    "base": Key(type="record", doc="the runtime base image", required=True, scope="product", merge="merge",
                fields={
                    "image": _str("image reference; a registry image is pinned as name@sha256:...",
                                  required=True, pattern=IMAGE_REF_RE, pattern_doc="an image reference"),
                    "id": _str("the base pinned by image ID: how a local base (docker import, a local build) "
                               "is pinned, since it has no registry digest", pattern=IMAGE_ID_RE,
                               pattern_doc=IMAGE_ID_DOC),
                    "require_digest": Key(type="bool", doc="refuse a base given by tag alone (a digest or an "
                                          "id pins it)"),
                    "platforms": _platform_images("the base image of one platform, when it is not image"),
                }),
    "builder": Key(type="record", doc="image of the stage that compiles kernels", scope="product",
                   merge="merge", fields={
                       "image": _str("image reference with a C compiler", required=True,
                                     pattern=IMAGE_REF_RE, pattern_doc="an image reference"),
                       "id": _str("the builder pinned by image ID", pattern=IMAGE_ID_RE, pattern_doc=IMAGE_ID_DOC),
                       "platforms": _platform_images("the builder of one platform, when it is not image: its cc "
                                                     "must compile for that platform (natively or as a cross "
                                                     "compiler)"),
                   }),
    "engine": Key(type="record", doc="the inference engine", required=True, scope="product", merge="merge",
                  fields={
                      "name": _str("engine name", required=True, pattern=UPSTREAM_NAME_RE,
                                   pattern_doc=UPSTREAM_NAME_DOC),
                      "version": _str("engine version", required=True, pattern=COMPONENT_VERSION_RE,
                                      pattern_doc=COMPONENT_VERSION_DOC),
                      "source": _path("directory baked as the engine", required=True),
                      "command": Key(type="list", doc="command that starts the engine; ${PORT}, "
                                     "${MODEL_NAME} and other ${VARS} are expanded when the container starts",
                                     required=True, item=_str("one word")),
                  }),
    "kernels": Key(type="list", doc="native kernels shared by every profile", scope="product",
                   item=Key(type="record", doc="a kernel", fields=_kernel_fields())),
    "overlays": Key(type="list", doc="files and folders copied over the engine, in order", scope="product",
                    item=Key(type="record", doc="an overlay", fields={
                        "source": _path("the file, or the folder (its whole tree, dot-files included), to copy",
                                        required=True),
                        "target": Key(type="str", doc="where it goes, relative to the engine folder ('.' for "
                                      "the engine folder itself)", required=True, pattern=OVERLAY_TARGET_RE,
                                      pattern_doc="a relative path inside the engine folder, or '.'"),
                        "name": _str("its name in the notes and labels (default: the target)",
                                     pattern=PATH_RE, pattern_doc="a name like adapter or sglang/srt/adapter"),
                        "md5": Key(type="bool", doc="also list its files in the md5 ledger meta/overlays.md5",
                                   default=False),
                    })),
    "patches": Key(type="list", doc="unified diffs applied to the engine's files when the image is planned, "
                   "in order", scope="product", item=Key(type="record", doc="a patch", fields={
                       "file": _path("the patch file", required=True),
                       "strip": Key(type="int", doc="leading path components to strip, as patch -p",
                                    minimum=0, maximum=16, default=1),
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
    "devices": Key(type="record", doc="the devices run.sh gives the container", merge="merge", fields={
        "vendor": _str("nvidia (--gpus), amd or hygon (/dev/kfd and one render node per GPU; hygon also "
                       "sets HIP_VISIBLE_DEVICES)", choices=("nvidia", "amd", "hygon"), default="nvidia"),
        "extra": Key(type="list", doc="more device nodes this profile needs, like /dev/mkfd (not a GPU's: run.sh "
                     "gives those of GPUS)",
                     item=_str("a device path", pattern=DEVICE_RE, pattern_doc="a path like /dev/mkfd")),
        "groups": Key(type="list", doc="more groups the container joins, like render",
                      item=_str("a group name or number", pattern=GROUP_RE, pattern_doc="a group like render")),
    }),
    "topology": Key(type="record", doc="how the container shares the host: IPC, shared memory, nodes",
                    merge="merge", fields={
                        "nodes": Key(type="int", doc="nodes the profile spans; over 1, run.sh takes NODE_RANK and "
                                     "MASTER_ADDR and adds host networking, RDMA devices and memlock",
                                     minimum=1, maximum=MAX_GPUS, default=1),
                        "network": _str("host or bridge (default: host on several nodes, else bridge)",
                                        choices=("host", "bridge")),
                        "ipc": _str("host, private or shareable", choices=("host", "private", "shareable"),
                                    default="host"),
                        "shm_size": _str("size of /dev/shm, like 16g (not with ipc: host, which shares the "
                                         "host's)", pattern=SHM_SIZE_RE, pattern_doc="a size like 16g or 512m"),
                        "rdma": Key(type="bool", doc="give the container /dev/infiniband and unlimited memlock "
                                    "(default: true on several nodes)"),
                        "master_port": Key(type="int", doc="default MASTER_PORT on several nodes", minimum=1,
                                           maximum=65535, default=29500),
                    }),
    "args": Key(type="list", doc="extra engine arguments for this profile; ${VARS} expand at start",
                item=_str("one argument")),
    "env_file": _path("a file of KEY=VALUE lines (as docker run --env-file reads them) under this file's env; "
                      "product.yaml's applies to every profile"),
    "env": Key(type="map", doc="environment; product.yaml's apply to every profile", merge="merge",
               key_pattern=ENV_KEY_RE, key_doc="a variable name like NCCL_ALGO",
               value=_str("value")),
    "sidecars": Key(type="list", doc="profile-only kernels; replace a shared kernel of the same name",
                    merge="by_name", item=Key(type="record", doc="a sidecar kernel", fields=_kernel_fields())),
    "tune_caches": Key(type="record", doc="this profile's autotune caches", merge="merge", fields={
        "source": _path("directory of *.json tune caches"),
        "expect": Key(type="int", doc="fail-closed count of the *.json files at the top of source (files in its "
                      "subfolders are baked, not counted)", minimum=0, maximum=1_000_000),
    }),
    "smoke": Key(type="record", doc="the smoke gate", merge="merge", fields={
        "expect_reply": _str("the reply the chat completion must give (surrounding spaces, tabs and line ends trimmed)"),
        "match": _str("how the reply is compared: exact, contains, or regex (the whole trimmed reply)",
                      choices=MATCHES, default="exact"),
        "prompt": _str("prompt sent to the engine", default="Say the smoke-test phrase."),
        "prompts": Key(type="list", doc="several prompts, each with its expected reply (instead of prompt and "
                       "expect_reply)", item=Key(type="record", doc="a prompt", fields={
                           "prompt": _str("prompt sent to the engine", required=True),
                           "expect": _str("the reply it must give"),
                           "match": _str("exact, contains or regex", choices=MATCHES, default="exact"),
                       })),
        "skip": _str("why this profile's gate cannot run in the verify engine (one line, required words): the gate "
                     "is skipped, and the notes and the release's records say so and why, never that it passed; "
                     "false: this profile's gate runs, whatever the file it extends (or product.yaml) says",
                     takes_false=True),
        "timeout": Key(type="int", doc="seconds to wait for /health", minimum=1, maximum=3600, default=60),
    }),
    "notes": Key(type="record", doc="what the release notes carry besides what unibake measures",
                 scope="product", merge="merge", fields={
                     "changelog": _path("a Markdown file written by a person: what changed, for the notes"),
                     "known_limits": _path("a Markdown file: known limits, for the notes"),
                     "attachments": Key(type="list", doc="files copied into the release (results JSON, tables), "
                                        "listed in SHA256SUMS and linked from the notes",
                                        item=_path("a file in the repository")),
                     "external": Key(type="list", doc="artifacts the release needs but does not ship (weights, "
                                     "a patch set): recorded by name, size and sha256; build.py verify DIR "
                                     "--external PATH checks a copy", item=Key(type="record", doc="an artifact",
                                                                               fields={
                         "name": _str("its file name, or path in a folder", required=True, pattern=EXTERNAL_NAME_RE,
                                      pattern_doc="a relative name like weights/model-00001.safetensors"),
                         "bytes": Key(type="int", doc="its size", required=True, minimum=0,
                                      maximum=1 << 50),
                         "sha256": _str("its sha256", required=True, pattern=SHA256_RE,
                                        pattern_doc="64 lower-case hex digits"),
                     })),
                 }),
}

NOT_INHERITED = ("profile", "extends")


def default_of(*path: str) -> object:
    """The schema's default for a key path, e.g. ``default_of("launch", "port")``; a list's items are
    passed through: ``default_of("patches", "strip")``."""
    spec = SCHEMA[path[0]]
    for part in path[1:]:
        if spec.type == "list" and spec.item is not None:
            spec = spec.item
        spec = spec.fields[part]
    if spec.default is None:
        raise KeyError(f"the schema gives no default for {'.'.join(path)}")
    return spec.default
