"""The release folder: complete or absent, sums last, notes and run.sh a downloader can follow."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from unibake.archive import write_archive
from unibake.archive_reader import read_back
from unibake.errors import InputError, UnibakeError
from unibake.manifest import ChatCheck, GateResult, GateStep, Validation
from unibake.metadata import ImageMetadata
from unibake.publish import ReleaseFolder, build_manifest, previous_release, publish, record_temp, render_files

from ..savefixtures import docker_layout, layer_tar, oci_layout

METADATA = {
    "product": "demo-llm", "version": "1.3.1", "tag": "demo-llm:1.3.1", "default_profile": "tp4",
    "launch": {"port": 30000, "model_name": "demo-llm", "mounts": {"target": "/models/target", "draft": "/models/draft"}},
    "profiles": {
        "tp1": {"gpus": 1, "vendor": "nvidia", "kernels": ["/k/a.so"], "tune_caches": 3, "sidecars": [], "args": [],
                "smoke": {"expect_reply": "UNIFIED_TP1_OK", "prompt": "p", "timeout": 60}},
        "tp2": {"gpus": 2, "vendor": "nvidia", "kernels": ["/k/a.so"], "tune_caches": 7, "args": [],
                "sidecars": [{"name": "flash_attn", "version": "260602"}],
                "smoke": {"expect_reply": "UNIFIED_TP2_OK", "prompt": "p", "timeout": 60}},
        "tp4": {"gpus": 4, "vendor": "amd", "kernels": ["/k/a.so"], "tune_caches": 5, "sidecars": [], "args": [],
                "smoke": {"expect_reply": "UNIFIED_TP4_OK", "prompt": "p", "timeout": 60}},
    },
    "components": [{"kind": "engine", "name": "demo-engine", "version": "0.5.12", "digest": "a" * 64, "profile": ""},
                   {"kind": "tune_caches", "name": "tp2", "version": "7", "digest": "b" * 64, "profile": "tp2"}],
}
PASSED = Validation(round_trip=None, round_trip_skipped="skipped with --no-roundtrip", smoke=(
    GateResult(profile="tp1", steps=(GateStep(name="self-check", passed=True, seconds=0.2),
                                     GateStep(name="chat", passed=True, seconds=0.1))),), smoke_skipped=None)


def make_release(out, tag="1.3.1", metadata=METADATA, *, split=None, force=False, layers=None, notes=None,
                 image_labels=None, gzip_layers=False, validation=PASSED):
    if gzip_layers:  # saved as an engine's containerd store can save them: layers kept gzip-compressed
        data, image_id, _ = oci_layout(*([layers] if layers else []), tag=f"demo-llm:{tag}", gzip_layers=True)
    else:
        data, image_id, _ = docker_layout(*([layers] if layers else []), tag=f"demo-llm:{tag}", labels=image_labels,
                                          architecture=metadata.get("platform", "linux/amd64").split("/")[1])
    with ReleaseFolder(out, tag, force=force) as folder:
        return publish_into(folder, out.parent / "checksums", data, metadata=metadata, split=split, notes=notes,
                            validation=validation), image_id


def publish_into(folder, checksums, data=None, *, metadata=METADATA, split=None, notes=None, validation=PASSED):
    """A release of the image saved as ``data`` (default: a small one) written in ``folder`` and committed."""
    tag, out = folder.tag, folder.out
    data = data if data is not None else docker_layout(tag=f"demo-llm:{tag}")[0]
    archive = write_archive([data], folder.staging, f"demo-llm-{tag}.tar.zst", tag=f"demo-llm:{tag}", split=split)
    back = read_back(archive)
    meta = ImageMetadata.model_validate_json(json.dumps(metadata))
    previous = previous_release(out, "demo-llm", tag, meta)
    manifest = build_manifest(product="demo-llm", tag=tag, image_ref=f"demo-llm:{tag}", archive=archive,
                              digests=back, metadata=meta,
                              labels={"org.opencontainers.image.version": tag}, previous=previous, notes=notes,
                              attachments={a.name: a.read() for a in notes.attachments} if notes else None)
    files = {**render_files(manifest, validation, previous, notes),
             **({a.name: a.read() for a in notes.attachments} if notes else {})}
    return publish(folder, archive, back, files, checksums)


def test_a_release_folder_is_complete_and_its_sums_pass(tmp_path):
    folder, image_id = make_release(tmp_path / "release")
    assert sorted(os.listdir(folder)) == ["IMAGE_ID", "README-DIST.md", "RELEASE_NOTES.md", "SHA256SUMS", "VALIDATION.json",
                                          "demo-llm-1.3.1.tar.zst", "manifest.json", "run.sh"]
    subprocess.run(["sha256sum", "--quiet", "--strict", "-c", "SHA256SUMS"], cwd=folder, check=True)
    listed = [line.split("  ")[1] for line in (folder / "SHA256SUMS").read_text().splitlines()]
    assert sorted(listed) == sorted(set(os.listdir(folder)) - {"SHA256SUMS"})
    assert (tmp_path / "checksums/1.3.1.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()
    assert (folder / "IMAGE_ID").read_text() == image_id + "\n"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["image_id"] == image_id and manifest["default_profile"] == "tp4"
    assert manifest["archive"]["files"][0]["name"] == "demo-llm-1.3.1.tar.zst"
    assert {"uncompressed_bytes", "uncompressed_sha256", "sha256", "bytes"} <= set(manifest["archive"])
    assert [p for p in os.listdir(tmp_path / "release") if not p.startswith(".")] == ["1.3.1"]



def test_the_notes_say_a_prompt_without_an_expected_reply_needed_a_non_empty_one(tmp_path):
    chat = ChatCheck(prompt="Say it.", match="exact", expect=None, reply="hello", passed=True, seconds=0.1)
    validation = PASSED.model_copy(update={"smoke": (PASSED.smoke[0].model_copy(update={"chats": (chat,)}),)})
    folder, _ = make_release(tmp_path / "release", validation=validation)
    row = next(line for line in (folder / "RELEASE_NOTES.md").read_text().splitlines() if "Say it." in line)
    assert "(any non-empty reply)" in row

def test_the_notes_carry_every_digest_and_the_import_command(tmp_path):
    folder, image_id = make_release(tmp_path / "release")
    notes = (folder / "RELEASE_NOTES.md").read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert image_id in notes and manifest["archive"]["sha256"] in notes
    assert "zstd -dc demo-llm-1.3.1.tar.zst | docker load" in notes
    assert "sha256sum -c SHA256SUMS" in notes
    assert ("| `tp2` | 2 | 1 | nvidia | 1 | `flash_attn` `260602` | 7 | 0 keys, `e3b0c44298fc` | `./run.sh tp2` |"
            in notes)
    assert "Round trip: **not run** (skipped with --no-roundtrip)" in notes
    assert f"({manifest['archive']['bytes']} bytes)" in notes


def test_every_run_sh_line_of_the_guides_works_when_the_default_profile_spans_nodes(tmp_path):
    # tp4, the default, runs on 2 nodes: run.sh refuses it without NODE_RANK and MASTER_ADDR, so a line
    # that starts it must give them (the notes' table, the guide's "needs GPUs" and roll-back lines did not)
    import re
    import shlex

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"]["topology"] = {"nodes": 2, "network": "host", "rdma": True}
    make_release(tmp_path / "release", "1.3.0", metadata)
    folder, _ = make_release(tmp_path / "release", "1.3.1", metadata)
    lines = []
    for name in ("README-DIST.md", "RELEASE_NOTES.md"):
        text = (folder / name).read_text()
        lines += [m.group(1) for m in re.finditer(r"(?:^|`)((?:[A-Z_]+=\S+ )*\./run\.sh [^`\n#]*tp4)", text, re.M)]
    assert len(lines) >= 6, lines
    for line in lines:
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words[:words.index("./run.sh")])
        args = [w for w in words[words.index("./run.sh") + 1:] if w != "--dry-run"]
        run = subprocess.run(["sh", "./run.sh", "--dry-run", *args], cwd=folder, capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"], **env})
        assert run.returncode == 0, (line, run.stderr)


def test_the_next_release_names_the_previous_one_and_how_to_roll_back(tmp_path):
    make_release(tmp_path / "release", "1.3.0")
    changed = json.loads(json.dumps(METADATA))
    changed["components"][1]["digest"] = "c" * 64
    folder, _ = make_release(tmp_path / "release", "1.3.1", changed)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "## Changes since 1.3.0" in notes
    assert "| tune_caches `tp2` | tp2 | `7 bbbbbbbbbbbb` | `7 cccccccccccc` |" in notes
    assert "IMAGE=demo-llm:1.3.0 ./run.sh tp4" in notes
    assert json.loads((folder / "manifest.json").read_text())["previous"] == "1.3.0"


@pytest.mark.parametrize("change", ["gpus and vendor", "a mount renamed", "nothing run.sh reads"])
def test_a_roll_back_to_a_release_that_runs_otherwise_names_its_own_run_sh_not_image_with_this_one(tmp_path, change):
    # found by review: 1.3.0's tp4 was AMD on 4 GPUs with its weights at /models/target; 1.3.1's, NVIDIA on 8 with a
    # mount "weights": the guide's IMAGE=demo-llm:1.3.0 ./run.sh tp4 gave the old image 8 NVIDIA GPUs, no /dev/kfd,
    # and its weights where the old engine does not look
    make_release(tmp_path / "release", "1.3.0")
    changed = json.loads(json.dumps(METADATA))
    if change == "gpus and vendor":
        changed["profiles"]["tp4"].update(gpus=8, vendor="amd")
    elif change == "a mount renamed":
        changed["launch"]["mounts"] = {"weights": "/models/target", "draft": "/models/draft"}
    else:
        changed["components"][1]["digest"] = "c" * 64
    folder, _ = make_release(tmp_path / "release", "1.3.1", changed)
    notes, guide = ((folder / name).read_text() for name in ("RELEASE_NOTES.md", "README-DIST.md"))
    alike = change == "nothing run.sh reads"
    assert ("IMAGE=demo-llm:1.3.0 ./run.sh tp4" in notes) == alike and ("IMAGE=demo-llm:1.3.0 ./run.sh" in guide) == alike
    if not alike:
        assert "with its own `run.sh` (`release/1.3.0/run.sh tp4`: its\n`tp4` runs otherwise than this release's" in notes
        assert "roll back with 1.3.0's own\n`run.sh`, in its release folder" in guide, guide


def _selection(names, default, platform="linux/amd64", tp8=False):
    """METADATA cut to the profiles ``names`` (tp8 added when asked), with ``default`` as default."""
    meta = json.loads(json.dumps(METADATA))
    if tp8:
        meta["profiles"]["tp8"] = {**meta["profiles"]["tp4"], "gpus": 8}
        meta["components"].append({"kind": "tune_caches", "name": "tp8", "version": "1", "digest": "d" * 64,
                                   "profile": "tp8"})
    meta["profiles"] = {k: v for k, v in meta["profiles"].items() if k in names}
    meta["components"] = [c for c in meta["components"] if not c["profile"] or c["profile"] in names]
    meta["default_profile"], meta["platform"] = default, platform
    return meta


def test_a_release_follows_the_newest_one_that_can_roll_it_back(tmp_path):
    out = tmp_path / "release"
    make_release(out, "1.3.0", _selection({"tp1", "tp2", "tp4"}, "tp4"))
    make_release(out, "1.3.0-tp2", _selection({"tp2"}, "tp2"))
    make_release(out, "1.3.0-arm64", _selection({"tp1", "tp2", "tp4"}, "tp4", platform="linux/arm64"))
    # the first release of a new profile alone follows none (no image before it can run tp8)
    folder, _ = make_release(out, "1.3.1-tp8", _selection({"tp8"}, "tp8", tp8=True))
    assert json.loads((folder / "manifest.json").read_text())["previous"] is None
    assert "## Changes since" not in (folder / "RELEASE_NOTES.md").read_text()
    # a profile added to the unified image: the unified release before it holds the default profile,
    # so it is the previous one, and the new profile's files are added, nothing removed
    folder, _ = make_release(out, "1.3.1", _selection({"tp1", "tp2", "tp4", "tp8"}, "tp4", tp8=True))
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert json.loads((folder / "manifest.json").read_text())["previous"] == "1.3.0"
    assert "| tune_caches `tp8` | tp8 | (none) | `1 dddddddddddd` |" in notes
    assert "(removed)" not in notes and "IMAGE=demo-llm:1.3.0 ./run.sh tp4" in notes
    # one profile: the release of the same selection, not the newer unified one
    folder, _ = make_release(out, "1.3.1-tp2", _selection({"tp2"}, "tp2"))
    assert json.loads((folder / "manifest.json").read_text())["previous"] == "1.3.0-tp2"
    # one profile first released alone follows the newest release that has it, the other profiles'
    # files not called removed
    folder, _ = make_release(out, "1.3.1-tp4", _selection({"tp4"}, "tp4"))
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert json.loads((folder / "manifest.json").read_text())["previous"] == "1.3.1"
    assert "(removed)" not in notes and "IMAGE=demo-llm:1.3.1 ./run.sh tp4" in notes
    # another platform follows its own platform's release, never an image this machine cannot run
    folder, _ = make_release(out, "1.3.1-arm64", _selection({"tp1", "tp2", "tp4"}, "tp4", platform="linux/arm64"))
    assert json.loads((folder / "manifest.json").read_text())["previous"] == "1.3.0-arm64"


def test_an_existing_release_is_kept_unless_forced(tmp_path):
    out = tmp_path / "release"
    make_release(out)
    with pytest.raises(InputError, match=r"release .*/1\.3\.1 already exists; use --force"):
        make_release(out)
    make_release(out, force=True)
    assert sorted(p for p in os.listdir(out) if not p.endswith(".lock")) == ["1.3.1"]


def test_force_on_a_release_folder_that_is_a_link_is_refused_leaving_the_link_and_its_target(tmp_path):
    # (before: the new release became a real folder in --out, the target stayed the old release, and a
    # .1.0.old link was left beside it)
    target, _ = make_release(tmp_path / "big" / "release", "1.0")
    out = tmp_path / "release"
    out.mkdir()
    (out / "1.0").symlink_to(target)
    before = (target / "SHA256SUMS").read_text()
    with pytest.raises(InputError, match=rf"release {out / '1.0'} is a link \(to {target}\): the new release would .* "
                                         "nothing was replaced"):
        make_release(out, "1.0", force=True)
    assert (out / "1.0").is_symlink() and (target / "SHA256SUMS").read_text() == before
    assert sorted(os.listdir(out)) == [".1.0.lock", "1.0"]
    (out / "1.0").unlink()
    (out / "1.0").symlink_to(tmp_path / "gone")  # a link to nothing: not replaced by a folder either
    with pytest.raises(InputError, match="is a link"):
        make_release(out, "1.0")
    assert (out / "1.0").is_symlink()


@pytest.mark.parametrize("left", ["a link", "a file"])
def test_a_dot_old_that_is_no_folder_does_not_fail_the_next_force_at_its_commit(tmp_path, left):
    # (before: a .1.0.old link, as --force on a linked release left it, failed the next --force of 1.0 at its
    # very end, after the build: "1.0: Not a directory", the new release not published)
    out = tmp_path / "release"
    make_release(out, "1.0")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("kept")
    if left == "a link":
        (out / ".1.0.old").symlink_to(tmp_path / "elsewhere")
    else:
        (out / ".1.0.old").write_text("")
    folder, _ = make_release(out, "1.0", force=True)
    assert folder == out / "1.0" and sorted(os.listdir(out)) == [".1.0.lock", "1.0"]
    assert (tmp_path / "elsewhere" / "keep").read_text() == "kept"  # the link went, not what it named


def test_a_link_planted_as_the_checksums_record_s_temporary_file_is_not_written_through(tmp_path):
    # (before: publish wrote checksums/.1.0.SHA256SUMS.tmp through a link planted there, overwriting the
    # file it named, the releasing user's, with the listing)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "checksums").mkdir()
    # the name is the release folder's own, not a random one: what a killed run left is replaced
    record_temp(tmp_path / "checksums" / "1.0.SHA256SUMS", tmp_path / "release" / "1.0").symlink_to(victim)
    folder, _ = make_release(tmp_path / "release", "1.0")
    assert victim.read_text() == "precious\n"
    assert os.listdir(tmp_path / "checksums") == ["1.0.SHA256SUMS"]
    assert (tmp_path / "checksums" / "1.0.SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text()


def test_two_sibling_outs_publishing_one_version_at_once_each_commit_their_own_checksums_record(tmp_path):
    # (before: both wrote checksums/.1.0.SHA256SUMS.tmp; the second run's unlinked the first's, so its
    # commit renamed its own listing into place and the first then failed after publishing)
    from unibake.publish import CommitGroup

    group = CommitGroup()
    with ReleaseFolder(tmp_path / "a", "1.0", force=False) as a:
        a.group = group  # a build for several platforms: its record waits for the group's commit
        publish_into(a, tmp_path / "checksums")
        b = make_release(tmp_path / "b", "1.0")[0]  # a sibling --out, the same version, meanwhile
        assert (tmp_path / "checksums/1.0.SHA256SUMS").read_text() == (b / "SHA256SUMS").read_text()
        group.commit()
    assert (tmp_path / "checksums/1.0.SHA256SUMS").read_text() == (tmp_path / "a/1.0/SHA256SUMS").read_text()
    assert os.listdir(tmp_path / "checksums") == ["1.0.SHA256SUMS"]


def test_a_group_whose_checksums_folder_is_spelled_two_ways_commits(tmp_path):
    # (before: each spelling was locked in turn, and a second flock on another open of the one folder waited
    # on the first for ever: the commit hung)
    from unibake.publish import CommitGroup

    (tmp_path / "checksums").mkdir()
    (tmp_path / "also").symlink_to("checksums")
    group = CommitGroup()
    with ReleaseFolder(tmp_path / "a", "1.0", force=False) as a, \
            ReleaseFolder(tmp_path / "b", "1.0-arm64", force=False) as b:
        a.group = b.group = group
        publish_into(a, tmp_path / "checksums")
        publish_into(b, tmp_path / "also")
        done = threading.Thread(target=group.commit, daemon=True)
        done.start()
        done.join(timeout=20)
        assert not done.is_alive(), "the group's commit hung"
    assert sorted(os.listdir(tmp_path / "checksums")) == ["1.0-arm64.SHA256SUMS", "1.0.SHA256SUMS"]
    assert (tmp_path / "checksums/1.0.SHA256SUMS").read_text() == (tmp_path / "a/1.0/SHA256SUMS").read_text()


def test_a_second_run_on_the_same_tag_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "release"
    with ReleaseFolder(out, "1.3.1", force=False):
        with pytest.raises(UnibakeError, match=r"another run is writing release .*1\.3\.1 \(pid \d+\)"):
            ReleaseFolder(out, "1.3.1", force=False).__enter__()


def test_an_interrupted_run_leaves_nothing_under_a_final_name_and_the_next_cleans_up(tmp_path):
    out = tmp_path / "release"
    folder = ReleaseFolder(out, "1.3.1", force=False).__enter__()
    (folder.staging / ".demo-llm-1.3.1.tar.zst.tmp").write_bytes(b"partial")
    folder._unlock()  # as if the process had died: the lock goes with it, the staging folder stays
    assert not (out / "1.3.1").exists()
    make_release(out)
    assert not (out / ".1.3.1.partial").exists()
    assert (out / "1.3.1/SHA256SUMS").exists()


@pytest.mark.parametrize("tag", ["../x", ".hidden", "a/b", "1.0 beta", ""])
def test_unsafe_release_tags_are_refused(tmp_path, tag):
    with pytest.raises(InputError, match="is not valid"):
        ReleaseFolder(tmp_path, tag, force=False)


def run_sh(folder, *args, **env):
    stub = folder.parent / "bin-no-groups"  # a host that knows no group: run.sh gives the groups by name
    if not stub.exists():
        stub.mkdir()
        (stub / "getent").write_text("#!/bin/sh\nexit 2\n")
        (stub / "getent").chmod(0o755)
    return subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", *args], capture_output=True, text=True,
                          env={"PATH": f"{stub}:/usr/bin:/bin", **env})


def test_run_sh_gives_each_profile_only_the_gpus_it_needs(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    base = "docker run --rm --name demo-llm-{p} -e PROFILE={p} -e PORT=30000 -p 30000:30000 --ipc=host"
    assert run_sh(folder, "tp1").stdout == base.format(p="tp1") + " --gpus '\"device=0\"' demo-llm:1.3.1\n"
    assert run_sh(folder, "tp2").stdout == base.format(p="tp2") + " --gpus '\"device=0,1\"' demo-llm:1.3.1\n"
    assert run_sh(folder, "tp2", GPUS="2,3").stdout == base.format(p="tp2") + " --gpus '\"device=2,3\"' demo-llm:1.3.1\n"
    from .test_real_stacks import _fake_getent  # this host's groups, as run.sh reads them

    fake_bin = _fake_getent(tmp_path, {"video": 44})
    amd = run_sh(folder, "tp4", GPUS="4,5,6,7", PATH=f"{fake_bin}:/usr/bin:/bin").stdout
    assert amd == base.format(p="tp4") + (" --device /dev/kfd --security-opt seccomp=unconfined"
                                          " --device /dev/dri/renderD132 --device /dev/dri/renderD133"
                                          " --device /dev/dri/renderD134 --device /dev/dri/renderD135"
                                          " --group-add 44 demo-llm:1.3.1\n")
    assert run_sh(folder).stdout.startswith(base.format(p="tp4"))  # the default profile


def test_run_sh_passes_port_model_name_mounts_and_engine_args(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    out = run_sh(folder, "tp1", "--max-len", "4 096", PORT="8080", MODEL_NAME="my model", MODEL_TARGET="/data/w 1",
                 IMAGE="demo-llm:1.3.0").stdout
    assert out == ("docker run --rm --name demo-llm-tp1 -e PROFILE=tp1 -e PORT=8080 -p 8080:8080 --ipc=host "
                   "--gpus '\"device=0\"' -e 'MODEL_NAME=my model' "
                   "--mount 'type=bind,source=/data/w 1,target=/models/target,readonly' "
                   "demo-llm:1.3.0 serve --max-len '4 096'\n")


def test_run_sh_keeps_the_container_name_whatever_registry_the_image_comes_from(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    pulled = run_sh(folder, "tp2", IMAGE="registry.example:5000/team/demo-llm:1.3.1").stdout
    assert pulled.startswith("docker run --rm --name demo-llm-tp2 ")  # not the registry's host name
    assert pulled.rstrip().endswith(" registry.example:5000/team/demo-llm:1.3.1")
    named = run_sh(folder, "--name", "mybox", "tp1", IMAGE="localhost/demo-llm:1.3.1").stdout
    assert named.startswith("docker run --rm --name mybox ")


def test_every_text_names_a_mount_by_the_variable_run_sh_reads(tmp_path):
    meta = json.loads(json.dumps(METADATA))
    meta["launch"]["mounts"] = {"draft-a.v2": "/models/draft"}
    folder, _ = make_release(tmp_path / "release", metadata=meta)
    texts = "".join((folder / name).read_text() for name in ("README-DIST.md", "RELEASE_NOTES.md", "run.sh"))
    assert "MODEL_DRAFT_A_V2" in texts and "MODEL_DRAFT-A" not in texts
    out = run_sh(folder, "tp1", MODEL_DRAFT_A_V2="/data/w").stdout  # what the guides say is what run.sh takes
    assert "source=/data/w,target=/models/draft" in out


def test_run_sh_passes_engine_arguments_whole_final_newlines_and_quotes_included(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    out = run_sh(folder, "tp1", "--", "--chat-template=x\n\n", "it's").stdout
    # (final newlines as they are, in '...': no sh reads one-line quoting of them, and the line breaks before a "'")
    assert out.endswith(" demo-llm:1.3.1 serve '--chat-template=x''\n\n' 'it'\\''s'\n"), out


def test_run_sh_takes_the_profile_from_profile_as_the_image_does(tmp_path):
    folder, _ = make_release(tmp_path / "release")
    out = run_sh(folder, PROFILE="tp1").stdout  # before: ignored, and the default tp4 started on 4 GPUs
    assert "--name demo-llm-tp1 -e PROFILE=tp1 " in out and "device=0\"" in out


@pytest.mark.parametrize("args,env,message", [
    (["tp8"], {}, "error: unknown profile 'tp8'; known: tp1, tp2, tp4"),
    (["tp2"], {"GPUS": "0"}, "error: profile tp2 needs 2 GPUs; GPUS=0 names 1"),
    (["tp1"], {"GPUS": "0,1"}, "error: profile tp1 needs 1 GPU; GPUS=0,1 names 2"),  # (was "1 GPUs")
    (["tp1"], {"GPUS": "a"}, "error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got 'a'"),
    # a space, a newline or a glob would be split or expanded into GPUs the count never saw
    (["tp1"], {"MODEL_TARGET": '/w/a"b'},
     "error: MODEL_TARGET must not hold ':', ',', '\"' or a control character; got '/w/a\"b'"),
    (["tp1"], {"GPUS": "0 1"}, "error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0 1'"),
    (["tp2"], {"GPUS": "0\n1"}, "error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0\\n1'"),
    (["tp1"], {"GPUS": "*"}, "error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '*'"),
    (["tp4"], {"GPUS": "0 1 2 3 4,5,6,7"},
     "error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0 1 2 3 4,5,6,7'"),
    (["tp2"], {"GPUS": "0,0"}, "error: GPUS names GPU '0' twice; each GPU once"),  # the count alone passed it
    (["tp2"], {"PROFILE": "tp1"}, "error: PROFILE=tp1 and the profile argument 'tp2' disagree; give one"),
])
def test_run_sh_refuses_what_cannot_work(tmp_path, args, env, message):
    folder, _ = make_release(tmp_path / "release")
    result = run_sh(folder, *args, **env)
    assert result.returncode == 2 and result.stderr.strip() == message


def test_every_manifest_written_validates_against_the_published_schema(tmp_path):
    """Checked with jsonschema, a validator independent of the models that wrote the manifest."""
    import jsonschema

    from ..conftest import REPO

    schema = json.loads((REPO / "docs" / "manifest.schema.json").read_text())
    make_release(tmp_path / "release", "1.3.0")
    folder, _ = make_release(tmp_path / "release", "1.3.1", split=1 << 20,
                             layers=[layer_tar({"w.bin": os.urandom(3 << 20)})])
    for name in ("1.3.0", "1.3.1"):
        manifest = json.loads((tmp_path / "release" / name / "manifest.json").read_text())
        jsonschema.validate(manifest, schema, format_checker=jsonschema.FormatChecker())
    broken = json.loads((folder / "manifest.json").read_text())
    del broken["archive"]["sha256"]
    with pytest.raises(jsonschema.ValidationError, match="'sha256' is a required property"):
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize("planted", ["link", "file", "fifo"])
def test_a_link_or_file_planted_as_the_staging_folder_is_named_with_what_to_do_and_never_followed(tmp_path, planted):
    # (before: error: .../.1.0.partial: File exists, saying neither what it is nor what to remove)
    out = tmp_path / "release"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("kept")
    staging = out / ".1.0.partial"
    {"link": lambda: staging.symlink_to(victim), "file": lambda: staging.write_text("x"),
     "fifo": lambda: os.mkfifo(staging)}[planted]()
    kind = "a link" if planted == "link" else "a file"

    def writer():  # a run opening the FIFO to read (rmtree did) would wait for one: the test fails, not hangs
        try:
            os.close(os.open(staging, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    unblock = threading.Timer(10, writer)
    unblock.start()
    try:
        with pytest.raises(UnibakeError, match=rf"^{staging} is {kind} where a run makes a release's staging folder "
                                               r"\(a folder\): no run's, so it is neither followed nor removed; "
                                               "remove it, then run again$") as caught:
            make_release(out, "1.0")
    finally:
        unblock.cancel()
    assert caught.value.exit_code == 1
    assert os.path.lexists(staging) and os.listdir(victim) == ["keep"]
    staging.unlink()  # as it says: the next run goes
    with ReleaseFolder(out, "1.0", force=False):  # and the lock was let go
        pass


def _deep_tree(top):
    """``top``, a folder 1500 levels deep: deeper than any path a plain makedirs takes, as a hostile tree can be."""
    fd = os.open(top.parent, os.O_RDONLY)
    try:
        os.mkdir(top.name, dir_fd=fd)
        for n in range(1500):
            inner = os.open(top.name if n == 0 else "d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
            os.mkdir("d", dir_fd=fd)
    finally:
        os.close(fd)


def test_a_staging_folder_nested_too_deep_to_remove_is_an_error_line_not_a_traceback(tmp_path):
    # (before: RecursionError from shutil.rmtree, a traceback, on every run of that tag; prune's too)
    from unibake.prune import remove_leftovers

    out = tmp_path / "release"
    deep = out / ".1.0.partial"
    os.makedirs(out)
    _deep_tree(deep)
    with pytest.raises(UnibakeError, match=rf"^{deep} holds folders nested too deep to remove here \(not a release's "
                                           r"staging folder a run made\): remove it \(rm -rf\), then run again$"):
        ReleaseFolder(out, "1.0", force=False).__enter__()
    assert remove_leftovers(out) == [] and deep.is_dir()
    subprocess.run(["rm", "-rf", str(deep)], check=True)
    with ReleaseFolder(out, "1.0", force=False):
        pass


@pytest.mark.parametrize("when", ["before the commit", "after the commit", "a fifo --force replaces"])
def test_a_staging_folder_swapped_for_a_fifo_during_the_run_does_not_hang_its_clean_up(tmp_path, when):
    # (before: the clean-up's shutil.rmtree opened the FIFO to read it as a folder, and waited for a
    # writer for ever, holding the release's lock; run in a child, so that the old code fails, not hangs)
    import sys
    import textwrap
    out = tmp_path / "release"
    script = textwrap.dedent(f"""
        import os, shutil
        from pathlib import Path
        from unibake.publish import ReleaseFolder
        out = Path({str(out)!r})
        if {when!r} == "a fifo --force replaces":  # release/1.0 itself a FIFO: set aside, then removed
            out.mkdir()
            os.mkfifo(out / "1.0")
        with ReleaseFolder(out, "1.0", force=True) as folder:
            if {when!r} != "before the commit":
                (folder.staging / "a").write_text("a")
                folder.commit()
            else:
                shutil.rmtree(folder.staging)
            os.mkfifo(folder.staging)  # whoever can write --out, while the run goes on
        print("done")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
    assert sorted(os.listdir(out)) == ([".1.0.lock"] if when == "before the commit" else [".1.0.lock", "1.0"])
    assert when == "before the commit" or (out / "1.0" / "a").read_text() == "a"
    with ReleaseFolder(out, "1.0", force=True):  # the lock was let go
        pass


