"""The supply chain of a release, on fake engines and Debian's real gpg and minisign with throwaway
keys: SHA256SUMS signed before the folder is committed, verify --key checking the signature
before anything else, the SBOM valid against the CycloneDX schema, the provenance's subjects, and
what verify refuses when either is about something else."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from hypothesis import given, settings
from hypothesis import strategies as st

from unibake.console import Reporter
from unibake.errors import InputError, VerificationError
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL
from unibake.pipeline import ARCHIVE, Request, run_stages, selection
from unibake.provenance import byproducts_of, check_subjects, materials_of, parse_provenance
from unibake.sbom import NO_REPO_DIGEST, check_sbom
from unibake.signing import _child_env, check_keys
from unibake.verify import verify_folder

from ..conftest import gpg_home, minisign_key, run  # noqa: F401 - fixtures used by name
from ..fake_engine import FakeEngine
from ..forge import resum
from ..savefixtures import tar_of
from .test_smoke import server  # noqa: F401 - the fixture is used by name

KERNEL = b"\x7fELF kernel " + bytes(range(256)) * 400
STATUS = (b"Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2+b7\n\n"
          b"Package: python3.11\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-6\n")
LAYERS = [
    tar_of([("etc/os-release", b'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n', None),
            ("var/lib/dpkg/status", STATUS, None),
            ("usr/lib/python3/dist-packages/idna-3.3.dist-info/METADATA",
             b"Metadata-Version: 2.1\nName: idna\nVersion: 3.3\n\nlong text\n", None)]),
    tar_of([("opt/unibake/kernels/k/libk.so", KERNEL, None),
            ("opt/unibake/profiles/tp1/tune/a.json", b"{}\n", None)]),
]
PASSWORD = "correct horse battery staple"


class Quiet(Reporter):
    def __init__(self):
        import io
        self.stream = io.StringIO()
        super().__init__(env={"CI": "1"}, stream=self.stream)


def image_metadata(port: int) -> str:
    return json.dumps({
        "product": "demo", "version": "1.0", "tag": "demo:1.0", "default_profile": "tp1",
        "components": [{"kind": "engine", "name": "eng", "version": "0.1", "digest": "a" * 64, "profile": ""},
                       {"kind": "kernel", "name": "k", "version": "2.0", "digest": "c" * 64, "profile": ""},
                       {"kind": "tune_caches", "name": "tp1", "version": "1", "digest": "d" * 64, "profile": "tp1"}],
        "launch": {"port": port, "model_name": "demo", "mounts": {}},
        "profiles": {"tp1": {"gpus": 1, "vendor": "nvidia", "kernels": ["/opt/unibake/kernels/k/libk.so"],
                             "tune_caches": 1, "sidecars": [], "args": [],
                             "smoke": {"expect_reply": "UNIFIED_TP1_OK", "prompt": "Say it.", "timeout": 5}}}},
        sort_keys=True, separators=(",", ":"))


@pytest.fixture
def engines(server):  # noqa: F811
    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: image_metadata(server.server_port), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.0", "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 2}, LAYERS, tag="demo:1.0")
    return {None: source, "fake://verify": FakeEngine(address="fake://verify")}


def release(engines, out: Path, env: dict | None = None, **kw):
    request = Request(env=env or {}, cwd=out.parent, out=out, image="demo:1.0", verify_engine="fake://verify", **kw)
    return run_stages(selection(ARCHIVE), request, Quiet(), connect=engines.__getitem__)


def test_a_signed_release_verifies_with_gpg_minisign_and_verify_key_and_a_tampered_sums_fails_all(
        engines, tmp_path, gpg_home, minisign_key, cli):
    env, public = gpg_home
    secret, minisign_public = minisign_key
    results = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid", sign_minisign=secret)
    folder = results["release"].folder
    names = set(os.listdir(folder))
    assert {"SHA256SUMS.asc", "SHA256SUMS.minisig", "sbom.cdx.json", "provenance.intoto.json",
            "provenance.intoto.json.asc", "provenance.intoto.json.minisig"} <= names
    assert run("gpg", "--verify", "SHA256SUMS.asc", "SHA256SUMS", env=env, cwd=folder).returncode == 0
    assert run("minisign", "-Vm", "SHA256SUMS", "-p", str(minisign_public), cwd=folder).returncode == 0
    listed = (folder / "SHA256SUMS").read_text()
    assert "  provenance.intoto.json.asc\n" in listed and "  sbom.cdx.json\n" in listed
    assert "SHA256SUMS.asc" not in listed  # it signs the sums: it cannot be in them
    manifest = json.loads((folder / "manifest.json").read_text())
    fingerprint = run("gpg", "--with-colons", "--fingerprint", "signer@example.invalid",
                      env=env).stdout.split("fpr:::::::::")[1].split(":")[0]
    minisign_id = minisign_public.read_text().splitlines()[0].split()[-1]  # "... minisign public key <ID>"
    assert [(s["kind"], s["key"], s["files"]) for s in manifest["supply_chain"]["signatures"]] == [
        ("openpgp", fingerprint, ["SHA256SUMS.asc", "provenance.intoto.json.asc"]),
        ("minisign", minisign_id, ["SHA256SUMS.minisig", "provenance.intoto.json.minisig"])]
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "gpg --verify SHA256SUMS.asc SHA256SUMS" in notes and "minisign -Vm SHA256SUMS -p publisher.pub" in notes
    guide = (folder / "README-DIST.md").read_text()
    assert "gpg --verify SHA256SUMS.asc SHA256SUMS" in guide and "minisign -Vm SHA256SUMS -p publisher.pub" in guide

    for key in (public, minisign_public):
        good = cli("verify", str(folder), "--key", str(key))
        assert good.code == 0, good.err
        assert "good" in good.err and "signature" in good.err

    # another image ID, and SHA256SUMS rewritten to match: sha256sum -c passes, the signatures do not
    old = hashlib.sha256((folder / "IMAGE_ID").read_bytes()).hexdigest()
    (folder / "IMAGE_ID").write_text("sha256:" + "0" * 64 + "\n")
    new = hashlib.sha256((folder / "IMAGE_ID").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text((folder / "SHA256SUMS").read_text().replace(old, new))
    assert run("sha256sum", "--quiet", "-c", "SHA256SUMS", cwd=folder).returncode == 0
    assert run("gpg", "--verify", "SHA256SUMS.asc", "SHA256SUMS", env=env, cwd=folder).returncode != 0
    assert run("minisign", "-Vm", "SHA256SUMS", "-p", str(minisign_public), cwd=folder).returncode != 0
    for key in (public, minisign_public):
        bad = cli("--json", "verify", str(folder), "--key", str(key))
        assert bad.code == 3
        assert bad.error_lines[-1].startswith("error: SHA256SUMS.") and "signature check failed: BAD" in bad.err
        assert [c["check"] for c in json.loads(bad.out)["checks"]] == ["signature"]  # nothing else was trusted


def test_verify_key_refuses_an_unsigned_release_and_a_key_that_is_not_one(engines, tmp_path, gpg_home, cli):
    _, public = gpg_home
    folder = release(engines, tmp_path / "release")["release"].folder
    assert cli("verify", str(folder)).code == 0
    unsigned = cli("verify", str(folder), "--key", str(public))
    assert unsigned.code == 3 and "SHA256SUMS.asc: signature check failed: missing: SHA256SUMS is not signed" in \
        unsigned.error_lines[-1]
    junk = tmp_path / "junk.pub"
    junk.write_text("hello\n")
    refused = cli("verify", str(folder), "--key", str(junk))
    assert refused.code == 2 and "neither an armoured OpenPGP public key" in refused.error_lines[-1]


def test_a_signing_key_that_cannot_sign_fails_before_any_work(engines, tmp_path, gpg_home):
    env, _ = gpg_home
    out = tmp_path / "release"
    with pytest.raises(InputError, match=r"--sign nobody@example.invalid: no secret key"):
        release(engines, out, env=env, sign="nobody@example.invalid")
    folder = tmp_path / "keys"
    folder.mkdir()
    made = run("minisign", "-G", "-p", str(folder / "k.pub"), "-s", str(folder / "k.key"),
               stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert made.returncode == 0, made.stderr
    with pytest.raises(InputError, match=r"minisign could not sign probe: .*needs UNIBAKE_MINISIGN_PASSWORD"):
        release(engines, out, sign_minisign=folder / "k.key")  # no password: refused at once, never a prompt
    assert engines["fake://verify"].loads == 0 and not (out / "1.0").exists()
    # a CI passes the password in the environment; it reaches minisign on its stdin, and nowhere else
    signer = check_keys(None, folder / "k.key", {"UNIBAKE_MINISIGN_PASSWORD": PASSWORD, "PATH": os.environ["PATH"]})
    assert signer.minisign_id == (folder / "k.pub").read_text().splitlines()[0].split()[-1]
    assert PASSWORD not in repr(signer) and "UNIBAKE_MINISIGN_PASSWORD" not in _child_env(signer.env)


def test_the_sbom_is_valid_cyclonedx_and_lists_what_the_layers_hold(engines, tmp_path):
    folder = release(engines, tmp_path / "release")["release"].folder
    text = (folder / "sbom.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    sbom = json.loads(text)
    image_id = engines[None].inspect_image("demo:1.0").id
    assert sbom["specVersion"] == "1.6"
    assert sbom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": image_id[7:]}]
    by_ref = {c["bom-ref"]: c for c in sbom["components"]}
    assert by_ref["kernel:k"]["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(KERNEL).hexdigest()}]
    assert by_ref["kernel:k"]["version"] == "2.0"
    assert by_ref["deb:bash:amd64"]["purl"] == "pkg:deb/debian/bash@5.2.15-2%2Bb7?arch=amd64&distro=debian-12"
    assert by_ref["pypi:/usr/lib/python3/dist-packages/idna-3.3.dist-info"]["purl"] == "pkg:pypi/idna@3.3"
    assert by_ref["os"]["name"] == "debian" and by_ref["os"]["version"] == "12"
    assert {"engine:eng", "tune_caches:tp1:tp1"} <= set(by_ref)
    again = release(engines, tmp_path / "again")["release"].folder
    assert (again / "sbom.cdx.json").read_text() == text


def test_the_provenance_names_the_archive_and_the_image_and_verify_checks_both_documents(engines, tmp_path):
    folder = release(engines, tmp_path / "release")["release"].folder
    manifest = json.loads((folder / "manifest.json").read_text())
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {"demo-1.0.tar.zst": manifest["archive"]["sha256"], "demo:1.0": manifest["image_id"][7:],
                        "sbom.cdx.json": manifest["supply_chain"]["sbom"]["sha256"]}
    predicate = statement["predicate"]
    assert predicate["runDetails"]["builder"]["version"]["unibake"] == manifest["tool"]["version"]
    assert predicate["buildDefinition"]["externalParameters"]["command"] == "archive"
    assert predicate["buildDefinition"]["externalParameters"]["level"] == 3
    assert {"name": "demo:1.0", "digest": {"sha256": manifest["image_id"][7:]},
            "annotations": {"role": "image", "repo_digests": NO_REPO_DIGEST}} in predicate["buildDefinition"][
        "resolvedDependencies"]
    assert {c.name for c in verify_folder(folder).checks if c.passed} >= {"sbom", "provenance"}

    def rewrite(folder: Path, name: str, change) -> None:  # a file tampered with, and every listing made to match
        def sha(path: Path) -> str:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        path, listing = folder / name, folder / "manifest.json"
        old, old_listing = sha(path), sha(listing)
        path.write_text(change(path.read_text()))
        listing.write_text(listing.read_text().replace(old, sha(path)))
        sums = folder / "SHA256SUMS"
        sums.write_text(sums.read_text().replace(old, sha(path)).replace(old_listing, sha(listing)))

    rewrite(folder, "sbom.cdx.json", lambda t: t.replace(manifest["image_id"][7:], "0" * 64))
    failed = {c.name: c.detail for c in verify_folder(folder).checks if not c.passed}
    assert "not this release's" in failed["sbom"] and "the sha256 of sbom.cdx.json differs" in failed["provenance"]
    assert set(failed) == {"sbom", "provenance"}  # every sum still matches: only the documents' subjects tell
    other = release(engines, tmp_path / "other")["release"].folder
    rewrite(other, "provenance.intoto.json", lambda t: t.replace(manifest["archive"]["sha256"], "1" * 64))
    failed = {c.name: c.detail for c in verify_folder(other).checks if not c.passed}
    assert set(failed) == {"provenance"} and "the sha256 of demo-1.0.tar.zst differs" in failed["provenance"]


JSON_KEYS = ["bomFormat", "specVersion", "metadata", "component", "hashes", "alg", "content", "_type", "predicateType",
             "subject", "predicate", "name", "digest", "sha256", "buildDefinition", "resolvedDependencies",
             "annotations", "role", "runDetails", "byproducts"]
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
              st.sampled_from(["CycloneDX", "1.6", "SHA-256", "https://in-toto.io/Statement/v1", "input",
                               "https://slsa.dev/provenance/v1"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(JSON_KEYS), inner,
                                                                         max_size=5)), max_leaves=25)


@settings(max_examples=int(os.environ.get("UNIBAKE_FUZZ_EXAMPLES", "150")), deadline=None)
@given(document=json_values)
def test_a_hostile_sbom_or_provenance_is_a_failed_check_never_a_crash(document):
    text = json.dumps(document)
    assert isinstance(check_sbom(text, image_id="sha256:" + "0" * 64, where="sbom.cdx.json"), list)
    try:
        statement = parse_provenance(text, "provenance.intoto.json")
    except VerificationError:
        return
    for role in ("input", "profile", "lock", "base image"):
        assert isinstance(materials_of(statement, role), dict)
    assert isinstance(byproducts_of(statement), dict)
    assert isinstance(check_subjects(statement, files={}, image_ref="demo:1", image_id="sha256:" + "0" * 64,
                                     required=("a",), where="p"), list)


@pytest.fixture
def demo(engines, tmp_path):
    """A whole release, SBOM and provenance included, its archive in the folder (the example's
    release/1.3.1 is tracked without its archive, so a clean clone has none to copy)."""
    return release(engines, tmp_path / "release")["release"].folder


def supply(folder, name: str, change) -> None:
    """A supply-chain file changed, and the manifest's record of it and SHA256SUMS made to agree."""
    document = json.loads((folder / name).read_text())
    change(document)
    (folder / name).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    manifest = json.loads((folder / "manifest.json").read_text())
    key = "sbom" if name.startswith("sbom") else "provenance"
    data = (folder / name).read_bytes()
    manifest["supply_chain"][key].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


