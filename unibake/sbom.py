"""``sbom.cdx.json``: a CycloneDX 1.6 bill of materials of what the image holds, made with
cyclonedx-python-lib.

Its subject (``metadata.component``) is the image, by ID. Its components: the base image by
digest, the OS, the engine, every kernel and sidecar with the sha256 of its ``.so`` as it lies in
the image, the tune caches and overlays, every other library under the install root, and the OS
and Python packages found in the image's layers. The layers are read in the pass that archives
the image (:mod:`unibake.contents`), not by another export. The document is deterministic: the
serial number derives from the image ID and release, the timestamp is ``SOURCE_DATE_EPOCH``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component as CdxComponent
from cyclonedx.model.component import ComponentType
from cyclonedx.model.dependency import Dependency
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from packageurl import PackageURL
from sortedcontainers import SortedSet

from . import __version__
from .contents import ImageContents
from .errors import VerificationError
from .metadata import Component

SBOM = "sbom.cdx.json"
SPEC = SchemaVersion.V1_6
SBOM_LIMIT = 64 << 20
# packages listed at most: a distribution's image installs a few thousand; 40,000 took cyclonedx 50 s and 1 GB, and
# a dpkg status of a few MB can name millions (the rest are counted in a unibake:not-listed property)
MAX_PACKAGES = 20_000


@dataclass(frozen=True, kw_only=True)
class BaseImage:
    """An image a release was built on (the base, or the kernels' builder), as the engine knows it."""

    ref: str
    image_id: str
    diff_ids: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()  # NAME@sha256:<manifest digest>, of the ref's own repository

    @property
    def purl(self) -> str | None:
        """The package URL of its first repository digest (``pkg:oci/NAME@sha256:...?repository_url=...``),
        by which an auditor pulls the very image; None when the engine knew none."""
        return image_purl(self.repo_digests[0], self.ref) if self.repo_digests else None


NO_REPO_DIGEST = ("none known to the engine for its repository (an image built, loaded or tagged there, not pulled "
                  "from it)")


def _repository(ref: str) -> str:
    """A reference's repository as docker names it in full: its tag and digest dropped, ``docker.io/``
    and ``library/`` put in where docker reads them (``debian:12`` is ``docker.io/library/debian``)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]
    first = name.split("/", 1)[0]
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name if '/' in name else 'library/' + name}"
    return name


def repo_digests(listed: tuple[str, ...], ref: str) -> tuple[str, ...]:
    """The repository digests ``ref`` is known by: ``ref`` itself when it names one, and those of the engine's
    ``RepoDigests`` (each a repository and a sha256 digest) in ``ref``'s repository. Another repository's
    (a mirror the image was also pulled from) is left out: it says where else the image was, which the
    release's texts would carry (a private registry's address among them)."""
    from .schema import IMAGE_REF_RE

    own = _repository(ref)
    found = [d for d in ((ref,) if "@sha256:" in ref else ()) + tuple(listed)
             if len(d) <= 512 and "@sha256:" in d and IMAGE_REF_RE.fullmatch(d) and _repository(d) == own]
    return tuple(dict.fromkeys(found))


def image_purl(repo_digest: str, ref: str) -> str:
    """``pkg:oci/NAME@sha256:HEX?repository_url=REPOSITORY`` (the purl spec's oci type), with ``tag`` when
    ``ref`` is a tag of that repository."""
    repository = _repository(repo_digest)
    qualifiers = {"repository_url": repository}
    name = ref.split("@", 1)[0]
    tag = name.rsplit("/", 1)[-1].partition(":")[2]
    if tag and _repository(ref) == repository:
        qualifiers["tag"] = tag
    return PackageURL("oci", None, repository.rsplit("/", 1)[-1].lower(), repo_digest.partition("@")[2],
                      qualifiers).to_string()


def kernel_folder(component: Component, install_root: str) -> str:
    """Where render puts a kernel's or sidecar's libraries in the image (``render.kernel_paths``): one
    ``lib<name>.so``, the outputs a build declares, or every ``.so`` of a prebuilt archive."""
    folder = f"profiles/{component.profile}/kernels" if component.kind == "sidecar" else "kernels"
    return f"{install_root}/{folder}/{component.name}"


def _sha(hexdigest: str) -> list[HashType]:
    if not hexdigest:  # a library whose content was not read (a hard link to a file the pass did not hash)
        return []
    return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest.removeprefix("sha256:"))]


# what the hash of a patch, an env file or an overlay is (found by review: read as the file's own sha256, which it is
# not, it could not be reproduced): the sha256 of its files' sha256sum listing, as `sha256sum` prints it
LISTED = ("sha256 of the sha256sum listing of its files (\"HASH  PATH\" lines sorted by path, each path relative to "
          "the folder; a file's own name for a file): `sha256sum NAME | sha256sum` beside the file, `find . -type f "
          "-print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sed 's|  \\./|  |' | sha256sum` in the folder")


def _props(**values: object) -> list[Property]:
    return [Property(name=f"unibake:{k.replace('_', '-')}", value=str(v)) for k, v in values.items() if v not in ("", None)]


def _pypi_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as the purl spec asks


def _ref_part(text: str) -> str:
    """A name or architecture as a part of a bom-ref: the characters that join or number the parts are
    percent-encoded, so ``collide:b`` of ``c`` and ``collide`` of ``b:c`` are two references."""
    return text.replace("%", "%25").replace(":", "%3A").replace("#", "%23")


def _order(component: CdxComponent) -> tuple:
    """The first fields by which cyclonedx sorts components, a missing value last."""
    fields = (component.type.value, component.group, component.name, component.version, component.bom_ref.value)
    return tuple((0, f) if f is not None else (1, "") for f in fields)


def _add_all(bom: Bom, image: CdxComponent, listed: list[CdxComponent], top: list[CdxComponent]) -> None:
    """Put the components and the dependency graph in the document in one step each. Registering them one
    at a time (``Bom.register_dependency``, and ``Bom.validate`` which the outputter calls) searches every
    entry for each: 85 s for a base of 8000 packages. The graph is the one those calls make: the image
    depends on ``top``, and every component has its entry."""
    # keyed by the order cyclonedx itself sorts by (the references are unique, so it never looks further):
    # its own comparison rebuilds a 30-field tuple per step, seconds for thousands of packages
    bom._components = SortedSet(listed, key=_order)
    entries = {str(image.bom_ref): Dependency(ref=image.bom_ref, dependencies=sorted(
        (Dependency(ref=c.bom_ref) for c in top), key=lambda d: str(d.ref)))}
    for component in listed:
        entries.setdefault(str(component.bom_ref), Dependency(ref=component.bom_ref))
    bom.dependencies = sorted(entries.values(), key=lambda d: str(d.ref))

    def register(target, depends_on=None) -> None:  # validate's pass: every component has its entry already
        if depends_on or str(target.bom_ref) not in entries:
            Bom.register_dependency(bom, target, depends_on)
    bom.register_dependency = register


def sbom_document(*, product: str, release: str, tag: str, version: str, image_id: str, diff_ids: tuple[str, ...],
                  components: tuple[Component, ...], contents: ImageContents, base: BaseImage | None,
                  engine_version: str, install_root: str, epoch: int | None, created: int | None = None) -> str:
    """The SBOM of one release, as JSON text; raises when a kernel the image declares is not in it.

    Its timestamp: ``epoch`` (the image's SOURCE_DATE_EPOCH label), else ``created`` (its config's created,
    for an image unibake did not build; the property ``unibake:timestamp-from`` then says so), else 1970-01-01."""
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"unibake:{image_id}:{product}:{release}"))
    when = epoch if epoch is not None else created
    bom.metadata.timestamp = datetime.fromtimestamp(when or 0, timezone.utc)
    said = None if epoch is not None else "the image config's created" if created is not None else "none known"
    bom.metadata.tools.components.add(CdxComponent(type=ComponentType.APPLICATION, name="unibake",
                                                   version=__version__, bom_ref="tool:unibake"))
    if engine_version:
        bom.metadata.tools.components.add(CdxComponent(
            type=ComponentType.PLATFORM, name="docker-engine", version=engine_version, bom_ref="tool:docker-engine",
            description="the container engine that built and saved the image"))
    # what the layers' pass could not list, said in the document itself and not only in the build log: a
    # reader of the SBOM alone would take it for the whole image
    gaps = [Property(name="unibake:layer-not-inspected", value=d) for d in contents.not_inspected]
    gaps += [Property(name="unibake:not-listed", value=problem) for problem in contents.problems]
    if len(contents.packages) > MAX_PACKAGES:
        gaps.append(Property(name="unibake:not-listed", value=(
            f"{len(contents.packages) - MAX_PACKAGES} packages: the image lists {len(contents.packages)}, more than "
            f"the {MAX_PACKAGES} an SBOM of unibake's lists")))
    image = CdxComponent(type=ComponentType.CONTAINER, name=tag.rsplit(":", 1)[0] if ":" in tag else tag,
                         version=version, bom_ref="image", hashes=_sha(image_id),
                         properties=_props(image_id=image_id, tag=tag, release=release, layers=len(diff_ids),
                                           source_date_epoch=epoch, timestamp_from=said) + gaps)
    bom.metadata.component = image
    top: list[CdxComponent] = []
    listed: list[CdxComponent] = []
    seen: set[str] = set()

    def add(component: CdxComponent, dependency: bool = True) -> None:
        ref = str(component.bom_ref)
        if ref in seen:
            return
        seen.add(ref)
        listed.append(component)
        if dependency:
            top.append(component)

    if base is not None:
        # by its ID (the hash); its purl names a repository digest to pull it by, when the engine knew one
        purl = base.purl
        add(CdxComponent(type=ComponentType.CONTAINER, name=base.ref, version=base.image_id, bom_ref="base-image",
                         hashes=_sha(base.image_id), description="the base image",
                         purl=PackageURL.from_string(purl) if purl else None,
                         properties=_props(role="base", image_id=base.image_id, layers=len(base.diff_ids),
                                           repo_digests=" ".join(base.repo_digests) or NO_REPO_DIGEST)))
    if contents.os is not None and contents.os.id:
        add(CdxComponent(type=ComponentType.OPERATING_SYSTEM, name=contents.os.id, version=contents.os.version_id,
                         description=contents.os.pretty_name or None, bom_ref="os"))
    claimed: set[str] = set()
    for c in components:
        ref = f"{c.kind}:{c.profile + ':' if c.profile else ''}{c.name}"
        props = dict(kind=c.kind, profile=c.profile, source_sha256=c.digest)
        if c.kind in ("kernel", "sidecar"):
            folder = kernel_folder(c, install_root)
            libs = [lib for lib in contents.libraries if lib.path.startswith(folder + "/")]
            if not libs and not contents.not_inspected:
                raise VerificationError(f"the image declares {c.kind} {c.name} {c.version} in {folder}, but its "
                                        "layers hold no library there")
            # one library: the kernel's hash is its own; several: each is listed as a file with its hash
            lib = libs[0] if len(libs) == 1 else None
            if lib is not None:
                claimed.add(lib.path)
            add(CdxComponent(type=ComponentType.LIBRARY, name=c.name, version=c.version, bom_ref=ref,
                             hashes=_sha(lib.sha256) if lib else [],
                             properties=_props(**props, path=lib.path if lib else folder,
                                               size=lib.size if lib and lib.sha256 else None,
                                               layer=lib.layer if lib else None, libraries=len(libs) or None)))
        elif c.kind == "engine":
            add(CdxComponent(type=ComponentType.FRAMEWORK, name=c.name, version=c.version, bom_ref=ref,
                             properties=_props(**props, path=f"{install_root}/engine")))
        elif c.kind == "tune_caches":
            add(CdxComponent(type=ComponentType.FILE, name=f"tune-caches-{c.profile or c.name}", version=c.version,
                             bom_ref=ref, description=f"{c.version} autotune cache files",
                             properties=_props(**props, path=f"{install_root}/profiles/{c.profile or c.name}/tune")))
        elif c.kind == "patch":  # a patch applied to the engine's files at build time
            add(CdxComponent(type=ComponentType.FILE, name=f"patch-{c.name}", version=c.version, bom_ref=ref,
                             hashes=_sha(c.digest),
                             properties=_props(**props, path=f"{install_root}/engine", hash_of=LISTED)))
        elif c.kind == "env_file":  # its KEY=VALUE lines are baked as the profiles' environment
            add(CdxComponent(type=ComponentType.DATA, name=f"env-file-{c.name}", version=c.version, bom_ref=ref,
                             hashes=_sha(c.digest), properties=_props(**props, hash_of=LISTED)))
        else:  # an overlay: a file or a folder laid over the engine (its version: how many files)
            add(CdxComponent(type=ComponentType.FILE, name=f"overlay-{c.name}", version=c.version, bom_ref=ref,
                             hashes=_sha(c.digest), properties=_props(**props, hash_of=LISTED)))
    for lib in contents.libraries:
        if lib.path not in claimed:
            add(CdxComponent(type=ComponentType.FILE, name=lib.path, bom_ref=f"file:{lib.path}", hashes=_sha(lib.sha256),
                             properties=_props(path=lib.path, size=lib.size if lib.sha256 else None, layer=lib.layer)))
    # an os-release ID with '/' would move every purl to another namespace (packageurl-python keeps it)
    odd = contents.os is not None and "/" in contents.os.id
    distro = f"{contents.os.id}-{contents.os.version_id}" if contents.os and contents.os.version_id and not odd else None
    namespace = contents.os.id if contents.os and contents.os.id and not odd else ""  # else the manager's own
    numbered: dict[str, int] = {}  # a reference listed again: the next number to try (counting from 2 each time took
    # time growing with the square of the repeats: 32,000 copies of one dpkg stanza, 79 s)
    for p in contents.packages[:MAX_PACKAGES]:
        if p.kind in ("deb", "apk"):
            qualifiers = {k: v for k, v in (("arch", p.arch), ("distro", distro)) if v}
            purl = PackageURL(p.kind, namespace or ("debian" if p.kind == "deb" else "alpine"), p.name, p.version,
                              qualifiers)
            ref = f"{p.kind}:{_ref_part(p.name)}:{_ref_part(p.arch)}"
        elif p.kind == "rpm":  # the purl spec's rpm: VERSION-RELEASE, the epoch a qualifier, the vendor a namespace
            epoch = re.fullmatch(r"([0-9]+):(.*)", p.version, re.DOTALL)
            qualifiers = {k: v for k, v in (("arch", p.arch), ("epoch", epoch[1] if epoch else ""),
                                            ("distro", distro)) if v}
            purl = PackageURL("rpm", namespace or None, p.name, epoch[2] if epoch else p.version, qualifiers)
            ref = f"rpm:{_ref_part(p.name)}:{_ref_part(p.arch)}"
        elif p.kind == "conda":
            purl = PackageURL("conda", None, p.name, p.version, {"build": p.source})
            ref = f"conda:{p.path}"
        else:
            purl = PackageURL("pypi", None, _pypi_name(p.name), p.version)
            ref = f"pypi:{p.path}"
        # every package found (up to MAX_PACKAGES, the rest counted on the subject) is listed, as the build log
        # counts them: one listed twice (two versions in a status file, or in status and status.d) gets a numbered
        # reference instead of being dropped
        if ref in seen:
            n = numbered.get(ref, 2)
            while f"{ref}#{n}" in seen:
                n += 1
            numbered[ref], ref = n + 1, f"{ref}#{n}"
        add(CdxComponent(type=ComponentType.LIBRARY, name=p.name, version=p.version, purl=purl, bom_ref=ref,
                         properties=_props(path=p.path, source=p.source if p.kind != "conda" else "", layer=p.layer)))
    _add_all(bom, image, listed, top)
    text = make_outputter(bom, OutputFormat.JSON, SPEC).output_as_string(indent=2)
    return json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def check_sbom(text: str, *, image_id: str, where: str) -> list[str]:
    """What is wrong with a release's SBOM as the release's: not CycloneDX, or about another image."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return [f"{where}: not valid JSON ({str(exc)[:80]})"]
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        return [f"{where}: not a CycloneDX document"]
    spec = document.get("specVersion", "")  # a string, as CycloneDX has it (and the shell verifier reads it)
    if not isinstance(spec, str) or not re.fullmatch(r"1\.([5-9]|[0-9][0-9])", spec):
        return [f"{where}: CycloneDX {str(spec)[:10]!r}, not 1.5 or later"]
    subject = (document.get("metadata") or {}).get("component") if isinstance(document.get("metadata"), dict) else None
    if not isinstance(subject, dict):
        return [f"{where}: names no subject (metadata.component)"]
    listed = subject.get("hashes")
    sha256 = [h.get("content") for h in (listed if isinstance(listed, list) else [])
              if isinstance(h, dict) and h.get("alg") == "SHA-256"]
    if len(sha256) > 1:  # which one a reader believes would be its own choice
        return [f"{where}: its subject has {len(sha256)} SHA-256 hashes, not one"]
    if sha256 != [image_id.removeprefix("sha256:")]:
        shown = str(sha256[0])[:64] if sha256 else "(none)"
        return [f"{where}: describes image sha256:{shown}, not this release's {image_id}"]
    return []