def test_a_release_set_aside_nested_too_deep_to_remove_is_an_error_line_not_a_traceback(tmp_path):
    # (before: RecursionError from shutil.rmtree of .1.0.old beside 1.0, a traceback, on every run of 1.0)
    out = tmp_path / "release"
    make_release(out, "1.0")
    _deep_tree(out / ".1.0.old")
    with pytest.raises(UnibakeError, match=rf"^{out / '.1.0.old'} holds folders nested too deep to remove here \(not "
                                           r"a release a run set aside\): remove it \(rm -rf\), then run again$"):
        ReleaseFolder(out, "1.0", force=True).__enter__()
    subprocess.run(["rm", "-rf", str(out / ".1.0.old")], check=True)
    with ReleaseFolder(out, "1.0", force=True):  # the lock was let go
        pass


def test_a_lock_file_planted_as_a_link_is_never_followed_nor_written_through(tmp_path):
    # whoever can write --out could make .1.0.lock a link to a file of the releasing user (root's):
    # the run wrote its pid into that file, truncating it; a FIFO there hung prune's dry run
    from unibake.amend import _Lock
    from unibake.publish import hold_release, lock_release

    out = tmp_path / "release"
    out.mkdir()
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA precious\n")
    (out / ".1.0.lock").symlink_to(victim)
    refused = rf"{out / '.1.0.lock'} is not a regular file \(a symlink, a folder or a FIFO\): a release's lock file " \
              "is never followed; remove it"
    with pytest.raises(UnibakeError, match=refused):
        ReleaseFolder(out, "1.0", force=False).__enter__()  # build, archive, hotfix: their own release
    with pytest.raises(UnibakeError, match=refused):
        hold_release(out, "1.0")  # a hotfix's base
    with pytest.raises(UnibakeError, match=refused):
        _Lock(out, "1.0").__enter__()  # push amending a release
    with pytest.raises(UnibakeError, match=refused):
        lock_release(out, "1.0")  # prune
    assert victim.read_text() == "ssh-ed25519 AAAA precious\n"
    assert not (out / ".1.0.partial").exists()
    os.mkfifo(out / ".1.1.lock")
    with pytest.raises(UnibakeError, match=r"\.1\.1\.lock is not a regular file"):
        lock_release(out, "1.1", create=False)  # prune --dry-run: never waits for a writer
    (out / ".1.2.lock").write_text("")
    lock = lock_release(out, "1.2", create=False)  # a plain lock file still locks
    assert lock is not None
    with pytest.raises(UnibakeError, match="another run is writing release"):
        ReleaseFolder(out, "1.2", force=False).__enter__()
    lock.close()
    with ReleaseFolder(out, "1.2", force=False) as folder:
        assert folder.staging.is_dir()


