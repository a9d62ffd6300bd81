"""The registry side without a registry: references, credentials, the retry loop, the OCI documents,
what a push uploads (into a recording client), and the release folder amended atomically."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from unibake import amend
from unibake.archive import write_archive
from unibake.archive_reader import read_back
from unibake.errors import (DigestMismatch, InputError, RegistryAuthError, RegistryError, UnibakeError,
                            VerificationError)
from unibake.manifest import Signature, load_manifest
from unibake.metadata import ImageMetadata
from unibake.notes import Notes
from unibake.publish import ReleaseFolder, build_manifest, publish, record_temp, render_files
from unibake.registry import (OCI_INDEX, OCI_MANIFEST, Blob, Credentials, Reference, RegistryClient, Retry, check_remote,
                              image_manifest,
                              find_release_by_index, load_credentials, manifest_config_digest, merge_record,
                              parse_reference, push_index, push_release)
from unibake.signing import check_keys, check_signer
from unibake.verify import read_sums, verify_folder

from dxf import exceptions as dxf_errors

from ..forge import resum
from ..conftest import child_ended, kill_children, signal_inside_popen, terminated_as_the_cli
from ..savefixtures import docker_layout, layer_tar
from .test_publish import METADATA, PASSED, make_release

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, host, path, tag", [
    ("localhost:5000/demo-llm", "localhost:5000", "demo-llm", None),
    ("registry.example.org/team/demo-llm:1.3.1", "registry.example.org", "team/demo-llm", "1.3.1"),
    ("127.0.0.1:443/a/b/c:v_1.2-rc", "127.0.0.1:443", "a/b/c", "v_1.2-rc"),
])
def test_push_references(text, host, path, tag):
    ref = parse_reference(text, what="--to", digest=False)
    assert (ref.host, ref.path, ref.tag, ref.digest) == (host, path, tag, None)


@pytest.mark.parametrize("text, message", [
    ("demo-llm", "is not REGISTRY/REPOSITORY"),
    ("localhost:5000/Demo", "lower-case"),
    ("localhost:5000/a//b", "is not REGISTRY/REPOSITORY"),
    ("localhost:5000/a:b c", "is not REGISTRY/REPOSITORY"),
    (f"localhost:5000/a@{DIGEST}", "a push names a tag, not a digest"),
    ("localhost:5000/a\n", "is not REGISTRY/REPOSITORY"),
    # docker would read these as docker.io/team/...: unibake asks for the registry host instead
    ("team/demo-llm", "names no registry host: 'team' is not one"),
    ("team/demo-llm:1.3.1", "registry.example:5000/team/demo-llm"),
    # ASCII tags only (as the manifest records them), a real port: refused before anything is sent
    ("localhost:5000/t/bb:t\u00e5g", "is not REGISTRY/REPOSITORY"),
    ("localhost:5000/t/bb:\u0663", "is not REGISTRY/REPOSITORY"),
    ("localhost:99999/t/bb", "port 99999 of the registry host is out of range 1..65535"),
    ("localhost:0/t/bb", "port 0 of the registry host"),
    # Docker Hub: its API and its logins are kept under other hosts than its names (before: sent to docker.io/v2/)
    ("docker.io/team/demo-llm:1.3.1", "names Docker Hub \\(docker.io\\), which unibake does not push to or pull from"),
    ("Index.Docker.io/team/demo-llm", "names Docker Hub"),
])
def test_bad_push_references_are_exit_2(text, message):
    with pytest.raises(InputError, match=message):
        parse_reference(text, what="--to", digest=False)


def test_a_pull_reference_names_its_registry_host_too():
    with pytest.raises(InputError, match="names no registry host"):
        parse_reference(f"team/demo-llm@{DIGEST}", what="the reference", digest=True)
    assert parse_reference(f"localhost/demo-llm@{DIGEST}", what="ref", digest=True).host == "localhost"
    assert parse_reference(f"[::1]:5000/demo-llm@{DIGEST}", what="ref", digest=True).host == "[::1]:5000"
    # found by review: any hex digits and colons passed, and the push verified the whole archive before its first
    # request failed, blaming the registry ("an answer that cannot be read")
    for bad in ("[:::]:5000", "[1:2:3]:5000", "[12345::1]"):
        with pytest.raises(InputError, match=rf"{re.escape(bad[:bad.index(']') + 1])} is not an IPv6 address"):
            parse_reference(f"{bad}/demo-llm@{DIGEST}", what="ref", digest=True)
    assert parse_reference("[fd00::5]:443/team/a:1", what="--to", digest=False).host == "[fd00::5]:443"


def test_pull_references_need_a_digest():
    ref = parse_reference(f"localhost:5000/team/a:1@{DIGEST}", what="ref", digest=True)
    assert ref.pinned == f"localhost:5000/team/a@{DIGEST}"
    with pytest.raises(InputError, match="names no digest"):
        parse_reference("localhost:5000/team/a:1", what="ref", digest=True)
    with pytest.raises(InputError):
        parse_reference("localhost:5000/team/a@sha256:abc", what="ref", digest=True)


def config_file(path, entries):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": entries}))
    return path


def test_credentials_come_from_the_auth_file_or_the_docker_config(tmp_path):
    auth = base64.b64encode(b"ci:s3cret-value").decode()
    given = config_file(tmp_path / "given.json", {"reg.example:5000": {"auth": auth}})
    found = load_credentials("reg.example:5000", {}, given)
    assert (found.username, found.password, found.source) == ("ci", "s3cret-value", str(given))
    assert "s3cret-value" not in repr(found)
    assert load_credentials("other.example", {}, given) is None

    config_file(tmp_path / "dc" / "config.json", {"https://reg.example:5000": {"auth": auth}})
    assert load_credentials("reg.example:5000", {"DOCKER_CONFIG": str(tmp_path / "dc")}, None).username == "ci"
    config_file(tmp_path / "home" / ".docker" / "config.json", {"reg.example:5000": {"auth": auth}})
    assert load_credentials("reg.example:5000", {"HOME": str(tmp_path / "home")}, None).username == "ci"
    assert load_credentials("reg.example:5000", {"HOME": str(tmp_path / "nobody")}, None) is None


def test_a_broken_entry_is_an_error_for_its_own_host_only(tmp_path):
    import base64

    good = base64.b64encode(b"ci:pw").decode()
    auths = {"reg.example:5000": {"auth": good}, "other.example": {"auth": base64.b64encode(b"nocolon").decode()}}
    config_file(tmp_path / "dc" / "config.json", auths)
    env = {"DOCKER_CONFIG": str(tmp_path / "dc")}
    assert load_credentials("reg.example:5000", env, None).username == "ci"  # another registry's entry is not ours
    for broken in ("oops", None):  # not even an object: docker-py's InvalidConfigFile
        config_file(tmp_path / "dc2" / "config.json", {"reg.example:5000": {"auth": good}, "third.example": broken})
        assert load_credentials("reg.example:5000", {"DOCKER_CONFIG": str(tmp_path / "dc2")}, None).username == "ci"
    with pytest.raises(UnibakeError, match="the entry for other.example cannot be read"):
        load_credentials("other.example", env, None)
    (tmp_path / "auth.json").write_text(json.dumps({"auths": {"reg.example": {"auth": 123}}}))
    with pytest.raises(InputError, match="the entry for reg.example cannot be read"):
        load_credentials("reg.example", {}, tmp_path / "auth.json")


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a Docker config file"),
    (json.dumps({"auths": {"reg.example": {"identitytoken": "x"}}}), "identity token"),
    ("[" * 100_000, "not valid JSON"),  # nested past the stack: was a RecursionError traceback
])
def test_a_bad_auth_file_is_exit_2(tmp_path, content, message):
    path = tmp_path / "auth.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_credentials("reg.example", {}, path)
    with pytest.raises(InputError, match="missing"):
        load_credentials("reg.example", {}, tmp_path / "absent.json")


def client(attempts=3, credentials=None, push=False):
    waits, lines = [], []
    c = RegistryClient(Reference(host="reg.example:5000", path="team/a"), credentials=credentials, ca_file=None,
                       retry=Retry(attempts=attempts, sleep=waits.append), on_retry=lines.append, push=push)
    return c, waits, lines


def http_error(status, body=b""):
    response = requests.Response()
    response.status_code, response._content = status, body
    return requests.exceptions.HTTPError(response=response)


def failing(*errors, result="done"):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result
    return call, calls


def test_transient_errors_are_retried_with_backoff_then_succeed():
    c, waits, lines = client(attempts=5)
    call, calls = failing(requests.exceptions.ConnectionError("Connection refused"), http_error(503),
                          requests.exceptions.ReadTimeout(), requests.exceptions.SSLError("EOF occurred in violation "
                                                                                          "of protocol"))
    assert c._call("uploading layer 1", call) == "done"
    assert len(calls) == 5 and waits == [1, 2, 4, 8]
    assert "connection refused; retrying in 1 s (attempt 2 of 5)" in lines[0] and "HTTP 503" in lines[1]


def test_retries_run_out_with_one_clear_error():
    c, waits, _ = client(attempts=2, push=True)
    call, calls = failing(*[requests.exceptions.ConnectionError("Connection refused")] * 2)
    with pytest.raises(RegistryError, match="did not answer while uploading x .connection refused. after 2 attempts; "
                                            "nothing was recorded"):
        c._call("uploading x", call)
    assert len(calls) == 2 and waits == [1]


@pytest.mark.parametrize("error, kind, message", [
    (dxf_errors.DXFUnauthorizedError(), RegistryAuthError, "refused the credentials from /x/config.json"),
    (http_error(403, b'{"errors":[{"code":"DENIED","message":"no"}]}'), RegistryAuthError, "DENIED: no"),
    (http_error(400, b'{"errors":[{"code":"MANIFEST_INVALID","message":"bad\\u0007"}]}'), RegistryError,
     r"HTTP 400 MANIFEST_INVALID: bad\?"),
    (requests.exceptions.SSLError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), RegistryError,
     "--ca-file"),
    (dxf_errors.DXFDigestMismatchError("a", "b"), DigestMismatch, "does not match its digest"),
    # what python-dxf raises on answers it cannot read (a manifest that is not UTF-8, a 401 without
    # WWW-Authenticate, a token answer that is a list or lacks the token): one error line, not a traceback
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), RegistryError, "an answer that cannot be read"),
    (KeyError("www-authenticate"), RegistryError, r"cannot be read while pushing \(KeyError\)"),
    (AttributeError("'list' object has no attribute 'get'"), RegistryError, "cannot be read"),
])
def test_answers_that_are_not_worth_a_retry_fail_at_once(error, kind, message):
    c, waits, _ = client(credentials=Credentials(username="u", password="pw-never-shown", source="/x/config.json"))
    call, calls = failing(error)
    with pytest.raises(kind, match=message) as caught:
        c._call("pushing", call)
    assert len(calls) == 1 and waits == [] and "pw-never-shown" not in str(caught.value)


def test_the_manifest_is_one_fixed_form_and_an_index_is_refused():
    config = Blob(digest=DIGEST, size=10, media_type="application/vnd.oci.image.config.v1+json")
    layer = Blob(digest="sha256:" + "cd" * 32, size=5, media_type="application/vnd.oci.image.layer.v1.tar+zstd")
    body = image_manifest(config, [layer])
    assert body == image_manifest(config, [layer]) and b" " not in body
    info = manifest_config_digest(body, "x")
    assert info.config_digest == DIGEST and info.compressions == {"zstd"}
    with pytest.raises(RegistryError, match="image index"):
        manifest_config_digest(json.dumps({"mediaType": OCI_INDEX, "manifests": []}).encode(), "x")
    with pytest.raises(DigestMismatch, match="not an image manifest"):
        manifest_config_digest(b'{"layers": []}', "x")


class RecordingClient:
    """Stands in for the registry's side of the HTTP calls: keeps what a push uploads."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}

    def blob_exists(self, digest, size=None):
        return digest in self.blobs

    def upload(self, digest, opener, what, progress=lambda n: None):
        data = opener()
        data = data if isinstance(data, bytes) else data.read()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, what
        self.blobs[digest] = data

    def put_manifest(self, tag, body, media_type):
        self.manifests[tag] = body
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        return digest, digest


def test_a_push_uploads_each_layer_compressed_and_a_manifest_naming_the_image(tmp_path):
    folder, image_id = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    registry = RecordingClient()
    first = push_release(folder, manifest, target, registry, temp_dir=tmp_path)
    assert first.record.tag == "1.3.1" and first.uploaded == len(manifest.diff_ids)
    document = json.loads(registry.manifests["1.3.1"])
    assert document["config"]["digest"] == manifest.image_id == image_id
    for layer, diff_id in zip(document["layers"], manifest.diff_ids):
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        tar = gzip.decompress(registry.blobs[layer["digest"]])
        assert "sha256:" + hashlib.sha256(tar).hexdigest() == diff_id
    assert list(tmp_path.glob("unibake-push-*")) == []  # the spool folder is gone

    second = push_release(folder, manifest, target, registry, temp_dir=tmp_path)
    assert second.record.digest == first.record.digest and second.uploaded == 0  # the same bytes every time
    zstd = push_release(folder, manifest, target, RecordingClient(), compression="zstd", temp_dir=tmp_path)
    assert zstd.record.digest != first.record.digest and zstd.record.layers == "zstd"


def test_a_push_shows_the_compression_of_its_layers_before_any_upload(tmp_path):
    # every layer is compressed before the first upload: for an image of many gigabytes, minutes in which the push
    # said nothing at all after "==> push" (no line, no bar), as if it hung
    from contextlib import contextmanager

    folder, _ = make_release(tmp_path / "release", layers=[bytes(3 << 20), os.urandom(1 << 20)])
    manifest = load_manifest(folder)
    events = []

    @contextmanager
    def progress(what, total):
        events.append(("begin", what, total))
        yield lambda n: events.append(("read", n))
        events.append(("end",))

    class Watched(RecordingClient):
        def upload(self, digest, opener, what, progress=lambda n: None):
            events.append(("upload", what))
            super().upload(digest, opener, what)

    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    push_release(folder, manifest, target, Watched(), temp_dir=tmp_path,
                 on_line=lambda line: events.append(("line", line)), progress=progress)
    assert events[0] == ("line", f"compressing the layers of demo-llm-1.3.1.tar.zst in {tmp_path} (gzip; a layer it "
                                 "holds compressed goes as it is), then uploading those the registry lacks")
    assert events[1] == ("begin", "compress demo-llm:1.3.1", manifest.archive.uncompressed_bytes)
    end = events.index(("end",))
    assert sum(e[1] for e in events[2:end] if e[0] == "read") == manifest.archive.uncompressed_bytes
    assert all(e[0] == "read" for e in events[2:end]) and end > 3
    assert "upload" in [e[0] for e in events[end + 1:]]  # every upload after the compression it waited for


