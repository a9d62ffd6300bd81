"""`build.py archive IMAGE` of an image someone else made: its config, labels and layers are outside input
(found by probing: each test says what happened before)."""

from __future__ import annotations

import json

import pytest

import unibake.pipeline as pipeline
from unibake.contents import _os_release
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL

from ..fake_engine import FakeEngine
from ..savefixtures import DEFAULT_LAYERS, layer_tar


def meta(**over) -> str:
    doc = {"product": "demo", "version": "1", "tag": "demo:1", "default_profile": "tp1", "components": [],
           "launch": {"port": 8000, "model_name": "demo", "mounts": {}},
           "profiles": {"tp1": {"gpus": 1, "vendor": "nvidia", "kernels": [], "tune_caches": 0, "sidecars": [],
                                "args": [], "smoke": {"prompts": [], "timeout": 5, "skip": "no gpu"}}}}
    doc.update(over)
    return json.dumps(doc)


def engines_with(labels=None, layers=None, tag="demo:1.0", config_extra=None):
    source = FakeEngine(address="fake://source")
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels or {}},
              "history": [{"created_by": "x"}] * len(layers or DEFAULT_LAYERS)}
    config.update(config_extra or {})
    source.add(config, layers or DEFAULT_LAYERS, tag=tag)
    return {None: source, "tcp://verify.invalid:2375": FakeEngine(address="tcp://verify.invalid:2375")}


@pytest.fixture
def archive(monkeypatch, tmp_path, cli):
    def run(engines, *extra, image="demo:1.0"):
        monkeypatch.setattr(pipeline, "docker_engines", lambda request: engines.__getitem__)
        out = tmp_path / "release"
        verify = () if "--no-roundtrip" in extra else ("--verify-engine", "tcp://verify.invalid:2375")
        return cli("archive", image, "--out", str(out), *verify, *extra, cwd=tmp_path), out
    return run


def sbom_of(out) -> dict:
    return json.loads((out / "1.0" / "sbom.cdx.json").read_text())


def test_a_long_os_release_line_is_passed_over_not_split_for_minutes():
    # shlex.split of a 1 MiB PRETTY_NAME took 15 s of the archive stage, 4 MiB two minutes (its time grows with the
    # square of the line); a real line is under 200 bytes
    found = _os_release(b'ID="rhel"\nVERSION_ID="9.4"\nPRETTY_NAME="' + b"a'" * (1 << 20) + b'"\n')
    assert (found.id, found.version_id, found.pretty_name) == ("rhel", "9.4", "")


def test_a_package_listed_thousands_of_times_is_numbered_once_each(archive):
    # each repeat counted its number up from #2 again: 32,000 copies of one dpkg stanza took 79 s
    status = b"Package: a\nVersion: 1\nArchitecture: amd64\n\n" * 3000
    result, out = archive(engines_with({}, layers=[layer_tar({"var/lib/dpkg/status": status}), DEFAULT_LAYERS[0]]),
                          "--no-roundtrip")
    assert result.code == 0, result.err
    refs = [c["bom-ref"] for c in sbom_of(out)["components"] if c.get("name") == "a"]
    assert sorted(refs) == sorted(["deb:a:amd64"] + [f"deb:a:amd64#{n}" for n in range(2, 3001)])


def test_packages_past_the_sboms_bound_are_counted_not_listed(archive, monkeypatch):
    # a dpkg status of a few MB names hundreds of thousands of packages: 40,000 took cyclonedx 50 s and 1 GB
    from unibake import sbom

    monkeypatch.setattr(sbom, "MAX_PACKAGES", 50)  # (the bound's value: the test lists 60, not 20,060)
    status = b"".join(b"Package: p%d\nVersion: 1\nArchitecture: amd64\n\n" % n for n in range(60))
    result, out = archive(engines_with({}, layers=[layer_tar({"var/lib/dpkg/status": status}), DEFAULT_LAYERS[0]]),
                          "--no-roundtrip")
    assert result.code == 0, result.err
    document = sbom_of(out)
    assert len([c for c in document["components"] if c.get("purl", "").startswith("pkg:deb/")]) == 50
    said = [p["value"] for p in document["metadata"]["component"]["properties"] if p["name"] == "unibake:not-listed"]
    assert said == ["10 packages: the image lists 60, more than the 50 an SBOM of unibake's lists"]