def test_a_lock_file_holding_other_text_than_a_pid_is_not_printed_and_no_traceback(tmp_path):
    # whoever can write --out can write the lock file: bytes that are not UTF-8, a terminal's escape
    # sequences, a flood; the run it refuses names the pid, or "another process", in one line
    import fcntl

    out = tmp_path / "release"
    out.mkdir()
    lock = out / ".1.3.1.lock"
    lock.write_bytes(b"\xff\x1b]0;owned\x07\x1b[31m " + b"9" * 100 + b" 4242\n" + b"x" * (1 << 20))
    with open(lock, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UnibakeError) as caught:
            ReleaseFolder(out, "1.3.1", force=True).__enter__()
    assert str(caught.value).startswith(f"another run is writing release {out}/1.3.1 (pid 4242);")


def test_the_notes_name_every_image_the_kits_rebuild_needs_with_its_id(tmp_path):
    # the rebuild refuses unless the base, the builder and every toolchain image are in the engine with
    # the release's IDs: the notes named the base alone
    from unibake.manifest import ReleaseManifest, SupplyChain, SupplyFile
    from unibake.sbom import BaseImage
    from unibake.supply import Kit, Sbom, kit_images

    folder, _ = make_release(tmp_path / "release")
    manifest = ReleaseManifest.model_validate_json((folder / "manifest.json").read_text())
    supply = SupplyFile(name="x", bytes=1, sha256="a" * 64)
    kit = SupplyFile(name="demo-llm-1.3.1-kit.tar.zst", bytes=1, sha256="b" * 64)
    manifest = manifest.model_copy(update={"supply_chain": SupplyChain(sbom=supply, provenance=supply, kit=kit,
                                                                        signatures=())})
    images = [BaseImage(ref=f"localhost/{name}:1", image_id="sha256:" + digit * 64)
              for name, digit in (("base", "1"), ("builder", "2"), ("cuda", "3"), ("rocm", "4"))]
    run = {"sbom": Sbom(file=supply, base=images[0], builder=images[1], engine_version="20.10", packages=0,
                        libraries=0, toolchains=tuple(images[2:])),
           "kit": Kit(file=kit, context_sha256="c" * 64, dockerfile_sha256="d" * 64)}
    notes = render_files(manifest, PASSED, None, kit_images=kit_images(run))["RELEASE_NOTES.md"]
    rows = [line for line in notes.splitlines() if line.startswith("| ") and "localhost/" in line]
    assert rows == ["| base image | `localhost/base:1` | `sha256:" + "1" * 64 + "` |",
                    "| builder image | `localhost/builder:1` | `sha256:" + "2" * 64 + "` |",
                    "| toolchain image | `localhost/cuda:1` | `sha256:" + "3" * 64 + "` |",
                    "| toolchain image | `localhost/rocm:1` | `sha256:" + "4" * 64 + "` |"], notes
    assert "the engine needs every image the kit names, with these IDs" in notes, notes
    assert kit_images({"sbom": run["sbom"]}) == ()  # no kit: no images to name


