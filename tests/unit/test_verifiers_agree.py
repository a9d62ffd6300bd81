"""Differential tests: the same hostile release folder, given to ``build.py verify`` and to
``scripts/verify-release.sh`` (under dash and bash), gets the same verdict. A forger controls every
file of the folder and re-sums SHA256SUMS; what one verifier passes the other must not refuse, and
what one refuses the other must refuse too."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from ..conftest import REPO, gpg_home, minisign_key  # noqa: F401 - fixtures used by name
from ..forge import resum
from .test_publish import make_release
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import engines, release  # noqa: F401 - the fixture is used by name

SCRIPT = REPO / "scripts" / "verify-release.sh"
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]


@pytest.fixture
def folder(tmp_path):
    return make_release(tmp_path / "release")[0]


def shell(folder, sh: str = "sh", timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sh, str(SCRIPT), str(folder), "--no-load"], capture_output=True, text=True,
                          timeout=timeout)


def verdicts(cli, folder) -> tuple[int, list[int], str, str]:
    """(build.py verify's exit code, the shell verifier's under each shell, their error lines)."""
    python = cli("verify", str(folder))
    assert "Traceback" not in python.err, python.err
    runs = [shell(folder, sh) for sh in SHELLS]
    errors = [line for line in runs[0].stderr.splitlines() if line.startswith("error:")]
    assert len(errors) <= 1, runs[0].stderr
    return python.code, [r.returncode for r in runs], python.err, runs[0].stderr


def assert_same(cli, folder, passes: bool, python_says: str = "", shell_says: str = "") -> None:
    python, shells, python_err, shell_err = verdicts(cli, folder)
    want = 0 if passes else 3
    assert python == want, python_err
    assert shells == [want] * len(SHELLS), shell_err
    assert python_says in python_err, python_err
    assert shell_says in shell_err, shell_err


def edit_manifest(folder, change) -> None:
    path = folder / "manifest.json"
    old = path.read_bytes()
    new = change(old)
    assert new != old
    path.write_bytes(new)
    resum(folder)


NOT_CANONICAL = "not written as unibake writes it"


@pytest.mark.parametrize("change", [
    pytest.param(lambda t: t.replace(b'"platform": "linux/amd64"', b'"platform": "linux\\/amd64"'), id="escaped slash"),
    pytest.param(lambda t: t.replace(b'"image_id": "sha256:', b'"image_id": "sha256\\u003a'), id="escaped digest"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.\\u0031"'), id="escaped label"),
    pytest.param(lambda t: json.dumps(json.loads(t)).encode() + b"\n", id="one line"),
    pytest.param(lambda t: json.dumps(json.loads(t), indent=4).encode() + b"\n", id="indent 4"),
    pytest.param(lambda t: t.rstrip(b"\n"), id="no final newline"),
    pytest.param(lambda t: t + b"\n", id="blank last line"),
    pytest.param(lambda t: t.replace(b"\n", b"\r\n"), id="crlf"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 3.0'), id="a float"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 3e0'), id="an exponent"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 03'), id="a leading zero"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\\u00E9"'), id="upper-case escape"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\xc3\xa9"'), id="raw utf-8"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\\u000a"'), id="long form of \\n"),
])
def test_a_manifest_not_in_unibakes_one_form_is_refused_by_both_in_one_line(cli, folder, change):
    edit_manifest(folder, change)
    assert_same(cli, folder, passes=False, shell_says=NOT_CANONICAL)
    said = cli("verify", str(folder)).error_lines
    assert len(said) == 1 and any(s in said[0] for s in (NOT_CANONICAL, "not valid JSON", "not a valid release manifest")), said


def test_a_manifest_holding_every_escape_json_dumps_writes_passes_both(cli, folder):
    def labelled(text: bytes) -> bytes:
        manifest = json.loads(text)
        manifest["labels"]["x"] = 'a "quoted" back\\slash \u00e9\U0001f600 \x7f tab\t'
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, labelled)
    assert b"\\u00e9\\ud83d\\ude00 \\u007f tab\\t" in (folder / "manifest.json").read_bytes()
    assert_same(cli, folder, passes=True)


# --- the SBOM's and the provenance's subjects ----------------------------------------------------


@pytest.fixture
def whole(engines, tmp_path):
    """A release with its SBOM and provenance (made on fake engines), its archive in the folder."""
    return release(engines, tmp_path / "release")["release"].folder


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rewrite(folder, name: str, change, *, text=None) -> None:
    """A supply-chain file changed and written as unibake writes it (or as ``text`` makes it), and the
    manifest's record of it, the provenance's subject of the SBOM and SHA256SUMS made to agree."""
    path = folder / name
    document = json.loads(path.read_text())
    change(document)
    written = text(document) if text else json.dumps(document, indent=2, sort_keys=True) + "\n"
    assert written != path.read_text() or text is None
    path.write_text(written)
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["supply_chain"]
    for key in ("sbom", "provenance"):
        if record[key]["name"] == name:
            record[key].update(bytes=path.stat().st_size, sha256=sha(path.read_bytes()))
    if name == record["sbom"]["name"]:  # the provenance names the SBOM: made to agree too
        provenance = folder / record["provenance"]["name"]
        statement = json.loads(provenance.read_text())
        for subject in statement["subject"]:
            if isinstance(subject, dict) and subject.get("name") == name:
                subject["digest"] = {"sha256": sha(path.read_bytes())}
        provenance.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
        record["provenance"].update(bytes=provenance.stat().st_size, sha256=sha(provenance.read_bytes()))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


def test_a_release_with_its_sbom_and_provenance_passes_both(cli, whole):
    assert {"sbom.cdx.json", "provenance.intoto.json"} <= set(os.listdir(whole))
    assert_same(cli, whole, passes=True)


def subject(document) -> dict:
    return document["metadata"]["component"]


def image_subject(statement) -> dict:
    return next(s for s in statement["subject"] if ":" in s["name"])


def file_subject(statement, suffix: str) -> dict:
    return next(s for s in statement["subject"] if s["name"].endswith(suffix))


SBOM_CASES = [
    ("another image", lambda d: subject(d)["hashes"][0].update(content="0" * 64), "describes image sha256:"),
    ("two SHA-256 hashes", lambda d: subject(d)["hashes"].append({"alg": "SHA-256", "content": "1" * 64}),
     "its subject has 2 SHA-256 hashes, not one"),
    ("no SHA-256 hash", lambda d: subject(d).update(hashes=[]), "describes image sha256:(none)"),
    ("hashes not a list", lambda d: subject(d).update(hashes={"alg": "SHA-256"}), "describes image sha256:(none)"),
    ("a content that is no string", lambda d: subject(d)["hashes"][0].update(content=None), "describes image"),
    ("CycloneDX 1.4", lambda d: d.update(specVersion="1.4"), "not 1.5 or later"),
    ("a spec version that is a number", lambda d: d.update(specVersion=16), "not 1.5 or later"),
    ("no spec version", lambda d: d.pop("specVersion"), "not 1.5 or later"),
    ("another format", lambda d: d.update(bomFormat="SPDX"), "not a CycloneDX document"),
    ("no subject", lambda d: d["metadata"].pop("component"), "names no subject"),
    ("a subject that is a list", lambda d: d["metadata"].update(component=[subject(d)]), "names no subject"),
    ("metadata that is a list", lambda d: d.update(metadata=[d["metadata"]]), "names no subject"),
]


@pytest.mark.parametrize("change, says", [pytest.param(c, s, id=i) for i, c, s in SBOM_CASES])
def test_a_forged_sbom_resummed_is_refused_by_both(cli, whole, change, says):
    rewrite(whole, "sbom.cdx.json", change)
    assert_same(cli, whole, passes=False, python_says=says, shell_says=says)


def test_an_sbom_whose_other_hashes_are_not_sha256_passes_both(cli, whole):
    def more(document):
        subject(document)["hashes"][:0] = [{"alg": "MD5", "content": "x"}, "SHA-256", {"alg": ["SHA-256"]},
                                           {"content": "0" * 64}]
    rewrite(whole, "sbom.cdx.json", more)
    assert_same(cli, whole, passes=True)


PROVENANCE_CASES = [
    ("another image", lambda d: image_subject(d)["digest"].update(sha256="0" * 64), "its image subject is"),
    ("no image", lambda d: d["subject"].remove(image_subject(d)), "its image subject is"),
    ("another archive", lambda d: file_subject(d, ".tar.zst")["digest"].update(sha256="1" * 64),
     "the sha256 of demo-1.0.tar.zst differs from the file's"),
    ("an upper-case digest", lambda d: file_subject(d, ".tar.zst")["digest"].update(
        sha256=file_subject(d, ".tar.zst")["digest"]["sha256"].upper()), "differs from the file's"),
    ("no SBOM", lambda d: d["subject"].remove(file_subject(d, "sbom.cdx.json")),
     "does not name sbom.cdx.json as a subject"),
    ("an SBOM subject without a digest", lambda d: file_subject(d, "sbom.cdx.json").update(digest=["x"]),
     "its subject 'sbom.cdx.json' has no sha256 digest"),
    ("a file the release does not hold", lambda d: d["subject"].append({"name": "x.bin", "digest": {"sha256": "2" * 64}}),
     "names 'x.bin', which this release does not hold"),
    ("a subject twice", lambda d: d["subject"].insert(0, {"name": image_subject(d)["name"], "digest": {"sha256": "1" * 64}}),
     "as a subject more than once"),
    ("a subject twice, once without a digest", lambda d: d["subject"].append({"name": "demo-1.0.tar.zst"}),
     "as a subject more than once"),
    ("another statement type", lambda d: d.update(_type="https://in-toto.io/Statement/v0.1"),
     "not an in-toto statement with an SLSA provenance v1 predicate"),
    ("another predicate type", lambda d: d.update(predicateType="https://slsa.dev/provenance/v0.2"),
     "not an in-toto statement with an SLSA provenance v1 predicate"),
    ("subjects not a list", lambda d: d.update(subject={"name": "x"}), "has no subjects or no predicate"),
    ("no predicate", lambda d: d.pop("predicate"), "has no subjects or no predicate"),
]


@pytest.mark.parametrize("change, says", [pytest.param(c, s, id=i) for i, c, s in PROVENANCE_CASES])
def test_a_forged_provenance_resummed_is_refused_by_both(cli, whole, change, says):
    rewrite(whole, "provenance.intoto.json", change)
    python, shells, python_err, shell_err = verdicts(cli, whole)
    assert python == 3 and shells == [3] * len(SHELLS), python_err + shell_err
    said = says.replace("'", "\"") if "names '" in says or "subject '" in says else says  # (the shell: JSON form)
    assert says in python_err, python_err
    assert said in shell_err, shell_err


@pytest.mark.parametrize("extra, shown", [
    ({"name": "notes.txt", "digest": {"sha512": "3" * 128}}, "'notes.txt'"),
    ({"name": "notes.txt", "digest": ["x"]}, "'notes.txt'"),
    ({"name": "notes.txt", "digest": {"sha256": 7}}, "'notes.txt'"),
    ({"name": "notes.txt"}, "'notes.txt'"),
    ({"digest": {"sha256": "3" * 64}}, "#LAST"),
    ("x", "#LAST"),
    ({"name": 7, "digest": {"sha256": "3" * 64}}, "#LAST"),
])
def test_a_provenance_subject_without_a_name_and_a_sha256_is_refused_by_both_naming_it(cli, whole, extra, shown):
    # it would be passed over, not compared: a file named so (re-summed) would pass for the provenance's
    count = []
    rewrite(whole, "provenance.intoto.json", lambda d: (d["subject"].append(extra), count.append(len(d["subject"]))))
    shown = shown.replace("LAST", str(count[0]))
    python, shells, python_err, shell_err = verdicts(cli, whole)
    assert python == 3 and shells == [3] * len(SHELLS), python_err + shell_err
    says = f"provenance.intoto.json: its subject {shown} has no sha256 digest"
    assert says in python_err, python_err
    assert says.replace("'", '"') in shell_err, shell_err


@pytest.mark.parametrize("name", ["sbom.cdx.json", "provenance.intoto.json"])
@pytest.mark.parametrize("form", [
    pytest.param(lambda d: json.dumps(d), id="one line"),
    pytest.param(lambda d: json.dumps(d, indent=2, sort_keys=True).replace("://", ":\\/\\/", 1) + "\n",
                 id="escaped slash"),
    pytest.param(lambda d: json.dumps(d, indent=2, sort_keys=True).replace('"name": "', '"n\\u0061me": "', 1) + "\n",
                 id="escaped letter"),
    pytest.param(lambda d: json.dumps(d, indent=2, sort_keys=True), id="no final newline"),
    pytest.param(lambda d: json.dumps(d, indent=2, sort_keys=True).replace('{\n  "', '{\n  "x": 1.5,\n  "', 1) + "\n",
                 id="a fraction"),
    pytest.param(lambda d: json.dumps(d, indent=2, sort_keys=True).replace('{\n  "', '{\n  "x": 1' + "0" * 4300 + ',\n  "', 1)
                 + "\n", id="a number of 4301 digits"),  # Python's int() reads none so long: the shell took it
])
def test_an_sbom_or_provenance_not_in_unibakes_one_form_is_refused_by_both(cli, whole, name, form):
    rewrite(whole, name, lambda d: None, text=form)
    assert_same(cli, whole, passes=False, python_says=NOT_CANONICAL, shell_says=NOT_CANONICAL)


def test_an_sbom_written_twice_with_the_subject_key_is_refused_by_both(cli, whole):
    def twice(document):
        return json.dumps(document, indent=2, sort_keys=True).replace(
            '"bomFormat": "CycloneDX",', '"bomFormat": "CycloneDX",\n  "bomFormat": "CycloneDX",', 1) + "\n"
    rewrite(whole, "sbom.cdx.json", lambda d: None, text=twice)
    python, shells, python_err, shell_err = verdicts(cli, whole)
    assert python == 3 and shells == [3] * len(SHELLS), python_err + shell_err


MINISIGS = ["SHA256SUMS.minisig", "provenance.intoto.json.minisig"]


def record_change(folder, change) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest["supply_chain"])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


@pytest.mark.parametrize("change, says", [
    pytest.param(lambda r: r["sbom"].update(sha256="0" * 64), "SHA256SUMS and manifest.json disagree", id="sbom sha256"),
    pytest.param(lambda r: r["provenance"].update(name="VALIDATION.json"), "its supply_chain.provenance names "
                 "VALIDATION.json, not the release's provenance (provenance.intoto.json)", id="another file"),
    pytest.param(lambda r: r["signatures"].append({"kind": "minisign", "key": "ABCD", "files": MINISIGS}),
                 "SHA256SUMS.minisig", id="a signature missing"),
    pytest.param(lambda r: r["signatures"].append({"kind": "minisign", "key": "ABCD", "files": ["../x"]}),
                 "", id="a signature outside the folder"),
])
def test_a_supply_chain_record_that_is_not_the_folder_s_is_refused_by_both(cli, whole, change, says):
    record_change(whole, change)
    python, shells, python_err, shell_err = verdicts(cli, whole)
    assert python == 3 and shells == [3] * len(SHELLS), python_err + shell_err
    assert says in python_err and says in shell_err, python_err + shell_err


def with_kit(folder, data: bytes | None = None, name: str = "demo-1.0-kit.tar.zst") -> dict:
    """The release given a kit as unibake records one (a zstd stream here: the verifiers do not unpack it):
    the file, its supply_chain record, the provenance's subject; returns the record."""
    import zstandard

    data = zstandard.ZstdCompressor(write_checksum=True).compress(b"kit\n" * 64) if data is None else data
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["supply_chain"]
    record["kit"] = {"name": name, "bytes": len(data), "sha256": sha(data)}
    provenance = folder / record["provenance"]["name"]
    statement = json.loads(provenance.read_text())
    statement["subject"].append({"name": name, "digest": {"sha256": sha(data)}})
    provenance.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
    record["provenance"].update(bytes=provenance.stat().st_size, sha256=sha(provenance.read_bytes()))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    return record["kit"]


