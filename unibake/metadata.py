"""What an image built by unibake says about itself: :class:`ImageMetadata`, typed once.

It is made from the plan when we build the image (:meth:`ImageMetadata.from_plan`), baked into the
image twice (the label ``io.unibake.metadata`` and ``/opt/unibake/meta/release.json``), and read
back from the label when we release an image we did not just build
(:meth:`ImageMetadata.from_labels`). An image's labels come from whoever built it: they are
parsed against this schema, strictly, and anything else is refused.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_serializer, model_validator

from .errors import InputError, VerificationError
from .envfile import fingerprint
from .platforms import DEFAULT as DEFAULT_PLATFORM, RECORD_PATTERN as PLATFORM_PATTERN
from .regexsafe import check_regex
from .schema import (COMPONENT_VERSION_RE, DEVICE_RE, ENV_KEY_RE, GROUP_RE, IMAGE_PATH_RE, IMAGE_REF_RE, MAX_GPUS,
                     NAME_RE, SHM_SIZE_RE, UPSTREAM_NAME_RE, VERSION_RE, default_of)

if TYPE_CHECKING:
    from .plan import ReleasePlan

METADATA_LABEL = "io.unibake.metadata"
PROFILES_LABEL = "io.unibake.profiles"
HEX64 = r"^[0-9a-f]{64}$"
DIGEST = r"^sha256:[0-9a-f]{64}$"
Vendor = Literal["nvidia", "amd", "hygon"]
Match = Literal["exact", "contains", "regex"]
Digest = Annotated[str, StringConstraints(pattern=DIGEST)]
DevicePath = Annotated[str, StringConstraints(pattern=DEVICE_RE.pattern)]
Group = Annotated[str, StringConstraints(pattern=GROUP_RE.pattern)]


class Record(BaseModel):
    """A frozen record that refuses unknown fields and values of the wrong type."""

    # python-re: the schema's path patterns refuse '.' and '..' components with a look-ahead
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, regex_engine="python-re")


def control_character(value: object, path: str = "", skip: frozenset[str] = frozenset()) -> str | None:
    """Where in a document (keys and values, recursively) a control character is; None if nowhere.
    Every string of these documents can reach a shell script or Markdown: none may end a line."""
    if isinstance(value, str):
        return path or "the document" if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if key in skip:
                continue
            found = control_character(key, here) or control_character(item, here)
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = control_character(item, f"{path}.{i}")
            if found:
                return found
    return None


class Document(Record):
    """A top-level document read from outside (an image's label, a downloaded manifest): no string in
    it may hold a control character."""

    @model_validator(mode="after")
    def _no_control_characters(self) -> "Document":
        found = control_character(self.model_dump(by_alias=True), skip=frozenset({"labels"}))
        if found:
            raise ValueError(f"{found} holds a control character")
        return self


def _pattern(regex) -> str:
    return regex.pattern


class Component(Record):
    """A versioned, hashed part of the image, for labels, the manifest and the notes."""

    kind: Literal["engine", "kernel", "sidecar", "tune_caches", "overlay", "patch", "env_file"]
    name: str = Field(max_length=1024)
    version: str = Field(max_length=4096)
    digest: str = Field(pattern=HEX64)
    profile: str = Field(default="", max_length=64)

    @property
    def label(self) -> tuple[str, str]:
        """The image label that records this component: key, "version sha256:digest"."""
        key = f"io.unibake.{self.kind.replace('_', '-')}."
        key += self.name if self.kind == "tune_caches" else ".".join(filter(None, (self.profile, self.name)))
        return key, f"{self.version} sha256:{self.digest}".strip()


class Sidecar(Record):
    name: str = Field(pattern=_pattern(UPSTREAM_NAME_RE))
    version: str = Field(pattern=_pattern(COMPONENT_VERSION_RE))


class SmokePrompt(Record):
    """One prompt of a smoke gate and the reply it must give."""

    prompt: str = Field(max_length=4096)
    expect: str | None = Field(default=None, max_length=4096)
    match: Match = "exact"

    @model_validator(mode="after")
    def _regex(self) -> "SmokePrompt":
        if self.match == "regex":
            # an image's own metadata is held to the profiles' rule: a pattern that could backtrack for
            # ever (the image's engine supplies the reply it is matched against) is refused
            try:
                check_regex(self.expect or "", "the smoke gate")
            except InputError as exc:
                raise ValueError(str(exc).removeprefix("the smoke gate: ")) from None
        return self


class SmokeSpec(Record):
    """The smoke gate of a profile: its prompts (``prompts``), or, as images made before several
    prompts existed say it, one ``prompt`` and ``expect_reply``, compared by ``match``."""

    expect_reply: str | None = Field(default=None, max_length=4096)
    prompt: str | None = Field(default=None, max_length=4096)
    # images made before exact matching existed were checked with "contains"; new ones say prompts
    match: Match = "contains"
    prompts: tuple[SmokePrompt, ...] = ()
    timeout: int = Field(ge=1, le=3600)
    skip: str | None = Field(default=None, min_length=1, max_length=300)  # why the gate is skipped (smoke.skip)

    @model_validator(mode="after")
    def _skip(self) -> "SmokeSpec":
        if self.skip is not None and not self.skip.strip():
            raise ValueError("smoke.skip is blank: a skipped gate needs its reason")
        return self

    @model_serializer(mode="wrap")
    def _without_no_skip(self, handler):
        # an image whose gates all run carries the label it carried before smoke.skip existed (its ID too)
        document = handler(self)
        if isinstance(document, dict) and document.get("skip") is None:
            document.pop("skip", None)
        return document

    @property
    def checks(self) -> tuple[SmokePrompt, ...]:
        """Every prompt the gate sends, with what its reply must be."""
        if self.prompts:
            return self.prompts
        return (SmokePrompt(prompt=self.prompt or default_of("smoke", "prompt"), expect=self.expect_reply,
                            match=self.match),)


class DeviceMetadata(Record):
    extra: tuple[DevicePath, ...] = ()
    groups: tuple[Group, ...] = ()


class TopologyMetadata(Record):
    nodes: int = Field(default=1, ge=1, le=MAX_GPUS)
    network: Literal["bridge", "host"] = "bridge"
    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: str | None = Field(default=None, pattern=SHM_SIZE_RE.pattern)
    rdma: bool = False
    master_port: int = Field(default=29500, ge=1, le=65535)


class ProfileMetadata(Record):
    gpus: int = Field(ge=1, le=MAX_GPUS)
    vendor: Vendor
    kernels: tuple[str, ...]
    tune_caches: int = Field(ge=0, le=1 << 31)  # how many JSON files: a count, not a number of any size
    sidecars: tuple[Sidecar, ...]
    args: tuple[str, ...]
    smoke: SmokeSpec
    devices: DeviceMetadata = DeviceMetadata()
    topology: TopologyMetadata = TopologyMetadata()
    env: dict[str, str] = {}  # every variable the profile sets (shared, its own, its env files'), for the notes

    @model_validator(mode="after")
    def _env(self) -> "ProfileMetadata":
        for key, value in self.env.items():
            if not ENV_KEY_RE.fullmatch(key) or len(value) > 4096:
                raise ValueError(f"env key {key[:40]!r} is not a variable name, or its value is too long")
        return self

    @property
    def extra_devices(self) -> tuple[str, ...]:
        """``devices.extra`` less the devices run.sh gives this profile already (amd, hygon: /dev/kfd; rdma:
        /dev/infiniband and what it holds): a ROCm docker run's ``--device /dev/kfd`` copied into extra was
        passed to docker twice."""
        given = (("/dev/kfd",) if self.vendor in ("amd", "hygon") else ()) + \
            (("/dev/infiniband",) if self.topology.rdma else ())
        return tuple(d for d in dict.fromkeys(self.devices.extra)
                     if not any(d == g or d.startswith(f"{g}/") for g in given))

    @property
    def env_count(self) -> int:
        return len(self.env)

    @property
    def env_sha256(self) -> str:
        return fingerprint(self.env)


class LaunchMetadata(Record):
    port: int = Field(ge=1, le=65535)
    model_name: str = Field(max_length=4096)
    mounts: dict[str, str]

    @model_validator(mode="after")
    def _mounts(self) -> "LaunchMetadata":
        for name, path in self.mounts.items():
            if not NAME_RE.fullmatch(name) or not IMAGE_PATH_RE.fullmatch(path):
                raise ValueError(f"mount {name[:40]!r} at {path[:80]!r} is not a name and an absolute path")
        return self


class ImageMetadata(Document):
    """The product, its profiles, components and run-time defaults, as baked into the image."""

    product: str = Field(pattern=_pattern(NAME_RE))
    version: str = Field(pattern=_pattern(VERSION_RE))
    tag: str = Field(pattern=_pattern(IMAGE_REF_RE), max_length=255)
    default_profile: str = Field(pattern=_pattern(NAME_RE))
    profiles: dict[str, ProfileMetadata] = Field(min_length=1)
    components: tuple[Component, ...]
    launch: LaunchMetadata
    platform: str = Field(default=DEFAULT_PLATFORM, pattern=PLATFORM_PATTERN)  # images made before it were amd64

    @model_validator(mode="after")
    def _profiles(self) -> "ImageMetadata":
        for name in self.profiles:
            if not NAME_RE.fullmatch(name):
                raise ValueError(f"profile name {name[:40]!r} is not valid")
        if self.default_profile not in self.profiles:
            raise ValueError(f"default_profile {self.default_profile!r} is not one of the profiles")
        return self

    @classmethod
    def from_plan(cls, plan: "ReleasePlan") -> "ImageMetadata":
        from .render import kernel_paths  # the image layout is render's to decide

        return cls(
            product=plan.product, version=plan.version, tag=plan.tag, default_profile=plan.default_profile,
            profiles={p.name: ProfileMetadata(
                gpus=p.gpus, vendor=p.vendor, kernels=kernel_paths(plan, p),
                tune_caches=len(p.tune.json_files) if p.tune else 0,
                sidecars=tuple(Sidecar(name=k.name, version=k.version) for k in p.sidecars), args=p.args,
                smoke=SmokeSpec(match="exact", timeout=p.smoke.timeout, skip=p.smoke.skip, prompts=tuple(
                    SmokePrompt(prompt=x.prompt, expect=x.expect, match=x.match) for x in p.smoke.prompts)),
                devices=DeviceMetadata(extra=p.devices.extra, groups=p.devices.groups),
                topology=TopologyMetadata(nodes=p.topology.nodes, network=p.topology.network, ipc=p.topology.ipc,
                                          shm_size=p.topology.shm_size, rdma=p.topology.rdma,
                                          master_port=p.topology.master_port),
                env=dict(sorted(p.env.items())))
                for p in plan.profiles},
            components=plan.components,
            launch=LaunchMetadata(port=plan.launch.port, model_name=plan.launch.model_name,
                                  mounts=dict(plan.launch.mounts)),
            platform=plan.platform.name)

    @classmethod
    def from_labels(cls, labels: dict[str, str], image: str) -> "ImageMetadata | None":
        """The metadata an image's labels carry; None for an image unibake did not build."""
        text = labels.get(METADATA_LABEL)
        if text is None:
            if PROFILES_LABEL in labels:
                raise VerificationError(f"{image} carries unibake labels but no {METADATA_LABEL}: it was built "
                                        "by an older unibake; rebuild it")
            return None
        return cls.parse(text, f"the label {METADATA_LABEL} of {image}")

    @classmethod
    def parse(cls, text: str, where: str) -> "ImageMetadata":
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise VerificationError(f"{where} is not valid unibake metadata: {first_error(exc)}") from None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def first_error(exc: ValidationError) -> str:
    """One line for the first problem pydantic found: where, and what."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in error["loc"]) or "the document"
    return f"{where}: {error['msg']}"[:300]

