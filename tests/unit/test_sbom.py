"""The SBOM document: the same bytes for the same image, every package found listed once with its own
reference, in time that grows with the packages, not with their square."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from unibake import __version__
from unibake.contents import ImageContents, Library, OsRelease, Package
from unibake.metadata import Component
from unibake.sbom import NO_REPO_DIGEST, BaseImage, sbom_document

from ..savefixtures import tar_of
from .test_contents import inspect

DEMO = Path(__file__).resolve().parents[2] / "release" / "1.3.1" / "sbom.cdx.json"


def props(c: dict) -> dict:
    return {p["name"].removeprefix("unibake:"): p["value"] for p in c.get("properties", [])}


def inputs_of(document: dict) -> dict:
    """What sbom_document was given for a release, read back from the document it wrote."""
    image = document["metadata"]["component"]
    meta = props(image)
    tools = {t["name"]: t["version"] for t in document["metadata"]["tools"]["components"]}
    components, libraries, packages, base, os_release = [], [], [], None, None
    for c in document["components"]:
        p, ref = props(c), c["bom-ref"]
        if ref == "base-image":
            base = BaseImage(ref=c["name"], image_id=p["image-id"], diff_ids=("l",) * int(p["layers"]))
        elif ref == "os":
            os_release = OsRelease(id=c["name"], version_id=c["version"], pretty_name=c.get("description", ""))
        elif ref.startswith(("deb:", "pypi:")):
            kind = ref.split(":")[0]
            arch = c["purl"].partition("arch=")[2].partition("&")[0] if kind == "deb" else ""
            packages.append(Package(kind=kind, name=c["name"], version=c["version"], arch=arch,
                                    source=p.get("source", ""), path=p["path"], layer=p["layer"]))
        elif ref.startswith("file:"):
            libraries.append(Library(path=p["path"], sha256=c["hashes"][0]["content"], size=int(p["size"]),
                                     layer=p["layer"]))
        else:
            components.append(Component(kind=p["kind"], name=ref.rsplit(":", 1)[1], version=c["version"],
                                        digest=p["source-sha256"], profile=p.get("profile", "")))
            if "size" in p:
                libraries.append(Library(path=p["path"], sha256=c["hashes"][0]["content"], size=int(p["size"]),
                                         layer=p["layer"]))
    libraries.sort(key=lambda lib: lib.path)
    packages.sort(key=lambda pk: (pk.kind, pk.name.lower(), pk.version, pk.path))
    return dict(product=image["name"], release=meta["release"], tag=meta["tag"], version=image["version"],
                image_id=meta["image-id"], diff_ids=("l",) * int(meta["layers"]), components=tuple(components),
                contents=ImageContents(packages=tuple(packages), libraries=tuple(libraries), os=os_release,
                                       layers=int(meta["layers"]), not_inspected=()),
                base=base, engine_version=tools["docker-engine"], install_root="/opt/unibake",
                epoch=int(meta["source-date-epoch"]))


def test_the_demo_release_sbom_is_written_again_byte_for_byte_from_the_same_image():
    text = DEMO.read_text()

    again = json.loads(sbom_document(**inputs_of(json.loads(text))))
    # the demo's base was built locally: the SBOM says no repository digest is known for it
    [base] = [c for c in again["components"] if c["bom-ref"] == "base-image"]
    assert {"name": "unibake:repo-digests", "value": NO_REPO_DIGEST} in base["properties"] and "purl" not in base
    expected = text.replace('"version": "0.2.0"', f'"version": "{__version__}"', 1)  # the tool's own version
    assert json.dumps(again, indent=2, sort_keys=True) + "\n" == expected


def packages(n: int) -> tuple[Package, ...]:
    return tuple(Package(kind="deb", name=f"pkg{i:05}", version=f"1.{i}", arch="amd64", path="/var/lib/dpkg/status",
                         layer="sha256:" + "1" * 64) for i in range(n))


def calls_made(work) -> int:
    """How many Python function calls ``work()`` makes: its work, the same on a loaded machine as on an idle one."""
    made = 0

    def count(frame, event, arg):
        nonlocal made
        made += event == "call"
    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
    return made


def test_a_base_with_thousands_of_packages_gets_its_sbom_in_seconds_not_minutes():
    """Measured in work (calls made), not in seconds: a time bound flaked on a loaded machine, and let a
    regression by a constant factor through. Each package registered one by one (searching every entry:
    85 s for 8000 packages) made 6400 calls a package at 2000 and the count grew with the packages;
    cyclonedx's own comparison of components (a 30-field tuple built per step) 3500; now 2300, flat."""
    def document(n: int) -> dict:
        contents = ImageContents(packages=packages(n), libraries=(), layers=1, not_inspected=(),
                                 os=OsRelease(id="debian", version_id="12", pretty_name="Debian 12"))
        return json.loads(sbom_document(product="p", release="1", tag="p:1", version="1", image_id="sha256:" + "0" * 64,
                                        diff_ids=("l",), components=(), contents=contents, base=None,
                                        engine_version="24.0", install_root="/opt/unibake", epoch=0))

    documents = []
    few, many = (calls_made(lambda: documents.append(document(n))) / n for n in (100, 1000))
    assert sum(1 for c in documents[-1]["components"] if c.get("purl", "").startswith("pkg:deb/")) == 1000
    [image] = [d for d in documents[-1]["dependencies"] if d["ref"] == "image"]
    assert len(image["dependsOn"]) == 1001  # every package and the OS
    assert many < 2800, f"{many:.0f} calls a package for 1000 packages"
    assert many < 1.25 * few, f"{few:.0f} calls a package for 100 packages, {many:.0f} for 1000: it grows with them"


