"""``provenance.intoto.json``: an in-toto Statement (v1) with an SLSA provenance (v1) predicate,
made with the in-toto-attestation library.

Subjects: the archive's files, the image (its ID: the config digest), the SBOM and the kit.
Materials (``resolvedDependencies``): every entry of ``inputs.lock``, the profile YAMLs and the lock
itself, the source revision, and the base and builder images by ID (and every other image a kernel
is compiled in: role ``toolchain image``), each with the repository digests the engine knows for it
(annotation ``repo_digests``, the first as the ``uri``, a ``pkg:oci`` purl; or that it knows none). The
builder is unibake with its version (and the engine's); the build parameters are what the command line
asked for. The build context and Dockerfile are byproducts, so that ``build.py kit`` can prove a kit
written later holds the same context.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from . import __version__
from .errors import InputError, VerificationError
from .sbom import NO_REPO_DIGEST, BaseImage

PROVENANCE = "provenance.intoto.json"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
BUILD_TYPE = "urn:unibake:buildtype:release:v1"  # defines the parameters below; a URN: no host to resolve
TOOLCHAIN_ROLE = "toolchain image"  # a kernel's own build.image, beside the product's builder image
BUILDER_ID = "urn:unibake:builder:local"  # a CI declares its own with UNIBAKE_BUILDER_ID
BUILDER_ID_VARIABLE = "UNIBAKE_BUILDER_ID"
# SLSA's builder.id is a TypeURI: an RFC 3986 URI (a scheme, then its characters: no blank, quote or control)
URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+$")
IMAGE_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"  # the image ID is its config's digest
HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
PROVENANCE_LIMIT = 64 << 20


@dataclass(frozen=True, kw_only=True)
class Material:
    """A file the release was made from: a path from the project root and its sha256."""

    name: str
    sha256: str
    role: str  # input | profile | lock


def _descriptor(name: str, digest: Mapping[str, str], **annotations: object) -> object:
    return ResourceDescriptor(name=name, digest=dict(digest),
                              annotations={k: v for k, v in annotations.items() if v not in ("", None)}).pb


def _ints(value):
    """protobuf's Struct holds every number as a double: give whole numbers back their form."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def builder_id(env: Mapping[str, str]) -> str:
    """The provenance's ``builder.id``: ``UNIBAKE_BUILDER_ID`` when set (a URI, as SLSA requires; InputError
    otherwise, before any work), else unibake's local builder."""
    value = env.get(BUILDER_ID_VARIABLE) or ""
    if not value:
        return BUILDER_ID
    if len(value) > 2048 or not URI_RE.fullmatch(value):
        raise InputError(f"{BUILDER_ID_VARIABLE}={value[:80]!r} is not a URI, which the provenance's builder.id must "
                         "be (SLSA provenance v1), e.g. https://ci.example.com/runners/release or "
                         "urn:example:builder:ci; set it to one, or unset it")
    return value