def test_a_push_shows_each_layer_upload_as_it_goes_never_past_the_layer(tmp_path):
    # a 30 GiB image's push showed the compression, then nothing while each layer uploaded (minutes per layer);
    # each upload now has its own counter (a bar on a terminal, a line every few seconds in a log), told the
    # bytes as the client sends them: a layer sent again (the registry's 307 to another place, a new token)
    # is counted only past the furthest byte sent before, so the counter never reads more than the layer
    import http.server
    from urllib.parse import parse_qs, urlsplit

    folder, _ = make_release(tmp_path / "release", layers=[layer_tar({"a": os.urandom(3 << 20)}),
                                                           layer_tar({"b": os.urandom(1 << 20)})])
    manifest = load_manifest(folder)
    blobs, manifests, puts = {}, {}, []

    class Registry(http.server.BaseHTTPRequestHandler):
        def reply(self, code, body=b"", headers=()):
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802 - http.server's names
            name = self.path.split("/")[-1]
            if "/blobs/" in self.path:
                return self.reply(200, headers=[("Content-Length", str(len(blobs[name])))]) if name in blobs \
                    else self.reply(404)
            body = manifests.get(name)
            digest = "sha256:" + hashlib.sha256(body).hexdigest() if body else ""
            return self.reply(200, headers=[("Docker-Content-Digest", digest)]) if body else self.reply(404)

        def do_GET(self):  # noqa: N802
            body = manifests.get(self.path.split("/")[-1])
            return self.reply(200, body, [("Content-Type", OCI_MANIFEST)]) if body else self.reply(404)

        def do_POST(self):  # noqa: N802
            self.reply(202, headers=[("Location", "/v2/team/a/blobs/uploads/1")])

        def do_PUT(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            puts.append(self.path)
            if "/manifests/" in self.path:
                digest = "sha256:" + hashlib.sha256(body).hexdigest()
                manifests[self.path.split("/")[-1]] = manifests[digest] = body
                return self.reply(201, headers=[("Docker-Content-Digest", digest)])
            digest = parse_qs(urlsplit(self.path).query)["digest"][0]
            if "again" not in self.path:  # (the whole body read, then sent elsewhere: the client sends it again)
                return self.reply(307, headers=[("Location", self.path + "&again=1")])
            blobs[digest] = body
            self.reply(201, headers=[("Docker-Content-Digest", digest)])

    events = []

    @contextmanager
    def progress(what, total):
        events.append(("begin", what, total))
        yield lambda n: events.append(("sent", n))
        events.append(("end", what))

    with tls_server(tmp_path, Registry) as port:
        target = parse_reference(f"127.0.0.1:{port}/team/a", what="--to", digest=False)
        with RegistryClient(target, credentials=None, ca_file=tmp_path / "cert.pem", push=True) as client:
            result = push_release(folder, manifest, target, client, temp_dir=tmp_path, progress=progress)
    assert result.uploaded == len(manifest.diff_ids) == 2
    assert len([p for p in puts if "again" in p]) == 3  # (two layers and the config, each sent twice)
    document = json.loads(manifests["1.3.1"])
    for i, layer in enumerate(document["layers"], 1):
        begin = events.index(("begin", f"upload layer {i} of 2", layer["size"]))
        end = events.index(("end", f"upload layer {i} of 2"))
        sent = [e[1] for e in events[begin + 1:end]]
        assert sum(sent) == layer["size"] == len(blobs[layer["digest"]]) and len(sent) > 1, sent


def test_recording_a_push_keeps_the_folder_a_release_that_verifies(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    record = push_release(folder, manifest, target, RecordingClient(), temp_dir=tmp_path).record
    updated = merge_record(manifest, record)
    amend.amend_release(folder, updated, read_sums(folder), tmp_path / "checksums")
    assert not verify_folder(folder).failures
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=folder).returncode == 0
    assert (tmp_path / "checksums" / "1.3.1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()
    assert load_manifest(folder).registry == (record,)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert notes.count(amend.MARKER) == 1 and f"docker pull {record.reference}" in notes
    assert merge_record(load_manifest(folder), record) is None  # the same push again changes nothing

    later = record.model_copy(update={"digest": DIGEST, "reference": f"{record.repository}@{DIGEST}"})
    amend.amend_release(folder, merge_record(load_manifest(folder), later), read_sums(folder), tmp_path / "checksums")
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert notes.count(amend.MARKER) == 1 and f"docker pull {later.reference}" in notes
    assert load_manifest(folder).registry == (later,)  # a new push to the same tag replaces the old record
    assert not verify_folder(folder).failures
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_the_notes_say_an_engine_before_23_cannot_pull_a_zstd_push_and_what_to_do(tmp_path, compression):
    # README-DIST's registry section gave `docker pull` for a --compression zstd push without a word: on Docker
    # 20.10 (what this project targets) the pull fails on the layers' media type. The section now says which
    # engines pull it and what to do on an older one; a gzip push (the default) says nothing of it
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    registry = RecordingClient()
    record = push_release(folder, manifest, target, registry, compression=compression, temp_dir=tmp_path).record
    types = {layer["mediaType"] for layer in json.loads(registry.manifests["1.3.1"])["layers"]}
    assert types == {f"application/vnd.oci.image.layer.v1.tar+{compression}"} and record.layers == compression
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    for name, instead in (("README-DIST.md", "load the archive instead (steps 1 to 3)"),
                          ("RELEASE_NOTES.md", "load the archive instead (Import)")):
        section = (folder / name).read_text().split(amend.MARKER)[1]
        assert f"docker pull {record.reference}" in section
        said = ("zstd-compressed (`build.py push --compression zstd`): Docker Engine 23 or later pulls\nthem; an "
                "older one (20.10 and before) cannot, and fails the pull" in section and instead in section
                and "--compression gzip" in section)
        assert said == (compression == "zstd"), section
    assert not verify_folder(folder).failures


def test_recording_a_push_never_drops_a_folder_or_link_put_in_the_release_folder(tmp_path, cli):
    """An unpacked kit, a link beside the files: refused, left where they are (before: the new folder
    took only the files, and the old one, with them, was removed)."""
    folder, _ = make_release(tmp_path / "release")
    (folder / "demo-llm-1.3.1-kit").mkdir()
    (folder / "demo-llm-1.3.1-kit" / "kit.json").write_text("{}")
    (folder / "latest").symlink_to("manifest.json")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    with pytest.raises(InputError, match=r"holds demo-llm-1\.3\.1-kit/, latest, which is not a file"):
        amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert (folder / "demo-llm-1.3.1-kit" / "kit.json").read_text() == "{}" and (folder / "latest").is_symlink()
    assert load_manifest(folder) == manifest
    pushed = cli("push", str(folder), "--to", "localhost:1/a")  # said before anything is uploaded
    assert pushed.code == 2 and "which is not a file" in pushed.error_lines[-1]


ARM64 = {**METADATA, "platform": "linux/arm64"}


def test_several_platforms_are_pushed_by_digest_and_one_image_index_names_them_under_the_tag(tmp_path):
    # issue 14: "an OCI image index in the registry so docker pull picks the right one"; before, each platform's
    # release was pushed alone, each under its own tag (1.3.1, 1.3.1-arm64), and no tag named both
    amd, _ = make_release(tmp_path / "amd" / "release")
    arm, _ = make_release(tmp_path / "arm" / "release", metadata=ARM64)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    registry, warned = RecordingClient(), []
    pushed = [push_release(f, load_manifest(f), target, registry, temp_dir=tmp_path, index_tag="1.3.1")
              for f in (arm, amd)]
    assert set(registry.manifests) == {p.record.digest for p in pushed}  # each by its digest: no tag moved yet
    assert [p.record.tag for p in pushed] == ["1.3.1", "1.3.1"]
    digest, body = push_index(registry, target, "1.3.1", pushed, warned.append)
    assert registry.manifests["1.3.1"] == body and digest == "sha256:" + hashlib.sha256(body).hexdigest()
    document = json.loads(body)
    assert document["mediaType"] == OCI_INDEX and document["schemaVersion"] == 2
    arm_push, amd_push = pushed
    assert document["manifests"] == [  # by platform, whatever order the folders came in
        {"mediaType": OCI_MANIFEST, "digest": amd_push.record.digest, "size": len(registry.manifests[
            amd_push.record.digest]), "platform": {"architecture": "amd64", "os": "linux"}},
        {"mediaType": OCI_MANIFEST, "digest": arm_push.record.digest, "size": len(registry.manifests[
            arm_push.record.digest]), "platform": {"architecture": "arm64", "os": "linux"}}]
    assert push_index(RecordingClient(), target, "1.3.1", pushed[::-1], warned.append)[0] == digest and not warned
    # the index names what each manifest is: its config is that platform's image
    for p, folder in ((arm_push, arm), (amd_push, amd)):
        assert json.loads(registry.manifests[p.record.digest])["config"]["digest"] == load_manifest(folder).image_id


def test_a_pull_by_the_index_digest_takes_the_release_of_the_engine_s_platform(tmp_path):
    out = tmp_path / "release"
    amd, _ = make_release(out, "1.3.1")
    arm, _ = make_release(out, "1.3.1-arm64", metadata=ARM64)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    registry = RecordingClient()
    pushed = [push_release(f, load_manifest(f), target, registry, temp_dir=tmp_path, index_tag="1.3.1")
              for f in (amd, arm)]
    index, _ = push_index(registry, target, "1.3.1", pushed, print)
    for folder, p in zip((amd, arm), pushed):
        manifest = load_manifest(folder)
        amend.amend_release(folder, merge_record(manifest, p.record.model_copy(update={"index": index})),
                            read_sums(folder), tmp_path / "checksums")
    ref = parse_reference(f"reg.example:5000/team/demo-llm@{index}", what="the reference", digest=True)
    assert find_release_by_index(out, ref, lambda: ("linux/arm64", "unix:///e")) == arm
    assert find_release_by_index(out, ref, lambda: ("linux/amd64", "unix:///e")) == amd
    with pytest.raises(InputError, match=r"is the image index of the releases linux/amd64 \(1\.3\.1\), linux/arm64 "
                                         r"\(1\.3\.1-arm64\) under .*; the engine at unix:///e is linux/s390x"):
        find_release_by_index(out, ref, lambda: ("linux/s390x", "unix:///e"))
    elsewhere = parse_reference(f"reg.example:5000/team/other@{index}", what="the reference", digest=True)
    asked = []
    assert find_release_by_index(out, elsewhere, lambda: asked.append(1)) is None and not asked  # another repo's


def test_a_push_of_several_folders_is_one_product_and_version_each_of_another_platform(tmp_path, cli):
    amd, _ = make_release(tmp_path / "amd" / "release")
    other_amd, _ = make_release(tmp_path / "amd2" / "release")
    arm, _ = make_release(tmp_path / "arm" / "release", metadata=ARM64)
    newer_arm, _ = make_release(tmp_path / "arm2" / "release", "1.4.0", metadata={**ARM64, "version": "1.4.0"})
    # (an image's version label, as `archive IMAGE` records it, is free text: before, the index's record refused it
    # with a traceback, after every layer was uploaded)
    beta_amd, _ = make_release(tmp_path / "amd3" / "release")
    beta_arm, _ = make_release(tmp_path / "arm3" / "release", metadata=ARM64)
    for folder in (beta_amd, beta_arm):
        path = folder / "manifest.json"
        path.write_text(path.read_text().replace('"version": "1.3.1"', '"version": "1.5 beta"', 1))
        resum(folder)
        assert load_manifest(folder).version == "1.5 beta"
    for folders, said in (((beta_amd, beta_arm), "the image index would be tagged '1.5 beta', the releases' version, "
                                                 "which is no registry tag: give one, as --to localhost:1/a:TAG"),
                          ((amd, other_amd), f"{amd} and {other_amd} are both linux/amd64: an image index holds "
                                             "one image per platform"),
                          ((amd, newer_arm), f"{amd} is demo-llm 1.3.1 and {newer_arm} is demo-llm 1.4.0: one push "
                                             "of several folders makes one image index"),
                          ((amd, arm, amd), f"push: the release folder {amd} is given twice")):
        pushed = cli("push", *map(str, folders), "--to", "localhost:1/a")  # said before anything is uploaded
        assert pushed.code == 2 and said in pushed.error_lines[-1], pushed.err
        assert len(pushed.error_lines) == 1 and "==> verify" not in pushed.err  # before the archives are read
    assert load_manifest(amd).registry == () and load_manifest(arm).registry == ()


@pytest.mark.parametrize("notes", ["latin-1", "huge"])
def test_notes_that_cannot_be_read_as_text_are_refused_before_the_push_not_a_traceback_after_it(tmp_path, cli, notes):
    # (before: a RELEASE_NOTES.md that is not UTF-8, listed in SHA256SUMS with its right hash (the folder
    # verifies), was read only to record the push, after the upload: a UnicodeDecodeError traceback)
    import hashlib
    import re
    folder, _ = make_release(tmp_path / "release")
    path = folder / "RELEASE_NOTES.md"
    if notes == "latin-1":
        path.write_bytes(path.read_bytes() + "- caf\u00e9 fixed\n".encode("latin-1"))
    else:
        with open(path, "ab") as fh:
            fh.write(b"x" * (amend.NOTES_LIMIT + 1))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums = folder / "SHA256SUMS"
    sums.write_text(re.sub(r"(?m)^[0-9a-f]{64}(  RELEASE_NOTES\.md)$", lambda m: digest + m.group(1), sums.read_text()))
    assert not verify_folder(folder).failures
    before = sums.read_bytes()
    pushed = cli("push", str(folder), "--to", "localhost:1/a")  # said before anything is uploaded
    assert pushed.code == 2 and len(pushed.error_lines) == 1 and "Traceback" not in pushed.err
    assert pushed.error_lines[0].startswith(f"error: {path}: ") and "registry section" in pushed.error_lines[0]
    assert sums.read_bytes() == before


def test_notes_changed_after_the_release_was_checked_are_not_vouched_for_by_the_recorded_push(tmp_path):
    # (before: recording read the notes as they were then, and the new SHA256SUMS, signed again by the
    # publisher's key when --sign was given, listed notes someone changed during the upload)
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    sums = read_sums(folder)  # as checked before the upload
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    notes = folder / "RELEASE_NOTES.md"
    notes.write_text(notes.read_text() + "\nDownload the fixed build from https://evil.example/x\n")
    with pytest.raises(VerificationError, match=rf"^{re.escape(str(notes))} is not the file SHA256SUMS lists \(it "
                                                r"changed after the release was checked\): nothing was recorded"):
        amend.amend_release(folder, merge_record(manifest, record), sums, tmp_path / "checksums")
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == {**before, "RELEASE_NOTES.md": notes.read_bytes()}  # nothing recorded, nothing signed
    assert not (tmp_path / "release/.1.3.1.amend").exists()  # no copy left behind


@pytest.mark.parametrize("where", ["changelog", "known_limits"])
def test_a_changelog_that_quotes_the_registry_marker_is_kept_whole_by_every_push(tmp_path, where):
    quoted = f"- fixed the `{amend.MARKER}` marker in docs\n\n{amend.MARKER}\n\n- a later line people wrote\n"
    folder, _ = make_release(tmp_path / "release", notes=Notes(**{where: quoted}))
    written = (folder / "RELEASE_NOTES.md").read_text()
    assert "- a later line people wrote" in written
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    later = record.model_copy(update={"tag": "other"})
    amend.amend_release(folder, merge_record(load_manifest(folder), later), read_sums(folder), tmp_path / "checksums")
    notes = (folder / "RELEASE_NOTES.md").read_text()
    head, section = notes.rsplit(amend.MARKER, 1)
    assert head.rstrip("\n") == written.rstrip("\n")  # everything people wrote, as it was
    assert section.count("docker pull") == 1 and "| `other` |" in section and "| `1.3.1` |" in section
    assert not verify_folder(folder).failures


@pytest.mark.parametrize("atomic", [True, False])
def test_recording_a_push_keeps_the_folder_s_mode_and_group_and_each_file_s(tmp_path, monkeypatch, atomic):
    groups = [g for g in ([1] if os.geteuid() == 0 else os.getgroups()) if g != os.getegid()]
    if not groups:
        pytest.skip("needs a second group to give the release folder")
    group = groups[0]
    folder, _ = make_release(tmp_path / "release")
    record_file = tmp_path / "checksums" / "1.3.1.SHA256SUMS"
    for path in [*folder.iterdir(), record_file]:
        os.chown(path, -1, group)
        path.chmod(0o640)
    os.chown(folder, -1, group)
    folder.chmod(0o700)
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    if not atomic:
        monkeypatch.setattr(amend, "_exchange", lambda a, b: False)
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert load_manifest(folder).registry == (record,) and not verify_folder(folder).failures
    assert (stat.S_IMODE(folder.stat().st_mode), folder.stat().st_gid) == (0o700, group)
    for path in [*folder.iterdir(), record_file]:
        assert (path.name, stat.S_IMODE(path.stat().st_mode), path.stat().st_gid) == (path.name, 0o640, group)


def test_an_interrupted_amend_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record

    def interrupted(a, b):
        raise KeyboardInterrupt
    monkeypatch.setattr(amend, "_exchange", interrupted)
    with pytest.raises(KeyboardInterrupt):
        amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (folder.parent / f".{folder.name}.amend").exists()


def test_without_an_atomic_exchange_the_files_are_replaced_sums_last(tmp_path, monkeypatch):
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    monkeypatch.setattr(amend, "_exchange", lambda a, b: False)
    replaced, replace = [], os.replace

    def recorded(src, dst):  # what was put in the folder, in order (the replace itself done)
        replace(src, dst)
        if os.path.dirname(dst) == str(folder):
            replaced.append(os.path.basename(dst))
    monkeypatch.setattr(os, "replace", recorded)
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    monkeypatch.undo()
    assert not verify_folder(folder).failures and load_manifest(folder).registry == (record,)
    # (before, only the end state was checked: any order, SHA256SUMS first too, passed)
    assert replaced[-1] == "SHA256SUMS" and "manifest.json" in replaced and len(set(replaced)) == len(replaced), \
        replaced



@pytest.mark.parametrize("atomic", [True, False])
def test_an_amend_signs_the_new_sums_again_and_moves_the_signature_in_with_them(tmp_path, monkeypatch, minisign_key,
                                                                                 atomic):
    secret, public = minisign_key
    folder, _ = make_release(tmp_path / "release")
    signer = check_keys(None, secret, {})
    signer.sign(folder / "SHA256SUMS")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    if not atomic:
        monkeypatch.setattr(amend, "_exchange", lambda a, b: False)
    old = (folder / "SHA256SUMS.minisig").read_bytes()
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums",
                        sign=lambda path, data: signer.sign(path, data=data))
    assert (folder / "SHA256SUMS.minisig").read_bytes() != old
    checked = subprocess.run(["minisign", "-Vm", "SHA256SUMS", "-p", str(public)], cwd=folder, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert not verify_folder(folder).failures and load_manifest(folder).registry == (record,)


def test_the_key_signs_the_bytes_written_not_whatever_file_then_has_the_name(tmp_path, minisign_key):
    # found by review: gpg and minisign signed the staging SHA256SUMS by its name; someone who can write a shared
    # --out swapped the staging folder while they ran, and the key signed their file
    secret, public = minisign_key
    signer = check_keys(None, secret, {})
    (tmp_path / "SHA256SUMS").write_bytes(b"0" * 64 + b"  theirs\n")  # what the name holds by the time the tool runs
    written = signer.sign(tmp_path / "SHA256SUMS", "demo 1.0 SHA256SUMS", data=b"1" * 64 + b"  ours\n")
    assert list(written) == ["SHA256SUMS.minisig"] and (tmp_path / "SHA256SUMS.minisig").read_text() == \
        written["SHA256SUMS.minisig"]
    theirs = subprocess.run(["minisign", "-Vm", "SHA256SUMS", "-p", str(public)], cwd=tmp_path, capture_output=True)
    assert theirs.returncode != 0
    (tmp_path / "SHA256SUMS").write_bytes(b"1" * 64 + b"  ours\n")
    ours = subprocess.run(["minisign", "-Vm", "SHA256SUMS", "-p", str(public)], cwd=tmp_path, capture_output=True)
    assert ours.returncode == 0, ours.stderr


@pytest.mark.parametrize("planted", ["a folder", "a folder with a link"])
def test_a_push_s_staging_folder_replaced_while_it_records_itself_is_never_put_in_place(tmp_path, planted):
    # found by review: with --out writable by someone else, the push's .TAG.amend folder could be swapped for theirs
    # while gpg ran: theirs was exchanged in as the release, and a link in it had its target chmod-ed to the release
    # file's mode
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    victim.chmod(0o600)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def swap(path, data):  # theirs: a copy of the push's folder (its files as they are), or with a link in it
        staging = path.parent
        staging.rename(tmp_path / "moved")
        shutil.copytree(tmp_path / "moved", staging)
        if planted == "a folder with a link":
            (staging / "manifest.json").unlink()
            (staging / "manifest.json").symlink_to(victim)
        return {}

    said = r"\.1\.3\.1\.amend was replaced while this push made it" if planted == "a folder" else "Too many levels"
    with pytest.raises((UnibakeError, OSError), match=said):
        amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums",
                            sign=swap)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and not folder.is_symlink()


def test_a_release_folder_whose_staging_folder_was_replaced_during_the_build_is_never_published(tmp_path):
    out = tmp_path / "release"
    with ReleaseFolder(out, "1.0", force=False) as folder:
        folder.staging.rename(tmp_path / "moved")
        folder.staging.mkdir()
        (folder.staging / "manifest.json").write_text("{}")
        with pytest.raises(UnibakeError, match=r"\.1\.0\.partial was replaced while this run made it \(someone else "
                                               r"can write .*\): nothing was published"):
            folder.commit()
    assert not (out / "1.0").exists()


@pytest.mark.parametrize("atomic", [True, False])
def test_a_signature_of_a_kind_not_signed_again_is_dropped_with_a_warning_not_left_stale(tmp_path, monkeypatch,
                                                                                          minisign_key, atomic):
    # (before: a SHA256SUMS.asc put beside the release by hand was linked into the new folder, a signature that no
    # longer matched its SHA256SUMS, and nothing said so)
    secret, _ = minisign_key
    folder, _ = make_release(tmp_path / "release")
    signer = check_keys(None, secret, {})
    signer.sign(folder / "SHA256SUMS")
    (folder / "SHA256SUMS.asc").write_text("-----BEGIN PGP SIGNATURE-----\nby hand\n-----END PGP SIGNATURE-----\n")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    if not atomic:
        monkeypatch.setattr(amend, "_exchange", lambda a, b: False)
    warnings = []
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums",
                        sign=lambda path, data: signer.sign(path, data=data), on_warning=warnings.append)
    assert not (folder / "SHA256SUMS.asc").exists() and (folder / "SHA256SUMS.minisig").exists()
    assert warnings == [f"{folder / 'SHA256SUMS.asc'} signed the old SHA256SUMS, and no key of its kind signed the "
                        "new one: it is left out of the release folder (sign the release again with that key to have "
                        "one)"]
    assert not verify_folder(folder).failures