@pytest.mark.parametrize("case, says", [
    ("an alg that is a list", "its subject has"),  # was a TypeError traceback
    ("two SHA-256 hashes", "its subject has 2 SHA-256 hashes, not one"),
])
def test_an_sbom_whose_subject_hashes_cannot_be_read_one_way_fails_in_one_line(cli, demo, case, says):
    def change(document):
        hashes = document["metadata"]["component"]["hashes"]
        hashes.append({"alg": [], "content": "x"} if case == "an alg that is a list" else
                      {"alg": "SHA-256", "content": "1" * 64})
        if case == "an alg that is a list":
            hashes.append({"alg": "SHA-256", "content": "2" * 64})
    supply(demo, "sbom.cdx.json", change)
    result = cli("verify", str(demo))
    assert result.code == 3 and "Traceback" not in result.err and says in result.error_lines[-1], result.err


def test_a_provenance_naming_one_subject_twice_fails(cli, demo):
    def change(document):
        image = next(s for s in document["subject"] if ":" in s["name"])
        document["subject"].insert(0, {"name": image["name"], "digest": {"sha256": "1" * 64}})
    supply(demo, "provenance.intoto.json", change)
    result = cli("verify", str(demo))
    assert result.code == 3 and "as a subject more than once" in result.error_lines[-1], result.err