def stanza(name: str, version: str, arch: str = "amd64") -> bytes:
    return f"Package: {name}\nStatus: install ok installed\nArchitecture: {arch}\nVersion: {version}\n\n".encode()


def document_of(layers: list[bytes], tmp_path) -> tuple[ImageContents, dict]:
    archive, diff_ids = inspect(layers, tmp_path=tmp_path)
    contents = archive.contents
    return contents, json.loads(sbom_document(
        product="p", release="1", tag="p:1", version="1", image_id="sha256:" + "0" * 64, diff_ids=tuple(diff_ids),
        components=(), contents=contents, base=None, engine_version="", install_root="/opt/unibake", epoch=0))


def test_a_package_listed_twice_or_a_name_with_a_colon_is_kept_and_the_log_count_is_the_sboms(tmp_path):
    status = (stanza("bash", "5.2") + stanza("dup", "2.0") + stanza("dup", "1.0") + stanza("collide", "1", "b:c")
              + stanza("collide:b", "1", "c"))
    layer = tar_of([("var/lib/dpkg/status", status, None), ("var/lib/dpkg/status.d/dup", stanza("dup", "3.0"), None)])
    contents, document = document_of([layer], tmp_path)
    debs = [c for c in document["components"] if c.get("purl", "").startswith("pkg:deb/")]
    assert len(debs) == sum(1 for p in contents.packages if p.kind == "deb") == 6  # what the build log says
    assert sorted((c["name"], c["version"]) for c in debs) == [
        ("bash", "5.2"), ("collide", "1"), ("collide:b", "1"), ("dup", "1.0"), ("dup", "2.0"), ("dup", "3.0")]
    refs = [c["bom-ref"] for c in document["components"]]
    assert len(set(refs)) == len(refs) and {"deb:collide:b%3Ac", "deb:collide%3Ab:c"} <= set(refs)
    [image] = [d for d in document["dependencies"] if d["ref"] == "image"]
    assert set(image["dependsOn"]) == set(refs)


def test_status_files_listing_more_packages_than_are_read_are_listed_up_to_it_and_said(tmp_path, monkeypatch):
    # found by review: a 64 MiB status of 3-line stanzas was 2.9 million packages read (a minute, 1 GB) before the
    # SBOM kept 20 000; status.d's files, eight times that. They are read up to PACKAGES_READ in all, and said.
    from unibake import contents as module

    monkeypatch.setattr(module, "PACKAGES_READ", 5)
    layer = tar_of([("var/lib/dpkg/status", b"".join(stanza(f"p{i}", "1") for i in range(4)), None),
                    ("var/lib/dpkg/status.d/extra", b"".join(stanza(f"q{i}", "1") for i in range(3)), None)])
    contents, document = document_of([layer], tmp_path)
    assert [p.name for p in contents.packages] == ["p0", "p1", "p2", "p3", "q0"]
    assert contents.problems == (
        "/var/lib/dpkg/status.d/extra lists more packages than the 5 an image's are read up to (a distribution "
        "installs a few thousand): the first 1 it lists are in the SBOM, the others are not",)
    assert "the first 1 it lists are in the SBOM, the others are not" in json.dumps(document)  # said in it too