def _hotfix_release(out, shared, old, new):
    """Release 1.0 of the layers ``shared`` and ``old``, and its hotfix 1.1 of ``shared`` and ``new`` (``shared``
    omitted from its archive); returns the hotfix's folder, the base's manifest, the omitted diffID and the image ID."""
    base_folder, _ = make_release(out, "1.0", layers=[shared, old])
    base = load_manifest(base_folder)
    data, image_id, _ = docker_layout([shared, new], tag="demo-llm:1.1")
    omitted = "sha256:" + hashlib.sha256(shared).hexdigest()
    with ReleaseFolder(out, "1.1", force=False) as staged:
        archive = write_archive([data], staged.staging, "demo-llm-1.1.tar.zst", tag="demo-llm:1.1", omit=[omitted])
        back = read_back(archive, omitted=frozenset([omitted]))
        manifest = build_manifest(product="demo-llm", tag="1.1", image_ref="demo-llm:1.1", archive=archive,
                                  digests=back, metadata=ImageMetadata.model_validate_json(json.dumps(METADATA)),
                                  labels={}, previous=base, hotfix=base)
        folder = publish(staged, archive, back, render_files(manifest, PASSED, base), out.parent / "checksums")
    return folder, base, omitted, image_id


def test_signing_again_needs_the_very_keys_the_release_records(minisign_key):
    secret, _ = minisign_key
    signer = check_keys(None, secret, {})
    [mine] = signer.records
    ours = Signature(kind="minisign", key=mine.key, files=("SHA256SUMS.minisig",))
    check_signer(signer, (ours,), "release 1.3.1")  # the same key: fine
    for recorded, says in (((), "is not signed"),
                           ((ours.model_copy(update={"key": "ABCDEF"}),), "but release 1.3.1 was signed by ABCDEF"),
                           ((ours, Signature(kind="openpgp", key="AB" * 20, files=())), "give --sign too")):
        with pytest.raises(InputError, match=says):
            check_signer(signer, recorded, "release 1.3.1")


def test_a_hotfix_push_shows_its_base_release_verified_and_read_not_minutes_of_silence(tmp_path):
    # a hotfix's unchanged layers come from its base release: the base's whole archive was verified, then read
    # and compressed, without a word, while the bar of the hotfix's own (small) archive stood full
    from contextlib import contextmanager

    out = tmp_path / "release"
    shared, old, new = (layer_tar({name: os.urandom(200_000)}) for name in ("base", "old", "new"))
    folder, base, omitted, _ = _hotfix_release(out, shared, old, new)
    events = []

    @contextmanager
    def progress(what, total):
        events.append(("begin", what, total))
        yield lambda n: events.append(("read", what, n))
        events.append(("end", what))

    target = parse_reference("r.example/demo-llm", what="--to", digest=False)
    push_release(folder, load_manifest(folder), target, RecordingClient(), temp_dir=tmp_path, progress=progress)
    begun = [e[1:] for e in events if e[0] == "begin"]
    on_disk = sum(f.bytes for f in base.archive.files)
    assert begun[:3] == [("compress demo-llm:1.1", load_manifest(folder).archive.uncompressed_bytes),
                         ("read archive of 1.0 (the base)", on_disk),
                         ("compress demo-llm:1.0 (the base)", base.archive.uncompressed_bytes)], begun
    assert sum(e[2] for e in events if e[:2] == ("read", "compress demo-llm:1.0 (the base)")) == \
        base.archive.uncompressed_bytes
    assert sum(e[2] for e in events if e[:2] == ("read", "read archive of 1.0 (the base)")) > 0


def test_a_hotfix_is_pushed_whole_its_unchanged_layers_read_from_its_base_release(tmp_path):
    out = tmp_path / "release"
    shared, old, new = (layer_tar({name: name.encode() * 100}) for name in ("base", "old", "new"))
    folder, base, omitted, image_id = _hotfix_release(out, shared, old, new)
    manifest = load_manifest(folder)
    assert manifest.hotfix.omitted_diff_ids == (omitted,)

    registry = RecordingClient()
    target = parse_reference("r.example/demo-llm", what="--to", digest=False)
    push_release(folder, manifest, target, registry, temp_dir=tmp_path)
    document = json.loads(registry.manifests["1.1"])
    assert document["config"]["digest"] == image_id
    layers = [gzip.decompress(registry.blobs[layer["digest"]]) for layer in document["layers"]]
    assert layers == [shared, new]

    shutil.rmtree(out / "1.0")  # the base release's folder
    with pytest.raises(InputError, match="is a hotfix on 1.0, whose folder"):
        push_release(folder, manifest, target, RecordingClient(), temp_dir=tmp_path)


class ServingClient:
    """Stands in for a registry that answers manifest requests with what it holds (checked by digest,
    as the real client checks them)."""

    def __init__(self, *bodies):
        self.bodies = {"sha256:" + hashlib.sha256(b).hexdigest(): b for b in bodies}

    def manifest(self, digest):
        return self.bodies[digest]


def test_a_manifest_naming_the_release_s_image_but_other_layers_is_exit_3_before_any_pull(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    registry = RecordingClient()
    target = parse_reference("r.example/a", what="--to", digest=False)
    record = push_release(folder, manifest, target, registry, temp_dir=tmp_path).record
    genuine = registry.manifests["1.3.1"]
    document = json.loads(genuine)
    theirs = dict(document["layers"][-1], digest="sha256:" + "ee" * 32)
    forged = {"other layers": json.dumps({**document, "layers": [*document["layers"][:-1], theirs]}).encode(),
              "an extra layer": json.dumps({**document, "layers": [*document["layers"], theirs]}).encode()}
    client = ServingClient(genuine, *forged.values())

    def ref(body):
        return parse_reference(f"r.example/a@sha256:{hashlib.sha256(body).hexdigest()}", what="ref", digest=True)

    recorded = merge_record(manifest, record)
    assert check_remote(ref(genuine), recorded, client).config_digest == manifest.image_id
    for what, body in forged.items():
        for m, where in ((recorded, None), (manifest, None), (manifest, folder)):
            with pytest.raises(DigestMismatch) as refused:
                check_remote(ref(body), m, client, folder=where, temp_dir=tmp_path)
            assert f"{ref(body).pinned} " in str(refused.value), what
    with pytest.raises(DigestMismatch, match="layers that are not its own: a push of its archive gives "
                                             f"{record.digest} \\(gzip layers\\)"):
        check_remote(ref(forged["other layers"]), manifest, client, folder=folder, temp_dir=tmp_path)
    with pytest.raises(DigestMismatch, match="names 4 layers; release 1.3.1's image has 3"):
        check_remote(ref(forged["an extra layer"]), manifest, client, folder=folder)
    # a push the release does not record (a signed release pushed without its keys): checked against its archive
    with pytest.raises(DigestMismatch, match="is not a push release 1.3.1 records"):
        check_remote(ref(genuine), manifest, client)
    assert check_remote(ref(genuine), manifest, client, folder=folder, temp_dir=tmp_path).layers == \
        tuple(layer["digest"] for layer in document["layers"])
    assert list(tmp_path.glob("unibake-check-*")) == []


def test_a_pull_of_a_digest_the_release_does_not_record_shows_the_compression_it_checks_it_with(tmp_path):
    # pull and deploy --from registry of a push the release does not record compress the whole archive again to
    # know the digest a push of it gives: minutes for a big archive under "==> check", without a word
    from contextlib import contextmanager

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    registry = RecordingClient()
    push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False), registry,
                 temp_dir=tmp_path)
    body = registry.manifests["1.3.1"]
    ref = parse_reference(f"r.example/a@sha256:{hashlib.sha256(body).hexdigest()}", what="ref", digest=True)
    events = []

    @contextmanager
    def progress(what, total):
        events.append(("begin", what, total))
        yield lambda n: events.append(("read", n))

    check_remote(ref, manifest, ServingClient(body), folder=folder, temp_dir=tmp_path, progress=progress)
    assert events[0] == ("begin", "compress demo-llm:1.3.1 (gzip, as a push would)",
                         manifest.archive.uncompressed_bytes)
    assert sum(e[1] for e in events[1:]) == manifest.archive.uncompressed_bytes


@contextmanager
def tls_server(tmp_path, handler):
    """An HTTPS server on loopback answering with ``handler``; yields its port (its certificate in tmp_path)."""
    import http.server
    import ssl
    import threading

    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                           str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")], capture_output=True)
    assert made.returncode == 0, made.stderr
    handler.log_message = lambda self, *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


def test_a_manifest_answer_bigger_than_a_manifest_is_cut_off_not_read_whole(tmp_path):
    """A registry (or something posing as one) that answers a manifest request with endless bytes:
    the client stops at the limit, it does not hold the answer in memory first."""
    import http.server

    from unibake.registry import MAX_MANIFEST

    sent = []

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.end_headers()  # no Content-Length: the body ends when the connection does
            try:
                for _ in range(400):  # 100 MiB at most
                    self.wfile.write(b" " * (256 << 10))
                    sent.append(256 << 10)
            except OSError:
                pass

    with tls_server(tmp_path, Endless) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        c = RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1))
        with pytest.raises(RegistryError, match=f"more than the {MAX_MANIFEST} a manifest may be"):
            c.manifest(DIGEST)
    assert sum(sent) < 32 << 20, sum(sent)  # it stopped reading near the limit, not at the end of 100 MiB


def test_a_content_length_in_other_digits_is_no_crash(tmp_path):
    """``Content-Length: \u00b2`` is a digit to str.isdigit() and no number to int(): the answer is read
    and checked against its digest like any other."""
    import http.server

    class Superscript(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Content-Length", "\u00b2")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"{}")

    with tls_server(tmp_path, Superscript) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        c = RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1))
        with pytest.raises(DigestMismatch, match="with a document whose digest is"):
            c.manifest(DIGEST)


def test_credentials_go_to_the_registry_alone_not_to_a_host_its_answers_name(tmp_path):
    """A registry's upload ``Location`` may name any host, and a redirect may lead to one that asks for
    credentials itself: neither gets the user's password (python-dxf sent it to both), as docker
    sends it only to the registry it logged in to."""
    import http.server

    heard = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def answer(self):
            heard.append((self.command, self.path, self.headers.get("Authorization")))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/token"):
                self.send_response(200)
                body = b'{"token": "t"}'
            elif self.path.startswith("/upload"):
                self.send_response(201)
                body = b""
            else:  # what it serves, it serves to a token of its own realm
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="https://127.0.0.1:{self.server.server_port}'
                                                     '/token",service="elsewhere"')
                body = b""
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = do_PUT = answer  # noqa: N815 - http.server's names

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with tls_server(tmp_path / "b", Elsewhere) as other:
        class Registry(http.server.BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:pw-never-sent").decode():
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                elif self.command == "POST":
                    self.send_response(202)
                    self.send_header("Location", f"https://127.0.0.1:{other}/upload/1")
                else:  # a blob kept elsewhere
                    self.send_response(307)
                    self.send_header("Location", f"https://127.0.0.1:{other}/blob/1")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_POST = answer  # noqa: N815 - http.server's names

        with tls_server(tmp_path / "a", Registry) as port:
            (tmp_path / "ca.pem").write_bytes((tmp_path / "a/cert.pem").read_bytes() +
                                              (tmp_path / "b/cert.pem").read_bytes())
            ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
            credentials = Credentials(username="u", password="pw-never-sent", source="/x/config.json")
            with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "ca.pem", retry=Retry(attempts=1),
                                push=True) as c:
                c.upload("sha256:" + hashlib.sha256(b"layer").hexdigest(), lambda: b"layer", "layer 1")
                with pytest.raises(RegistryAuthError, match="refused the credentials"):
                    c.blob_exists(DIGEST)
    assert [(command, path.split("?")[0]) for command, path, _ in heard] == \
        [("PUT", "/upload/1"), ("HEAD", "/blob/1")]  # the upload arrived; no token was asked for elsewhere
    assert [auth for _, _, auth in heard] == [None, None]


def test_an_upload_location_that_parsers_read_as_two_hosts_gets_no_credentials(tmp_path):
    """``https://OTHER\\@REGISTRY/...``: Python's URL parser reads the registry's host and port in it
    (after the '@'), the HTTP client connects to OTHER (a backslash ends the host there): the check
    that keeps credentials to the registry's own host read it as the registry's, and OTHER got the
    password. The host is now read as the connection reads it."""
    import http.server

    heard = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            heard.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with tls_server(tmp_path / "b", Other) as other:
        class Registry(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:pw-never-sent").decode():
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                else:
                    self.send_response(202)
                    self.send_header("Location", f"https://127.0.0.1:{other}\\@127.0.0.1:{self.server.server_port}"
                                                 "/v2/team/a/blobs/uploads/1")
                self.send_header("Content-Length", "0")
                self.end_headers()

        with tls_server(tmp_path / "a", Registry) as port:
            (tmp_path / "ca.pem").write_bytes((tmp_path / "a/cert.pem").read_bytes() +
                                              (tmp_path / "b/cert.pem").read_bytes())
            ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
            credentials = Credentials(username="u", password="pw-never-sent", source="/x/config.json")
            with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "ca.pem", retry=Retry(attempts=1),
                                push=True) as c:
                c.upload("sha256:" + hashlib.sha256(b"layer").hexdigest(), lambda: b"layer", "layer 1")
    assert heard == [None]  # the upload went where the client connects, without the password


def ask_for_a_token(handler) -> None:
    """A registry's 401 that sends the client to its own /token realm (an http.server handler's answer)."""
    handler.send_response(401)
    handler.send_header("WWW-Authenticate", f'Bearer realm="https://127.0.0.1:{handler.server.server_port}/token",'
                                            'service="r"')
    handler.send_header("Content-Length", "0")
    handler.end_headers()


@pytest.mark.parametrize("answer", ["a token", "an error", "a redirect"])
def test_an_endless_token_or_error_answer_is_cut_off_not_read_whole(tmp_path, answer):
    """Every answer a registry gives is read up to a limit: a token answer (requests read it whole,
    then python-dxf parsed it), an error's body (read whole for its message, a streamed request's
    too) and a redirect's (read whole before each of up to 30 redirects) that never end are no
    longer memory without bound."""
    import http.server

    from unibake.registry import MAX_ANSWER

    sent = []

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if answer == "a token" and not self.path.startswith("/token"):
                return ask_for_a_token(self)
            self.send_response({"a token": 200, "an error": 404, "a redirect": 302}[answer])
            self.send_header("Location", self.path)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no Content-Length: the body ends when the connection does
            try:
                self.wfile.write(b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "' if answer == "an error"
                                 else b'{"token": "')
                for _ in range(400):  # 100 MiB at most
                    self.wfile.write(b"x" * (256 << 10))
                    sent.append(256 << 10)
            except OSError:
                pass

    with tls_server(tmp_path, Endless) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
            expected = {"a token": f"answered /token with more than the {MAX_ANSWER} bytes",
                        "an error": "refused reading manifest sha256:abababababab: HTTP 404$",
                        "a redirect": r"failed while reading manifest sha256:abababababab \(TooManyRedirects\)"}
            with pytest.raises(RegistryError, match=expected[answer]):
                c.manifest(DIGEST)
    # it stopped reading each answer near the limit, not at the end of its 100 MiB
    assert sum(sent) < (200 << 20 if answer == "a redirect" else 32 << 20), sum(sent)