def test_a_release_with_its_kit_passes_both(cli, whole):
    with_kit(whole)
    assert_same(cli, whole, passes=True)


@pytest.mark.parametrize("what, name", [("sbom", "sbom.cdx.json"), ("provenance", "provenance.intoto.json"),
                                        ("kit", "demo-1.0-kit.tar.zst")])
@pytest.mark.parametrize("off", [1, -1])
def test_a_supply_chain_record_whose_bytes_are_not_the_file_s_is_refused_by_both_naming_both_sizes(
        cli, whole, what, name, off):
    # its sha256 is the file's; its size was not compared (a record made of another file's size passed both)
    if what == "kit":
        with_kit(whole)
    size = (whole / name).stat().st_size
    record_change(whole, lambda r: r[what].update(bytes=size + off))
    says = f"{size} bytes, but manifest.json records {size + off}"
    assert_same(cli, whole, passes=False, python_says=f"{name}: size check failed: {says}",
                shell_says=f"/{name}: {says}")


def as_record(folder, name: str) -> dict:
    data = (folder / name).read_bytes()
    return {"name": name, "bytes": len(data), "sha256": sha(data)}


def renamed(folder, old: str, new: str, key: str) -> None:
    """A supply-chain file renamed, its record, the provenance's subject and SHA256SUMS made to agree."""
    (folder / old).rename(folder / new)
    manifest = json.loads((folder / "manifest.json").read_text())
    provenance = folder / (new if key == "provenance" else manifest["supply_chain"]["provenance"]["name"])
    statement = json.loads(provenance.read_text())
    for entry in statement["subject"]:
        if entry.get("name") == old:
            entry["name"] = new
    provenance.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
    manifest["supply_chain"][key] = as_record(folder, new)
    manifest["supply_chain"]["provenance"] = as_record(folder, provenance.name)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