def test_a_force_over_a_release_holding_folders_nested_too_deep_is_published_and_says_what_is_left(tmp_path):
    """A release folder that someone filled with folders nested past shutil.rmtree's recursion (1200
    levels) and made again with --force: the new release was published, then the replaced one, set aside,
    raised RecursionError (a traceback, exit 1) and was left as .TAG.old. It is one error saying the release
    was published and what to remove."""
    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")
    fd = os.open(folder, os.O_RDONLY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    try:
        with pytest.raises(UnibakeError) as caught:
            make_release(out, "1.0", force=True)
        assert str(caught.value) == (f"release {out / '1.0'} was published, but the release it replaced, set aside "
                                     f"as {out / '.1.0.old'}, holds folders nested too deep to remove here (not a "
                                     "release's): remove it (rm -rf) before this release is made again")
        assert not (out / "1.0" / "d").exists() and (out / "1.0" / "manifest.json").is_file()
    finally:  # (pytest's own clean-up is shutil.rmtree too)
        subprocess.run(["rm", "-rf", "--", str(out / ".1.0.old"), str(out / "1.0")], check=True)


def test_a_folder_inside_a_tree_swapped_for_a_fifo_before_its_open_does_not_hang_the_removal(tmp_path):
    """shutil.rmtree lstat()s a folder inside the tree, then opens it (O_RDONLY) to read it: a FIFO put there in
    between (whoever can write --out, while a release set aside or a staging folder is removed) made it wait for
    a writer for ever, holding the release's lock. The swap is made at that very moment (the child's os.open);
    run in a child, so that the old code fails, not hangs."""
    import sys
    import textwrap
    tree = tmp_path / ".1.0.old"
    (tree / "inner" / "deeper").mkdir(parents=True)
    (tree / "inner" / "deeper" / "f").write_text("f")
    (tree / "g").write_text("g")
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from unibake.files import remove_tree
        tree = Path({str(tree)!r})
        real_open = os.open

        def swapping_open(path, flags, *args, dir_fd=None, **kw):
            if path == "inner" and dir_fd is not None and not (tree.parent / "moved").exists():
                os.rename(tree / "inner", tree.parent / "moved")  # listed and lstat()ed as a folder: now a FIFO
                os.mkfifo(tree / "inner")
            return real_open(path, flags, *args, dir_fd=dir_fd, **kw)

        os.open = swapping_open
        remove_tree(tree)
        print("done")
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20,
                              cwd=Path(__file__).parents[2])
    except subprocess.TimeoutExpired:
        pytest.fail("the removal waited on the FIFO")
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
    assert not os.path.lexists(tree) and (tmp_path / "moved" / "deeper" / "f").read_text() == "f"  # not followed