def test_an_endless_authentication_challenge_is_refused_not_parsed_for_minutes(tmp_path):
    """A 401 whose WWW-Authenticate is as long as the HTTP client lets it be (100 headers of 64 kB, joined):
    python-dxf's parser takes time quadratic in its length (10 headers: 25 s; 100: some 40 minutes of
    CPU), and an attempt's time limit cannot stop it, as it shuts sockets. It is now refused at once."""
    import http.server

    class Challenging(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(401)
            for _ in range(10):
                self.send_header("WWW-Authenticate", "Bearer " + "," * 65000)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with tls_server(tmp_path, Challenging) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
                c.manifest(DIGEST)

        outcome = _asked_in_a_thread(ask, seconds=5)
    assert outcome is not None, "still parsing the challenge after 5 s"
    assert outcome == (f"the registry 127.0.0.1:{port} answered /v2/team/a/manifests/{DIGEST} with a WWW-Authenticate "
                       f"of {10 * 65007 + 9 * 2} characters, more than the {16 << 10} a challenge may be")


def test_a_push_recorded_while_another_uploaded_is_not_dropped_by_it(cli, tmp_path, monkeypatch):
    """Two pushes of one release at once (two registries, a CI matrix): the one that records second
    used to write the manifest it read before its upload, dropping the first one's record while both
    said 'pushed' (and recorded: true). Now the second is an error that records nothing; run again,
    it records its push beside the first."""
    from unibake import registry

    folder, _ = make_release(tmp_path / "release")
    real_push = registry.push_release
    uploads = RecordingClient()

    def push_while_another_records(folder, manifest, target, client, **kwargs):
        other = parse_reference("other.example/team/demo-llm", what="--to", digest=False)
        first = real_push(folder, manifest, other, uploads, temp_dir=tmp_path)  # the other push, done first
        amend.amend_release(folder, merge_record(load_manifest(folder), first.record), read_sums(folder),
                            tmp_path / "checksums")
        return real_push(folder, manifest, target, uploads, **kwargs)

    monkeypatch.setattr(registry, "push_release", push_while_another_records)
    result = cli("push", str(folder), "--to", "reg.example/team/demo-llm")
    assert result.code == 1 and "changed while this push ran" in result.err and "push again" in result.err
    assert [r.repository for r in load_manifest(folder).registry] == ["other.example/team/demo-llm"]
    assert not verify_folder(folder).failures

    monkeypatch.setattr(registry, "push_release", lambda folder, manifest, target, client, **kwargs:
                        real_push(folder, manifest, target, uploads, **kwargs))
    assert cli("push", str(folder), "--to", "reg.example/team/demo-llm").code == 0
    assert [r.repository for r in load_manifest(folder).registry] == ["other.example/team/demo-llm",
                                                                      "reg.example/team/demo-llm"]


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot write, as root can")
def test_a_push_from_a_folder_this_user_cannot_write_is_pushed_and_said_unrecorded_not_failed_after(tmp_path,
                                                                                                     monkeypatch):
    # found by review: the push uploaded, then failed to record ("error: .../.1.3.1.lock: Permission denied",
    # exit 1), naming neither the reference it was pushed as nor that it was pushed
    import contextlib
    import io
    import tempfile

    from unibake import registry
    from unibake.cli import main

    from ..conftest import as_nobody

    shared = Path(tempfile.mkdtemp(prefix="unibake-readonly-"))
    try:
        shared.chmod(0o755)
        folder, _ = make_release(shared / "release")
        spool = shared / "spool"
        spool.mkdir(mode=0o777)
        spool.chmod(0o777)
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        real_push, uploads = registry.push_release, RecordingClient()
        monkeypatch.setattr(registry, "push_release", lambda folder, manifest, target, client, **kwargs:
                            real_push(folder, manifest, target, uploads, **kwargs))

        def push():
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(["push", str(folder), "--to", "reg.example/team/demo-llm", "--temp-dir", str(spool)],
                            env={"CI": "1"}, cwd=shared)
            return code, [line for line in err.getvalue().splitlines() if line.startswith(("warning:", "error:"))]

        warm, _ = make_release(tmp_path / "warm")  # as root first: every module a push loads is loaded (nobody
        assert main(["push", str(warm), "--to", "reg.example/team/demo-llm", "--temp-dir", str(spool)],  # cannot
                    env={"CI": "1"}, cwd=tmp_path) == 0  # read them where the tests run)
        said = as_nobody(push)
        assert said.startswith("ok: (0, "), said
        assert "release 1.3.1: the push cannot be recorded in " in said and "it is pushed, and its reference said" \
            in said and "not recorded (" in said and "pull it by reg.example/team/demo-llm@sha256:" in said, said
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the folder as it was
    finally:
        shutil.rmtree(shared)

@pytest.mark.parametrize("answer", ["an error", "a busy registry", "a token", "a manifest"])
def test_json_nested_past_the_stack_is_one_error_line_not_a_traceback(tmp_path, answer):
    """``[[[[...`` in a registry's answer (an error's body, a token answer, a manifest whose digest the
    pull was given) made json raise RecursionError, which nothing caught: a traceback."""
    import http.server

    deep = b"[" * 200_000
    digest = "sha256:" + hashlib.sha256(deep).hexdigest()

    class Deep(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if answer == "a token" and not self.path.startswith("/token"):
                return ask_for_a_token(self)
            self.send_response({"an error": 404, "a busy registry": 503}.get(answer, 200))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(deep)))
            self.end_headers()
            self.wfile.write(deep)

    with tls_server(tmp_path, Deep) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{digest}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem",
                            retry=Retry(attempts=2, sleep=lambda seconds: None)) as c:
            with pytest.raises(UnibakeError) as caught:
                manifest_config_digest(c.manifest(digest), ref.pinned)
    expected = {"an error": "refused reading manifest sha256:.*: HTTP 404$", "a busy registry": r"\(HTTP 503\) after 2",
                "a token": r"/token named by .* answered with no token \(RecursionError\)",
                "a manifest": "the manifest is not JSON"}
    assert caught.match(expected[answer])


def test_a_ca_file_without_a_certificate_is_exit_2_and_one_that_does_not_vouch_is_named(cli, tmp_path):
    """``--ca-file`` given a file with no certificate (a key, a typo'd download) was told, after the
    retries, to 'give its CA certificate with --ca-file'; one with the wrong CA was told the same."""
    import http.server

    folder, _ = make_release(tmp_path / "release")
    (tmp_path / "key-only.pem").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    refused = cli("push", str(folder), "--to", "127.0.0.1:1/team/a", "--ca-file", str(tmp_path / "key-only.pem"))
    assert refused.code == 2 and "--ca-file" in refused.err and "no CA certificate in it" in refused.err
    assert "did not answer" not in refused.err  # refused before anything was sent

    class Any(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's name
            self.send_response(404)
            self.end_headers()

    (tmp_path / "other").mkdir()
    with tls_server(tmp_path / "other", Any):
        pass  # only its certificate: a CA that signed nothing the registry shows
    with tls_server(tmp_path, Any) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "other/cert.pem", retry=Retry(attempts=1)) as c:
            with pytest.raises(RegistryError, match=f"the CA certificate in --ca-file {tmp_path}/other/cert.pem does "
                                                    "not vouch for the TLS certificate of the registry 127.0.0.1:"):
                c.blob_exists(DIGEST)


@pytest.mark.parametrize("config", [{"credsStore": "unibake-absent"},
                                    {"credHelpers": {"reg.example:5000": "unibake-absent"}}])
def test_a_credential_helper_that_is_not_installed_is_named_with_no_python_warning(tmp_path, config, recwarn):
    """A Docker config from a desktop (``"credsStore": "desktop"``) on a CI runner without that helper
    was 'the credential helper failed (DockerException)', after docker-py's UserWarning with its own
    source line on stderr."""
    config_file(tmp_path / "dc" / "config.json", {})
    (tmp_path / "dc" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnibakeError, match="the credential helper for reg.example:5000, docker-credential-unibake-absent"
                                           ", is not installed"):
        load_credentials("reg.example:5000", {"DOCKER_CONFIG": str(tmp_path / "dc")}, None)
    assert [str(w.message) for w in recwarn] == []


def test_a_push_records_the_compression_its_layers_have_not_the_one_asked_for(tmp_path):
    """An archive that holds its layers gzip-compressed already (as a containerd store saves them)
    pushes them as they are: a push with --compression zstd recorded 'zstd' in the release (its notes'
    table, the push's summary) for layers that are gzip."""
    folder, _ = make_release(tmp_path / "release", gzip_layers=True)
    manifest = load_manifest(folder)
    registry, lines = RecordingClient(), []
    target = parse_reference("r.example/a", what="--to", digest=False)
    result = push_release(folder, manifest, target, registry, compression="zstd", temp_dir=tmp_path,
                          on_line=lines.append)
    kinds = {layer["mediaType"] for layer in json.loads(registry.manifests["1.3.1"])["layers"]}
    assert kinds == {"application/vnd.oci.image.layer.v1.tar+gzip"}
    assert result.record.layers == "gzip"
    assert any("holds its layers gzip-compressed" in line for line in lines)


@pytest.mark.parametrize("header", [None, "sha512", "junk"])
def test_a_registry_that_sends_no_docker_content_digest_is_pushed_to(tmp_path, header):
    """Docker-Content-Digest is optional (the OCI distribution spec: clients should not depend on it;
    Docker Hub leaves it out of some answers): a push to a registry that never sends it was exit 3,
    'the registry says REPO:TAG is nothing, not the manifest just pushed', every time. One that is no
    sha256 digest (the manifest's sha512 digest, or 60 kB of junk) is no digest to compare with either:
    it was exit 3 too, the junk quoted whole in the error line."""
    import http.server
    import threading

    stored: dict[str, bytes] = {}
    lock = threading.Lock()

    class Spare(http.server.BaseHTTPRequestHandler):
        """A registry of the OCI distribution spec's required answers, and no optional header (a HEAD's
        Content-Length is not required either: a push to a registry that left it out was exit 1, 'an
        answer that cannot be read while looking for blob ... (KeyError)', as python-dxf reads the size)."""

        def reply(self, status, body=b"", **headers):
            self.send_response(status)
            length = {} if self.command == "HEAD" else {"Content-Length": str(len(body))}
            for name, value in {**headers, **length}.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802 - http.server's names
            with lock:
                found = stored.get(self.path.split("?")[0])
            said = {None: {}, "sha512": {"Docker-Content-Digest": f"sha512:{hashlib.sha512(found or b'').hexdigest()}"},
                    "junk": {"Docker-Content-Digest": "x" * 60000}}[header] if "/manifests/" in self.path else {}
            self.reply(200 if found is not None else 404, **said)

        def do_GET(self):  # noqa: N802
            with lock:
                found = stored.get(self.path)
            self.reply(200, found, Content_Type=OCI_MANIFEST) if found is not None else self.reply(404)

        def do_POST(self):  # noqa: N802
            self.reply(202, Location="/v2/team/a/blobs/uploads/1")

        def do_PUT(self):  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            path, _, query = self.path.partition("?")
            with lock:
                if path.startswith("/v2/team/a/blobs/uploads/"):
                    stored["/v2/team/a/blobs/" + query.split("digest=")[1].replace("%3A", ":")] = data
                else:  # a manifest: under its tag and its digest (which a pull asks for)
                    stored[path] = stored[f"/v2/team/a/manifests/sha256:{hashlib.sha256(data).hexdigest()}"] = data
            self.reply(201)

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    with tls_server(tmp_path, Spare) as port:
        target = parse_reference(f"127.0.0.1:{port}/team/a", what="--to", digest=False)
        with RegistryClient(target, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                            push=True) as c:
            record = push_release(folder, manifest, target, c, temp_dir=tmp_path).record
            again = push_release(folder, manifest, target, c, temp_dir=tmp_path)  # every blob there: HEAD says so
    assert record.digest == "sha256:" + hashlib.sha256(stored["/v2/team/a/manifests/1.3.1"]).hexdigest()
    assert (again.record.digest, again.uploaded, again.present) == (record.digest, 0, len(manifest.diff_ids))


def test_a_registry_that_answers_nothing_is_given_up_on_not_waited_for_ten_minutes_a_try(tmp_path, monkeypatch):
    """A registry that takes the connection and the TLS handshake, then says nothing (hung, or a
    black hole in front of it): every request waited 600 s, five times, 50 minutes before the error.
    An answer is now waited for a minute (here: 1 s); only a blob's upload keeps the long wait, as the
    registry answers it once it has stored the whole blob (here: 2 s, longer than an answer's wait)."""
    import http.server
    import socket
    import ssl
    import threading

    from unibake import registry

    monkeypatch.setattr(registry, "ANSWER_TIMEOUT", (30, 1), raising=False)
    (tmp_path / "slow").mkdir()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(2)  # storing the blob
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):  # noqa: N802
            self.send_response(202)
            self.send_header("Location", "/v2/team/a/blobs/uploads/1")
            self.send_header("Content-Length", "0")
            self.end_headers()

    with tls_server(tmp_path / "slow", Slow) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "slow/cert.pem", retry=Retry(attempts=1),
                            push=True) as c:
            c.upload("sha256:" + hashlib.sha256(b"layer").hexdigest(), lambda: b"layer", "layer 1")

    with tls_server(tmp_path, Slow):  # (only its certificate)
        pass
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener, held = socket.create_server(("127.0.0.1", 0)), []

    def silent():
        connection, _ = listener.accept()
        held.append(context.wrap_socket(connection, server_side=True))  # the handshake, then nothing

    threading.Thread(target=silent, daemon=True).start()
    ref = Reference(host=f"127.0.0.1:{listener.getsockname()[1]}", path="team/a")
    outcome = []

    def ask():
        try:
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
                c.blob_exists(DIGEST)
        except RegistryError as exc:
            outcome.append(str(exc))

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(30)
    listener.close()
    assert outcome and "did not answer while looking for blob" in outcome[0] and "(timed out)" in outcome[0]


def test_an_entry_of_user_name_and_password_without_auth_is_used_as_the_docker_cli_uses_it(tmp_path):
    """``{"auths": {"HOST": {"username": ..., "password": ...}}}`` (a config CI jobs write by hand; the
    docker CLI reads it): docker-py passes over it, and the push went anonymous and was told 'no
    credentials (none found for it)'."""
    config_file(tmp_path / "dc" / "config.json", {"https://reg.example:5000": {"username": "ci", "password": "pw"},
                                                  "other.example": {"username": "x", "password": "y"}})
    found = load_credentials("reg.example:5000", {"DOCKER_CONFIG": str(tmp_path / "dc")}, None)
    assert (found.username, found.password) == ("ci", "pw")
    assert load_credentials("third.example", {"DOCKER_CONFIG": str(tmp_path / "dc")}, None) is None
    assert "pw" not in repr(found)


def _asked_in_a_thread(ask, seconds=20):
    """``ask()``'s error line (or 'answered'), or None when it was still waiting after ``seconds``."""
    import threading

    outcome = []

    def run():
        try:
            ask()
            outcome.append("answered")
        except RegistryError as exc:
            outcome.append(str(exc))

    asking = threading.Thread(target=run, daemon=True)
    asking.start()
    asking.join(seconds)
    return outcome[0] if outcome else None


@pytest.mark.parametrize("where", ["the body", "the headers", "a token"])
def test_a_registry_that_sends_a_byte_at_a_time_is_given_up_on_as_too_slow(tmp_path, monkeypatch, where):
    """A registry that sends its answer a byte at a time, each just within the per-read timeout (a
    minute in use; here the bytes come every 0.2 s): each read was answered, so the request went on
    for as long as the registry liked (a 4 MiB manifest: years). Now a small answer (a manifest, its
    headers, a token) must be whole in ANSWER_DEADLINE (here 1 s), and the error names the registry
    and what was being read."""
    import http.server

    from unibake import registry

    monkeypatch.setattr(registry, "ANSWER_DEADLINE", 1.0, raising=False)
    monkeypatch.setattr(registry, "WATCH_TICK", 0.1, raising=False)
    stop = []

    class Trickle(http.server.BaseHTTPRequestHandler):
        def trickle(self, data):
            for byte in data:
                if stop:
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)

        def do_GET(self):  # noqa: N802 - http.server's name
            if where == "a token" and not self.path.startswith("/token"):
                return ask_for_a_token(self)
            body = b'{"token": "' + b"t" * 200 + b'"}' if where == "a token" else b"{" + b" " * 500 + b"}"
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    + "X-Padding: " + "p" * 200 + "\r\n\r\n").encode()
            try:
                if where == "the headers":
                    self.trickle(head)
                else:
                    self.wfile.write(head)
                    self.trickle(body)
            except OSError:
                pass

    with tls_server(tmp_path, Trickle) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
                c.manifest(DIGEST)

        start = time.monotonic()
        outcome = _asked_in_a_thread(ask)
        stop.append(1)
    assert outcome is not None, "still reading the answer after 20 s"
    assert time.monotonic() - start < 10
    assert outcome == (f"the registry 127.0.0.1:{port} did not answer while reading manifest sha256:abababababab "
                       "(too slow: no whole answer in 1 s) after 1 attempt; nothing was pulled, tagged or changed; "
                       "run the command again when the registry is back")


def test_a_registry_whose_connect_never_completes_is_given_up_on_within_the_attempt_s_time(monkeypatch):
    """A connect waits up to the connect timeout (30 s) for each address a host's name gives, and the
    attempt's watch, which shuts a slow attempt's sockets, learnt of a socket only once it was connected:
    a name of many addresses that take no connection (a broken IPv6 route, a CDN's hosts behind a
    redirect) held an attempt for that many times 30 s, past the 2 minutes a small answer has. The socket
    is now watched from before its connect. Here one address whose listener's queue is full (it drops
    the connection's SYN), a connect timeout of 5 s and 1 s for a whole answer: given up on at 1 s."""
    import socket

    from unibake import registry

    monkeypatch.setattr(registry, "ANSWER_TIMEOUT", (5, 5), raising=False)
    monkeypatch.setattr(registry, "ANSWER_DEADLINE", 1.0, raising=False)
    monkeypatch.setattr(registry, "WATCH_TICK", 0.1, raising=False)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # never accepted: once its queue is full, a connect waits for an answer that never comes
    port = listener.getsockname()[1]
    queued = []
    for _ in range(4):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        queued.append(sock)
    time.sleep(0.3)
    try:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=None, retry=Retry(attempts=1)) as c:
                c.manifest(DIGEST)

        start = time.monotonic()
        outcome = _asked_in_a_thread(ask, seconds=20)
        took = time.monotonic() - start
    finally:
        for sock in [listener, *queued]:
            sock.close()
    assert outcome == (f"the registry 127.0.0.1:{port} did not answer while reading manifest sha256:abababababab "
                       "(too slow: no whole answer in 1 s) after 1 attempt; nothing was pulled, tagged or changed; "
                       "run the command again when the registry is back")
    assert took < 4  # not the connect timeout's 5 s