@pytest.mark.parametrize("what, name, says", [
    ("kit", "sbom.cdx.json", "its supply_chain.kit names sbom.cdx.json, not the release's kit (demo-1.0-kit.tar.zst)"),
    ("kit", "demo-1.0.tar.zst", "its supply_chain.kit names demo-1.0.tar.zst, not the release's kit "
     "(demo-1.0-kit.tar.zst)"),
    ("sbom", "provenance.intoto.json", "its supply_chain.sbom names provenance.intoto.json, not the release's SBOM "
     "(sbom.cdx.json)"),
    ("provenance", "sbom.cdx.json", "its supply_chain.provenance names sbom.cdx.json, not the release's provenance "
     "(provenance.intoto.json)"),
])
def test_a_supply_chain_entry_naming_another_listed_file_is_refused_by_both(cli, whole, what, name, says):
    # its record made of that file's own name, size and sha256: the kit's passed both (the provenance names it)
    with_kit(whole)
    record_change(whole, lambda r: r.update({what: as_record(whole, name)}))
    assert_same(cli, whole, passes=False, python_says=says, shell_says=says)


@pytest.mark.parametrize("old, new, key, says", [
    ("demo-1.0-kit.tar.zst", "other-2.0-kit.tar.zst", "kit", "its supply_chain.kit names other-2.0-kit.tar.zst, not "
     "the release's kit (demo-1.0-kit.tar.zst)"),
    ("sbom.cdx.json", "bom.json", "sbom", "its supply_chain.sbom names bom.json, not the release's SBOM "
     "(sbom.cdx.json)"),
    ("provenance.intoto.json", "prov.json", "provenance", "its supply_chain.provenance names prov.json, not the "
     "release's provenance (provenance.intoto.json)"),
])
def test_a_supply_chain_file_renamed_everywhere_is_refused_by_both(cli, whole, old, new, key, says):
    with_kit(whole)
    renamed(whole, old, new, key)
    assert_same(cli, whole, passes=False, python_says=says, shell_says=says)


@pytest.mark.parametrize("data, says", [
    pytest.param(lambda folder: (folder / "demo-1.0.tar.zst").read_bytes(), "the same bytes as demo-1.0.tar.zst "
                 "(SHA256SUMS): not the release's kit", id="a copy of the archive"),
    pytest.param(lambda folder: (folder / "sbom.cdx.json").read_bytes(), "the same bytes as sbom.cdx.json "
                 "(SHA256SUMS): not the release's kit", id="a copy of the SBOM"),
    pytest.param(lambda folder: b"PK\x03\x04 a zip", "does not start as a zstd stream, as the release's kit does: "
                 "not its kit", id="a zip"),
])
def test_a_kit_that_is_a_copy_of_another_file_or_no_zstd_stream_is_refused_by_both(cli, whole, data, says):
    with_kit(whole, data(whole))
    assert_same(cli, whole, passes=False, python_says=f"demo-1.0-kit.tar.zst: kit check failed: {says}",
                shell_says=f"/demo-1.0-kit.tar.zst: {says}")