def test_a_staging_folder_swapped_for_a_tree_nested_too_deep_during_the_run_ends_it_without_a_traceback(tmp_path):
    # (before: the clean-up's RecursionError, a traceback from the release folder's exit, the lock not let go by it)
    import sys
    import textwrap
    out = tmp_path / "release"
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from unibake.publish import ReleaseFolder
        from tests.unit.test_publish import _deep_tree
        out = Path({str(out)!r})
        folder = ReleaseFolder(out, "1.0", force=False)
        with folder:
            os.rename(folder.staging, out / "moved")  # whoever can write --out, while the run goes on
            _deep_tree(folder.staging)
        print("done", folder._lock)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[2])
    assert (done.returncode, done.stdout, done.stderr) == (0, "done None\n", "")
    with pytest.raises(UnibakeError, match=r"holds folders nested too deep to remove here"):  # the next run says it
        ReleaseFolder(out, "1.0", force=False).__enter__()
    subprocess.run(["rm", "-rf", str(out / ".1.0.partial")], check=True)


def test_the_checksums_record_is_fsynced_before_it_takes_its_name(tmp_path, monkeypatch):
    """Every file of the release folder is fsynced before the commit; the checksums record was only closed, then
    renamed into place: after a power cut it could stand under its name empty, beside a whole release."""
    synced: set[tuple[int, int]] = set()
    real = os.fsync

    def fsync(fd):
        info = os.fstat(fd)
        synced.add((info.st_dev, info.st_ino))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "release"
    make_release(out, "1.0")
    record = tmp_path / "checksums" / "1.0.SHA256SUMS"
    info = record.stat()
    assert (info.st_dev, info.st_ino) in synced
    checksums = (tmp_path / "checksums").stat()
    assert (checksums.st_dev, checksums.st_ino) in synced  # and its folder, after the rename