def test_a_blob_upload_the_registry_takes_in_a_trickle_is_given_up_on_as_too_slow(tmp_path, monkeypatch):
    """A registry that reads an upload's body slowly (8 KiB a second: each write still goes through
    within the per-write timeout) held a push for as long as the blob took at that pace (a 64 MiB layer:
    more than two hours). Now an upload must move BLOB_RATE (here 32 MiB in 0.5 s: far more than the
    socket buffers take in) all along, and the error names the registry and the layer; a blob that
    moves at the pace is uploaded (the first, small one)."""
    import http.server

    from unibake import registry

    monkeypatch.setattr(registry, "BLOB_RATE", (32 << 20, 0.5), raising=False)
    monkeypatch.setattr(registry, "WATCH_TICK", 0.1, raising=False)
    stop, stored = [], []

    class Sluggish(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.send_response(202)
            self.send_header("Location", "/v2/team/a/blobs/uploads/1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self):  # noqa: N802
            left = int(self.headers["Content-Length"])
            try:
                while left and not stop:
                    left -= len(self.rfile.read(min(left, 8 << 10)))
                    if left:
                        time.sleep(1 if left > 1 << 20 else 0)
            except OSError:
                return
            if stop:
                return
            stored.append(self.path)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

    blob = tmp_path / "blob"
    with open(blob, "wb") as f:
        f.truncate(64 << 20)  # (sparse: quick to read)
    with tls_server(tmp_path, Sluggish) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                                push=True) as c:
                c.upload("sha256:" + hashlib.sha256(b"small").hexdigest(), lambda: b"small", "the image config")
                assert stored
                c.upload(DIGEST, lambda: open(blob, "rb"), "layer 1 of 1")

        start = time.monotonic()
        outcome = _asked_in_a_thread(ask)
        stop.append(1)
    assert outcome is not None, "still uploading after 20 s"
    assert time.monotonic() - start < 10
    assert outcome.startswith(f"the registry 127.0.0.1:{port} did not answer while uploading layer 1 of 1 (too slow: "
                              f"the upload moved less than {32 << 20} bytes in 0.5 s, after "), outcome
    assert outcome.endswith("after 1 attempt; nothing was recorded in the release; run the command again when the "
                            "registry is back (blobs already there are not uploaded again)")


@pytest.mark.parametrize("answer", ["a 307 redirect", "a 308 redirect", "a 401 asking for a new token",
                                    "a 401 after a while, the new token slow to come", "307 redirects without end"])
def test_an_upload_the_registry_redirects_or_asks_a_new_token_for_is_sent_whole_again(tmp_path, monkeypatch, answer):
    """A registry that answers a blob's upload with a 307/308 redirect (the upload moved), or with a 401
    (its token ran out): the blob was sent again with nothing left of it. After a redirect the request
    still said the blob's length, and the registry waited for bytes that never came: 10 minutes an
    attempt (here BLOB_ANSWER_DEADLINE: 2 s), then 'too slow'; after a new token the registry got an
    empty blob and refused it (HTTP 400). Now the blob is sent whole again, from a file as from bytes,
    its time limits counted from then (the first sending's time is not held against the token's fetch);
    as each redirect sends it again, an upload follows 3 of them, not requests' 30."""
    import http.server

    from unibake import registry

    monkeypatch.setattr(registry, "BLOB_ANSWER_DEADLINE", 2.0, raising=False)
    monkeypatch.setattr(registry, "WATCH_TICK", 0.05, raising=False)
    slow = "slow" in answer
    if slow:  # the first sending took longer than a small answer may, the token's fetch does not
        monkeypatch.setattr(registry, "ANSWER_DEADLINE", 1.0, raising=False)
    blob = os.urandom(300 << 10)
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    (tmp_path / "blob").write_bytes(blob)
    stored, heard = [], []

    class Moved(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status, body=b"", **headers):
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server's names
            time.sleep(0.3 if slow else 0)
            self.reply(200, b'{"token": "fresh"}')  # (the token realm)

        def do_POST(self):  # noqa: N802
            self.reply(202, Location="/v2/team/a/blobs/uploads/1")

        def do_PUT(self):  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            path = self.path.split("?")[0]
            heard.append((path, len(data)))
            if answer == "307 redirects without end":
                return self.reply(307, Location=f"/v2/team/a/blobs/uploads/{len(heard) + 1}")
            if path.endswith("/1"):
                if "401" in answer:
                    if self.headers.get("Authorization") != "Bearer fresh":
                        time.sleep(1.3 if slow else 0)  # (storing it, then finding the token out of date)
                        return self.reply(401, WWW_Authenticate=f'Bearer realm="https://127.0.0.1:'
                                                                f'{self.server.server_port}/token",service="r"')
                else:
                    return self.reply(int(answer[2:5]), Location=self.path.replace("uploads/1", "uploads/2"))
            stored.append(data)
            self.reply(201 if hashlib.sha256(data).hexdigest() == digest[7:] else 400)

    with tls_server(tmp_path, Moved) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                                push=True) as c:
                c.upload(digest, lambda: blob, "layer 1 of 2")
                c.upload(digest, lambda: open(tmp_path / "blob", "rb"), "layer 2 of 2")

        outcome = _asked_in_a_thread(ask)
    if answer == "307 redirects without end":
        assert outcome == f"the registry 127.0.0.1:{port} failed while uploading layer 1 of 2 (TooManyRedirects)"
        assert heard == [(f"/v2/team/a/blobs/uploads/{n}", len(blob)) for n in range(1, 5)]
        return
    assert outcome == "answered", outcome
    assert stored == [blob, blob]
    assert [size for _, size in heard] == [len(blob)] * (3 if "401" in answer else 4)  # (one token for both)


def test_a_temp_dir_that_cannot_take_the_compressed_layers_is_named(tmp_path):
    """A push compresses every layer into --temp-dir (default $TMPDIR) before it uploads: a full one
    said 'error: a file: No space left on device', naming neither the folder nor the option. Here
    the files it writes are held to 20 kB (RLIMIT_FSIZE), as a full disk holds them."""
    import os
    import resource
    import signal
    import sys

    from ..savefixtures import layer_tar

    folder, _ = make_release(tmp_path / "release", layers=[layer_tar({"blob": os.urandom(300_000)})])
    (tmp_path / "spool").mkdir()

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # (a registry that lacks every blob: the push asks it before it compresses)
    with tls_server(tmp_path, _heard_server(tmp_path, [], lambda handler: _answer(handler, 404))) as port:
        done = subprocess.run([sys.executable, os.path.join(repo, "build.py"), "push", str(folder), "--to",
                               f"127.0.0.1:{port}/team/a", "--ca-file", str(tmp_path / "cert.pem"), "--temp-dir",
                               str(tmp_path / "spool"), "--retries", "0"],
                              capture_output=True, text=True, preexec_fn=small_files, cwd=tmp_path, timeout=120,
                              # not measured by pytest-cov: its data file, written at exit, would meet the limit too
                              env={**{k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "COVERAGE_"))},
                                   "CI": "1"})
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: cannot write in {tmp_path / 'spool'} (--temp-dir; default $TMPDIR) while the release's layers are "
        "compressed for the registry (File too large): give another --temp-dir; nothing was sent")
    assert os.listdir(tmp_path / "spool") == []