@pytest.mark.parametrize("change, name, label", [
    pytest.param(lambda m: m.update(supply_chain=None), "sbom.cdx.json", "SBOM (supply_chain.sbom)", id="null"),
    pytest.param(lambda m: m.pop("supply_chain"), "sbom.cdx.json", "SBOM (supply_chain.sbom)", id="dropped"),
    pytest.param(lambda m: m["supply_chain"].update(kit=None), "demo-1.0-kit.tar.zst", "kit (supply_chain.kit)",
                 id="the kit's null"),
])
def test_a_supply_chain_file_listed_but_left_out_of_the_record_is_refused_by_both(cli, whole, change, name, label):
    # nothing read it then: an SBOM of another image, shipped as the release's, passed both
    with_kit(whole)
    manifest = json.loads((whole / "manifest.json").read_text())
    change(manifest)
    (whole / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(whole)
    says = f"listed in SHA256SUMS, but manifest.json records no {label}: nothing checks it against the release"
    assert_same(cli, whole, passes=False, python_says=f"{name}: ", shell_says=f"/{name}: {says}")
    assert says in cli("verify", str(whole)).err


def test_an_archive_renamed_everywhere_is_refused_by_both(cli, whole):
    # its file, manifest.json's archive, the provenance's subject and SHA256SUMS: the notes and README-DIST load
    # demo-1.0.tar.zst, which was not there; both passed
    (whole / "demo-1.0.tar.zst").rename(whole / "other.tar.zst")
    manifest = json.loads((whole / "manifest.json").read_text())
    manifest["archive"]["name"] = manifest["archive"]["files"][0]["name"] = "other.tar.zst"
    provenance = whole / "provenance.intoto.json"
    statement = json.loads(provenance.read_text())
    for entry in statement["subject"]:
        if entry.get("name") == "demo-1.0.tar.zst":
            entry["name"] = "other.tar.zst"
    provenance.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
    manifest["supply_chain"]["provenance"] = as_record(whole, provenance.name)
    (whole / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(whole)
    says = "its archive is named other.tar.zst, not demo-1.0.tar.zst, as unibake names the archive of release 1.0"
    assert_same(cli, whole, passes=False, python_says=says, shell_says=says)


def attached(folder, records) -> None:
    """results.json copied into the release as an attachment, and manifest.json's attachments made ``records``."""
    (folder / "results.json").write_text('{"tokens_per_second": 812}\n')
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["attachments"] = records(as_record(folder, "results.json"))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


def test_a_release_with_an_attachment_passes_both(cli, whole):
    attached(whole, lambda record: [record])
    assert_same(cli, whole, passes=True)


@pytest.mark.parametrize("records, python_says, shell_says", [
    pytest.param(lambda r: [r, {**r, "name": "results.txt"}],
                 "results.txt: sha256 check failed: not listed in SHA256SUMS (manifest.json records it as an "
                 "attachment)",
                 "/results.txt: not listed in SHA256SUMS (manifest.json records it as an attachment)", id="missing"),
    pytest.param(lambda r: [{**r, "bytes": r["bytes"] + 1}], "results.json: size check failed: 27 bytes, but "
                 "manifest.json records 28", "/results.json: 27 bytes, but manifest.json records 28", id="bytes"),
    pytest.param(lambda r: [{**r, "sha256": "0" * 64}], "results.json: sha256 check failed: SHA256SUMS and "
                 "manifest.json disagree", "/results.json: SHA256SUMS and manifest.json disagree", id="sha256"),
    pytest.param(lambda r: [r, {**r, "name": "sbom.cdx.json"}], "its attachments.1 names sbom.cdx.json, which an "
                 "attachment cannot be named", "its attachments.1 names sbom.cdx.json, which an attachment cannot be "
                 "named", id="the SBOM"),
    pytest.param(lambda r: [{**r, "name": "demo-1.0.tar.zst"}], "its attachments.0 names demo-1.0.tar.zst, which an "
                 "attachment cannot be named", "its attachments.0 names demo-1.0.tar.zst, which an attachment cannot "
                 "be named", id="the archive"),
    pytest.param(lambda r: [{**r, "name": "IMAGE_ID"}], "its attachments.0 names IMAGE_ID, which", "its attachments.0 "
                 "names IMAGE_ID, which", id="IMAGE_ID"),
    pytest.param(lambda r: [r, {**r, "name": "Results.JSON"}], "its attachments.1 names Results.JSON, as another "
                 "attachment does (letter case aside)", "its attachments.1 names Results.JSON, as another attachment "
                 "does (letter case aside)", id="twice"),
])
def test_an_attachment_record_that_is_not_a_file_of_the_folder_is_refused_by_both(
        cli, whole, records, python_says, shell_says):
    # manifest.json's attachments were read by neither verifier: a record of a file not there, or of another
    # file of the release, passed both
    attached(whole, records)
    assert_same(cli, whole, passes=False, python_says=python_says, shell_says=shell_says)


def test_a_signature_file_the_record_names_passes_both_when_it_is_there(cli, whole):
    for name in MINISIGS:
        (whole / name).write_text("untrusted comment: x\n")
    record_change(whole, lambda r: r["signatures"].append({"kind": "minisign", "key": "ABCD", "files": MINISIGS}))
    assert_same(cli, whole, passes=True)


@pytest.mark.parametrize("records, says", [
    ([{"kind": "minisign", "key": "ABCD", "files": ["manifest.json"]}],
     "its supply_chain.signatures.0 (minisign) names manifest.json, not SHA256SUMS.minisig and "
     "provenance.intoto.json.minisig"),
    ([{"kind": "minisign", "key": "ABCD", "files": ["SHA256SUMS.asc", "provenance.intoto.json.asc"]}],
     "its supply_chain.signatures.0 (minisign) names SHA256SUMS.asc, provenance.intoto.json.asc, not "
     "SHA256SUMS.minisig and provenance.intoto.json.minisig"),
    ([{"kind": "openpgp", "key": "ABCD", "files": ["sbom.cdx.json", "provenance.intoto.json.asc"]}],
     "its supply_chain.signatures.0 (openpgp) names sbom.cdx.json, provenance.intoto.json.asc, not SHA256SUMS.asc "
     "and provenance.intoto.json.asc"),
    ([{"kind": "openpgp", "key": "ABCD", "files": []}],
     "its supply_chain.signatures.0 (openpgp) names no file, not SHA256SUMS.asc and provenance.intoto.json.asc"),
    ([{"kind": "minisign", "key": "ABCD", "files": MINISIGS}, {"kind": "minisign", "key": "EF01", "files": MINISIGS}],
     "its supply_chain.signatures.1 is a second minisign record (unibake signs with one key of each kind)"),
])
def test_a_signature_record_naming_other_files_than_its_kind_s_is_refused_by_both(cli, whole, records, says):
    # each file there (a release's own: manifest.json, the SBOM; or written here): they all passed both
    for name in ("SHA256SUMS.asc", "provenance.intoto.json.asc", *MINISIGS):
        (whole / name).write_text("a signature\n")
    record_change(whole, lambda r: r.update(signatures=records))
    assert_same(cli, whole, passes=False, python_says=f"manifest.json: signature check failed: {says}", shell_says=says)


# --- the provenance's own signature, with --key ---------------------------------------------------


def resummed_and_signed(folder, sign) -> None:
    """SHA256SUMS made anew over the folder (its own signatures aside) and signed again by the key holder."""
    lines = [f"{sha(p.read_bytes())}  {p.name}\n" for p in sorted(folder.iterdir())
             if p.name not in ("SHA256SUMS", "SHA256SUMS.asc", "SHA256SUMS.minisig")]
    (folder / "SHA256SUMS").write_text("".join(lines))
    sign(folder / "SHA256SUMS")


def with_key(cli, folder, key) -> tuple[int, int, str, str]:
    python = cli("verify", str(folder), "--key", str(key))
    script = subprocess.run(["sh", str(SCRIPT), str(folder), "--no-load", "--key", str(key)], capture_output=True,
                            text=True, timeout=300)
    return python.code, script.returncode, python.err, script.stderr


def minisigned(secret, path, comment: str) -> None:
    made = subprocess.run(["minisign", "-S", "-s", str(secret), "-m", str(path), "-x", f"{path}.minisig", "-t", comment],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr


@pytest.mark.parametrize("case", ["another file's signature", "another release's comment"])
def test_a_provenance_minisign_signature_not_for_it_fails_both_with_key(cli, engines, tmp_path, minisign_key, case):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    assert with_key(cli, folder, public)[:2] == (0, 0)
    if case == "another file's signature":  # the key's good signature, of something else
        other = tmp_path / "other"
        other.write_text("another provenance\n")
        minisigned(secret, other, "demo 1.0 provenance.intoto.json")
        shutil.copy(f"{other}.minisig", folder / "provenance.intoto.json.minisig")
        says = "is not a good signature of provenance.intoto.json"
    else:
        minisigned(secret, folder / "provenance.intoto.json", "demo 2.0 provenance.intoto.json")
        says = "trusted comment says 'demo 2.0 provenance.intoto.json', but this is 'demo 1.0 provenance.intoto.json'"
    resummed_and_signed(folder, lambda path: minisigned(secret, path, "demo 1.0 SHA256SUMS"))
    python, script, python_err, script_err = with_key(cli, folder, public)
    assert (python, script) == (3, 3), python_err + script_err
    assert "provenance.intoto.json.minisig: signature check failed" in python_err, python_err
    errors = [line for line in script_err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], script_err


def test_a_provenance_openpgp_signature_of_another_file_fails_both_with_key(cli, engines, tmp_path, gpg_home):
    env, public = gpg_home

    def sign(path, out=None):
        made = subprocess.run(["gpg", "--batch", "--yes", "--armor", "--detach-sign", "--local-user=signer@example.invalid",
                               "--output", str(out or f"{path}.asc"), str(path)], capture_output=True, text=True,
                              env={**os.environ, **env})
        assert made.returncode == 0, made.stderr

    folder = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid")["release"].folder
    assert with_key(cli, folder, public)[:2] == (0, 0)
    other = tmp_path / "other"
    other.write_text("another provenance\n")
    sign(other, folder / "provenance.intoto.json.asc")
    resummed_and_signed(folder, sign)
    python, script, python_err, script_err = with_key(cli, folder, public)
    assert (python, script) == (3, 3), python_err + script_err
    assert "provenance.intoto.json.asc: signature check failed" in python_err, python_err
    assert "provenance.intoto.json.asc is not a good signature of provenance.intoto.json" in script_err, script_err


def test_an_archive_in_more_than_a_thousand_parts_passes_both(cli, engines, tmp_path):
    """--split of a big archive into small parts (--split 10MiB of a 20 GiB archive): part-1000 comes after
    part-999, as unibake numbers and records them, not after part-100 as their names sort."""
    folder = release(engines, tmp_path / "release", split=6)["release"].folder
    assert (folder / "demo-1.0.tar.zst.part-1000").is_file()
    python = cli("verify", str(folder))
    assert python.code == 0, python.err
    # one shell: a part costs the shell verifier a few processes in each of its five reads (10,000
    # processes: 40 s of CPU, 100 s and more on a loaded 2-core machine, where 300 s was not always enough)
    run = shell(folder, timeout=1200)
    assert run.returncode == 0, run.stderr[-2000:]


def test_an_sbom_holding_a_number_of_4300_digits_passes_both(cli, whole):
    """The longest whole number both read (Python's int() reads no longer one): a key unibake does not read."""
    rewrite(whole, "sbom.cdx.json", lambda d: None, text=lambda d: json.dumps(d, indent=2, sort_keys=True).replace(
        '{\n  "', '{\n  "x": 1' + "0" * 4299 + ',\n  "', 1) + "\n")
    assert_same(cli, whole, passes=True)


def test_an_sbom_swapped_after_its_sums_check_is_not_parsed_unchecked(whole, monkeypatch):
    """build.py verify reads the SBOM once: the bytes hashed against SHA256SUMS are the bytes parsed.
    Before, the sums check hashed the file and the supply-chain check read it again, so a valid SBOM
    swapped in between (here by a hook on the sums check's read) passed, never checked."""
    from unibake import verify

    sbom = whole / "sbom.cdx.json"
    document = json.loads(sbom.read_text())
    document["components"] = [{"type": "library", "name": "planted", "version": "6.6.6"}]
    forged = json.dumps(document, indent=2, sort_keys=True) + "\n"
    hashed = verify._sha256_of

    def swapped_after(path, *rest):
        digest = hashed(path, *rest)
        if path.name == sbom.name:
            sbom.write_text(forged)  # after the sums check's read, before any other
        return digest

    monkeypatch.setattr(verify, "_sha256_of", swapped_after)
    report = verify.verify_folder(whole)
    assert sbom.read_text() == forged
    failed = [c for c in report.failures if c.target == sbom.name]
    # (its size, compared with the record since, differs too: the bytes parsed are still the ones checked)
    assert any("changed after its sha256 was checked" in c.detail for c in failed), report.checks


def test_a_profile_released_without_its_smoke_gate_is_warned_of_by_both(cli, folder):
    """A profile whose gate was skipped (smoke.skip, recorded in manifest.json): both verifiers pass the
    folder and each warns of it in the same words (before, the shell verifier said nothing of it)."""
    def skipped(text: bytes) -> bytes:
        manifest = json.loads(text)
        for name in sorted(manifest["profiles"])[::-1]:
            manifest["profiles"][name]["smoke"]["skip"] = f'needs "4" nodes \\ RDMA ({name})'
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, skipped)
    names = sorted(json.loads((folder / "manifest.json").read_text())["profiles"])
    assert_same(cli, folder, passes=True)
    python, shells, python_err, shell_err = verdicts(cli, folder)
    warnings = [f'warning: profile {n} was released without its smoke gate (smoke.skip: needs "4" nodes \\ RDMA ({n}))'
                for n in names]
    for warning in warnings:
        assert warning in python_err, python_err
    for run in (shell(folder, sh) for sh in SHELLS):
        assert [line for line in run.stderr.splitlines() if line.startswith("warning: profile")] == warnings, run.stderr


def test_a_skip_reason_not_in_ascii_is_warned_of_in_the_same_words_by_both(cli, folder):
    """json.dumps writes a reason's "é" as "\\u00e9": the shell verifier showed that escape as written
    ("n\\u00e9cessite"), build.py verify the text. The words are the same but for a bidi override."""
    reason = "n\u00e9cessite 4 n\u0153uds \U0001f600 (\u202eRDMA)"

    def skipped(text: bytes) -> bytes:
        manifest = json.loads(text)
        first_profile(manifest)["smoke"]["skip"] = reason
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, skipped)
    name = sorted(json.loads((folder / "manifest.json").read_text())["profiles"])[0]
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    warning = f"warning: profile {name} was released without its smoke gate (smoke.skip: {reason})"
    # the bidi override, which would show the text after it reversed, as its escape (the shell's as '?')
    assert warning.replace("\u202e", "\\u202e") in python_err.splitlines(), python_err
    for run in (shell(folder, sh) for sh in SHELLS):
        assert warning.replace("\u202e", "?") in run.stderr.splitlines(), run.stderr


def test_a_release_whose_gates_all_ran_gets_no_skip_warning_from_either(cli, folder):
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    assert "smoke gate" not in python_err and "smoke gate" not in shell_err, python_err + shell_err


# --- a manifest that breaks its schema elsewhere than in the values the shell verifier reads --------


def schema_change(change):
    def changed(text: bytes) -> bytes:
        manifest = json.loads(text)
        change(manifest)
        return json.dumps(manifest, indent=2).encode() + b"\n"
    return changed


def first_profile(manifest) -> dict:
    return manifest["profiles"][sorted(manifest["profiles"])[0]]


def renamed_profile(manifest, name: str) -> None:
    manifest["profiles"][name] = manifest["profiles"].pop(sorted(manifest["profiles"])[0])


def pushed(**change) -> dict:
    """A push's record (``build.py push``), changed."""
    digest = "sha256:" + "a" * 64
    return {"reference": f"localhost:5000/team/demo-llm@{digest}", "repository": "localhost:5000/team/demo-llm",
            "tag": "1.0", "digest": digest, "media_type": "application/vnd.oci.image.manifest.v1+json",
            "layers": "gzip", "pushed": "2026-12-05T12:00:00Z", "index": "", **change}


SCHEMA_CASES = [
    ("a negative image size", lambda m: m.update(image_size=-1), "image_size"),
    ("an unknown top-level key", lambda m: m.update(extra="x"), "extra"),
    ("an unknown key in a profile", lambda m: first_profile(m)["topology"].update(x=1), "topology.x"),
    ("a required key missing", lambda m: m.pop("revision"), "revision"),
    ("a nested required key missing", lambda m: first_profile(m)["smoke"].pop("timeout"), "smoke.timeout"),
    ("a size that is a string", lambda m: m["archive"]["files"][0].update(bytes=str(m["archive"]["files"][0]["bytes"])),
     "archive.files.0.bytes"),
    ("a size that is a boolean", lambda m: m.update(image_size=True), "image_size"),
    ("a negative uncompressed size", lambda m: m["archive"].update(uncompressed_bytes=-5),
     "archive.uncompressed_bytes"),
    ("a compression level over 19", lambda m: m["archive"]["compression"].update(level=20),
     "archive.compression.level"),
    ("a size past an engine's int64", lambda m: m.update(image_size=2 ** 63), "image_size"),
    ("a size of 41 digits", lambda m: m.update(image_size=10 ** 40), "image_size"),
    ("a time past 9999", lambda m: m.update(source_date_epoch=253402300800), "source_date_epoch"),
    ("a value it may not take", lambda m: m.update(save_layout="tarball"), "save_layout"),
    ("a vendor it does not know", lambda m: first_profile(m).update(vendor="intel"), "vendor"),
    ("a hotfix record that is empty", lambda m: m.update(hotfix={}), "hotfix"),
    ("labels that are a list", lambda m: m.update(labels=[]), "labels"),
    ("a control character in the version", lambda m: m.update(version="1.0\n"), "version"),
    ("a version too long", lambda m: m.update(version="\u00e9" * 129), "version"),
    ("a blank smoke.skip", lambda m: first_profile(m)["smoke"].update(skip="   "), "skip"),
    ("an empty smoke.skip", lambda m: first_profile(m)["smoke"].update(skip=""), "skip"),
    ("first published after published", lambda m: m.update(first_published="2999-01-01T00:00:00Z"), "first_published"),
    ("a supply chain record without its SBOM", lambda m: m.update(supply_chain={"provenance": None}), "supply_chain"),
    # the patterns (grep -E in the shell: its awk may read no {m,n})
    ("a product not a name", lambda m: m.update(product="Demo LLM"), "product"),
    ("a published time in another form", lambda m: m.update(published="2026-12-02 16:19:09", first_published=None),
     "published"),
    ("a diffID that is no digest", lambda m: m["diff_ids"].insert(0, "sha256:xyz"), "diff_ids.0"),
    ("a component digest in upper case", lambda m: m["components"][0].update(digest="A" * 64), "components.0.digest"),
    ("a previous release that is a path", lambda m: m.update(previous="../1.0"), "previous"),
    ("a device outside /dev", lambda m: first_profile(m)["devices"].update(extra=["/dev/../etc/shadow"]),
     "devices.extra.0"),
    ("an external artifact named by a path up", lambda m: m.update(external=[
        {"name": "w/../../x", "bytes": 1, "sha256": "0" * 64}]), "external.0.name"),
    ("a release with a slash", lambda m: m.update(release="1.0/x"), "release"),
    # what the models check in code, as the shell checks it too
    ("an env name that is no variable", lambda m: first_profile(m)["env"].update({"1BAD": "x"}), "1BAD"),
    ("an env value too long", lambda m: first_profile(m)["env"].update(LONGVALUE="x" * 4097), "LONGVALUE"),
    ("a mount path that is relative", lambda m: m["launch"]["mounts"].update(models="relative/path"), "relative/path"),
    ("a mount name that is no name", lambda m: m["launch"]["mounts"].update({"Models!": "/models"}), "Models!"),
    # a profile's name as the image's metadata takes it (before, both passed these; the shell's skip warning
    # read no name holding a quote or a slash)
    ("a profile name with a quote", lambda m: renamed_profile(m, 'tp"1'), "tp"),
    ("a profile name with a slash", lambda m: renamed_profile(m, "tp/1"), "tp/1"),
    ("a profile name in upper case", lambda m: renamed_profile(m, "TP1"), "TP1"),
    ("a profile name with a leading dash", lambda m: renamed_profile(m, "-tp1"), "-tp1"),
    ("a profile name not ascii", lambda m: renamed_profile(m, "tp\u00e91"), "tp"),
    # a push's record (before: only its length was checked; `pull` and the notes' pull line use its reference)
    ("tune caches past any count", lambda m: first_profile(m).update(tune_caches=2 ** 40), "tune_caches"),
    ("a pushed repository that is no registry's", lambda m: m.update(registry=[pushed(
        repository="Registry Host/x", reference="Registry Host/x@sha256:" + "a" * 64)]), "registry.0.reference"),
    ("a pull reference of another repository", lambda m: m.update(registry=[pushed(
        reference="evil.example/team/demo-llm@sha256:" + "a" * 64)]), "registry.0"),
    ("a pull reference of another digest", lambda m: m.update(registry=[pushed(
        reference="localhost:5000/team/demo-llm@sha256:" + "b" * 64)]), "registry.0"),
    ("a pull reference by tag", lambda m: m.update(registry=[pushed(reference="localhost:5000/team/demo-llm:1.0")]),
     "registry.0.reference"),
]


@pytest.mark.parametrize("change, where", [pytest.param(c, w, id=i) for i, c, w in SCHEMA_CASES])
def test_a_manifest_that_breaks_its_schema_is_refused_by_both(cli, folder, change, where):
    """Re-summed: before, the shell verifier checked only the values it reads, and passed these."""
    edit_manifest(folder, schema_change(change))
    assert_same(cli, folder, passes=False, python_says=f"{where}", shell_says="not a valid release manifest")
    assert where in verdicts(cli, folder)[3]


@pytest.mark.parametrize("change", [
    pytest.param(lambda m: m["labels"].update(x="a\nb\u0007"), id="a control character in a label"),
    pytest.param(lambda m: m.update(version="\U0001f600" * 128), id="128 characters written as 256 escapes"),
    pytest.param(lambda m: m.update(image_size=2 ** 63 - 1), id="the most a size can be"),
    pytest.param(lambda m: m.update(first_published="2000-01-01T00:00:00Z"), id="first published before published"),
    pytest.param(lambda m: first_profile(m)["smoke"].update(skip=" why "), id="a smoke.skip with blanks around it"),
    pytest.param(lambda m: first_profile(m)["devices"].update(extra=["/dev/.hidden/x..y"], groups=["video", "44"]),
                 id="a device whose names start with a dot"),
    pytest.param(lambda m: m.update(external=[{"name": "w/.x/model.bin", "bytes": 1, "sha256": "0" * 64}]),
                 id="an external artifact in a dot folder"),
    pytest.param(lambda m: m.update(registry=[pushed(), pushed(
        repository="[::1]:5000/a__b/c-d", reference="[::1]:5000/a__b/c-d@sha256:" + "a" * 64, tag="1.0-x")]),
        id="pushes to a named host and to an IPv6 one"),
])
def test_a_manifest_the_schema_takes_passes_both(cli, folder, change):
    edit_manifest(folder, schema_change(change))
    assert_same(cli, folder, passes=True)


def test_the_shell_verifiers_manifest_shape_is_the_schemas():
    """verify-release.sh holds the manifest's shape as text: it is the one the schema gives."""
    from unibake.manifest import shell_shape

    held = SCRIPT.read_text().split("\nmanifest_shape='", 1)[1].split("'\n", 1)[0]
    assert held == shell_shape(), "regenerate the script's manifest_shape from unibake.manifest.shell_shape()"


@pytest.mark.parametrize("skipped", [{"smoke": False}, {"roundtrip": False}])
def test_a_release_made_without_any_gate_is_warned_of_by_both_for_every_profile(engines, tmp_path, cli, skipped):
    """A --no-smoke or --no-roundtrip release (VALIDATION.json's smoke_skipped): both verifiers pass it and
    warn of every profile in the same words (before, the shell verifier said nothing: it read smoke.skip only)."""
    folder = release(engines, tmp_path / "release", **skipped)["release"].folder
    why = "skipped with --no-smoke" if "smoke" in skipped else \
        "they run on the loaded image, and the round trip was skipped"
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    warnings = [f"warning: profile tp1 was released without its smoke gate (no gate ran: {why})"]
    assert [line for line in python_err.splitlines() if line.startswith("warning: profile")] == warnings, python_err
    for run in (shell(folder, sh) for sh in SHELLS):
        assert [line for line in run.stderr.splitlines() if line.startswith("warning: profile")] == warnings, run.stderr


def test_a_validation_json_sha256sums_does_not_list_is_read_by_neither(engines, tmp_path, cli):
    """VALIDATION.json is read for the warning only when SHA256SUMS lists it (a file added beside a release
    is not part of it, not read): build.py verify read it wherever it came from, the shell did not."""
    folder = release(engines, tmp_path / "release", smoke=False)["release"].folder
    sums = folder / "SHA256SUMS"
    sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines()
                            if not line.endswith(" VALIDATION.json")))
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    assert "smoke gate" not in python_err and "smoke gate" not in shell_err, python_err + shell_err