@pytest.mark.parametrize("path", ["opt/conda/conda-meta/ -1.0-b.json", "usr/lib/python3/site-packages/ -1.0-py3.11.egg"])
def test_a_package_whose_name_is_blank_is_left_out_and_said_not_a_traceback(archive, path):
    # a name taken from a file name, " ": packageurl made it None, a TypeError traceback (exit 1)
    result, out = archive(engines_with({}, layers=[layer_tar({path: b"{}"}), DEFAULT_LAYERS[0]]), "--no-roundtrip")
    assert result.code == 0 and "Traceback" not in result.err, result.err
    said = [p["value"] for p in sbom_of(out)["metadata"]["component"]["properties"] if p["name"] == "unibake:not-listed"]
    assert said == [f"/{path} lists a package without a name; left out"], said


def test_a_components_profile_in_the_image_metadata_is_text_in_the_notes_not_markup(archive):
    # the Components table wrote it as it was: an image, a link and two more table cells in RELEASE_NOTES.md
    component = {"kind": "engine", "name": "e", "version": "1", "digest": "a" * 64,
                 "profile": "<img src=//evil.example/x>[fix](https://e.x)|x|"}
    result, out = archive(engines_with({METADATA_LABEL: meta(components=[component]), PROFILES_LABEL: "tp1"}))
    assert result.code == 0, result.err
    row = next(line for line in (out / "1.0" / "RELEASE_NOTES.md").read_text().splitlines() if "evil" in line)
    assert "<img" not in row and "\\[fix\\](https" in row and row.count(" | ") == 4, row


def test_a_smoke_skip_reason_from_the_image_reaches_the_summary_escaped(archive):
    # the summary printed it as it was: a bidi override, a C1 CSI and a line separator reached the terminal
    document = json.loads(meta())
    document["profiles"]["tp1"]["smoke"]["skip"] = "ok \u202egnp.exe\u202c \x9b2J \u2028X"
    result, _ = archive(engines_with({METADATA_LABEL: json.dumps(document), PROFILES_LABEL: "tp1"}))
    assert result.code == 0, result.err
    assert not any(c in result.err for c in "\u202e\u202c\x9b\u2028"), repr(result.err[-600:])
    assert "ok \\u202egnp.exe\\u202c \\x9b2J \\u2028X" in result.err


def test_a_repository_name_that_is_no_product_name_is_bad_input_before_any_work(archive):
    # it failed the manifest's schema at publish, exit 3, after the export, the read-back and the SBOM
    name = "a" * 70
    result, out = archive(engines_with({}, tag=f"{name}:1.0"), "--no-roundtrip", image=f"{name}:1.0")
    assert result.code == 2 and result.error_lines == [
        f"error: the image's repository name gives the product name '{name}', which is not one (lower-case letters, "
        "digits, '.', '_' and '-', at most 64): give --product NAME"], result.err
    assert "==> archive" not in result.err


@pytest.mark.parametrize("arch", ["AMD64", "x86-64", "amd64 "])
def test_an_image_platform_no_release_can_record_is_named_before_any_work(archive, arch):
    # it failed the manifest's schema at publish, exit 3, after all the work, without the config's value
    result, _ = archive(engines_with({}, config_extra={"architecture": arch}), "--no-roundtrip")
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert f"(its config's architecture {arch!r}, os 'linux'): not one a release can record" in result.error_lines[0]
    assert "==> archive" not in result.err