def test_a_package_name_with_a_slash_is_left_out_and_said_not_written_as_another_packages_purl(tmp_path):
    meta = b"Metadata-Version: 2.1\nName: evil/../requests\nVersion: 1\n\n"
    layer = tar_of([("var/lib/dpkg/status", stanza("a/b", "1") + stanza("../../etc/passwd", "1") + stanza("ok", "1"),
                     None),
                    ("etc/os-release", b"ID=deb/ian\nVERSION_ID=12\n", None),
                    ("usr/lib/python3/dist-packages/evil-1.dist-info/METADATA", meta, None)])
    contents, document = document_of([layer], tmp_path)
    assert [p.name for p in contents.packages] == ["ok"]
    says = "a name with '/' would name another package in the SBOM; left out"
    assert contents.problems == (
        f"/usr/lib/python3/dist-packages/evil-1.dist-info lists a package named 'evil/../requests': {says}",
        f"/var/lib/dpkg/status lists a package named 'a/b': {says}",
        f"/var/lib/dpkg/status lists a package named '../../etc/passwd': {says}")
    assert [c["purl"] for c in document["components"] if "purl" in c] == ["pkg:deb/debian/ok@1?arch=amd64"]


def test_what_the_layers_pass_could_not_list_is_said_in_the_sbom_itself_not_only_in_the_log():
    # a layer not read (compressed, unparsable) and a package list behind a link: the build log warned,
    # the SBOM read alone looked whole
    contents = ImageContents(packages=(), libraries=(), os=None, layers=2, not_inspected=("sha256:" + "1" * 64,),
                             problems=("/var/lib/dpkg/status is a hard link to /aaa/status, not a file: the packages "
                                       "it lists are not in the SBOM",))
    text = sbom_document(product="demo", release="1.0", tag="demo:1.0", version="1.0", image_id="sha256:" + "e" * 64,
                         diff_ids=("sha256:" + "0" * 64, "sha256:" + "1" * 64), components=(), contents=contents,
                         base=None, engine_version="", install_root="/opt/unibake", epoch=None)
    subject = json.loads(text)["metadata"]["component"]
    said = [(p["name"], p["value"]) for p in subject["properties"]]
    assert ("unibake:layer-not-inspected", "sha256:" + "1" * 64) in said
    assert ("unibake:not-listed", contents.problems[0]) in said


PULLED = {"Id": "sha256:" + "1" * 64, "RepoTags": ["debian:bookworm", "mirror.example:5000/debian:12"],
          "RepoDigests": ["mirror.example:5000/debian@sha256:" + "2" * 64, "debian@sha256:" + "3" * 64,
                          "not a digest", 7],
          "RootFS": {"Layers": ["sha256:" + "4" * 64]}, "Config": {"Labels": None}, "Created": "2024-01-01T00:00:00Z"}
LOCAL = {**PULLED, "RepoTags": ["localhost/unibake-demo-base:bookworm"], "RepoDigests": []}


def _records(raw: dict, ref: str):
    """The base image as the SBOM stage records it, from the engine's inspect of it (``raw``), and the
    SBOM's base component and the provenance's base image dependency made of it."""
    from unibake.docker_engine import DockerEngine
    from unibake.provenance import provenance_document
    from unibake.supply import image_record

    class API:  # the engine's answer to GET /images/REF/json
        def inspect_image(self, asked):
            assert asked == ref
            return raw

    engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the inspect above
    engine.address, engine.api = "fake://", API()
    base = image_record(engine, ref, "base image")
    contents = ImageContents(packages=(), libraries=(), layers=1, not_inspected=(), os=None)
    sbom = json.loads(sbom_document(product="p", release="1", tag="p:1", version="1", image_id="sha256:" + "0" * 64,
                                    diff_ids=("sha256:" + "4" * 64,), components=(), contents=contents, base=base,
                                    engine_version="", install_root="/opt/unibake", epoch=0))
    statement = json.loads(provenance_document(
        subjects={}, image_ref="p:1", image_id="sha256:" + "0" * 64, parameters={}, materials=(), revision="",
        base=base, builder=None, source_image=None, engine_version="", byproducts={}))
    [component] = [c for c in sbom["components"] if c["bom-ref"] == "base-image"]
    [dependency] = [d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
                    if d["annotations"]["role"] == "base image"]
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    return base, component, dependency