def test_a_skip_reason_with_escapes_and_blanks_is_warned_of_alike_by_both(engines, tmp_path, cli):
    folder = release(engines, tmp_path / "release", smoke=False)["release"].folder
    path = folder / "VALIDATION.json"
    path.write_text(path.read_text().replace('"smoke_skipped": "skipped with --no-smoke"',
                                             '"smoke_skipped": "  a \\"quoted\\"   \\\\ reason  "'))
    resum(folder)
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    warning = 'warning: profile tp1 was released without its smoke gate (no gate ran: a "quoted" \\ reason)'
    assert warning in python_err.splitlines(), python_err
    assert warning in shell_err.splitlines(), shell_err


def test_a_no_gate_reason_with_escapes_python_reads_as_blanks_is_warned_of_alike_by_both(engines, tmp_path, cli):
    folder = release(engines, tmp_path / "release", smoke=False)["release"].folder
    path = folder / "VALIDATION.json"
    escaped = json.dumps("\u2003x\u00a0\u2003y\t\u0001 z\u00e9\u0085" + "w" * 400)
    path.write_text(path.read_text().replace('"smoke_skipped": "skipped with --no-smoke"',
                                             f'"smoke_skipped": {escaped}'))
    resum(folder)
    python, shells, python_err, shell_err = verdicts(cli, folder)
    assert python == 0 and shells == [0] * len(SHELLS), python_err + shell_err
    said = "x y \\x01 z\u00e9 " + "w" * 291  # (U+0085 is a blank to Python)
    warning = f"warning: profile tp1 was released without its smoke gate (no gate ran: {said})"
    assert warning in python_err.splitlines(), python_err
    for run in (shell(folder, sh) for sh in SHELLS):
        assert warning in run.stderr.splitlines(), run.stderr


