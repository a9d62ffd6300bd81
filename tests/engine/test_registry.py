"""Push and pull by digest through a real registry (the distribution registry 2.8, TLS, htpasswd)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import zstandard

from unibake.amend import MARKER
from unibake.scratch import ScratchEngine

from ..conftest import REPO
from ..registry_lab import USER, bridge, registry
from .conftest import build_dockerfile
from .test_downloader import code_lines


@pytest.fixture(scope="module")
def reg():
    with registry() as running:
        yield running


def make_release(cli, image: str, out: Path, tag: str) -> Path:
    result = cli("archive", image, "--tag", tag, "--out", str(out), "--no-roundtrip")
    assert result.code == 0, result.err
    return out / tag


def registry_args(reg) -> list[str]:
    return ["--auth-file", str(reg.auth_file), "--ca-file", str(reg.ca)]


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_push_records_the_digest_and_a_fresh_engine_pulls_the_same_image(cli, engine, reg, tmp_path):
    folder = make_release(cli, "localhost/unibake-busybox:1", tmp_path / "release", "bb-1")
    before = json.loads((folder / "manifest.json").read_text())
    repo = f"{reg.host}/unibake-test/bb"

    pushed = cli("--json", "push", str(folder), "--to", repo, *registry_args(reg))
    assert pushed.code == 0, pushed.err
    doc = json.loads(pushed.out)
    manifest = json.loads((folder / "manifest.json").read_text())
    [record] = manifest["registry"]
    assert record["reference"] == f"{repo}@{doc['digest']}" and record["tag"] == "bb-1" and record["layers"] == "gzip"
    assert {k: v for k, v in manifest.items() if k != "registry"} == {k: v for k, v in before.items() if k != "registry"}
    # the registry holds exactly that manifest, naming the release's image ID as its config
    body = requests.get(f"https://{reg.host}/v2/unibake-test/bb/manifests/{record['digest']}",
                        auth=(USER, reg.password), verify=str(reg.ca),
                        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).content
    assert "sha256:" + hashlib.sha256(body).hexdigest() == record["digest"]
    assert json.loads(body)["config"]["digest"] == manifest["image_id"]
    # the folder is still a release that verifies, with the pull line in its notes and sums
    for name in ("RELEASE_NOTES.md", "README-DIST.md"):
        assert f"docker pull {record['reference']}" in (folder / name).read_text()
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=folder).returncode == 0
    assert (tmp_path / "checksums" / "bb-1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()
    assert cli("verify", str(folder)).code == 0
    # no credential anywhere: files, output, the JSON document
    everything = pushed.out + pushed.err + "".join(b.decode("utf-8", "replace") for b in files_of(folder).values())
    assert reg.password not in everything

    # a second push uploads nothing and changes nothing
    snapshot = files_of(folder)
    again = cli("--json", "push", str(folder), "--to", repo, *registry_args(reg))
    assert again.code == 0, again.err
    assert json.loads(again.out)["uploaded"] == 0 and json.loads(again.out)["digest"] == record["digest"]
    assert files_of(folder) == snapshot

    # an engine that never saw the image pulls it by digest; same image ID
    # each scratch engine in a base folder of its own: a new one sweeps its folder of this process's others
    with ScratchEngine(tmp_path / "scratch-1") as scratch, bridge(reg, scratch.pid):
        assert scratch.engine.inspect_image(manifest["image_id"]) is None
        pulled = cli("pull", record["reference"], "--engine", scratch.engine.address, "--out", str(tmp_path / "release"),
                     *registry_args(reg))
        assert pulled.code == 0, pulled.err
        got = scratch.engine.inspect_image(record["reference"])
        assert got.id == manifest["image_id"]
        assert scratch.engine.inspect_image(manifest["tag"]).id == manifest["image_id"]

        # the downloader's guides, as written: docker pull by digest, the ID check, the tag
        with ScratchEngine(tmp_path / "scratch-2") as guided, bridge(reg, guided.pid):
            for markdown, marker in ((folder / "README-DIST.md").read_text().split(MARKER)[1], ""), \
                                    ((REPO / "README-DIST.md").read_text(), "# from a registry"):
                lines = [line for line in code_lines(markdown, ()) if marker in line]
                script = "set -e\n" + "".join(line + "\n" for line in lines)
                done = subprocess.run(["sh", "-c", script], cwd=folder, capture_output=True, text=True,
                                      env={**os.environ, "DOCKER_HOST": guided.engine.address,
                                           "DOCKER_CONFIG": str(reg.auth_file.parent),
                                           "REF": record["reference"], "TAG": manifest["tag"]})
                assert done.returncode == 0 and "image ID ok" in done.stdout, done.stderr
                assert any(line.startswith("docker pull") for line in lines)
            assert guided.engine.inspect_image(manifest["tag"]).id == manifest["image_id"]

        # deploy from the registry: the same engine is skipped, a fresh one pulls
        with ScratchEngine(tmp_path / "scratch-3") as other, bridge(reg, other.pid):
            deployed = cli("--json", "deploy", str(folder), "--from", "registry", "--engine", scratch.engine.address,
                           "--engine", other.engine.address, *registry_args(reg))
            assert deployed.code == 0, deployed.err
            rows = {r["engine"]: r["result"] for r in json.loads(deployed.out)["engines"]}
            assert rows == {scratch.engine.address: "skipped", other.engine.address: "pulled"}
            assert other.engine.inspect_image(manifest["tag"]).id == manifest["image_id"]


def test_zstd_layers_are_pushed_as_oci_tar_zstd_and_engine_20_10_is_told_it_cannot_pull_them(cli, engine, reg,
                                                                                          tmp_path):
    folder = make_release(cli, "localhost/unibake-busybox:1", tmp_path / "release", "bb-z")
    pushed = cli("--json", "push", str(folder), "--to", f"{reg.host}/unibake-test/bbz", "--compression", "zstd",
                 *registry_args(reg))
    assert pushed.code == 0, pushed.err
    digest = json.loads(pushed.out)["digest"]
    manifest = json.loads((folder / "manifest.json").read_text())
    session = requests.Session()
    session.auth = (USER, reg.password)
    base = f"https://{reg.host}/v2/unibake-test/bbz"
    document = session.get(f"{base}/manifests/{digest}", verify=str(reg.ca),
                           headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
    [layer] = document["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"
    blob = session.get(f"{base}/blobs/{layer['digest']}", verify=str(reg.ca)).content
    tar = zstandard.ZstdDecompressor().stream_reader(blob).read()
    assert "sha256:" + hashlib.sha256(tar).hexdigest() == manifest["diff_ids"][0]
    assert manifest["registry"][0]["layers"] == "zstd"

    refused = cli("pull", f"{reg.host}/unibake-test/bbz@{digest}", "--release", str(folder), *registry_args(reg))
    assert refused.code == 1
    assert "cannot pull zstd layers" in refused.error_lines[-1] and "--compression gzip" in refused.error_lines[-1]



def test_a_signed_release_is_recorded_only_when_signed_again_by_its_own_keys(cli, engine, reg, tmp_path, gpg_home,
                                                                             minisign_key):
    env, public = gpg_home
    secret, minisign_public = minisign_key
    env = {"CI": "true", **env}
    made = cli("archive", "localhost/unibake-busybox:1", "--tag", "bb-signed", "--out", str(tmp_path / "release"),
               "--no-roundtrip", "--sign", "signer@example.invalid", "--sign-minisign", str(secret), env=env)
    assert made.code == 0, made.err
    folder = tmp_path / "release" / "bb-signed"
    repo = f"{reg.host}/unibake-test/bbsigned"
    signed = files_of(folder)

    # without the keys: pushed, not recorded (the folder stays exactly as it was signed)
    unrecorded = cli("--json", "push", str(folder), "--to", repo, *registry_args(reg), env=env)
    assert unrecorded.code == 0, unrecorded.err
    assert "is signed" in unrecorded.err and "--sign" in unrecorded.err
    assert json.loads(unrecorded.out)["recorded"] is False and files_of(folder) == signed
    # the push's warning says to pull it by that reference: pull checks it against a push of the
    # archive (the release records no digest), and an engine that never saw the image gets it
    with ScratchEngine(tmp_path / "scratch-u") as scratch, bridge(reg, scratch.pid):
        pulled = cli("pull", json.loads(unrecorded.out)["reference"], "--release", str(folder),
                     "--engine", scratch.engine.address, *registry_args(reg), env=env)
        assert pulled.code == 0, pulled.err
        assert scratch.engine.inspect_image(json.loads(unrecorded.out)["reference"]).id == \
            json.loads((folder / "manifest.json").read_text())["image_id"]
        # deploy --ref takes the same push, checked the same way (it refused every push it did not record)
        deployed = cli("deploy", str(folder), "--from", "registry", "--ref", json.loads(unrecorded.out)["reference"],
                       "--engine", scratch.engine.address, *registry_args(reg), env=env)
        assert deployed.code == 0, deployed.err

    # one of its two keys, or another key: refused before anything is uploaded or changed
    made = subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Other <other@example.invalid>",
                           "ed25519", "sign", "never"], env={**os.environ, **env}, capture_output=True)
    assert made.returncode == 0, made.stderr
    for keys, says in (([], "give --sign-minisign too"),
                       (["--sign-minisign", str(secret)], "that is the openpgp key")):
        args = ["--sign", "other@example.invalid" if keys else "signer@example.invalid", *keys]
        refused = cli("push", str(folder), "--to", repo, *registry_args(reg), *args, env=env)
        assert refused.code == 2 and says in refused.error_lines[-1], refused.err
        assert files_of(folder) == signed

    # with both of its keys: recorded, and SHA256SUMS signed again: every verifier accepts the folder
    recorded = cli("--json", "push", str(folder), "--to", repo, *registry_args(reg), "--sign", "signer@example.invalid",
                   "--sign-minisign", str(secret), env=env)
    assert recorded.code == 0, recorded.err
    doc = json.loads(recorded.out)
    assert doc["recorded"] is True and doc["signed_again"] is True and doc["uploaded"] == 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["registry"][0]["digest"] == doc["digest"]
    assert (folder / "SHA256SUMS.asc").read_bytes() != signed["SHA256SUMS.asc"]
    assert subprocess.run(["gpg", "--verify", "SHA256SUMS.asc", "SHA256SUMS"], cwd=folder, capture_output=True,
                          env={**os.environ, **env}).returncode == 0
    assert subprocess.run(["minisign", "-Vm", "SHA256SUMS", "-p", str(minisign_public)], cwd=folder,
                          capture_output=True).returncode == 0
    for key in (public, minisign_public):
        assert cli("verify", str(folder), "--key", str(key), env=env).code == 0
    assert (tmp_path / "checksums" / "bb-signed.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()
    assert not [p.name for p in (tmp_path / "release").iterdir() if p.name.endswith(".amend")]  # no staging left

def test_bad_credentials_are_exit_1_and_never_shown(cli, reg, tmp_path):
    folder = make_release(cli, "localhost/unibake-busybox:1", tmp_path / "release", "bb-auth")
    wrong = reg.write_auth(tmp_path / "wrong" / "config.json", "not-the-password-" + reg.password[:6])
    result = cli("push", str(folder), "--to", f"{reg.host}/unibake-test/bb", "--auth-file", str(wrong),
                 "--ca-file", str(reg.ca))
    assert result.code == 1
    assert f"the registry {reg.host} refused the credentials from {wrong}" in result.error_lines[-1]
    assert "not-the-password" not in result.out + result.err

    # none at all: DOCKER_CONFIG names a folder with no config.json
    (tmp_path / "empty").mkdir()
    anonymous = cli("push", str(folder), "--to", f"{reg.host}/unibake-test/bb", "--ca-file", str(reg.ca),
                    env={"CI": "true", "DOCKER_CONFIG": str(tmp_path / "empty")})
    assert anonymous.code == 1 and "refused no credentials (none found for it)" in anonymous.error_lines[-1]
    # the Docker config is where credentials come from without --auth-file
    from_config = cli("push", str(folder), "--to", f"{reg.host}/unibake-test/bb", "--ca-file", str(reg.ca),
                      env={"CI": "true", "DOCKER_CONFIG": str(reg.auth_file.parent)})
    assert from_config.code == 0, from_config.err
    # TLS is verified: without the CA the registry's certificate is refused
    untrusted = cli("push", str(folder), "--to", f"{reg.host}/unibake-test/bb", "--auth-file", str(reg.auth_file))
    assert untrusted.code == 1 and "--ca-file" in untrusted.error_lines[-1]


def test_a_digest_that_is_not_the_release_is_exit_3(cli, engine, reg, images, tmp_path):
    out = tmp_path / "release"
    folder = make_release(cli, "localhost/unibake-busybox:1", out, "bb-m")
    images("unibake-test-other:1")
    build_dockerfile(engine, "unibake-test-other:1", b"FROM localhost/unibake-busybox:1\nLABEL other=1\n")
    other = make_release(cli, "unibake-test-other:1", out, "other-1")
    assert cli("push", str(other), "--to", f"{reg.host}/unibake-test/bb", *registry_args(reg)).code == 0
    other_ref = json.loads((other / "manifest.json").read_text())["registry"][0]["reference"]

    result = cli("pull", other_ref, "--release", str(folder), *registry_args(reg))
    assert result.code == 3
    assert f"is image {json.loads((other / 'manifest.json').read_text())['image_id']}, not release bb-m's" \
        in result.error_lines[-1]
    unknown = cli("pull", f"{reg.host}/unibake-test/bb@sha256:{'0' * 64}", "--out", str(out), *registry_args(reg))
    assert unknown.code == 2 and "no release under" in unknown.error_lines[-1]


def test_a_registry_killed_mid_push_is_a_clear_error_and_a_push_after_restart_works(cli, engine, reg, images, tmp_path):
    images("unibake-test-push-big:1")
    build_dockerfile(engine, "unibake-test-push-big:1",
                     b"FROM localhost/unibake-busybox:1\nRUN head -c 24000000 /dev/urandom > /blob\n")
    folder = make_release(cli, "unibake-test-push-big:1", tmp_path / "release", "big-1")
    snapshot = files_of(folder)
    cmd = [sys.executable, str(REPO / "build.py"), "push", str(folder), "--to", f"{reg.host}/unibake-test/big",
           "--retries", "1", *registry_args(reg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CI": "true"})
    deadline = time.monotonic() + 60
    while not reg.uploads_started():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no upload"
        time.sleep(0.005)
    reg.kill()
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        reg.start()
    assert proc.returncode == 1, err
    last = [line for line in err.splitlines() if line.startswith("error:")][-1]
    assert f"the registry {reg.host} did not answer while" in last and "after 2 attempts" in last
    assert "nothing was recorded in the release" in last
    assert "retrying in 1 s (attempt 2 of 2)" in err
    assert files_of(folder) == snapshot  # the release is as it was

    again = cli("--json", "push", str(folder), "--to", f"{reg.host}/unibake-test/big", *registry_args(reg))
    assert again.code == 0, again.err
    assert json.loads((folder / "manifest.json").read_text())["registry"][0]["digest"] == json.loads(again.out)["digest"]
    assert cli("verify", str(folder)).code == 0


def test_releases_of_two_platforms_are_one_tag_from_which_each_engine_pulls_its_own(cli, reg, tmp_path):
    # issue 14: "an OCI image index in the registry so docker pull picks the right one" (before: each platform's
    # release pushed alone under its own tag; no tag named both)
    amd = make_release(cli, "localhost/unibake-busybox:1", tmp_path / "amd" / "release", "bb-2")
    arm = make_release(cli, "localhost/unibake-busybox:1-arm64", tmp_path / "arm" / "release", "bb-2")
    repo = f"{reg.host}/unibake-test/multi"
    pushed = cli("--json", "push", str(amd), str(arm), "--to", repo, *registry_args(reg))
    assert pushed.code == 0, pushed.err
    doc = json.loads(pushed.out)
    index = doc["index"]["digest"]
    assert doc["index"] == {"reference": f"{repo}@{index}", "repository": repo, "tag": "bb-2", "digest": index}
    records = {f: json.loads((f / "manifest.json").read_text())["registry"] for f in (amd, arm)}
    for folder, [record] in records.items():
        assert record["tag"] == "bb-2" and record["index"] == index
        assert record["reference"] == f"{repo}@{record['digest']}"
        assert f"names an image index (`{index}`)" in (folder / "RELEASE_NOTES.md").read_text()
        assert cli("verify", str(folder)).code == 0
        assert subprocess.run(["sh", str(REPO / "scripts" / "verify-release.sh"), str(folder), "--no-load"],
                              capture_output=True).returncode == 0
    # the registry's tag is the index, each platform's manifest by its digest
    body = requests.get(f"https://{reg.host}/v2/unibake-test/multi/manifests/bb-2", auth=(USER, reg.password),
                        verify=str(reg.ca), headers={"Accept": "application/vnd.oci.image.index.v1+json"}).content
    assert "sha256:" + hashlib.sha256(body).hexdigest() == index
    assert sorted((m["platform"]["architecture"], m["digest"]) for m in json.loads(body)["manifests"]) == sorted(
        (a, records[f][0]["digest"]) for a, f in (("amd64", amd), ("arm64", arm)))
    # an amd64 engine that pulls the tag gets the amd64 release's image; by the arm64 digest, the arm64 image
    ids = {f: json.loads((f / "manifest.json").read_text())["image_id"] for f in (amd, arm)}
    with ScratchEngine(tmp_path / "scratch") as scratch, bridge(reg, scratch.pid):
        env = {**os.environ, "DOCKER_HOST": scratch.engine.address, "DOCKER_CONFIG": str(reg.auth_file.parent)}
        done = subprocess.run(["docker", "pull", f"{repo}:bb-2"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert scratch.engine.inspect_image(f"{repo}:bb-2").id == ids[amd]
        pulled = cli("pull", records[arm][0]["reference"], "--release", str(arm), "--engine", scratch.engine.address,
                     *registry_args(reg))
        assert pulled.code == 0, pulled.err
        assert scratch.engine.inspect_image(records[arm][0]["reference"]).id == ids[arm]
        # build.py pull by the index's digest: the release of the engine's platform among those under --out
        by_index = cli("--json", "pull", f"{repo}@{index}", "--engine", scratch.engine.address, "--out",
                       str(amd.parent), *registry_args(reg))
        assert by_index.code == 0, by_index.err
        assert json.loads(by_index.out)["reference"] == records[amd][0]["reference"]
        assert "is the image index release bb-2 was pushed under" in by_index.err
        # deploy --ref by the index's digest: that folder's own image, as pull takes it (before: refused as an index)
        deployed = cli("--json", "deploy", str(amd), "--from", "registry", "--ref", f"{repo}@{index}", "--engine",
                       scratch.engine.address, *registry_args(reg))
        assert deployed.code == 0, deployed.err
        assert "is the image index release bb-2 was pushed under" in deployed.err
        assert [e["image_id"] for e in json.loads(deployed.out)["engines"]] == [ids[amd]]
        other = cli("pull", f"{repo}@{index}", "--engine", scratch.engine.address, "--out", str(arm.parent),
                    *registry_args(reg))
        assert other.code == 2 and "is the image index of the releases linux/arm64 (bb-2)" in other.error_lines[-1]
        assert "the engine at" in other.error_lines[-1] and "is linux/amd64" in other.error_lines[-1]
    # pushed again: nothing uploaded, nothing changed
    snapshot = {f: files_of(f) for f in (amd, arm)}
    again = cli("--json", "push", str(arm), str(amd), "--to", repo, *registry_args(reg))
    assert again.code == 0, again.err
    assert json.loads(again.out)["index"]["digest"] == index
    assert [r["uploaded"] for r in json.loads(again.out)["releases"]] == [0, 0]
    assert {f: files_of(f) for f in (amd, arm)} == snapshot