def test_a_small_release_gives_its_sizes_in_mib_or_kib_never_as_0_00_gib(tmp_path, cli):
    # a busybox-sized product (a sidecar, a small service) read "0.00 GiB" everywhere: the notes, the
    # downloader's guide ("0.00 GiB once loaded"), the summary and the releases table
    from unibake.templates import gib

    assert (gib(5492), gib(1082284), gib(161 * 2**20), gib(3 * 2**30)) == \
        ("5.36 KiB", "1.03 MiB", "0.16 GiB", "3.00 GiB")
    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")
    for name in ("RELEASE_NOTES.md", "README-DIST.md"):
        text = (folder / name).read_text()
        assert "0.00 GiB" not in text and " KiB" in text, name
    listed = cli("releases", "--out", str(out))
    assert listed.code == 0 and "0.00 GiB" not in listed.err and " KiB" in listed.err, listed.err


def test_one_release_or_one_engine_is_counted_in_the_singular(tmp_path, cli):
    # "1 releases under release; 1 verify", "deploy ... to 1 engines from the archive"
    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")
    listed = cli("releases", "--out", str(out))
    assert listed.code == 0 and listed.err.splitlines()[-1] == f"1 release under {out}; 1 verifies", listed.err
    gone = f"unix://{tmp_path}/nothing.sock"
    deployed = cli("deploy", str(folder), "--engine", gone)
    assert deployed.code == 3 and "demo-llm:1.0 to 1 engine from the archive" in deployed.err, deployed.err


