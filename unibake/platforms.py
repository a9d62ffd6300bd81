"""Target platforms: which ones unibake builds for, the host's default, and how an image records one.

A platform is written as Docker writes it (``linux/amd64``, ``linux/arm64``); several at once as
``docker buildx`` takes them, comma-separated (``linux/amd64,linux/arm64``). The image config, the
archive's OCI index, ``manifest.json`` and the notes carry it. ``linux/amd64`` keeps the names
releases always had (``demo-llm:1.3.1``, ``release/1.3.1/``); every other platform adds its
architecture to the tag and the release folder (``demo-llm:1.3.1-arm64``, ``release/1.3.1-arm64/``),
so the names do not depend on the machine that built them and both can sit side by side.

An engine of another architecture runs a foreign image's programs under emulation: qemu-user
registered with the host kernel's ``binfmt_misc`` (``scripts/setup.sh`` does it). Engine 20.10's
classic builder then runs the ``RUN`` steps, but it ignores the build's platform: it builds on the
local ``FROM`` image whatever its platform, and copies that image's ``architecture`` into the
config (``amd64`` for a base made with ``docker import``). So the build stage refuses a base of
another platform, and the normalise stage writes the platform into the config itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import InputError

DEFAULT = "linux/amd64"  # the platform whose releases carry no suffix
# One platform in the YAML or on the command line, or several separated by commas (with spaces or tabs around
# them, as a list is written by hand; docker buildx trims them too). linux/arm64/v8 is linux/arm64 (its variant).
LIST_RE = re.compile(r"^[ \t]*linux/(?:amd64|arm64(?:/v8)?)(?:[ \t]*,[ \t]*linux/(?:amd64|arm64(?:/v8)?))*[ \t]*$")
# One platform as a key of base.platforms, builder.platforms and a kernel's platforms.
KEY_RE = re.compile(r"^linux/(?:amd64|arm64(?:/v8)?)$")
# Any platform an image may record, for images unibake releases but did not build.
RECORD_PATTERN = r"^[a-z0-9]{1,32}/[a-z0-9_]{1,32}(?:/[a-z0-9.]{1,16})?$"


@dataclass(frozen=True, kw_only=True)
class Platform:
    """One target: the OCI ``os``/``architecture``/``variant`` and what ``uname -m`` says on it."""

    os: str
    architecture: str
    variant: str | None
    machine: str  # uname -m inside a container of this platform, native or emulated
    elf_machine: int  # the ELF header's e_machine of its programs and libraries (EM_X86_64, EM_AARCH64)

    @property
    def name(self) -> str:
        return f"{self.os}/{self.architecture}"

    @property
    def suffix(self) -> str:
        """What the tag and the release folder add: nothing for the default platform."""
        return "" if self.name == DEFAULT else f"-{self.architecture}"

    def oci(self) -> dict[str, str]:
        """The OCI platform object, as an image index's descriptor carries it."""
        return {"architecture": self.architecture, "os": self.os, **({"variant": self.variant} if self.variant else {})}


KNOWN: dict[str, Platform] = {
    "linux/amd64": Platform(os="linux", architecture="amd64", variant=None, machine="x86_64", elf_machine=62),
    # Docker's own arm64 images record the variant v8; so do ours.
    "linux/arm64": Platform(os="linux", architecture="arm64", variant="v8", machine="aarch64", elf_machine=183),
}
ALIASES = {"linux/arm64/v8": "linux/arm64"}
MACHINES = {p.machine: p for p in KNOWN.values()} | {"arm64": KNOWN["linux/arm64"], "amd64": KNOWN["linux/amd64"]}


def parse(text: str, where: str) -> tuple[Platform, ...]:
    """``linux/arm64`` or ``linux/amd64,linux/arm64``: the platforms, in order, each once."""
    if not isinstance(text, str) or not LIST_RE.fullmatch(text):
        known = ", ".join(KNOWN)
        raise InputError(f"{where}: platform {str(text)[:80]!r} is not one of {known} (several: comma-separated, "
                         "e.g. linux/amd64,linux/arm64)")
    out: list[Platform] = []
    for name in text.split(","):
        name = name.strip(" \t")
        platform = KNOWN[ALIASES.get(name, name)]
        if platform in out:
            raise InputError(f"{where}: platform {platform.name} is named twice")
        out.append(platform)
    return tuple(out)


def key_for(entries: dict, platform: Platform, where: str) -> str | None:
    """The key of ``entries`` (base.platforms, builder.platforms, a kernel's platforms) naming ``platform``,
    as written (linux/arm64 or linux/arm64/v8); None when none does. Two keys naming it are refused."""
    seen: dict[str, str] = {}
    for key in entries:  # (whichever platform is asked: the lock plans each, a build one)
        if ALIASES.get(key, key) in seen:
            raise InputError(f"{where}: {seen[ALIASES.get(key, key)]} and {key} are the same platform; keep one")
        seen[ALIASES.get(key, key)] = key
    return seen.get(platform.name)


def parse_options(values: Iterable[str]) -> tuple[Platform, ...]:
    """Every ``--platform`` given (each may be a comma-separated list), each platform once."""
    text = ",".join(values)
    return parse(text, "--platform") if text else ()


def host() -> Platform:
    """The platform of the machine unibake runs on: the default target."""
    machine = os.uname().machine
    if machine not in MACHINES:
        raise InputError(f"this machine is {machine}, for which unibake has no default platform: give --platform "
                         f"(one of {', '.join(KNOWN)}) or set platform: in product.yaml")
    return MACHINES[machine]


def recorded(architecture: str, os_name: str, variant: str = "") -> str:
    """The platform an image config records, as a name (``linux/arm64``); "" when it records none."""
    if not architecture or not os_name:
        return ""
    name = f"{os_name}/{architecture}"
    if name in KNOWN:
        return name  # arm64 with or without its v8 variant is the same target
    return f"{name}/{variant}" if variant else name


def recorded_by(config: dict) -> str:
    """The platform an image config records, as a name; "" when it records none."""
    found = of_config(config)
    return recorded(found["architecture"], found["os"], found.get("variant", "")) if found else ""


def apply(config: dict, platform: Platform) -> None:
    """Set the image config's ``os``, ``architecture`` and ``variant`` to ``platform`` (in place)."""
    config["os"] = platform.os
    config["architecture"] = platform.architecture
    if platform.variant:
        config["variant"] = platform.variant
    else:
        config.pop("variant", None)


def of_config(config: dict) -> dict[str, str] | None:
    """The OCI platform object of an image config, for the archive's index; None when it records none."""
    if not isinstance(config, dict):
        return None
    # its keys read as the engine (Go's encoding/json) reads them: in any case ("Architecture"), the last of two
    fields = {str(key).lower(): value for key, value in config.items()}
    architecture, os_name, variant = (fields.get(k) for k in ("architecture", "os", "variant"))
    if not isinstance(architecture, str) or not isinstance(os_name, str) or not architecture or not os_name:
        return None
    out = {"architecture": architecture, "os": os_name}
    if isinstance(variant, str) and variant:
        out["variant"] = variant
    return out


EXEC_FORMAT = "exec format error"  # what the kernel says of a foreign program it has no emulator for


def emulation_hint(platform: str) -> str:
    """What fixes an "exec format error" in a build or a container for ``platform``."""
    return (f"the engine's host cannot run {platform} programs: register qemu-user-static with binfmt_misc "
            "there (scripts/setup.sh does it, as root)")