@pytest.mark.parametrize("content", [
    pytest.param(lambda iid: iid + b"\0\n", id="a NUL byte the shell's $(cat) drops"),
    pytest.param(lambda iid: b"sha256:" + b"ab" * 32 + b"\n" + b"x" * 2000 + b"\n", id="another image over 1 KiB"),
    pytest.param(lambda iid: iid + b"\n" * 1100, id="the image and 1100 newlines"),
    pytest.param(lambda iid: iid + b"\n\xff\n", id="not utf-8"),
])
def test_an_image_id_file_that_names_no_image_as_read_is_refused_by_both(cli, folder, content):
    """IMAGE_ID (what the downloaders' guide compares the loaded image with): build.py verify passed one of
    more than 1 KiB or not UTF-8 unread (naming another image), the shell one whose NUL byte $(cat) drops."""
    image_id = json.loads((folder / "manifest.json").read_text())["image_id"].encode()
    (folder / "IMAGE_ID").write_bytes(content(image_id))
    resum(folder)
    assert_same(cli, folder, passes=False, python_says="IMAGE_ID", shell_says="IMAGE_ID")
    said = cli("verify", str(folder)).error_lines
    assert len(said) == 1 and "IMAGE_ID" in said[0] and len(said[0]) < 600, said


@pytest.mark.parametrize("suffix", [".tzst", ".tar", ".tar.zstd", ".zst"])
def test_an_archive_not_named_name_tar_zst_is_refused_by_both(cli, folder, suffix):
    """The archive renamed (its file, manifest.json and SHA256SUMS made to agree): the shell verifier refused
    it, build.py verify passed it."""
    def renamed(text: bytes) -> bytes:
        manifest = json.loads(text)
        old = manifest["archive"]["name"]
        new = old.removesuffix(".tar.zst") + suffix
        (folder / old).rename(folder / new)
        manifest["archive"]["name"] = manifest["archive"]["files"][0]["name"] = new
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, renamed)
    assert_same(cli, folder, passes=False, python_says="is not named NAME.tar.zst",
                shell_says="no archive name ending in .tar.zst")