def test_a_full_disk_when_a_run_writes_its_pid_in_the_lock_file_still_locks(tmp_path, monkeypatch):
    # (before: the pid's write failed as "error: a file: No space left on device", naming no file, before the
    # stage that needs the space could name the folder and its free bytes; prune and push failed alike)
    import errno
    import io

    from unibake import amend, publish
    from unibake.publish import hold_release, lock_release

    out = tmp_path / "release"
    out.mkdir()
    real, full = publish.open_lock, set()

    class FullLock(io.TextIOWrapper):  # what is written to the lock file is buffered, then meets a full disk
        pending = ""

        def write(self, text):
            self.pending += text

        def flush(self):
            if self.pending:  # kept, as Python's buffer keeps what it could not write: tried again on close
                raise OSError(errno.ENOSPC, "No space left on device")

    def open_full(path, **kwargs):
        lock = real(path, **kwargs)
        full.add(lock.fileno())
        return FullLock(lock.detach(), encoding="utf-8")

    def pwrite(fd, data, offset, _real=os.pwrite):
        if fd in full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return _real(fd, data, offset)

    monkeypatch.setattr(publish, "open_lock", open_full)
    monkeypatch.setattr(amend, "open_lock", open_full)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with ReleaseFolder(out, "1.0", force=False) as folder:  # the lock is held all the same
        assert folder.staging.is_dir()
        with pytest.raises(UnibakeError, match=r"another run is writing release .*1\.0 \(pid another process\)"):
            ReleaseFolder(out, "1.0", force=False).__enter__()
    for tag, take in (("1.1", hold_release), ("1.2", lock_release), ("1.3", lambda *a: amend._Lock(*a).__enter__().fh)):
        lock = take(out, tag)  # a hotfix's hold on its base, prune's, a push's: each locks
        with pytest.raises(UnibakeError, match=rf"(another run is writing|a hotfix or another release is being made on) release .*{tag}"):
            ReleaseFolder(out, tag, force=False).__enter__()
        lock.close()
    assert sorted(os.listdir(out)) == [".1.0.lock", ".1.1.lock", ".1.2.lock", ".1.3.lock"]