def serving_manifest(body: bytes):
    """A request handler answering every GET with ``body`` as an OCI manifest (for :func:`tls_server`)."""
    import http.server

    class Serving(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", OCI_MANIFEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Serving


def test_deploy_from_a_push_the_release_does_not_record_takes_a_temp_dir_as_pull_does(cli, tmp_path):
    """``deploy --from registry --ref`` of a push the release does not record compresses the release's
    layers again, as ``pull`` does; pull takes --temp-dir for that (a big image does not fit every
    $TMPDIR), deploy had none ('unrecognized arguments'). Now it takes one, and refuses it without
    --from registry."""
    folder, _ = make_release(tmp_path / "release")
    registry = RecordingClient()
    record = push_release(folder, load_manifest(folder), parse_reference("r.example/a", what="--to", digest=False),
                          registry, temp_dir=tmp_path).record
    document = json.loads(registry.manifests["1.3.1"])
    body = json.dumps({**document, "layers": [*document["layers"][:-1],
                                              dict(document["layers"][-1], digest="sha256:" + "ee" * 32)]}).encode()

    (tmp_path / "spool").mkdir()
    (tmp_path / "tls").mkdir()
    with tls_server(tmp_path / "tls", serving_manifest(body)) as port:
        ref = f"127.0.0.1:{port}/team/a@sha256:{hashlib.sha256(body).hexdigest()}"
        result = cli("deploy", str(folder), "--engine", "tcp://127.0.0.1:1", "--from", "registry", "--ref", ref,
                     "--ca-file", str(tmp_path / "tls/cert.pem"), "--temp-dir", str(tmp_path / "spool"))
    assert result.code == 3, result.err
    assert f"layers that are not its own: a push of its archive gives {record.digest} (gzip layers)" in \
        result.error_lines[-1]
    assert os.listdir(tmp_path / "spool") == []
    archive = cli("deploy", str(folder), "--engine", "tcp://127.0.0.1:1", "--temp-dir", str(tmp_path / "spool"))
    assert archive.code == 2 and archive.error_lines[-1] == "error: --temp-dir goes with --from registry"


def test_a_pull_of_a_push_the_release_does_not_record_asks_the_engine_before_it_compresses(cli, tmp_path,
                                                                                             monkeypatch):
    # found by probing: the whole archive was compressed again (minutes for a big one) before the engine the pull
    # is for was asked, which may not be there
    from unibake import registry as module

    compressed = []
    original = module.pushed_manifest_digest
    monkeypatch.setattr(module, "pushed_manifest_digest", lambda *a, **kw: compressed.append(1) or original(*a, **kw))

    folder, _ = make_release(tmp_path / "release")
    registry = RecordingClient()
    push_release(folder, load_manifest(folder), parse_reference("r.example/a", what="--to", digest=False), registry,
                 temp_dir=tmp_path)
    body = registry.manifests["1.3.1"]  # a genuine push, which the release does not record

    (tmp_path / "spool").mkdir()
    (tmp_path / "tls").mkdir()
    with tls_server(tmp_path / "tls", serving_manifest(body)) as port:
        ref = f"127.0.0.1:{port}/team/a@sha256:{hashlib.sha256(body).hexdigest()}"
        with pytest.raises(AssertionError, match="a unit test tried to reach a container engine"):
            cli("--engine", "tcp://127.0.0.1:1", "pull", ref, "--release", str(folder), "--ca-file",
                str(tmp_path / "tls/cert.pem"), "--temp-dir", str(tmp_path / "spool"))
    assert compressed == [] and os.listdir(tmp_path / "spool") == []  # the engine asked first: nothing compressed


def test_an_attempt_s_watch_expiring_as_the_attempt_ends_never_shuts_a_connection_after_it(monkeypatch):
    """An attempt that ends as its time runs out: its watch had found it overdue and was about to shut
    its connections when the attempt ended and gave them back to the pool; it shut them after, under
    the next request that took one up (a spurious 'connection failed', fatal with --retries 0). Once
    the attempt's watch has ended, none of its connections is shut."""
    import socket
    import threading

    from unibake import registry

    monkeypatch.setattr(registry, "WATCH_TICK", 0.01, raising=False)

    def shut(sock) -> bool:  # read shut down: a read ends at once, with nothing
        try:
            return sock.recv(1, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False

    kept, other = socket.socketpair()
    with kept, other:
        watch = registry._Watch()
        watch.start -= registry.ANSWER_DEADLINE + 1  # overdue from its first look
        watch.sockets.append(kept)
        with watch.lock:  # the watch finds it overdue and waits here to shut its connections
            watch.__enter__()
            time.sleep(0.3)
            ending = threading.Thread(target=watch.__exit__, args=(None, None, None))
            ending.start()  # the attempt ends
            ending.join(0.3)
        ending.join()
        was = shut(kept)  # as the attempt's end left it: the next request may take it up now
        time.sleep(0.3)
        assert shut(kept) == was


def test_a_push_of_a_release_folder_that_is_a_link_locks_and_records_the_name_given(cli, tmp_path, monkeypatch):
    # (before: push resolved release/1.3.1 -> /mnt/big/1.3.1 and took only the lock beside the target, so a
    # hotfix's hold on release/1.3.1 did not stop it, and it left checksums/1.3.1.SHA256SUMS stale)
    from unibake import registry
    from unibake.publish import hold_release

    real, _ = make_release(tmp_path / "big" / "release")
    (tmp_path / "repo" / "release").mkdir(parents=True)
    (tmp_path / "repo" / "checksums").mkdir()
    (tmp_path / "repo" / "checksums" / "1.3.1.SHA256SUMS").write_text((real / "SHA256SUMS").read_text())
    link = tmp_path / "repo" / "release" / "1.3.1"
    link.symlink_to(real)
    real_push, uploads = registry.push_release, RecordingClient()
    monkeypatch.setattr(registry, "push_release", lambda folder, manifest, target, client, **kwargs:
                        real_push(folder, manifest, target, uploads, **kwargs))

    hold = hold_release(tmp_path / "repo" / "release", "1.3.1")  # a hotfix being made on release/1.3.1
    try:
        refused = cli("push", "release/1.3.1", "--to", "reg.example/team/demo-llm", cwd=tmp_path / "repo")
    finally:
        hold.close()
    assert refused.code == 1 and "a hotfix or another release is being made on the release" in refused.err, refused.err
    assert load_manifest(real).registry == ()

    assert cli("push", "release/1.3.1", "--to", "reg.example/team/demo-llm", cwd=tmp_path / "repo").code == 0
    assert link.is_symlink() and load_manifest(real).registry and not verify_folder(real).failures
    assert (tmp_path / "repo" / "checksums" / "1.3.1.SHA256SUMS").read_text() == (real / "SHA256SUMS").read_text()
    assert (tmp_path / "big" / "checksums" / "1.3.1.SHA256SUMS").read_text() == (real / "SHA256SUMS").read_text()


def test_a_run_refused_while_a_push_records_itself_names_the_push_not_an_older_run(tmp_path):
    # (before: the push held the release's lock without writing its pid in it, so a build --force refused
    # meanwhile named the pid of the run that last wrote the release, long gone)
    folder, _ = make_release(tmp_path / "release")
    (tmp_path / "release" / ".1.3.1.lock").write_text("99999\n")  # the run that made the release, ended
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    said = []

    def meanwhile(path, data):  # while the push holds the lock: a build --force of 1.3.1
        with pytest.raises(UnibakeError) as refused:
            ReleaseFolder(tmp_path / "release", "1.3.1", force=True).__enter__()
        said.append(str(refused.value))
        return []

    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums",
                        sign=meanwhile)
    assert len(said) == 1 and f"(pid {os.getpid()})" in said[0] and "99999" not in said[0], said


def test_a_push_updates_its_checksums_record_while_it_holds_the_release_s_lock(tmp_path, monkeypatch):
    # (before: the record was written after the lock was let go: a build --force committing then had
    # its new record overwritten with the push's listing of the old folder)
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    real, refused = amend.write_atomic, []

    def a_build_force_meanwhile(where, name, *args, **kwargs):
        if name == "1.3.1.SHA256SUMS":
            with pytest.raises(UnibakeError, match="another run is writing release"):
                ReleaseFolder(tmp_path / "release", "1.3.1", force=True).__enter__()
            refused.append(name)
        return real(where, name, *args, **kwargs)

    monkeypatch.setattr(amend, "write_atomic", a_build_force_meanwhile)
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert refused == ["1.3.1.SHA256SUMS"]
    assert (tmp_path / "checksums" / "1.3.1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()


def test_a_link_planted_as_a_push_s_copy_of_the_release_is_named_with_what_to_do(tmp_path):
    # (before: error: .../.1.3.1.amend: File exists, saying neither what it is nor what to remove)
    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    (tmp_path / "victim").mkdir()
    (tmp_path / "release" / ".1.3.1.amend").symlink_to(tmp_path / "victim")
    with pytest.raises(UnibakeError, match=r"\.1\.3\.1\.amend is a link where a run makes a push's copy of a release "
                                           r"\(a folder\): no run's, so it is neither followed nor removed; remove it"):
        amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert os.listdir(tmp_path / "victim") == [] and load_manifest(folder) == manifest


def test_recording_a_push_writes_no_checksums_record_through_a_link_planted_as_its_temporary_file(tmp_path):
    # (before: the record's update wrote checksums/.1.3.1.SHA256SUMS.tmp through a link planted there, and
    # chmod-ed the file it named)
    folder, _ = make_release(tmp_path / "release")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    record_temp(tmp_path / "checksums" / "1.3.1.SHA256SUMS", folder).symlink_to(victim)
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert os.listdir(tmp_path / "checksums") == ["1.3.1.SHA256SUMS"]
    assert (tmp_path / "checksums" / "1.3.1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()


@pytest.mark.parametrize("planted", ["huge", "fifo", "link"])
def test_recording_a_push_reads_no_more_of_a_checksums_record_than_a_record_holds(tmp_path, planted):
    # (before: checksums/TAG.SHA256SUMS was read whole to tell whether it was the folder's own: one of
    # gigabytes was read into memory, and a link was followed to whatever it named)
    import tracemalloc
    folder, _ = make_release(tmp_path / "release")
    record = tmp_path / "checksums" / "1.3.1.SHA256SUMS"
    record.unlink()
    if planted == "huge":
        with open(record, "wb") as fh:
            fh.truncate(256 << 20)  # sparse: 256 MiB read as zeros
    elif planted == "fifo":
        os.mkfifo(record)
    else:
        (tmp_path / "copy").write_bytes((folder / "SHA256SUMS").read_bytes())
        record.symlink_to(tmp_path / "copy")
    manifest = load_manifest(folder)
    pushed = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    warnings = []
    tracemalloc.start()
    try:
        amend.amend_release(folder, merge_record(manifest, pushed), read_sums(folder), tmp_path / "checksums",
                            on_warning=warnings.append)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # (a manifest is read with a buffer of its 16 MiB bound)
    assert load_manifest(folder).registry == (pushed,) and not verify_folder(folder).failures
    assert [w.startswith(f"{record} ") and "left as it is" in w for w in warnings] == [True]
    assert os.path.lexists(record) and (planted != "link" or record.is_symlink())


def test_a_push_through_a_link_in_a_folder_it_cannot_write_still_records(tmp_path, monkeypatch):
    # the link's folder another user's (a shared link farm): its lock is read if there, not made
    real, _ = make_release(tmp_path / "big" / "release")
    (tmp_path / "repo" / "release").mkdir(parents=True)
    link = tmp_path / "repo" / "release" / "1.3.1"
    link.symlink_to(real)
    opened = amend.open_lock

    def unwritable_there(path, *, create=True, write=True):
        if path.parent == link.parent and (create or write):
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, create=create, write=write)

    monkeypatch.setattr(amend, "open_lock", unwritable_there)
    manifest = load_manifest(real)
    record = push_release(real, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    amend.amend_release(real, merge_record(manifest, record), read_sums(real), tmp_path / "repo" / "checksums",
                        named=link)
    assert load_manifest(real).registry == (record,)
    (link.parent / ".1.3.1.lock").write_text("")  # one there (its owner's): read and held
    later = record.model_copy(update={"digest": DIGEST, "reference": f"{record.repository}@{DIGEST}"})
    amend.amend_release(real, merge_record(load_manifest(real), later), read_sums(real),
                        tmp_path / "repo" / "checksums", named=link)
    assert load_manifest(real).registry == (later,)


@pytest.mark.parametrize("location", ["ftp://127.0.0.1:{free}/upload/1", "file:///etc/passwd", None,
                                      "http://127.0.0.1:{port}/v2/team/a/blobs/uploads/1"])
def test_an_upload_location_of_another_scheme_is_refused_naming_it_not_tried_as_https(tmp_path, location):
    """python-dxf sends a blob to its upload's Location over https, whatever the Location's scheme: an
    ``ftp://HOST/`` was tried as ``https://HOST/``, its failure retried as the registry's connection and
    reported as 'the registry R did not answer'. A Location of another scheme than http or https (or
    none) is now one error naming it, not retried; an http:// one is still taken (sent over https)."""
    import http.server
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # (nothing listens there)
    heard = []

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's names
            self.send_response(202)
            if location is not None:
                self.send_header("Location", location.format(free=free, port=self.server.server_port))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self):  # noqa: N802
            heard.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

    waits = []
    with tls_server(tmp_path, Registry) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", push=True,
                                retry=Retry(attempts=3, sleep=waits.append)) as c:
                c.upload("sha256:" + hashlib.sha256(b"layer").hexdigest(), lambda: b"layer", "layer 1 of 1")

        outcome = _asked_in_a_thread(ask)
    if location is None:
        assert outcome == (f"the registry 127.0.0.1:{port} answered the start of uploading layer 1 of 1 with no "
                           "Location to upload to (an upload's start must give one)")
    elif location.startswith("http:"):
        assert outcome == "answered" and len(heard) == 1
        return
    else:
        shown = location.format(free=free, port=port)
        assert outcome == (f"the registry 127.0.0.1:{port} answered the start of uploading layer 1 of 1 with the "
                           f"upload Location {shown!r}, whose scheme {shown.split(':')[0]!r} is neither https nor "
                           "http: nothing was sent there")
    assert waits == [] and heard == []  # not retried, nothing sent


@pytest.mark.parametrize("refusal", ["101 headers", "a header line of 70 kB"])
def test_an_answer_whose_headers_the_client_refuses_is_one_error_not_retried(tmp_path, refusal):
    """An answer with more than 100 header lines (or a line over 64 KiB) is refused by the HTTP client,
    and requests reports it as a failed connection: it was retried (the same answer each time), then
    'did not answer while ... (connection failed)'. It is now one error saying what the answer was."""
    import http.server

    class Headers(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's name
            self.send_response(404)
            if refusal == "101 headers":
                for n in range(101):
                    self.send_header(f"X-Header-{n}", "x")
            else:
                self.send_header("X-Long", "x" * (70 << 10))
            self.send_header("Content-Length", "0")
            self.end_headers()

    waits = []
    with tls_server(tmp_path, Headers) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")

        def ask():
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem",
                                retry=Retry(attempts=3, sleep=waits.append)) as c:
                c.blob_exists(DIGEST)

        outcome = _asked_in_a_thread(ask)
    what = {"101 headers": "more than the 100 header lines an HTTP client reads",
            "a header line of 70 kB": "a header line longer than the 65536 bytes an HTTP client reads"}[refusal]
    assert outcome == (f"the registry 127.0.0.1:{port} answered with {what} while looking for blob "
                       f"{DIGEST[:19]}: that answer cannot be read, and would come again on another try")
    assert waits == []


@pytest.mark.parametrize("registry_does", ["another push takes the tag", "another client removes the tag",
                                           "shows it by digest a moment later", "stores another manifest",
                                           "keeps nothing by digest"])
def test_a_push_whose_tag_another_push_replaced_meanwhile_is_recorded_by_its_digest_and_says_so(cli, tmp_path,
                                                                                                registry_does):
    """Two pushes to one tag at once: the one whose manifest the other's replaced read the tag back,
    found the other's digest and failed, exit 3 ('the registry says REPO:TAG is OTHER, not the manifest
    just pushed'), though its manifest was stored whole under its digest, which is what pull and deploy
    use. It now reads its manifest back by its digest: stored, the push completes and is recorded, and a
    warning names both digests (the tag is the last push's, as with docker push). A registry that
    stores another manifest, or nothing under its digest, is still exit 3."""
    import http.server
    import threading

    folder, _ = make_release(tmp_path / "release")
    other = "sha256:" + "0e" * 32
    stored: dict[str, bytes] = {}
    tags: dict[str, str] = {}
    pushed: list[str] = []
    read: list[str] = []
    lock = threading.Lock()

    class Racing(http.server.BaseHTTPRequestHandler):
        def reply(self, status, body=b"", **headers):
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def find(self):
            path = self.path.split("?")[0]
            name = path.rsplit("/", 1)[1]
            with lock:
                name = tags.get(name, name)
                return name, stored.get(name) if registry_does != "keeps nothing by digest" or "/blobs/" in path \
                    else None

        def do_HEAD(self):  # noqa: N802 - http.server's names
            name, found = self.find()
            if "/manifests/" in self.path and name == other:
                return self.reply(200, Docker_Content_Digest=other)
            self.reply(200 if found is not None else 404, Docker_Content_Digest=name)

        def do_GET(self):  # noqa: N802
            name, found = self.find()
            if registry_does == "shows it by digest a moment later" and "/manifests/sha256:" in self.path:
                read.append(self.path)
                found = found if len(read) > 1 else None
            self.reply(200, found, Content_Type=OCI_MANIFEST) if found is not None else self.reply(404)

        def do_POST(self):  # noqa: N802
            self.reply(202, Location="/v2/team/a/blobs/uploads/1")

        def do_PUT(self):  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            path, _, query = self.path.partition("?")
            with lock:
                stored[digest] = data
                if "/manifests/" in path:  # another push to the tag, at once: the tag is its manifest now
                    pushed.append(digest)
                    tags[path.rsplit("/", 1)[1]] = other if registry_does == "another push takes the tag" else \
                        "sha256:" + "00" * 32 if registry_does == "another client removes the tag" else digest
            said = other if registry_does == "stores another manifest" and "/manifests/" in path else digest
            self.reply(201, Docker_Content_Digest=said)

    with tls_server(tmp_path, Racing) as port:
        result = cli("--json", "push", str(folder), "--to", f"127.0.0.1:{port}/team/a", "--ca-file",
                     str(tmp_path / "cert.pem"), "--retries", "0")
    ours = pushed[0]
    where = f"127.0.0.1:{port}/team/a"
    if registry_does == "shows it by digest a moment later":  # (a registry of replicas): read again, a second on
        assert result.code == 0 and "warning" not in result.err, result.err
        assert read == [f"/v2/team/a/manifests/{ours}"] * 2
        return
    if registry_does == "another client removes the tag":
        assert result.code == 0, result.err
        assert f"warning: {where}:1.3.1 names nothing now (it was removed), not this push's {ours}: " in result.err
        assert json.loads(result.out)["tag_names"] == ""
        return
    if registry_does == "another push takes the tag":
        assert result.code == 0, result.err
        assert f"warning: {where}:1.3.1 names {other} now, not this push's {ours}: another push to the tag " \
               f"replaced it while this one ran; this release is stored as {where}@{ours}, which is recorded " \
               "(pull it by that); push again to point the tag at it" in result.err
        document = json.loads(result.out)
        assert (document["digest"], document["tag_names"], document["recorded"]) == (ours, other, True)
        assert [r.digest for r in load_manifest(folder).registry] == [ours]
        return
    assert result.code == 3, result.err
    expected = {"stores another manifest": f"the registry 127.0.0.1:{port} stored the manifest pushed as "
                                           f"{where}:1.3.1 as {other}, not as {ours}, its digest; nothing was recorded",
                "keeps nothing by digest": f"the registry 127.0.0.1:{port} took the manifest pushed as {where}:1.3.1 "
                                           f"but holds nothing as {where}@{ours}; nothing was recorded"}
    assert result.error_lines[-1] == f"error: {expected[registry_does]}"
    assert load_manifest(folder).registry == ()


@pytest.mark.parametrize("request_, status, location", [
    ("a manifest", 302, None), ("a manifest", 304, None), ("a blob", 302, None), ("a blob", 302, ""),
    ("a manifest", 307, "ftp://127.0.0.1/m"), ("a blob", 301, "file:///etc/passwd"),
    ("a manifest", 307, "https://127.0.0.1:99999/x"), ("a blob", 302, "https://[::1/x")])
def test_a_3xx_answer_without_a_location_to_follow_is_an_error_not_the_answer(tmp_path, request_, status, location):
    """A 3xx answer with no Location (or an empty one, or a 304) is no redirect requests follows, and it
    was taken as the answer: a manifest read as its empty body (exit 3, 'a document whose digest is
    sha256:e3b0...', as if the registry had been tampered with), a blob's HEAD as 'the blob is there'
    (its upload skipped, and the manifest then named a blob the registry lacks). A redirect to another
    scheme than http or https was '(InvalidSchema)', one to a port past 65535 a traceback. Each is now one error
    line saying what came."""
    import http.server

    class Odd(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = answer  # noqa: N815 - http.server's names

    with tls_server(tmp_path, Odd) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
            with pytest.raises(RegistryError) as caught:
                c.manifest(DIGEST) if request_ == "a manifest" else c.blob_exists(DIGEST)
    path = f"/v2/team/a/{'manifests' if request_ == 'a manifest' else 'blobs'}/{DIGEST}"
    if location and location.startswith("https"):  # found by probing: a LocationParseError traceback
        assert str(caught.value) == (f"the registry 127.0.0.1:{port} answered {path} with a redirect to {location!r}, "
                                     "an address that cannot be read: nothing was sent there")
    elif location:
        assert str(caught.value) == (f"the registry 127.0.0.1:{port} answered {path} with a redirect to {location!r}, "
                                     f"whose scheme {location.split(':')[0]!r} is neither https nor http")
    else:
        assert str(caught.value) == (f"the registry 127.0.0.1:{port} answered {path} with HTTP {status} and no "
                                     "Location to follow: not an answer to that request")


@pytest.mark.parametrize("redirected", ["a manifest", "a blob's upload", "a token", "to a server over TLS"])
def test_a_redirect_to_plain_http_is_followed_over_https_never_in_the_clear(tmp_path, redirected):
    """A redirect to http:// was followed in the clear, though a token realm or an upload Location named
    http:// is asked over https: a token server's redirect gave the token (push access) unencrypted, an
    upload's 307 sent the whole layer so, a manifest's read it so. A redirect to http:// is now followed
    over https, as those are: a server there that speaks plain HTTP hears no request (the error names it),
    and one that speaks TLS (a proxy that lost the forwarded scheme, naming its own https URL http://)
    answers as it should."""
    import http.server
    import threading

    heard = []

    class Clear(http.server.BaseHTTPRequestHandler):
        def answer(self):
            heard.append((self.command, self.path, self.headers.get("Authorization")))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"token": "t"}' if self.path.startswith("/token") else b"{}"
            self.send_response(200 if self.command != "PUT" else 201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = answer  # noqa: N815 - http.server's names

        def log_message(self, *args):
            pass

    clear = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Clear)
    threading.Thread(target=clear.serve_forever, daemon=True).start()
    layer = b"layer"
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()

    class Registry(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            own = self.server.server_port
            if self.path.startswith("/token"):  # the token server sends the client on to plain http
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{clear.server_port}/token")
            elif redirected == "a token" and self.headers.get("Authorization") != "Bearer t":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="https://127.0.0.1:{own}/token",service="r"')
            elif self.path.startswith("/served/"):  # what the redirect over TLS finds
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            elif self.command == "POST":
                self.send_response(202)
                self.send_header("Location", f"https://127.0.0.1:{own}/v2/team/a/blobs/uploads/1")
            else:
                self.send_response(307)
                port = own if redirected == "to a server over TLS" else clear.server_port
                self.send_header("Location", f"http://127.0.0.1:{port}/served/{self.command}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = answer  # noqa: N815 - http.server's names

    try:
        with tls_server(tmp_path, Registry) as port:
            ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
            credentials = Credentials(username="u", password="pw-never-sent", source="/x/config.json")
            with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                                push=True) as c:
                if redirected == "to a server over TLS":
                    with pytest.raises(DigestMismatch, match="with a document whose digest is sha256:44136fa3"):
                        c.manifest(DIGEST)  # ('{}', read over https from the registry the redirect named)
                else:
                    with pytest.raises(RegistryError) as caught:
                        if redirected == "a blob's upload":
                            c.upload(layer_digest, lambda: layer, "layer 1 of 1")
                        else:
                            c.manifest(DIGEST)
    finally:
        clear.shutdown()
        clear.server_close()
    assert heard == []  # nothing was sent in the clear: no request, no token, no layer
    if redirected == "a token":
        assert str(caught.value) == (f"the token server https://127.0.0.1:{port}/token named by the registry "
                                     f"127.0.0.1:{port} redirected to 127.0.0.1:{clear.server_port}, which answered "
                                     "the TLS handshake with something that is not TLS (a token server that speaks "
                                     "plain HTTP?): unibake sends no credentials and takes no token unencrypted (TLS "
                                     "is never turned off); serve the token server over HTTPS")
    elif redirected != "to a server over TLS":
        what = "uploading layer 1 of 1" if redirected == "a blob's upload" else f"reading manifest {DIGEST[:19]}"
        assert str(caught.value) == (f"the registry 127.0.0.1:{port} redirected to 127.0.0.1:{clear.server_port}, "
                                     "which answered the TLS handshake with something that is not TLS while "
                                     f"{what} (a server that speaks plain HTTP?): unibake follows a redirect to "
                                     "http:// over HTTPS and sends nothing unencrypted (TLS is never turned off)")


@pytest.mark.parametrize("status", [999, 103])
@pytest.mark.parametrize("asked", ["a blob's HEAD", "a blob's upload", "a manifest"])
def test_an_answer_whose_status_is_no_http_status_is_an_error_not_a_success(tmp_path, asked, status):
    """An answer's status runs from 200 to 599 (a 1xx is interim, and the HTTP client skips only 100
    Continue), but the HTTP client takes any three digits, and requests and python-dxf count all but 4xx
    and 5xx as success: a proxy's '999 Request denied' or a '103 Early Hints' to a blob's HEAD was
    'already in the registry' (its upload skipped), to the blob's upload 'stored', and to a manifest's
    GET a document read as the manifest (exit 3, as if tampered with). Each is now one error line naming
    the status, not retried."""
    import http.server

    layer = b"layer"
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()

    class Denying(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "POST":
                self.send_response(202)
                self.send_header("Location", "/v2/team/a/blobs/uploads/1")
            else:
                self.send_response(status, "Request denied")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_POST = do_PUT = answer  # noqa: N815 - http.server's names

    waits = []
    with tls_server(tmp_path, Denying) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", push=True,
                            retry=Retry(attempts=3, sleep=waits.append)) as c:
            with pytest.raises(RegistryError) as caught:
                if asked == "a blob's HEAD":
                    c.blob_exists(layer_digest, len(layer))
                elif asked == "a blob's upload":
                    c.upload(layer_digest, lambda: layer, "layer 1 of 1")
                else:
                    c.manifest(DIGEST)
    path = {"a blob's HEAD": f"/v2/team/a/blobs/{layer_digest}", "a blob's upload": "/v2/team/a/blobs/uploads/1",
            "a manifest": f"/v2/team/a/manifests/{DIGEST}"}[asked]
    assert str(caught.value) == (f"the registry 127.0.0.1:{port} answered {path} with HTTP {status}, which is no "
                                 "final HTTP status (they run from 200 to 599): not an answer to that request")
    assert waits == []


@pytest.mark.parametrize("storage_ca", ["among the default CAs", "in no CA given"])
def test_a_ca_file_adds_to_the_default_cas_so_a_registry_may_send_blobs_on_to_its_storage(tmp_path, monkeypatch,
                                                                                          storage_ca):
    """A private registry (its CA given with --ca-file) whose blob requests it sends on to its storage (S3, a
    CDN: a 307 to a host whose certificate a public CA signed, as registry:2 does with S3): the --ca-file was
    every host's only CA, so the first blob that was there failed the push, 'the CA certificate in --ca-file
    does not vouch for the TLS certificate of the registry', naming the registry, whose certificate it did
    vouch for. The file now adds to the default CAs (requests': here $REQUESTS_CA_BUNDLE, holding the
    storage's CA), as docker adds certs.d's to the system's; a storage host that neither vouches for is
    named, not the registry."""
    import http.server

    stored = b"layer"
    digest = "sha256:" + hashlib.sha256(stored).hexdigest()
    heard = []

    class Storage(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's name
            heard.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(stored)))
            self.end_headers()

    (tmp_path / "registry").mkdir()
    (tmp_path / "storage").mkdir()
    with tls_server(tmp_path / "storage", Storage) as storage:
        class Registry(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 - http.server's name
                self.send_response(307)
                self.send_header("Location", f"https://127.0.0.1:{storage}/bucket/blob?signature=s")
                self.send_header("Content-Length", "0")
                self.end_headers()

        with tls_server(tmp_path / "registry", Registry) as port:
            if storage_ca == "among the default CAs":
                monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "storage/cert.pem"))
            ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
            with RegistryClient(ref, credentials=None, ca_file=tmp_path / "registry/cert.pem",
                                retry=Retry(attempts=1)) as c:
                if storage_ca == "among the default CAs":
                    assert c.blob_exists(digest, len(stored))
                else:
                    with pytest.raises(RegistryError) as caught:
                        c.blob_exists(digest, len(stored))
    if storage_ca == "among the default CAs":
        assert heard == ["/bucket/blob?signature=s"]
    else:
        assert str(caught.value) == (f"the registry 127.0.0.1:{port} redirected to 127.0.0.1:{storage}, whose TLS "
                                     f"certificate neither the default CAs nor --ca-file {tmp_path}/registry/cert.pem "
                                     f"vouch for, while looking for blob {digest[:19]} (self-signed certificate): give "
                                     "that host's CA with --ca-file (it may hold several, the registry's too; TLS is "
                                     "never turned off)")