def provenance_document(*, subjects: Mapping[str, str], image_ref: str, image_id: str, parameters: Mapping[str, object],
                        materials: tuple[Material, ...], revision: str, base: BaseImage | None,
                        builder: BaseImage | None, source_image: BaseImage | None, engine_version: str,
                        byproducts: Mapping[str, str], builder_id: str = BUILDER_ID,
                        toolchains: tuple[BaseImage, ...] = ()) -> str:
    """The statement as JSON text. ``subjects``: file name -> sha256 (the archive files, SBOM, kit)."""
    described = [_descriptor(name, {"sha256": sha}) for name, sha in sorted(subjects.items())]
    described.append(ResourceDescriptor(name=image_ref, digest={"sha256": image_id.removeprefix("sha256:")},
                                        media_type=IMAGE_MEDIA_TYPE).pb)
    dependencies = []
    commit, _, dirty = revision.partition("-")
    if HEX.fullmatch(commit):
        dependencies.append(_descriptor("source", {"gitCommit": commit}, role="revision", dirty=bool(dirty) or None))
    images = [("base image", base), ("builder image", builder), ("image", source_image)]
    images += [(TOOLCHAIN_ROLE, image) for image in toolchains]
    for role, image in images:
        if image is not None:  # by ID (digest); its uri a purl of a repository digest to pull it by, when one is known
            described_image = _descriptor(image.ref, {"sha256": image.image_id.removeprefix("sha256:")}, role=role,
                                          repo_digests=" ".join(image.repo_digests) or NO_REPO_DIGEST)
            described_image.uri = image.purl or ""
            dependencies.append(described_image)
    dependencies += [_descriptor(m.name, {"sha256": m.sha256}, role=m.role) for m in materials]
    definition = provenance_pb2.BuildDefinition(build_type=BUILD_TYPE, resolved_dependencies=dependencies)
    definition.external_parameters.update(dict(parameters))
    definition.internal_parameters.update({"tool": {"name": "unibake", "version": __version__},
                                           "engine_version": engine_version})
    details = provenance_pb2.RunDetails(
        builder=provenance_pb2.Builder(id=builder_id, version={"unibake": __version__,
                                                               **({"docker": engine_version} if engine_version else {})}),
        byproducts=[_descriptor(name, {"sha256": sha}) for name, sha in sorted(byproducts.items())])
    details.metadata.invocation_id = str(uuid.uuid4())
    details.metadata.finished_on.FromDatetime(datetime.now(timezone.utc).replace(microsecond=0))
    predicate = json_format.MessageToDict(provenance_pb2.Provenance(build_definition=definition, run_details=details))
    statement = Statement(described, PREDICATE_TYPE, predicate)
    statement.validate()
    document = _ints(json_format.MessageToDict(statement.pb))
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def parse_provenance(text: str, where: str) -> dict:
    """A provenance statement as JSON, checked for its types; VerificationError otherwise."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise VerificationError(f"{where}: not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE \
            or document.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(f"{where}: not an in-toto statement with an SLSA provenance v1 predicate")
    if not isinstance(document.get("subject"), list) or not isinstance(document.get("predicate"), dict):
        raise VerificationError(f"{where}: has no subjects or no predicate")
    return document


def subjects_of(document: dict) -> dict[str, str]:
    """Subject name -> sha256, for the subjects that have one."""
    out = {}
    for s in document["subject"]:
        if isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("digest"), dict):
            sha = s["digest"].get("sha256")
            if isinstance(sha, str):
                out[s["name"]] = sha
    return out


def materials_of(document: dict, role: str) -> dict[str, str]:
    """name -> sha256 of the resolved dependencies with the annotation ``role``."""
    return dict(listed_materials(document, role))


def listed_materials(document: dict, role: str) -> list[tuple[str, str]]:
    """(name, sha256) of the resolved dependencies with the annotation ``role``, in order, a name listed
    twice kept twice."""
    out = []
    for d in _list(_dict(document["predicate"].get("buildDefinition")).get("resolvedDependencies")):
        d = _dict(d)
        sha = _dict(d.get("digest")).get("sha256")
        if _dict(d.get("annotations")).get("role") == role and isinstance(d.get("name"), str) and isinstance(sha, str):
            out.append((d["name"], sha))
    return out


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def byproducts_of(document: dict) -> dict[str, str]:
    out = {}
    for b in _list(_dict(document["predicate"].get("runDetails")).get("byproducts")):
        b = _dict(b)
        sha = _dict(b.get("digest")).get("sha256")
        if isinstance(b.get("name"), str) and isinstance(sha, str):
            out[b["name"]] = sha
    return out


def check_subjects(document: dict, *, files: Mapping[str, str], image_ref: str, image_id: str,
                   required: tuple[str, ...], where: str) -> list[str]:
    """What is wrong with the provenance's subjects against the release: a subject whose digest is
    not the file's, a required file it does not name, or another image."""
    problems = []
    names = [s.get("name") for s in document["subject"] if isinstance(s, dict) and isinstance(s.get("name"), str)]
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    if twice:  # which of the two a reader believes would be its own choice
        problems.append(f"{where}: names {twice[0][:80]!r} as a subject more than once")
    for n, s in enumerate(document["subject"], 1):  # one without a sha256 would be passed over, not compared
        s = _dict(s)
        if not isinstance(s.get("name"), str) or not isinstance(_dict(s.get("digest")).get("sha256"), str):
            shown = repr(s["name"][:80]) if isinstance(s.get("name"), str) else f"#{n}"
            problems.append(f"{where}: its subject {shown} has no sha256 digest (a name and a sha256 each subject "
                            "must have, to be compared): refused")
            break
    subjects = subjects_of(document)
    if subjects.get(image_ref) != image_id.removeprefix("sha256:"):
        problems.append(f"{where}: its image subject is {str(subjects.get(image_ref))[:64]!r}, not {image_id}")
    for name, sha in sorted(subjects.items()):
        if name == image_ref:
            continue
        if name not in files:
            problems.append(f"{where}: names {name[:80]!r}, which this release does not hold")
        elif files[name] != sha:
            problems.append(f"{where}: the sha256 of {name} differs from the file's")
    for name in required:
        if name not in subjects:
            problems.append(f"{where}: does not name {name} as a subject")
    return problems