def nested_under_zz(depth: int):
    """The document written as unibake writes it, with a last key "zz" holding lists nested so that the
    deepest is ``depth`` levels down (the document itself the first)."""
    def text(document) -> str:
        written = json.dumps(document, indent=2, sort_keys=True)
        lists = depth - 1
        lines = ["  " * (i + 1) + ('"zz": [' if i == 0 else "[") for i in range(lists)] + ["  " * (lists + 1) + "1"]
        lines += ["  " * (i + 1) + "]" for i in reversed(range(lists))]
        assert written.endswith("\n}")
        return written[:-2] + ",\n" + "\n".join(lines) + "\n}\n"
    return text


@pytest.mark.parametrize("depth, passes", [(256, True), (257, False), (1500, False)])
def test_an_sbom_nested_deeper_than_any_release_json_is_refused_by_both(cli, whole, depth, passes):
    """(before: nested 1500 deep, build.py verify refused it, its reader out of stack, "not valid JSON";
    the shell verifier passed it)"""
    rewrite(whole, "sbom.cdx.json", lambda document: None, text=nested_under_zz(depth))
    assert_same(cli, whole, passes=passes, python_says="" if passes else "nested more than 256 levels deep",
                shell_says="" if passes else "nested more than 256 levels deep")


def test_a_folder_given_with_trailing_slashes_is_named_once_slashed_in_the_shells_errors(folder):
    (folder / "IMAGE_ID").write_text("sha256:" + "ab" * 32 + "\n")
    resum(folder)
    for sh in SHELLS:
        run = subprocess.run([sh, str(SCRIPT), f"{folder}//", "--no-load"], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 3, run.stderr
        [error] = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert error.startswith(f"error: {folder}/IMAGE_ID names sha256:abab"), error


# --- the archive's zstd frames -------------------------------------------------------------------


def skippable(data: bytes) -> bytes:
    return (0x184D2A50).to_bytes(4, "little") + len(data).to_bytes(4, "little") + data


def reframed(folder, frames) -> None:
    """The archive's tar compressed again as ``frames(compress, tar)`` makes it, everything re-summed."""
    from ..forge import forge, read_entries, write_tar
    import zstandard

    tar = write_tar(read_entries(folder))
    data = frames(zstandard.ZstdCompressor(write_checksum=True).compress, tar)
    forge(folder, compressed=(data, len(tar), hashlib.sha256(tar).hexdigest()))


@pytest.mark.parametrize("frames", [
    pytest.param(lambda z, tar: z(tar) + z(b"more")[:7], id="a frame cut after its header"),
    pytest.param(lambda z, tar: z(tar) + z(b"")[:4], id="a magic number alone"),
    pytest.param(lambda z, tar: z(tar)[:-1], id="the checksum cut"),
    pytest.param(lambda z, tar: z(tar) + skippable(b"padding")[:-1], id="a skippable frame cut"),
])
def test_an_archive_ending_inside_a_zstd_frame_is_refused_by_both(cli, folder, frames):
    """zstandard's reader took a stream ending inside a frame (its rest cut off, or a frame's first bytes
    after the last whole one) as ended, where the zstd tool (the shell verifier, the guide's zstd -dc)
    refuses it as truncated: build.py verify passed such a folder, re-summed."""
    reframed(folder, frames)
    assert_same(cli, folder, passes=False, python_says="ends inside a zstd frame",
                shell_says="does not decompress")


@pytest.mark.parametrize("frames", [
    pytest.param(lambda z, tar: skippable(b"x" * 9) + z(tar[:4000]) + z(tar[4000:]) + z(b"") + skippable(b""),
                 id="skippable frames, an empty one, the tar in two"),
])
def test_an_archive_of_whole_zstd_frames_passes_both(cli, folder, frames):
    reframed(folder, frames)
    assert_same(cli, folder, passes=True)


@pytest.mark.parametrize("frames", [
    pytest.param(lambda z, tar: __import__("gzip").compress(tar, mtime=0), id="gzip"),
    pytest.param(lambda z, tar: __import__("lzma").compress(tar), id="xz"),
])
def test_an_archive_that_is_another_format_s_stream_is_refused_by_both(cli, folder, frames):
    """The zstd tool decodes gzip, xz, lzma and lz4 streams too: the shell verifier passed a .tar.zst that is a
    .tar.gz (re-summed), said "zstd ... ok", where build.py verify refuses it."""
    reframed(folder, frames)
    assert_same(cli, folder, passes=False, python_says="Unknown frame descriptor", shell_says="not a zstd stream")


@pytest.mark.parametrize("frames", [
    pytest.param(lambda z, tar: z(tar[:4000]) + __import__("gzip").compress(tar[4000:], mtime=0), id="the rest gzip"),
    pytest.param(lambda z, tar: z(tar) + __import__("gzip").compress(b"", mtime=0), id="an empty gzip after"),
])
def test_another_format_s_stream_after_the_first_zstd_frame_is_refused_by_both(cli, folder, frames):
    """The zstd tool decodes a gzip stream after zstd frames too: the shell verifier passed such an archive
    (re-summed), where build.py verify refuses it."""
    reframed(folder, frames)
    assert_same(cli, folder, passes=False, shell_says="holds something other than zstd frames after its first")


def test_a_validation_json_past_16_mib_is_refused_by_both(cli, folder):
    """A VALIDATION.json saying no gate ran, padded past the 16 MiB both read, re-summed: the shell verifier
    refused it, build.py verify passed the folder without reading it (its skipped-gate warning unsaid)."""
    path = folder / "VALIDATION.json"
    text = path.read_text().replace('  "smoke_skipped": null,', '  "smoke_skipped": "skipped with --no-smoke",\n'
                                    f'  "padding": "{"x" * (16 << 20)}",')
    assert '"padding"' in text
    path.write_text(text)
    resum(folder)
    assert_same(cli, folder, passes=False, python_says="VALIDATION.json: size check failed",
                shell_says="VALIDATION.json: more than 16777216 bytes")


def test_an_archive_of_thousands_of_empty_blobs_is_refused_by_both_in_seconds(cli, folder):
    """Each entry cost the shell verifier's header walk a few processes before its check of blobs nothing
    refers to: 5000 empty blobs (a 200 KB archive) kept it busy for half a minute, a million for hours."""
    from ..forge import forge, member

    forge(folder, lambda entries: entries + [member(f"blobs/sha256/{os.urandom(32).hex()}", b"") for _ in range(5000)])
    assert cli("verify", str(folder)).code == 3
    for sh in SHELLS:
        run = shell(folder, sh, timeout=20)
        assert run.returncode == 3 and "which nothing refers to" in run.stderr.splitlines()[-1], run.stderr


@pytest.mark.parametrize("text", [
    pytest.param("1.3.1\ud800", id="a high half alone"),
    pytest.param("\udc00 1.3.1", id="a low half alone"),
    pytest.param("\ude00\ud83d", id="the halves reversed"),
    pytest.param("\ud83d\\ude00", id="a high half, then an escaped backslash"),
])
def test_a_manifest_holding_half_a_character_is_refused_by_both(cli, folder, text):
    """json.dumps writes a str holding a lone surrogate as a \\ud800 escape; no character is that, and
    build.py verify's schema reader refuses it as invalid JSON: the shell verifier passed it."""
    def labelled(data: bytes) -> bytes:
        manifest = json.loads(data)
        manifest["labels"]["org.opencontainers.image.version"] = text
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, labelled)
    assert_same(cli, folder, passes=False, python_says="not a valid release manifest", shell_says="half of a character")