def test_a_blob_upload_the_registry_says_it_stored_as_another_digest_is_exit_3(tmp_path):
    """The answer to a blob's upload names what the registry stored (Docker-Content-Digest): one that
    names another blob than the one sent was taken as done, and the push went on to a manifest naming a
    blob the registry does not hold as it was sent. It is now exit 3, not retried; a registry that sends
    no such header, or the digest sent, is pushed to as before."""
    import http.server

    said = []

    class Storing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's names
            self.send_response(202)
            self.send_header("Location", "/v2/team/a/blobs/uploads/1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self):  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(201)
            if said[-1] == "another":
                self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(data + b"!").hexdigest())
            elif said[-1] == "the same":
                self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(data).hexdigest())
            self.send_header("Content-Length", "0")
            self.end_headers()

    digest = "sha256:" + hashlib.sha256(b"layer").hexdigest()
    waits = []
    with tls_server(tmp_path, Storing) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", push=True,
                            retry=Retry(attempts=3, sleep=waits.append)) as c:
            for answer in ("none", "the same"):
                said.append(answer)
                c.upload(digest, lambda: b"layer", "layer 1 of 1")
            said.append("another")
            with pytest.raises(DigestMismatch) as caught:
                c.upload(digest, lambda: b"layer", "layer 1 of 1")
    other = "sha256:" + hashlib.sha256(b"layer!").hexdigest()
    assert str(caught.value) == (f"the registry 127.0.0.1:{port} answered the upload of blob {digest} with "
                                 f"Docker-Content-Digest {other}: it did not store what was sent (layer 1 of 1); "
                                 "nothing was recorded")
    assert waits == []


def _reading_a_manifest_fails(tmp_path, handler) -> tuple[int, str, list]:
    """(the port of a TLS server answering with ``handler``, the one RegistryError reading a manifest
    from it gave, the waits before each retry)."""
    waits = []
    with tls_server(tmp_path, handler) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem",
                            retry=Retry(attempts=3, sleep=waits.append)) as c:
            with pytest.raises(RegistryError) as caught:
                c.manifest(DIGEST)
    return port, str(caught.value), waits


def test_a_chunked_answer_whose_chunk_length_is_no_number_is_one_error_not_retried(tmp_path):
    """A chunked answer whose chunk length is no hex number is the same answer on every try: it was retried
    as a broken connection, then 'did not answer ... (connection broken)'. It is now one error saying
    what came. (A chunk that ends early is still a broken connection, retried: that is what one looks like.)"""
    import http.server

    class Lying(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"zz\r\n{}\r\n0\r\n\r\n")

    port, said, waits = _reading_a_manifest_fails(tmp_path, Lying)
    assert said == (f"the registry 127.0.0.1:{port} answered with a chunked body whose chunk length is "
                                 f"no number ('zz') while reading manifest {DIGEST[:19]}: that answer cannot be read, "
                                 "and would come again on another try")
    assert waits == []


@pytest.mark.parametrize("asked", ["the manifest", "a token"])
def test_an_html_page_in_place_of_the_registry_s_answer_is_named_as_one(tmp_path, asked):
    """A login page or a proxy's page answering in the registry's place (200, text/html): a pull said
    'a document whose digest is sha256:...' (as if the manifest had been tampered with), a token's fetch
    '(JSONDecodeError)'. Both now say it was an HTML page, and ask whether the host is the registry."""
    import http.server

    page = b"<html><body>Sign in</body></html>"

    class Login(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if asked == "a token" and not self.path.startswith("/token"):
                return ask_for_a_token(self)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    with tls_server(tmp_path, Login) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        with RegistryClient(ref, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
            with pytest.raises(RegistryError if asked == "a token" else DigestMismatch) as caught:
                c.manifest(DIGEST)
    assert str(caught.value).endswith(f" (an HTML page, text/html: is 127.0.0.1:{port} the registry itself, or a "
                                      "login page or proxy in front of it?)"), str(caught.value)


@pytest.mark.parametrize("challenge, token, message", [
    (None, None, "with HTTP 401 .authentication required. and no WWW-Authenticate header, which must say how to log "
                 "in .* is 127.0.0.1:\\d+ the registry itself, or a proxy in front of it\\?$"),
    ("", None, "and no WWW-Authenticate header"),
    ("Bearer", None, "and a Bearer challenge whose realm .the token server's URL. is missing: 'Bearer'$"),
    ('Bearer realm=""', None, "and a WWW-Authenticate that cannot be read: 'Bearer realm=\"\"'$"),
    ('Bearer service="r"', None, "Bearer challenge whose realm .the token server's URL. is missing"),
    ('Bearer realm="/token"', None, "Bearer challenge whose realm .* is not an http or https URL: "),
    ('Bearer realm="ftp://x/token"', None, "is not an http or https URL"),
    ('Bearer abc, realm="x"', None, "a WWW-Authenticate that cannot be read"),
    ('Negotiate abc', None, "asking for 'negotiate' authentication, which unibake cannot do .Basic and Bearer"),
    ("TOKEN", b'{"access_token": ""}', "the token server https://127.0.0.1:\\d+/token named by the registry "
                                       "127.0.0.1:\\d+ answered with no token .KeyError.: a token answer is a JSON "
                                       "object with a 'token' or 'access_token' string$"),
    ("TOKEN", b'["t"]', "answered with no token .AttributeError."),
    ("TOKEN", b'{"token": 7}', "answered with no token .TypeError."),
    ("TOKEN", b"<html>", "answered with no token .JSONDecodeError."),
    ("TOKEN", b'{"token": "t\\r\\nX-Forged: 1"}', "answered with a token that is not printable ASCII, which no "
                                                  "Authorization header can carry$"),
    ("TOKEN", b'{"token": " t"}', "answered with a token that is not printable ASCII"),
])
def test_a_401_that_says_not_how_to_log_in_is_named_not_an_answer_that_cannot_be_read(tmp_path, challenge, token,
                                                                                       message):
    """A 401 with no WWW-Authenticate (a proxy's), a bare ``Bearer``, an empty realm, a token server's
    answer without a token: each was 'an answer that cannot be read (KeyError/TypeError/ValueError)';
    each is now one error naming the registry and what is missing, not retried."""
    import http.server

    asked = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            if self.path.startswith("/token"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(token)))
                self.end_headers()
                self.wfile.write(token)
                return
            if challenge == "TOKEN":
                return ask_for_a_token(self)
            self.send_response(401)
            if challenge is not None:
                self.send_header("WWW-Authenticate", challenge)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with tls_server(tmp_path, Refusing) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        credentials = Credentials(username="u", password="pw-never-shown", source="/x/config.json")
        with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=3)) as c:
            with pytest.raises(RegistryError, match=message) as caught:
                c.manifest(DIGEST)
    assert "pw-never-shown" not in str(caught.value) and "cannot be read while" not in str(caught.value)
    assert len([p for p in asked if not p.startswith("/token")]) == 1  # not retried


@pytest.mark.parametrize("lie", ["Content-Length 0", "another digest", "an HTML page", None])
def test_a_registry_that_answers_200_to_every_blob_head_still_gets_the_blobs(tmp_path, lie):
    """A registry (or a proxy, a login page) that answers "200" to every blob's HEAD: a push uploaded
    nothing, and the registry refused the manifest ('blob unknown'). A 200 whose Content-Length or
    Docker-Content-Digest is another blob's, or an HTML page, now means "not there": the blob is uploaded.
    A HEAD that names the very blob still spares its upload (None: an honest registry, pushed twice)."""
    import http.server
    import threading

    stored: dict[str, bytes] = {}
    lock = threading.Lock()

    class Lying(http.server.BaseHTTPRequestHandler):
        def reply(self, status, body=b"", **headers):
            self.send_response(status)
            for name, value in {**headers, "Content-Length": headers.get("Content_Length", str(len(body)))}.items():
                if name != "Content_Length":
                    self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802 - http.server's names
            with lock:
                found = stored.get(self.path)
            digest = self.path.rsplit("/", 1)[1]
            if lie is None:
                return self.reply(404) if found is None else \
                    self.reply(200, Content_Length=str(len(found)), Docker_Content_Digest=digest)
            said = {"Content-Length 0": {"Content_Length": "0"},
                    "another digest": {"Docker_Content_Digest": "sha256:" + "0" * 64},
                    "an HTML page": {"Content_Type": "text/html", "Content_Length": "1234"}}[lie]
            self.reply(200, **said)

        def do_GET(self):  # noqa: N802
            with lock:
                found = stored.get(self.path)
            self.reply(200, found, Content_Type=OCI_MANIFEST) if found is not None else self.reply(404)

        def do_POST(self):  # noqa: N802
            self.reply(202, Location="/v2/team/a/blobs/uploads/1")

        def do_PUT(self):  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            path, _, query = self.path.partition("?")
            with lock:
                if path.startswith("/v2/team/a/blobs/uploads/"):
                    stored["/v2/team/a/blobs/" + query.split("digest=")[1].replace("%3A", ":")] = data
                    return self.reply(201)
                document = json.loads(data)
                if any(f"/v2/team/a/blobs/{d['digest']}" not in stored for d in [document["config"],
                                                                                 *document["layers"]]):
                    return self.reply(400, b'{"errors": [{"code": "MANIFEST_BLOB_UNKNOWN", "message": "blob unknown '
                                           b'to registry"}]}')
                stored[path] = stored[f"/v2/team/a/manifests/sha256:{hashlib.sha256(data).hexdigest()}"] = data
            self.reply(201)

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    with tls_server(tmp_path, Lying) as port:
        target = parse_reference(f"127.0.0.1:{port}/team/a", what="--to", digest=False)
        with RegistryClient(target, credentials=None, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                            push=True) as c:
            first = push_release(folder, manifest, target, c, temp_dir=tmp_path)
            again = push_release(folder, manifest, target, c, temp_dir=tmp_path)
    blobs = [path for path in stored if "/blobs/" in path]
    assert len(blobs) == len(manifest.diff_ids) + 1  # every layer and the config
    assert (first.uploaded, first.present) == (len(manifest.diff_ids), 0)
    assert (again.uploaded, again.present) == ((0, len(manifest.diff_ids)) if lie is None else
                                               (len(manifest.diff_ids), 0))


@pytest.fixture
def credential_helper(tmp_path, monkeypatch):
    """``install(helper, timeout)``: docker-credential-unibake-test on PATH (a shell script that reads what
    it is sent, then runs the shell line ``helper``), named by a Docker config's credsStore, and
    HELPER_TIMEOUT set to ``timeout``; returns the environment naming that config, for load_credentials."""
    from unibake import registry

    def install(helper, timeout):
        monkeypatch.setattr(registry, "HELPER_TIMEOUT", timeout)
        (tmp_path / "bin").mkdir()
        script = tmp_path / "bin" / "docker-credential-unibake-test"
        script.write_text(f"#!/bin/sh\ncat >/dev/null\n{helper}\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        (tmp_path / "dc").mkdir()
        (tmp_path / "dc" / "config.json").write_text(json.dumps({"auths": {}, "credsStore": "unibake-test"}))
        return {"DOCKER_CONFIG": str(tmp_path / "dc")}
    return install


@pytest.mark.parametrize("helper, timeout, message", [
    # (ended, not waited for: its sleep is as long as the test's bound below)
    ("exec sleep 60", 1.0, "did not answer in 1 s .it was ended.: check it with 'echo reg.example:5000 | "
                           "docker-credential-unibake-test get', or give --auth-file$"),
    # (the helpers that answer at once get time enough to start on a loaded machine)
    ("echo 'not JSON'", 60.0, "answered with no credential .a JSON object with 'Username' and 'Secret' strings."),
    ("echo '[1]'", 60.0, "answered with no credential"),
    ("""echo '{"Username": "u", "Secret": 5}'""", 60.0, "answered with no credential"),
    ("""echo '{"Username": ["u"], "Secret": "pw"}'""", 60.0, "answered with no credential"),
])
def test_a_credential_helper_that_never_answers_or_answers_no_credential_is_named(tmp_path, credential_helper, helper,
                                                                                   timeout, message):
    """A credential helper that hangs (a keyring that never unlocks): docker-py ran it without a time
    limit, and push and pull waited with nothing said. It now has HELPER_TIMEOUT (here 1 s) and is
    ended; one that answers what is no credential was 'its 'auth' must be user:password in base64'."""
    env = credential_helper(helper, timeout)
    started = time.monotonic()
    with pytest.raises(UnibakeError, match=f"^{tmp_path}/dc/config.json: the credential helper for reg.example:5000, "
                                           f"docker-credential-unibake-test, {message}"):
        load_credentials("reg.example:5000", env, None)
    assert time.monotonic() - started < 50


def test_a_chunked_answer_whose_chunk_length_line_never_ends_is_one_error_not_retried(tmp_path):
    """A chunk length line longer than the HTTP client reads (64 KiB: ``1;`` and an endless extension)
    is the same answer on every try: it was retried as a broken connection, five attempts, then 'did
    not answer ... (connection broken)'. It is now one error saying what came."""
    import http.server

    class Endless(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                self.wfile.write(b"1;" + b"x" * (1 << 20))
            except OSError:
                pass

    port, said, waits = _reading_a_manifest_fails(tmp_path, Endless)
    assert said == (f"the registry 127.0.0.1:{port} answered with a chunked body whose chunk length line "
                                 f"is longer than the {1 << 16} bytes an HTTP client reads while reading manifest "
                                 f"{DIGEST[:19]}: that answer cannot be read, and would come again on another try")
    assert waits == []


def test_a_chunked_answer_whose_trailer_line_never_ends_is_one_error_not_retried(tmp_path):
    """After a chunked body's last chunk come its trailer lines, each read up to 64 KiB: a longer one (a
    manifest whole, then 'X-T: ' and 70 kB) is the same answer on every try, and it was retried as a
    broken connection, then 'did not answer ... (connection broken)'. It is now one error saying what came."""
    import http.server

    class Trailing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                 b"2\r\n{}\r\n0\r\nX-T: " + b"t" * 70000 + b"\r\n\r\n")
            except OSError:
                pass

    port, said, waits = _reading_a_manifest_fails(tmp_path, Trailing)
    assert said == (f"the registry 127.0.0.1:{port} answered with a chunked body whose trailer line (after "
                                 f"its last chunk) is longer than the {1 << 16} bytes an HTTP client reads while reading "
                                 f"manifest {DIGEST[:19]}: that answer cannot be read, and would come again on another "
                                 "try")
    assert waits == []


def test_a_registry_that_speaks_plain_http_is_named_as_such_not_retried_as_one_that_is_down(tmp_path):
    """A registry served over plain HTTP (registry:2 without TLS, on localhost:5000): the TLS handshake
    gets an HTTP answer, which was retried as a broken connection, then 'did not answer ... (connection
    broken) ...; run the command again when the registry is back', as if it were down. It is now one
    error that says the answer was not TLS, at once."""
    import http.server
    import threading

    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    waits = []
    try:
        ref = Reference(host=f"127.0.0.1:{server.server_port}", path="team/a")
        with RegistryClient(ref, credentials=None, ca_file=None, retry=Retry(attempts=3, sleep=waits.append)) as c:
            with pytest.raises(RegistryError) as caught:
                c.blob_exists(DIGEST)
    finally:
        server.shutdown()
        server.server_close()
    assert str(caught.value) == (f"the registry 127.0.0.1:{server.server_port} answered the TLS handshake with something "
                                 f"that is not TLS while looking for blob {DIGEST[:19]} (a registry that speaks plain "
                                 "HTTP?): unibake reaches a registry over HTTPS only (TLS is never turned off); serve "
                                 "it over TLS (a private CA: --ca-file)")
    assert waits == []


@pytest.mark.parametrize("helper, message", [
    # prints 2 MiB and never ends: its whole output was kept, HELPER_TIMEOUT long (a helper printing
    # without end filled memory), then it was 'did not answer'
    ("head -c 2097152 /dev/zero | tr '\\0' x; exec sleep 120",
     "answered with more than 1024 KiB .it was ended., which is no credential: check it with"),
    # fails with bytes that are no UTF-8: docker-py's strict decoding was 'its 'auth' must be ... base64'
    ("printf 'bad \\377 bytes'; exit 1", "failed .DockerException.$"),
])
def test_a_credential_helper_printing_without_end_or_no_utf8_is_named(tmp_path, credential_helper, helper, message):
    # (a HELPER_TIMEOUT far longer than the bound: the endless one is ended at 1 MiB, not at its timeout)
    env = credential_helper(helper, 60.0)
    started = time.monotonic()
    with pytest.raises(UnibakeError, match=f"^{tmp_path}/dc/config.json: the credential helper for reg.example:5000"
                                           f"(, docker-credential-unibake-test,)? {message}"):
        load_credentials("reg.example:5000", env, None)
    assert time.monotonic() - started < 30


def test_a_token_server_on_plain_http_is_refused_before_the_password_is_sent(tmp_path):
    """A registry over TLS whose 401 names a token server on plain http:// (python-dxf asks it over
    https all the same): the error was 'the registry 127.0.0.1:PORT answered the TLS handshake with
    something that is not TLS', naming the registry, which does speak TLS. It is now one error naming
    the token server's URL; what it was sent was a TLS handshake, never the credentials. (A realm named
    http:// whose server speaks TLS, a proxy's misnamed https URL, still works: python-dxf asks it over
    https.)"""
    import http.server
    import threading

    seen = []

    class TokenServer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            body = b'{"token": "t"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenServer)
    threading.Thread(target=plain.serve_forever, daemon=True).start()

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.headers.get("Authorization") == "Bearer t":
                self.send_response(404)
            else:
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{plain.server_port}/token",'
                                                     'service="registry"')
            self.send_header("Content-Length", "0")
            self.end_headers()

    try:
        with tls_server(tmp_path, Registry) as port:
            ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
            credentials = Credentials(username="u", password="pw-never-shown", source="/x/config.json")
            with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem",
                                retry=Retry(attempts=1)) as c:
                with pytest.raises(RegistryError, match=f"^the token server http://127.0.0.1:{plain.server_port}"
                                                        f"/token named by the registry 127.0.0.1:{port} answered "
                                                        "the TLS handshake with something that is not TLS .a token "
                                                        "server that speaks plain HTTP.*: unibake sends no "
                                                        "credentials and takes no token unencrypted"):
                    c.manifest(DIGEST)
    finally:
        plain.shutdown()
    assert seen == []