def test_a_pulled_base_is_recorded_by_id_and_by_the_repository_digest_the_engine_knows():
    # (before: by ID alone, its repository digest only when the profile's reference named one: an auditor
    # could not pull a base given by tag by its digest)
    base, component, dependency = _records(PULLED, "debian:bookworm")
    # the mirror's digest is left out: another repository (which may be a private registry's address)
    assert base.repo_digests == ("debian@sha256:" + "3" * 64,)
    purl = f"pkg:oci/debian@sha256:{'3' * 64}?repository_url=docker.io/library/debian&tag=bookworm"
    assert component["purl"] == purl and component["hashes"] == [{"alg": "SHA-256", "content": "1" * 64}]
    assert {"name": "unibake:repo-digests", "value": " ".join(base.repo_digests)} in component["properties"]
    assert dependency["digest"] == {"sha256": "1" * 64} and dependency["uri"] == purl
    assert dependency["annotations"]["repo_digests"] == " ".join(base.repo_digests)
    # by the mirror's tag: the mirror's digest alone, its tag in the purl
    base, component, _ = _records(PULLED, "mirror.example:5000/debian:12")
    assert base.repo_digests == ("mirror.example:5000/debian@sha256:" + "2" * 64,)
    assert component["purl"] == (f"pkg:oci/debian@sha256:{'2' * 64}?repository_url=mirror.example:5000/debian"
                                 "&tag=12")
    # by a tag of another repository (debian retagged here as mybase:1): none known for that repository
    base, component, dependency = _records(PULLED, "mybase:1")
    assert base.repo_digests == () and "purl" not in component and "uri" not in dependency
    assert dependency["annotations"]["repo_digests"] == NO_REPO_DIGEST


def test_a_base_made_locally_is_recorded_by_id_and_said_to_have_no_repository_digest():
    base, component, dependency = _records(LOCAL, "localhost/unibake-demo-base:bookworm")
    assert base.repo_digests == () and "purl" not in component and "uri" not in dependency
    assert {"name": "unibake:repo-digests", "value": NO_REPO_DIGEST} in component["properties"]
    assert dependency["annotations"]["repo_digests"] == NO_REPO_DIGEST and dependency["digest"] == {"sha256": "1" * 64}
    # a reference that names a digest the engine does not list is kept, as before
    pinned = "localhost/unibake-demo-base@sha256:" + "5" * 64
    base, component, dependency = _records(LOCAL, pinned)
    assert base.repo_digests == (pinned,) and dependency["uri"] == component["purl"] == (
        f"pkg:oci/unibake-demo-base@sha256:{'5' * 64}?repository_url=localhost/unibake-demo-base")


def test_the_hash_of_an_overlay_patch_or_env_file_is_reproduced_by_the_recipe_the_sbom_gives(tmp_path):
    # found by review: an overlay's hash read as a file's sha256, which it is not (the sha256 of unibake's listing of
    # its files): nobody could reproduce it. The SBOM says how it is made; the recipe it gives makes it
    import subprocess

    from unibake.inputs import read_source
    from unibake.sbom import LISTED

    folder = tmp_path / "overlays" / "fix"
    (folder / "sub dir").mkdir(parents=True)
    (folder / "b.py").write_text("b\n")
    (folder / "sub dir" / "a.py").write_text("a\n")
    (folder / "Z.txt").write_text("z\n")
    made = read_source(tmp_path, "overlays/fix", "overlays[0]").digest
    in_folder = LISTED.split("`")[3]
    assert subprocess.run(in_folder, shell=True, cwd=folder, capture_output=True, text=True).stdout.split()[0] == made
    beside = LISTED.split("`")[1].replace("NAME", "b.py")
    assert subprocess.run(beside, shell=True, cwd=folder, capture_output=True, text=True).stdout.split()[0] == \
        read_source(tmp_path, "overlays/fix/b.py", "overlays[0]").digest