# the command line's handlers (the first signal raises KeyboardInterrupt), and a signal raised right after SIGINT's
# handler is swapped for the commit's (WHEN swapped: a SIGTERM) or put back after it (put-back: a SIGINT)
_HELD_SIGNALS = """
import signal, sys
from unibake import publish

real, when, fired, ran = signal.signal, sys.argv[1], [], []
comes = signal.SIGINT if when == "put-back" else signal.SIGTERM

def terminate(signum, frame):
    raise KeyboardInterrupt

class Hooked:
    def __getattr__(self, name):
        return getattr(signal, name)

    @staticmethod
    def signal(sig, handler):
        before = real(sig, handler)
        if sig == signal.SIGINT and not fired and (handler is terminate) == (when == "put-back"):
            fired.append(sig)
            signal.raise_signal(comes)  # its handler runs at once, before this returns
        return before

for sig in publish.HELD:
    real(sig, terminate)
publish.signal = Hooked()
try:
    with publish.held_signals():
        ran.append("block")
except KeyboardInterrupt:
    ran.append("interrupted")
print(ran, [signal.getsignal(sig) is terminate for sig in publish.HELD])
"""


@pytest.mark.parametrize("when", ["swapped", "put-back"])
def test_a_signal_as_the_commit_s_handlers_are_swapped_or_put_back_leaves_every_handler_as_it_was(when):
    # a SIGTERM just after SIGINT's handler was swapped for the commit's (or a SIGINT just after it was put back)
    # raised in the middle of the swap: a handler was left recording signals, not acting on them, for the rest of
    # the run (a SIGTERM or a third Ctrl-C during the clean-up was swallowed without a word)
    import sys

    done = subprocess.run([sys.executable, "-c", _HELD_SIGNALS, when], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    ran = "['interrupted']" if when == "swapped" else "['block', 'interrupted']"
    assert done.stdout == f"{ran} [True, True, True]\n", done.stdout


def test_a_file_system_that_takes_no_locks_is_named_with_the_lock_file(tmp_path, monkeypatch, cli):
    # found by review: flock's ENOLCK (an NFS mount without lockd) was "error: a file: No locks available", exit 1
    import errno
    import fcntl

    from unibake import amend, publish

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    made, _ = make_release(tmp_path / "release", "1.0")
    monkeypatch.setattr(fcntl, "flock", no_locks)  # (the module publish and amend both call)
    with pytest.raises(UnibakeError, match=rf"cannot lock {tmp_path / 'release' / '.1.1.lock'} \(No locks available\): "
                                           r"--out must be on a file system that takes locks"):
        with ReleaseFolder(tmp_path / "release", "1.1", force=False):
            pass
    with pytest.raises(UnibakeError, match=r"cannot lock .*\.1\.0\.lock \(No locks available\): the release folder "
                                           "must be on a file system that takes locks"):
        publish.lock_release(tmp_path / "release", "1.0")
    with pytest.raises(UnibakeError, match=r"cannot lock .*\.1\.0\.lock \(No locks available\)"):
        with amend._Lock(tmp_path / "release", "1.0"):
            pass
    with pytest.raises(UnibakeError, match=r"cannot lock .*\.1\.0\.lock \(No locks available\): the release folder"):
        publish.hold_release(tmp_path / "release", "1.0")  # (a hotfix's hold on its base release)
    assert not os.path.exists(tmp_path / "release" / "1.1")