def test_an_sbom_spec_version_in_other_digits_is_not_cyclonedx_1_x():
    """``1.٣٣`` (Arabic-Indic digits) reads as a number to Python's ``\\d``; the spec version is ASCII."""
    text = json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.\u0663\u0663"})
    assert any("not 1.5 or later" in p for p in check_sbom(text, image_id="sha256:" + "0" * 64, where="sbom.cdx.json"))


@pytest.mark.parametrize("name", ["sbom.cdx.json", "run.sh"])
def test_a_listed_file_that_is_a_folder_is_a_failed_check_in_verify_and_releases(cli, demo, name):
    (demo / name).unlink()
    (demo / name).mkdir()  # was "error: 3: Is a directory", exit 1, and releases listed nothing
    result = cli("verify", str(demo))
    assert result.code == 3 and f"{name}: sha256 check failed: not a regular file" in result.error_lines[-1], result.err
    listed = cli("releases", "--out", str(demo.parent), "--deep")
    assert listed.code == 0 and f"FAILS: {name} not a regular file" in listed.err, listed.err


@pytest.mark.parametrize("value", ["my ci runner", "ci-42", "https://ci.example/a b", "urn:x:\u00e9", "x:\n"])
def test_a_builder_id_that_is_not_a_uri_is_refused_before_any_work_and_a_uri_is_the_provenance_s_builder(
        engines, cli, busybox_product, tmp_path, value):
    from .test_bad_input import assert_refused

    # before: written as the provenance's builder.id, which SLSA provenance v1 requires to be a URI
    env = {"CI": "true", "UNIBAKE_BUILDER_ID": value}
    refused = cli("--config", str(busybox_product), env=env)
    assert_refused(refused, busybox_product.parent)
    assert refused.error_lines[0].startswith(f"error: UNIBAKE_BUILDER_ID={value[:80]!r} is not a URI"), refused.err
    archive = cli("archive", "demo:1.0", "--out", str(tmp_path / "out"), env=env)
    assert archive.code == 2 and len(archive.error_lines) == 1 and not (tmp_path / "out").exists(), archive.err
    uri = "https://ci.example.com/org/repo/.github/workflows/release.yml@refs/heads/main"
    folder = release(engines, tmp_path / "release", env={"UNIBAKE_BUILDER_ID": uri})["release"].folder
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    assert statement["predicate"]["runDetails"]["builder"]["id"] == uri