def test_a_token_realm_named_http_whose_server_speaks_tls_still_works(tmp_path):
    """A proxy in front of a registry that names its own https token URL http:// (a forwarded scheme
    lost): python-dxf asks it over https, and unibake does too; the token is taken and used."""
    import http.server

    seen = []

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.startswith("/token"):
                seen.append(("token", self.headers.get("Authorization")))
                body = b'{"token": "t"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            seen.append(("registry", self.headers.get("Authorization")))
            if self.headers.get("Authorization") == "Bearer t":
                self.send_response(404)
            else:
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{self.server.server_port}'
                                                     '/token",service="registry"')
            self.send_header("Content-Length", "0")
            self.end_headers()

    with tls_server(tmp_path, Registry) as port:
        ref = parse_reference(f"127.0.0.1:{port}/team/a@{DIGEST}", what="ref", digest=True)
        credentials = Credentials(username="u", password="pw", source="/x/config.json")
        with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
            with pytest.raises(UnibakeError) as caught:
                c.manifest(DIGEST)
    assert "token server" not in str(caught.value), str(caught.value)
    assert ("token", "Basic dTpwdw==") in seen and ("registry", "Bearer t") in seen, seen


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent (after the kill of its own parent: init's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


@pytest.mark.parametrize("end", ["timeout", "interrupt"])
def test_a_credential_helpers_child_is_ended_with_it(tmp_path, credential_helper, end):
    """A helper that started a child of its own (a keyring's agent, a pinentry) and waits on it: the
    helper alone was killed, on its timeout and on an interrupt, and its child ran on until it ended.
    Both are now ended, by their PIDs."""
    import signal

    env = credential_helper(f"sleep 300 & echo $! > {tmp_path}/child; wait", 2.0 if end == "timeout" else 60.0)
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if end == "interrupt":
            signal.setitimer(signal.ITIMER_REAL, 2.0)
        with pytest.raises(KeyboardInterrupt if end == "interrupt" else UnibakeError):
            load_credentials("reg.example:5000", env, None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)  # (the test's own child's child: not left behind when the test fails)
    assert not alive, "the helper's child runs on"


def test_push_and_deploy_show_the_archive_read_of_their_verify_stage(tmp_path, cli, monkeypatch):
    # push and deploy --from archive verify the folder first: every byte of the archive read, hashed and its zstd
    # frames checked (minutes for 30 GiB), with no progress at all (verify itself showed it)
    import itertools

    folder, _ = make_release(tmp_path / "release", layers=[layer_tar({"a": os.urandom(1 << 20)})])
    clock = itertools.count(0.0, 6.0)  # (every counter's step is past its 5 s: each prints its line)
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    pushed = cli("push", str(folder), "--to", "127.0.0.1:1/team/a", "--retries", "0")
    deployed = cli("deploy", str(folder), "--engine", f"unix://{tmp_path}/nothing.sock")
    for result, code in ((pushed, 1), (deployed, 3)):
        lines = result.err.splitlines()
        verify = lines.index(next(line for line in lines if line.startswith("==> verify")))
        assert result.code == code and lines[verify + 1].startswith("    read archive: "), result.err


@pytest.mark.parametrize("atomic", [True, False])
def test_an_interrupt_while_a_push_is_recorded_lands_after_the_folder_and_its_record_are_whole(tmp_path, monkeypatch,
                                                                                                atomic):
    # (before: without an atomic exchange, a SIGINT after the first file was renamed in left manifest.json new
    # and SHA256SUMS old, so the folder failed verify; with one, a SIGINT right after it left checksums/ with
    # the old listing, which no later push updates: it records the push already)
    import signal

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    exchange, replace = amend._exchange, os.replace

    def exchanged_then_interrupted(a, b):
        if not atomic:
            return False
        done = exchange(a, b)
        signal.raise_signal(signal.SIGINT)
        return done

    def replaced_then_interrupted(src, dst):
        replace(src, dst)
        if os.path.dirname(dst) == str(folder):
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(amend, "_exchange", exchanged_then_interrupted)
    monkeypatch.setattr(os, "replace", replaced_then_interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert not verify_folder(folder).failures and load_manifest(folder).registry == (record,)
    assert (tmp_path / "checksums" / "1.3.1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()
    assert sorted(os.listdir(tmp_path / "checksums")) == ["1.3.1.SHA256SUMS"]
    assert not (folder.parent / f".{folder.name}.amend").exists()


@pytest.mark.parametrize("errno_", ["ENOSPC", "EACCES"])
def test_a_checksums_record_that_cannot_be_written_after_the_push_is_recorded_says_the_folder_records_it(
        tmp_path, monkeypatch, errno_, cli):
    # (before: error: .../checksums/1.3.1.SHA256SUMS: No space left on device, as if nothing had been recorded;
    # a second push then said "the release already records this push" and never wrote the record)
    import errno

    from unibake import files

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    record = push_release(folder, manifest, parse_reference("r.example/a", what="--to", digest=False),
                          RecordingClient(), temp_dir=tmp_path).record
    old_record = (tmp_path / "checksums" / "1.3.1.SHA256SUMS").read_bytes()
    real = files.open_new

    def full_in_checksums(path, *args, **kwargs):
        if path.parent == tmp_path / "checksums":
            raise OSError(getattr(errno, errno_), os.strerror(getattr(errno, errno_)), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files, "open_new", full_in_checksums)
    with pytest.raises(UnibakeError) as failed:
        amend.amend_release(folder, merge_record(manifest, record), read_sums(folder), tmp_path / "checksums")
    monkeypatch.undo()
    record_path = tmp_path / "checksums" / "1.3.1.SHA256SUMS"
    assert str(failed.value) == (
        f"the push was recorded in {folder}, but its checksums record {record_path} was not updated "
        f"({os.strerror(getattr(errno, errno_))}): copy {folder / 'SHA256SUMS'} there"), failed.value
    assert not verify_folder(folder).failures and load_manifest(folder).registry == (record,)
    assert record_path.read_bytes() == old_record and os.listdir(tmp_path / "checksums") == ["1.3.1.SHA256SUMS"]


def test_an_interrupt_inside_popen_as_a_credential_helper_starts_still_ends_the_helper(tmp_path, credential_helper,
                                                                                     monkeypatch):
    # an interrupt inside subprocess.Popen's __init__, once the helper is made: the Popen object is never returned,
    # so nothing ended it (before: a helper waiting on a keyring or a pinentry ran on after the run had ended)
    from unibake import registry

    env = credential_helper("exec sleep 300", 60.0)
    started = signal_inside_popen(monkeypatch, registry, lambda args: args[0].endswith("docker-credential-unibake-test"))
    try:
        with terminated_as_the_cli():
            with pytest.raises(KeyboardInterrupt):
                load_credentials("reg.example:5000", env, None)
            assert len(started) == 1
            assert child_ended(started[0]), "the credential helper runs on"
    finally:
        kill_children(started)


@pytest.mark.parametrize("spooled", ["push", "digest check"])
def test_an_interrupt_as_the_push_s_spool_folder_is_made_leaves_no_folder(tmp_path, monkeypatch, spooled):
    # (before: the spool folder was made before the try that removes it: a Ctrl-C or SIGTERM as mkdtemp returned left
    # an empty unibake-push-* / unibake-check-* folder in the temporary folder)
    import signal
    import tempfile

    from unibake import registry
    from unibake.registry import pushed_manifest_digest

    folder, _ = make_release(tmp_path / "release")
    manifest = load_manifest(folder)
    target = parse_reference("reg.example:5000/team/demo-llm", what="--to", digest=False)
    spool = tmp_path / "spool"
    spool.mkdir()
    real = tempfile.mkdtemp

    def made_then_interrupted(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the folder is there; the signal lands as mkdtemp returns it
        return made

    monkeypatch.setattr(registry.tempfile, "mkdtemp", made_then_interrupted)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            if spooled == "push":
                push_release(folder, manifest, target, RecordingClient(), temp_dir=spool)
            else:
                pushed_manifest_digest(folder, manifest, "gzip", temp_dir=spool)
    assert os.listdir(spool) == []


def _heard_server(tmp_path, heard, answer):
    """A registry (an http.server handler class) that keeps each request's method, path and Authorization in
    ``heard`` and answers with ``answer(handler)``."""
    import http.server

    class Heard(http.server.BaseHTTPRequestHandler):
        def handle_one(self):
            heard.append((self.command, self.path.split("?")[0], self.headers.get("Authorization")))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer(self)

        do_GET = do_HEAD = do_POST = do_PUT = handle_one  # noqa: N815 - http.server's names

    return Heard


def _answer(handler, status, body=b"", **headers):
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize("given", [None, "an auth file"])
def test_the_credentials_of_netrc_go_to_no_registry_and_no_host_it_redirects_to(tmp_path, monkeypatch, given):
    # found by probing: requests added ~/.netrc's login (a `default` entry too) to every request, before any 401,
    # and to every redirect whatever host it named; it also replaced the auth file's Basic header with its own.
    # docker reads no netrc: unibake's credentials come from the Docker config or --auth-file alone
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login netrcuser password netrc-secret\n"
                     "default login netrcuser password netrc-default-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    heard_elsewhere, heard = [], []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    wanted = "Basic " + base64.b64encode(b"u:pw").decode()
    with tls_server(tmp_path / "b", _heard_server(tmp_path, heard_elsewhere, lambda h: _answer(h, 200))) as other:
        def registry(handler):
            if given and handler.headers.get("Authorization") != wanted:
                return _answer(handler, 401, WWW_Authenticate='Basic realm="registry"')
            _answer(handler, 307, Location=f"https://127.0.0.1:{other}/elsewhere")

        with tls_server(tmp_path / "a", _heard_server(tmp_path, heard, registry)) as port:
            (tmp_path / "ca.pem").write_bytes((tmp_path / "a/cert.pem").read_bytes() +
                                              (tmp_path / "b/cert.pem").read_bytes())
            ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
            credentials = Credentials(username="u", password="pw", source="/x/auth.json") if given else None
            with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "ca.pem",
                                retry=Retry(attempts=1)) as c:
                c.blob_exists(DIGEST)
    sent = [auth for _, _, auth in heard + heard_elsewhere]
    assert not any(auth and "netrc" in base64.b64decode(auth.split()[-1]).decode() for auth in sent), sent
    assert [auth for _, _, auth in heard] == ([None, wanted] if given else [None])
    assert [(command, path, auth) for command, path, auth in heard_elsewhere] == [("HEAD", "/elsewhere", None)]


@pytest.mark.parametrize("realm", ["Basic", "Bearer"])
@pytest.mark.parametrize("password", ["s3cret-pw", "s3cret-pw" + "k" * 3300])
def test_a_registry_that_echoes_the_credentials_in_its_error_gets_them_shown_as_stars(tmp_path, realm, password):
    # found by probing: a registry (or its token server) that put the Authorization it was sent into its error
    # message had it printed, the password in CI logs and in the --json error. A token of kilobytes used as the
    # password (a cloud registry's) was cut at 4096 characters before it was hidden: its base64 was shown
    heard = []

    def registry(handler):
        sent = handler.headers.get("Authorization") or ""
        if handler.path.startswith("/token"):
            decoded = base64.b64decode(sent.split()[-1]).decode() if sent else ""
            return _answer(handler, 400, json.dumps({"errors": [{"code": "DENIED", "message":
                           f"bad credentials {decoded} ({sent})"}]}).encode())
        if not sent:
            if realm == "Bearer":
                return ask_for_a_token(handler)
            return _answer(handler, 401, WWW_Authenticate='Basic realm="registry"')
        decoded = base64.b64decode(sent.split()[-1]).decode()
        _answer(handler, 400, json.dumps({"errors": [{"code": "DENIED", "message":
                f"bad credentials {decoded} ({sent}); pw {password}"}]}).encode())

    with tls_server(tmp_path, _heard_server(tmp_path, heard, registry)) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
        credentials = Credentials(username="u", password=password, source="/x/auth.json")
        with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1),
                            push=True) as c:
            with pytest.raises(RegistryError) as raised:
                c.manifest(DIGEST)  # (a GET: an answer to a HEAD has no body to say anything in)
    said = str(raised.value)
    assert "s3cret" not in said and base64.b64encode(f"u:{password}".encode()).decode()[:24] not in said, said
    assert "bad credentials *** (Basic ***)" in said, said


def test_an_empty_token_is_said_to_be_the_token_server_s_not_the_user_s_credentials(tmp_path):
    # found by probing: {"token": ""} was sent as 'Bearer ' and ended as "refused the credentials ...; log in
    # with 'docker login'", sending the user to log in again for the token server's fault
    heard = []

    def registry(handler):
        if handler.path.startswith("/token"):
            return _answer(handler, 200, b'{"token": ""}', Content_Type="application/json")
        ask_for_a_token(handler)

    with tls_server(tmp_path, _heard_server(tmp_path, heard, registry)) as port:
        ref = Reference(host=f"127.0.0.1:{port}", path="team/a")
        credentials = Credentials(username="u", password="pw", source="/x/auth.json")
        with RegistryClient(ref, credentials=credentials, ca_file=tmp_path / "cert.pem", retry=Retry(attempts=1)) as c:
            with pytest.raises(RegistryError, match=f"the token server https://127.0.0.1:{port}/token named by the "
                                                    "registry 127.0.0.1:.* answered with an empty token") as raised:
                c.blob_exists(DIGEST)
    assert not isinstance(raised.value, RegistryAuthError)
    assert [auth for _, path, auth in heard if not path.startswith("/token")] == [None]  # no 'Bearer ' sent


def test_a_push_reaches_the_registry_before_it_compresses_and_an_unknown_host_is_not_retried(cli, tmp_path):
    # found by probing: every layer was compressed first (minutes for a big image), then a typo in the host was
    # retried and said as "did not answer ... run the command again when the registry is back"
    folder, _ = make_release(tmp_path / "release")
    (tmp_path / "spool").mkdir()
    down = cli("push", str(folder), "--to", "127.0.0.1:1/team/a", "--retries", "0", "--temp-dir",
               str(tmp_path / "spool"))
    assert down.code == 1 and "compressing the layers" not in down.err, down.err
    assert "did not answer while looking for blob" in down.error_lines[-1]
    unknown = cli("push", str(folder), "--to", "unibake-no-such-host.invalid:5000/team/a", "--retries", "3")
    assert unknown.code == 1 and "retrying" not in unknown.err and "compressing the layers" not in unknown.err
    assert unknown.error_lines == ["error: the host name of the registry unibake-no-such-host.invalid:5000 does not "
                                  f"resolve (no such host) while looking for blob {load_manifest(folder).image_id[:19]}"
                                  ": check the name given"], unknown.err
    assert os.listdir(tmp_path / "spool") == []


@pytest.mark.parametrize("command", ["push", "pull"])
def test_a_temp_dir_inside_the_release_folder_is_refused_before_anything_is_sent(cli, tmp_path, command):
    # found by probing: `push REL --temp-dir REL` spooled the layers into the release folder; killed, they stayed
    # there, a folder the release does not list, and every later push refused the folder
    folder, _ = make_release(tmp_path / "release")
    if command == "pull":  # (a push refuses a folder holding one, before its --temp-dir is looked at)
        (folder / "spool").mkdir()
    ref = "127.0.0.1:1/team/a" + ("@" + DIGEST if command == "pull" else "")
    args = [str(folder), "--to", ref] if command == "push" else [ref, "--release", str(folder)]
    for temp in (folder, folder / "spool") if command == "pull" else (folder,):
        result = cli(command, *args, "--temp-dir", str(temp), "--retries", "0")
        assert result.code == 2 and result.error_lines == [
            f"error: --temp-dir {temp}: inside the release folder {folder}, which holds only the release's files; give "
            "a folder outside it"], result.err


def test_a_ca_bundle_variable_naming_no_file_is_said_before_the_push(cli, tmp_path, monkeypatch):
    # found by probing: REQUESTS_CA_BUNDLE=/nonexistent was 'error: a file: Could not find a suitable TLS CA
    # certificate bundle', after every layer was compressed
    folder, _ = make_release(tmp_path / "release")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "nonexistent.pem"))
    result = cli("push", str(folder), "--to", "127.0.0.1:1/team/a", "--retries", "0")
    assert result.code == 2 and result.error_lines == [
        f"error: REQUESTS_CA_BUNDLE={tmp_path}/nonexistent.pem (from the environment): no such file or folder; unset "
        "it, or give --ca-file"], result.err
