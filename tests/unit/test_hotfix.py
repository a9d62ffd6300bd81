"""What a hotfix needs of its base release, checked before anything is built, and kept afterwards:
the base verifies and is of the same product; a base a hotfix needs is not made again under its
name; a hotfix whose base is gone says so; its guide lists the apply.sh it tells the user to run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from unibake.archive import write_archive
from unibake.archive_reader import read_back
from unibake.errors import InputError, VerificationError
from unibake.manifest import load_manifest
from unibake.metadata import ImageMetadata
from unibake.pipeline import BY_NAME, Request, _refuse_replacing_a_hotfix_base, run_stages, selection
from unibake.publish import ReleaseFolder, build_manifest, publish, render_files

from ..conftest import as_nobody
from ..forge import resum
from ..savefixtures import docker_layout, layer_tar
from .test_publish import METADATA, PASSED, make_release
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import Quiet, engines, release  # noqa: F401 - fixtures used by name


def hotfix_of(out, base_folder, tag="1.1", metadata=None):
    """A hotfix folder on ``base_folder``'s release, as the pipeline publishes one."""
    base = load_manifest(base_folder)
    shared, new = layer_tar({"base": b"base" * 100}), layer_tar({"new": b"new" * 100})
    data, _, _ = docker_layout([shared, new], tag=f"demo-llm:{tag}")
    omitted = base.diff_ids[0]
    with ReleaseFolder(out, tag, force=False) as staged:
        archive = write_archive([data], staged.staging, f"demo-llm-{tag}.tar.zst", tag=f"demo-llm:{tag}",
                                omit=[omitted])
        back = read_back(archive, omitted=frozenset([omitted]))
        manifest = build_manifest(product="demo-llm", tag=tag, image_ref=f"demo-llm:{tag}", archive=archive,
                                  digests=back, metadata=ImageMetadata.model_validate_json(json.dumps(metadata or METADATA)),
                                  labels={}, previous=base, hotfix=base, image_size=161_247_144)
        return publish(staged, archive, back, render_files(manifest, PASSED, base), out.parent / "checksums")


def test_a_hotfix_leaves_out_only_a_bottom_run_the_image_has_nowhere_above_it():
    from unibake.hotfix import omitted_layers

    a, e, b, c, d = (f"sha256:{x * 64}" for x in "aebcd")
    assert omitted_layers((a, e, b), (a, e, c)) == (a, e)
    # one blob per diffID: the same content again above the run (an empty layer) ships, and the run stops below it
    assert omitted_layers((a, e, b), (a, e, c, e)) == (a,)
    assert omitted_layers((a, e, b), (a, e, b, c, a)) == ()
    assert omitted_layers((a, a, b), (a, a, c)) == (a, a)
    assert omitted_layers((d,), (a,)) == ()


def base_stage(tmp_path, **kw):
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base="1.0", version="1.0.1", **kw)
    return run_stages([BY_NAME["hotfix base"]], request, Quiet())


def test_a_base_whose_manifest_no_longer_matches_its_sums_is_refused_before_the_build(engines, tmp_path):  # noqa: F811
    folder = release(engines, tmp_path / "release")["release"].folder
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["diff_ids"] = list(reversed(manifest["diff_ids"]))  # what decides which layers are left out
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for roundtrip in (True, False):  # with --no-roundtrip it was published on layers no base has
        with pytest.raises(VerificationError, match=r"the base release .*/1\.0: manifest\.json .*a hotfix is made "
                                                    r"on a release that verifies"):
            base_stage(tmp_path, roundtrip=roundtrip)


@pytest.mark.parametrize("case", ["a link", "not JSON", "not JSON, re-summed"])
def test_a_base_manifest_that_cannot_be_trusted_is_exit_3_whatever_is_wrong_with_it(engines, tmp_path, case):  # noqa: F811
    # found by probing: a manifest.json that was a link, or not JSON, was exit 2 (read before its sums were checked);
    # the README says a base that does not verify is exit 3
    folder = release(engines, tmp_path / "release")["release"].folder
    manifest = folder / "manifest.json"
    if case == "a link":
        (tmp_path / "elsewhere.json").write_bytes(manifest.read_bytes())
        manifest.unlink()
        manifest.symlink_to(tmp_path / "elsewhere.json")
    else:
        manifest.write_text("{")
        if case == "not JSON, re-summed":
            resum(folder)
    with pytest.raises(VerificationError, match=r"^the base release .*/1\.0: manifest\.json .*a hotfix is made on "
                                                r"a release that verifies"):
        base_stage(tmp_path)


def test_a_base_recording_an_epoch_past_what_a_tar_header_holds_is_refused(engines, tmp_path):  # noqa: F811
    # (before: the manifest's bound is the year 9999; the hotfix took the epoch as its own, its small base was a
    # ValueError's traceback, and its rewritten headers grew a byte each, found only after the whole build)
    folder = release(engines, tmp_path / "release")["release"].folder
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["source_date_epoch"] = 8 ** 11
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    with pytest.raises(VerificationError, match=r"^the base release .*/1\.0: its manifest\.json records "
                                                r"SOURCE_DATE_EPOCH 8589934592, past what a tar header holds "
                                                r"\(8589934591\)"):
        base_stage(tmp_path)


def test_a_small_base_of_folders_an_owner_past_ustar_holds_is_written():
    # (before: ustar's uid field holds 2097151; an OpenShift-style owner was a ValueError's traceback)
    import io
    import tarfile

    from unibake.assemble import _small_base

    settings = {"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}}
    _, archive = _small_base([("/opt", (0o755, 1000650000, 1000650000)), ("/opt/unibake", (0o755, 0, 0))],
                             settings, ["/bin/sh -c #(nop) ADD x"], 1700000000, "small:1")
    with tarfile.open(fileobj=io.BytesIO(archive)) as outer:
        layer = outer.extractfile("layer/layer.tar").read()
    with tarfile.open(fileobj=io.BytesIO(layer)) as inner:
        assert [(m.name, m.uid, m.gid, m.mtime) for m in inner] == [("opt", 1000650000, 1000650000, 1700000000),
                                                                    ("opt/unibake", 0, 0, 1700000000)]


@pytest.mark.parametrize("change", ["run.sh changed", "sbom changed", "provenance deleted", "guide changed"])
def test_a_base_whose_other_files_no_longer_match_its_sums_is_refused(engines, tmp_path, change):  # noqa: F811
    # found by probing: only the manifest and the archive were checked; a base with a changed run.sh, SBOM or kit,
    # or without its provenance, was taken, though the README says it must verify against its SHA256SUMS
    folder = release(engines, tmp_path / "release")["release"].folder
    name = {"run.sh changed": "run.sh", "sbom changed": "sbom.cdx.json", "provenance deleted": "provenance.intoto.json",
            "guide changed": "README-DIST.md"}[change]
    path = folder / name
    assert name in (folder / "SHA256SUMS").read_text(), sorted(p.name for p in folder.iterdir())
    if change == "provenance deleted":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    said = r"missing \(listed in SHA256SUMS\)" if change == "provenance deleted" else "differs from SHA256SUMS"
    for roundtrip in (False, True):  # (with the round trip, the kit is read beside the build, with the archive)
        with pytest.raises(VerificationError, match=rf"the base release .*/1\.0: {re.escape(name)} {said}; a hotfix "
                                                    r"is made on a release that verifies"):
            given = base_stage(tmp_path, roundtrip=roundtrip)
            if given.run.base_check is not None:
                given.run.base_check.result()


def test_a_base_kit_is_read_beside_the_build_and_must_be_the_one_its_manifest_records(engines, tmp_path,
                                                                                    server):  # noqa: F811
    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    kit = folder / "demo-1.0-kit.tar.zst"
    kit.write_bytes(b"(a kit)" * 1000)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"] = {"name": kit.name, "bytes": 7000,
                                       "sha256": hashlib.sha256(kit.read_bytes()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    base_stage(tmp_path, roundtrip=True)  # a base that verifies: taken
    kit.write_bytes(b"(a kit)" * 999 + b"(a kiT)")  # changed, SHA256SUMS left: found by the check beside the build
    hotfix_image(engines, server.server_port)
    with pytest.raises(VerificationError, match=r"the base release .*/1\.0: demo-1\.0-kit\.tar\.zst differs from "
                                                r"SHA256SUMS; a hotfix is made on a release that verifies"):
        hotfix_run(engines, out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["1.0"]
    resum(folder)  # and re-summed: SHA256SUMS no longer lists the kit the manifest records
    with pytest.raises(VerificationError, match=r"demo-1\.0-kit\.tar\.zst is not the kit its manifest\.json "
                                                r"records \(SHA256SUMS lists another sha256\)"):
        base_stage(tmp_path, roundtrip=True)


def test_a_base_archive_with_a_flipped_byte_is_refused_before_it_is_used_when_the_round_trip_loads_it(
        engines, tmp_path, server):  # noqa: F811
    # The archive is read against SHA256SUMS in a thread beside the plan and the build (a whole release's archive:
    # minutes for a big one, where an assembled hotfix builds in seconds), and waited for before it is used: the
    # run fails there, naming it, and nothing is published or left in the verify engine.
    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    archive = folder / "demo-1.0.tar.zst"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    hotfix_image(engines, server.server_port)
    held = set(engines["fake://verify"].images)
    with pytest.raises(VerificationError, match=r"the base release .*: demo-1\.0\.tar\.zst differs from "
                                                r"SHA256SUMS; a hotfix is made on a release that verifies"):
        hotfix_run(engines, out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["1.0"]
    assert set(engines["fake://verify"].images) == held
    assert base_stage(tmp_path, roundtrip=False)["base"].manifest.release == "1.0"  # the archive is not needed


def test_a_force_run_on_the_base_of_a_hotfix_is_refused_before_anything_is_written(engines, tmp_path):  # noqa: F811
    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    hotfix_of(out, folder)
    before = (folder / "SHA256SUMS").read_bytes()
    with pytest.raises(InputError, match=r"release 1.0 is the base of the hotfix 1.1 under .*: --force would "
                                         r"replace its image sha256:"):
        release(engines, out, force=True)
    assert (folder / "SHA256SUMS").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [".1.0.lock", ".1.1.lock", "1.0", "1.1"]


def test_a_base_of_another_product_is_refused(engines, tmp_path, busybox_product):  # noqa: F811
    release(engines, tmp_path / "release")  # product "demo"; the busybox product is unibake-test
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base="1.0", version="1.0.1",
                      config=str(busybox_product), require_lock=False)
    with pytest.raises(InputError, match="release 1.0 is of the product demo, not unibake-test; a hotfix is made on "
                                         "a release of its own product"):
        run_stages([BY_NAME["hotfix base"], BY_NAME["plan"]], request, Quiet())


def test_force_never_replaces_the_base_a_hotfix_needs_and_releases_says_when_a_base_is_gone(tmp_path, cli):
    out = tmp_path / "release"
    base_folder, _ = make_release(out, "1.0", layers=[layer_tar({"base": b"base" * 100}),
                                                      layer_tar({"old": b"old" * 100})])
    hotfix = hotfix_of(out, base_folder)
    guide = (hotfix / "README-DIST.md").read_text()
    assert "`apply.sh`" in guide.split("## 2.")[0]  # in the download list
    assert "(0.15 GiB once loaded, its base release's layers included)" in guide  # not the delta's 0.00 GiB
    with pytest.raises(InputError, match=r"release 1.0 is the base of the hotfix 1.1 under .*: --force would "
                                         r"replace its image sha256:"):
        _refuse_replacing_a_hotfix_base(out, "1.0")
    _refuse_replacing_a_hotfix_base(out, "1.1")  # nothing is made on the hotfix: it may be made again

    listed = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert [r["state"] for r in listed] == ["verifies", "verifies"]
    manifest = json.loads((base_folder / "manifest.json").read_text())
    manifest["image_id"] = "sha256:" + "e" * 64  # the base made again: another image under its name
    (base_folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (base_folder / "IMAGE_ID").write_text(manifest["image_id"] + "\n")
    resum(base_folder)
    listed = {r["release"]: r["state"] for r in json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]}
    assert listed["1.0"] == "verifies"
    assert listed["1.1"].startswith("base absent: no release here holds 1.0's image sha256:")


def test_releases_says_a_hotfix_does_not_verify_when_its_base_folder_lacks_its_archive_or_fails(tmp_path, cli):
    out = tmp_path / "release"
    base_folder, _ = make_release(out, "1.0", layers=[layer_tar({"base": b"base" * 100}),
                                                      layer_tar({"old": b"old" * 100})])
    hotfix_of(out, base_folder)

    def states():
        result = cli("--json", "releases", "--out", str(out))
        return {r["release"]: r["state"] for r in json.loads(result.out)["releases"]}, result.err

    archive = next(base_folder.glob("*.tar.zst"))
    archive.rename(tmp_path / archive.name)  # a fresh clone: archives are not tracked
    listed, err = states()
    assert listed["1.0"] == "archive absent"
    assert listed["1.1"] == "base does not verify: release 1.0 (1.0/): archive absent"  # was "verifies"
    assert err.rstrip().endswith("; 0 verify")
    (tmp_path / archive.name).rename(archive)
    notes = base_folder / "RELEASE_NOTES.md"
    notes.write_text(notes.read_text() + "edited\n")
    listed, _ = states()
    assert listed["1.0"].startswith("FAILS: RELEASE_NOTES.md")
    assert listed["1.1"].startswith("base does not verify: release 1.0 (1.0/): FAILS: RELEASE_NOTES.md")
    shutil.copytree(base_folder, out / "1.0-copy")  # another folder holding the base image that verifies
    notes.write_text(notes.read_text()[:-len("edited\n")])
    shutil.copy(notes, out / "1.0-copy" / notes.name)
    notes.write_text(notes.read_text() + "edited\n")
    listed, err = states()  # two rows of release 1.0: one verifies
    assert listed["1.1"] == "verifies"
    assert err.rstrip().endswith("; 2 verify")
    shutil.rmtree(out / "1.0-copy")
    (base_folder / "manifest.json").write_text("{")  # damaged: not "no release here holds 1.0's image"
    listed, _ = states()
    assert listed["1.1"].startswith("base does not verify: release 1.0 (1.0/): UNREADABLE: ")


def test_a_release_of_another_product_under_the_same_version_is_never_replaced(tmp_path, engines):  # noqa: F811
    from unibake.released import refuse_another_release, refuse_moving_a_released_tag

    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")  # demo-llm's 1.0
    for force in (False, True):  # the message named the wrong product, and --force replaced it silently
        with pytest.raises(InputError, match=r"release/1\.0 holds the release of demo-llm:1\.0 \(product demo-llm\), "
                                             r"not other:1\.0: release folders are named by version, so each "
                                             r"product needs its own --out \(e\.g\. --out release/other\)"):
            refuse_moving_a_released_tag(out, "other:1.0", force=force)
    refuse_moving_a_released_tag(out, "demo-llm:1.0", force=True)  # its own product's: --force replaces it
    with pytest.raises(InputError, match="holds the release of demo-llm:1.0 .* not demo:1.0"):
        refuse_another_release(out / "1.0", "demo:1.0")
    with pytest.raises(InputError, match="holds the release of demo-llm:1.0"):  # archive --force, end to end
        release(engines, out, force=True)
    assert load_manifest(folder).product == "demo-llm"


def hotfix_image(engines, port: int, bottom: bytes | None = None) -> None:
    """demo:1.1 in the source engine: release 1.0's image with its top layer changed (and its bottom one)."""
    from unibake.metadata import METADATA_LABEL, PROFILES_LABEL

    from ..savefixtures import tar_of
    from .test_supply_chain import KERNEL, LAYERS, image_metadata

    metadata = {**json.loads(image_metadata(port)), "version": "1.1", "tag": "demo:1.1"}
    labels = {METADATA_LABEL: json.dumps(metadata, sort_keys=True, separators=(",", ":")), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.1", "io.unibake.source-date-epoch": "1700000000"}
    fixed = tar_of([("opt/unibake/kernels/k/libk.so", KERNEL, None),
                    ("opt/unibake/profiles/tp1/tune/a.json", b'{"fixed": 1}\n', None)])
    engines[None].add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                       "history": [{"created_by": "x"}] * 2}, [bottom or LAYERS[0], fixed], tag="demo:1.1")


def hotfix_run(engines, out, reporter=None):
    """``hotfix --from 1.0`` of demo:1.1, archived and round-tripped by the sequential stages."""
    from unibake.pipeline import ARCHIVE, selection

    request = Request(env={}, cwd=out.parent, out=out, image="demo:1.1", base="1.0", verify_engine="fake://verify")
    return run_stages(selection(("hotfix base",) + ARCHIVE), request, reporter or Quiet(),
                      connect=engines.__getitem__)


def test_a_hotfix_round_trip_that_fails_leaves_nothing_in_the_verify_engine(engines, tmp_path, server):  # noqa: F811
    from unibake.errors import EngineError, UnibakeError

    from ..fake_engine import FakeEngine

    class RefusingTheHotfix(FakeEngine):  # takes in the base release, then runs out of room
        def load(self, chunks, stop=None):
            if self.loads:
                raise EngineError("the engine refused the image: no space left on device (engine at fake://verify)")
            return super().load(chunks)

    out = tmp_path / "release"
    release(engines, out)
    hotfix_image(engines, server.server_port)
    verify = engines["fake://verify"] = RefusingTheHotfix(address="fake://verify")
    with pytest.raises(UnibakeError, match="no space left on device"):
        hotfix_run(engines, out)
    assert verify.loads == 1 and (verify.images, verify.tags) == ({}, {})  # the base release was left in it

    class AndGone(RefusingTheHotfix):  # and then unreachable: its clean-up's error does not hide the run's
        def remove_image(self, ref):
            raise EngineError(f"cannot reach the Docker engine at {self.address}")

    engines["fake://verify"], reporter = AndGone(address="fake://verify"), Quiet()
    with pytest.raises(UnibakeError, match="no space left on device"):
        hotfix_run(engines, out, reporter)
    assert "may still be in the verify engine at fake://verify: cannot reach" in reporter.stream.getvalue()


def test_a_base_folder_holding_another_archive_is_refused_not_taken_for_the_base(engines, tmp_path, server):  # noqa: F811
    from ..forge import forge
    from ..savefixtures import docker_layout
    from .test_supply_chain import LAYERS

    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    hotfix_image(engines, server.server_port)
    # another product's archive, sharing the layer the hotfix leaves out, under the base's name
    other, _, _ = docker_layout([LAYERS[0]], tag="other:1.0")
    archive = folder / "demo-1.0.tar.zst"
    kept = archive.read_bytes(), (folder / "manifest.json").read_bytes()
    forge(folder, stream=other)
    swapped = archive.read_bytes()
    archive.write_bytes(kept[0])  # SHA256SUMS alone rewritten over it: refused before anything is built
    (folder / "manifest.json").write_bytes(kept[1])
    archive.write_bytes(swapped)
    resum(folder)
    with pytest.raises(VerificationError, match=r"the base release .*/1\.0: demo-1\.0\.tar\.zst is not the archive "
                                                r"its manifest\.json records"):
        base_stage(tmp_path)
    forge(folder, stream=other)  # its manifest's record of the archive rewritten too: the load tells
    with pytest.raises(VerificationError, match=r"the base release .*/1\.0: its archive did not load as the image "
                                                r"sha256:\w+ that its manifest\.json records"):
        hotfix_run(engines, out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["1.0"]


@pytest.mark.parametrize("name", ["../elsewhere/1.0", "{tmp}/elsewhere/1.0", "..", "."])
def test_a_base_named_by_a_path_is_refused_its_hotfix_would_have_no_base_under_out(engines, tmp_path, name):  # noqa: F811
    release(engines, tmp_path / "elsewhere")  # a release that verifies, but not under --out
    (tmp_path / "release").mkdir()
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base=name.format(tmp=tmp_path), version="1.0.1")
    with pytest.raises(InputError, match=r"--from '.*': not the name of a release folder under --out \(.*/release\)"):
        run_stages([BY_NAME["hotfix base"]], request, Quiet())
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "elsewhere", base="1.0/", version="1.0.1")
    assert run_stages([BY_NAME["hotfix base"]], request, Quiet())["base"].folder == tmp_path / "elsewhere" / "1.0"
    # the examples are this --out's releases, not the demo product's ("such as 1.3.1 ... (demo-llm:1.3.1)")
    for out, such in (("release", " (it holds none), nor a release's image tag (PRODUCT:VERSION)"),
                      ("elsewhere", ", such as 1.0, nor its image's tag (demo:1.0)")):
        request = Request(env={}, cwd=tmp_path, out=tmp_path / out, base="..", version="1.0.1")
        with pytest.raises(InputError) as refused:
            run_stages([BY_NAME["hotfix base"]], request, Quiet())
        assert str(refused.value) == (f"--from '..': not the name of a release folder under --out ({tmp_path / out})"
                                      f"{such}; copy a release made elsewhere under --out first")


def test_a_base_named_by_another_repositorys_tag_is_refused_not_taken_by_its_folder_name(engines, tmp_path, cli):  # noqa: F811
    release(engines, tmp_path / "release")  # demo:1.0
    for name in ("other:1.0", "registry.example/demo:1.0", ":1.0"):
        request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base=name, version="1.0.1")
        with pytest.raises(InputError, match=rf"--from {name}: .*/release/1\.0 is the release of demo:1\.0, not of "
                                             rf"{name.rsplit(':', 1)[0]}: release folders are named by version, so {name} names no release "
                                             r"under --out \("):
            run_stages([BY_NAME["hotfix base"]], request, Quiet())
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base="demo:1.0", version="1.0.1")
    assert run_stages([BY_NAME["hotfix base"]], request, Quiet())["base"].manifest.tag == "demo:1.0"
    result = cli("hotfix", "--from", "other:1.0", "--version", "1.0.1", "--out", str(tmp_path / "release"),
                 cwd=tmp_path)
    assert result.code == 2 and result.err.count("error:") == 1 and "is the release of demo:1.0, not of other" in result.err


def test_a_hotfix_holds_its_base_release_so_a_force_run_of_it_is_refused_until_the_hotfix_ends(engines, tmp_path):  # noqa: F811
    from contextlib import ExitStack

    from unibake.errors import UnibakeError

    out = tmp_path / "release"
    release(engines, out)  # demo:1.0
    request = Request(env={}, cwd=tmp_path, out=out, base="1.0", version="1.0.1")
    with ExitStack() as hotfix:  # the hotfix's run, from its first stage to its end
        run_stages([BY_NAME["hotfix base"]], request, Quiet(), stack=hotfix)
        with pytest.raises(UnibakeError, match=rf"a hotfix or another release is being made on release {out / '1.0'} \(pid {os.getpid()}\): "
                                               "it needs that release as it is until it ends; wait for it"):
            release(engines, out, force=True)  # build --version 1.0 --force, archive --tag 1.0 --force
        from unibake.amend import _Lock
        with pytest.raises(UnibakeError, match=rf"a hotfix or another release is being made on the release beside {out / '.1.0.lock'} "
                                               rf"\(pid {os.getpid()}\); wait for it"):
            _Lock(out, "1.0").__enter__()  # push 1.0, recording its digest in the folder
        with ExitStack() as second:  # another hotfix on the same base may run beside it
            run_stages([BY_NAME["hotfix base"]], replace(request, version="1.0.2"), Quiet(), stack=second)
        assert (out / "1.0" / "manifest.json").is_file()
    release(engines, out, force=True)  # the hotfix ended: its base may be made again
    with ReleaseFolder(out, "1.0", force=True):  # a run writing 1.0: a hotfix on it waits for it
        with pytest.raises(UnibakeError, match=rf"another run is writing release {out / '1.0'} \(pid {os.getpid()}\); "
                                               "wait for it, then make the hotfix"):
            run_stages([BY_NAME["hotfix base"]], request, Quiet())


def hotfix_pair(out):
    """Release 1.0 and the hotfix 1.1 on it (hotfix_of), and the hotfix's whole image as an engine holds it."""
    from ..fake_engine import FakeImage
    from ..savefixtures import config_for

    shared, new = layer_tar({"base": b"base" * 100}), layer_tar({"new": b"new" * 100})
    base, _ = make_release(out, "1.0", layers=[shared, layer_tar({"old": b"old" * 100})])
    return base, hotfix_of(out, base), FakeImage(config=config_for([shared, new]), layers=[shared, new])


def test_verify_load_of_a_hotfix_the_engine_holds_whole_needs_no_base(tmp_path):
    from unibake.verify import load_and_compare, verify_folder

    from ..fake_engine import FakeEngine

    _, folder, whole = hotfix_pair(tmp_path / "release")
    report = verify_folder(folder)
    engine = FakeEngine()
    refused = load_and_compare(report, engine)  # nothing there: the base is needed for a load
    assert refused.failures[-1].detail.startswith("this hotfix needs image sha256:")
    engine.images[whole.id] = whole  # pulled whole from a registry, or its base removed after it was applied
    engine.tags["demo-llm:1.1"] = whole.id
    held = load_and_compare(report, engine)
    assert not held.failures and "already has" in held.checks[-1].detail  # was: "load release 1.0 first"
    del engine.tags["demo-llm:1.1"]
    assert not load_and_compare(report, engine).failures and engine.tags["demo-llm:1.1"] == whole.id
    assert engine.loads == 0


FAKE_DOCKER = """#!/bin/sh
# the docker CLI as the release's scripts use it, over an engine kept as files: $ENGINE/<ref> holds its image ID
key() { printf '%s' "$1" | tr '/:' '__'; }
case "$1 ${2:-}" in
  "version "*) echo 20.10.24 ;;
  "image inspect")
    if [ "$3" = --format ]; then ref=$5; else ref=$3; fi
    [ -f "$ENGINE/$(key "$ref")" ] || { echo "Error: No such image: $ref" >&2; exit 1; }
    if [ "$3" = --format ]; then cat "$ENGINE/$(key "$ref")"; fi ;;
  "image ls")  # verify-release.sh's list before a load: "ID REF" lines
    for f in "$ENGINE"/*; do if [ -f "$f" ]; then echo "$(cat "$f") $(basename "$f")"; fi; done ;;
  "load ")
    cat > /dev/null; echo "$LOADS_AS" > "$ENGINE/$(key "$LOADS_TAG")"; echo loaded >> "$ENGINE/.loads" ;;
  *) echo "fake docker: $*" >&2; exit 1 ;;
esac
"""


def test_apply_sh_and_the_shell_verifier_take_a_hotfix_the_engine_holds_whole_without_its_base(tmp_path):
    _, folder, whole = hotfix_pair(tmp_path / "release")
    bin_dir, engine = tmp_path / "bin", tmp_path / "engine"
    bin_dir.mkdir()
    engine.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ENGINE": str(engine), "LOADS_AS": whole.id,
           "LOADS_TAG": "demo-llm:1.1"}
    verifier = Path(__file__).resolve().parents[2] / "scripts" / "verify-release.sh"

    def both():
        return (subprocess.run(["sh", "./apply.sh"], cwd=folder, capture_output=True, text=True, env=env),
                subprocess.run(["sh", str(verifier), str(folder)], capture_output=True, text=True, env=env))

    for result in both():  # neither the base nor the hotfix's image: refused, nothing loaded
        assert result.returncode == 3 and "this hotfix needs image sha256:" in result.stderr, result.stderr
    assert not (engine / ".loads").exists()
    for ref in (whole.id, "demo-llm:1.1"):  # pulled whole, or its base removed after it was applied
        (engine / ref.replace(":", "_")).write_text(whole.id + "\n")
    for result in both():
        assert result.returncode == 0, result.stderr  # was: "import release 1.0 first"
        assert f"demo-llm:1.1 is {whole.id}" in result.stdout


def test_a_profile_of_the_base_since_renamed_is_named_as_the_base_releases_not_as_a_profile_option(busybox_product):
    from .test_platforms import hotfix_plan

    renamed = busybox_product / "tp9.yaml"
    (busybox_product / "tp2.yaml").rename(renamed)
    renamed.write_text(renamed.read_text().replace("profile: tp2", "profile: tp9"))
    with pytest.raises(InputError, match=r"^unknown profile 'tp2'; known: tp1, tp9: a hotfix builds the profiles of "
                                         r"release 0\.1\.0 \(tp1, tp2\) unless --profile names others$"):
        hotfix_plan(busybox_product, "linux/amd64")  # no --profile given: it said "(--profile)"
    with pytest.raises(InputError, match=r"^unknown profile 'tp3' \(--profile\); known: tp1, tp9$"):
        hotfix_plan(busybox_product, "linux/amd64", profiles=("tp3",))


def test_a_hotfix_that_shares_no_layer_with_its_base_is_released_whole_needing_no_base(engines, tmp_path,
                                                                                      server):  # noqa: F811
    from ..savefixtures import tar_of

    out = tmp_path / "release"
    release(engines, out)
    hotfix_image(engines, server.server_port, bottom=tar_of([("etc/os-release", b"ID=debian\nVERSION_ID=13\n", None)]))
    reporter = Quiet()
    folder = hotfix_run(engines, out, reporter)["release"].folder
    manifest = load_manifest(folder)
    assert manifest.hotfix is None and manifest.previous == "1.0"  # was a "hotfix" asking for 1.0's image
    assert not (folder / "apply.sh").exists() and "Hotfix on top of" not in (folder / "RELEASE_NOTES.md").read_text()
    assert "the image shares no layer with release 1.0" in reporter.stream.getvalue()


def test_apply_sh_s_roll_back_line_works_when_the_default_profile_spans_nodes(tmp_path):
    """run.sh refuses a profile on several nodes without NODE_RANK and MASTER_ADDR: the roll-back
    apply.sh prints must give them, as the guides' lines do."""
    import re
    import shlex

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"]["topology"] = {"nodes": 2, "network": "host", "rdma": True}
    shared = layer_tar({"base": b"base" * 100})
    base, _ = make_release(tmp_path / "release", "1.0", metadata, layers=[shared, layer_tar({"old": b"old" * 100})])
    folder = hotfix_of(tmp_path / "release", base, metadata=metadata)
    line = re.search(r"roll back with ([^)]*\./run\.sh)", (folder / "apply.sh").read_text()).group(1)
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[:-1])
    run = subprocess.run(["sh", "./run.sh", "--dry-run"], cwd=folder, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **env})
    assert run.returncode == 0, (line, run.stderr)


def test_stage_build_force_of_a_released_version_waits_for_a_hotfix_made_on_it(engines, tmp_path, busybox_product):  # noqa: F811
    # build --stage build --force moved the released tag without the release's lock: a hotfix's hold
    # on it did not stop it (a full build's release folder takes that lock)
    from unibake.errors import UnibakeError
    from unibake.pipeline import BUILD, selection
    from unibake.publish import hold_release

    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(product="unibake-test", tag="unibake-test:1.0")  # the busybox product's release 1.0
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    request = Request(env={}, cwd=tmp_path, out=out, version="1.0", force=True, config=str(busybox_product),
                      require_lock=False)
    hold = hold_release(out, "1.0")  # a hotfix made on 1.0, running
    try:
        with pytest.raises(UnibakeError, match=rf"a run is using release {out / '1.0'} \(pid {os.getpid()}\): a hotfix "
                                               r"made on it, .* the build would move unibake-test:1.0; wait for it "
                                               r"\(nothing was built\)"):
            run_stages(selection(BUILD, "build"), request, Quiet(), connect=engines.__getitem__)
    finally:
        hold.close()
    assert engines[None].loads == 0 and "unibake-test:1.0" not in engines[None].tags


def test_stage_build_force_of_the_base_of_a_published_hotfix_is_refused_as_a_whole_force_run_is(
        engines, tmp_path, busybox_product):  # noqa: F811
    # found by review: the folder stage refuses a --force on a hotfix's base, but --stage build skips it: the build
    # moved the base's tag and let its image go at the end, and the hotfix's apply.sh and verify --load then failed
    from unibake.pipeline import BUILD, selection

    out = tmp_path / "release"
    folder, _ = make_release(out, "1.0")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(product="unibake-test", tag="unibake-test:1.0")  # the busybox product's release 1.0
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    hotfix_of(out, folder)
    request = Request(env={}, cwd=tmp_path, out=out, version="1.0", force=True, config=str(busybox_product),
                      require_lock=False)
    with pytest.raises(InputError, match=r"release 1.0 is the base of the hotfix 1.1 under .*: --force would "
                                         r"replace its image sha256:"):
        run_stages(selection(BUILD, "build"), request, Quiet(), connect=engines.__getitem__)
    assert engines[None].loads == 0 and "unibake-test:1.0" not in engines[None].tags


def test_stage_build_force_through_a_linked_release_waits_for_a_hotfix_made_under_the_target_s_out(
        engines, tmp_path, busybox_product):  # noqa: F811
    # (before: release/1.0 -> /mnt/big/1.0: --out release held release/.1.0.lock only, while a hotfix made
    # with --out /mnt/big holds /mnt/big/.1.0.lock, and the build moved the tag of the hotfix's base)
    from unibake.errors import UnibakeError
    from unibake.pipeline import BUILD, selection
    from unibake.publish import hold_release

    out, big = tmp_path / "release", tmp_path / "big"
    folder, _ = make_release(big, "1.0")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(product="unibake-test", tag="unibake-test:1.0")  # the busybox product's release 1.0
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    out.mkdir()
    (out / "1.0").symlink_to(folder)
    request = Request(env={}, cwd=tmp_path, out=out, version="1.0", force=True, config=str(busybox_product),
                      require_lock=False)
    hold = hold_release(big, "1.0")  # a hotfix made on /mnt/big/1.0 with --out /mnt/big, running
    try:
        with pytest.raises(UnibakeError, match=rf"a run is using release {big / '1.0'} \(pid {os.getpid()}\): a hotfix "
                                               r"made on it, .* the build would move unibake-test:1.0"):
            run_stages(selection(BUILD, "build"), request, Quiet(), connect=engines.__getitem__)
    finally:
        hold.close()
    assert engines[None].loads == 0 and "unibake-test:1.0" not in engines[None].tags


def test_a_hotfix_from_a_link_to_a_release_holds_the_release_it_names(engines, tmp_path):  # noqa: F811
    # (before: --from latest (-> 1.0) held only .latest.lock: a build --force of 1.0 replaced the base under it)
    from contextlib import ExitStack

    from unibake.errors import UnibakeError

    out = tmp_path / "release"
    release(engines, out)  # demo:1.0
    (out / "latest").symlink_to("1.0")
    request = Request(env={}, cwd=tmp_path, out=out, base="latest", version="1.0.1")
    with ExitStack() as hotfix:
        run_stages([BY_NAME["hotfix base"]], request, Quiet(), stack=hotfix)
        with pytest.raises(UnibakeError, match=rf"a hotfix or another release is being made on release {out / '1.0'} \(pid {os.getpid()}\)"):
            release(engines, out, force=True)
    release(engines, out, force=True)  # the hotfix ended: let go


def test_stage_build_of_a_version_a_full_build_is_writing_is_refused_naming_it(engines, tmp_path, busybox_product):  # noqa: F811
    # (before: a plain --stage build of a version whose release folder a running build was writing, its
    # manifest not written yet, moved the tag under that build)
    from unibake.errors import UnibakeError
    from unibake.pipeline import BUILD, selection
    from unibake.publish import ReleaseFolder

    out = tmp_path / "release"
    request = Request(env={}, cwd=tmp_path, out=out, version="1.0", config=str(busybox_product), require_lock=False)
    with ReleaseFolder(out, "1.0", force=False):  # the full build of 1.0, running: its folder staged, locked
        with pytest.raises(UnibakeError, match=rf"a run is using release {out / '1.0'} \(pid {os.getpid()}\): .*"
                                               r"the build would move unibake-test:1.0; wait for it"):
            run_stages(selection(BUILD, "build"), request, Quiet(), connect=engines.__getitem__)
    assert engines[None].loads == 0 and "unibake-test:1.0" not in engines[None].tags


@pytest.mark.skipif(os.geteuid() != 0, reason="makes the hotfix's run another user's, as root can")
def test_a_hotfix_by_another_user_holds_a_base_release_whose_lock_file_it_cannot_write(tmp_path):
    # release 1.0 made by one user (its lock file theirs, 0644) under an --out shared with the user
    # who makes the hotfix: the hold is a shared flock, which needs no write ("Permission denied" before)
    import tempfile

    from unibake.publish import hold_release

    shared = Path(tempfile.mkdtemp(prefix="unibake-shared-"))
    try:
        shared.chmod(0o755)
        out = shared / "release"
        make_release(out, "1.0")
        out.chmod(0o777)
        assert oct((out / ".1.0.lock").stat().st_mode & 0o777) == "0o644"
        # the other user: hold the base as the hotfix's first stage does
        assert as_nobody(lambda: hold_release(out, "1.0").close()) == "ok: None"
    finally:
        shutil.rmtree(shared)


def test_stage_build_of_a_version_whose_release_folder_is_a_link_looping_back_does_not_refuse_itself(
        engines, tmp_path, busybox_product):  # noqa: F811
    # (before: release/1.0 -> release/1.0 (or release/1.0 -> other/1.0 -> release/1.0) named the same lock
    # twice, as its own and as its target's: the run took it, then was refused by itself, 'a run is using
    # release .../1.0 (pid <its own>)')
    from unibake.pipeline import BUILD, selection

    out = tmp_path / "release"
    out.mkdir()
    (out / "1.0").symlink_to(out / "1.0")
    (out / ".1.0.lock").write_text("")  # a run before this one made it
    request = Request(env={}, cwd=tmp_path, out=out, version="1.0", force=True, config=str(busybox_product),
                      require_lock=False)
    # past the release's lock, to the engine (which has no base image here: nothing was built)
    with pytest.raises(InputError, match=r"base image \S+ is not in the engine \(fake://source\)"):
        run_stages(selection(BUILD, "build"), request, Quiet(), connect=engines.__getitem__)


def test_a_forged_base_that_loads_as_another_image_is_taken_out_of_the_verify_engine_again(engines, tmp_path, server):  # noqa: F811
    """The base folder's archive another product's, its manifest's archive record and SHA256SUMS rewritten to
    match: the round trip refused it (the load gave another image), but that image and its tag other:1.0 stayed in
    the --verify-engine, and a tag other:1.0 it held before named the forged image from then on."""
    from ..forge import forge
    from ..savefixtures import docker_layout
    from .test_supply_chain import LAYERS

    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    hotfix_image(engines, server.server_port)
    other, _, _ = docker_layout([LAYERS[0]], tag="other:1.0")
    forge(folder, stream=other)
    verify = engines["fake://verify"]
    loads = verify.loads
    with pytest.raises(VerificationError, match=r"its archive did not load as the image sha256:\w+ that its "
                                                r"manifest\.json records: it holds another image; check it with: "
                                                r"python build\.py verify \S+/1\.0$"):
        hotfix_run(engines, out)
    assert verify.loads == loads + 1 and (verify.images, verify.tags) == ({}, {})
    mine = verify.add({"architecture": "amd64", "os": "linux", "mine": 1}, [b"mine"], tag="other:1.0")
    kept = verify.add({"architecture": "amd64", "os": "linux", "kept": 1}, [b"kept"], tag="kept:1")
    with pytest.raises(VerificationError, match="it holds another image"):
        hotfix_run(engines, out)
    assert verify.tags == {"other:1.0": mine, "kept:1": kept} and set(verify.images) == {mine, kept}


def test_a_base_archive_holding_another_image_beside_the_base_is_refused_and_undone(engines, tmp_path, server):  # noqa: F811
    """The base folder's archive forged to hold the base image and another one tagged victim:1 (its manifest's archive
    record and SHA256SUMS rewritten to match): the base loaded, so the round trip went on, and victim:1 in the
    --verify-engine named the forged image from then on (the run removed only the base again)."""
    import hashlib

    from ..forge import json_member, member, replace_member

    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    hotfix_image(engines, server.server_port)
    evil = layer_tar({"evil": b"evil" * 10})
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {
        "type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(evil).hexdigest()}"]}}).encode()

    def beside(entries):
        manifest = json_member(entries, "manifest.json")
        manifest.append({"Config": "evil.json", "RepoTags": ["victim:1"], "Layers": ["evil/layer.tar"]})
        return replace_member(entries, "manifest.json", json.dumps(manifest).encode()) + [
            member("evil/layer.tar", evil), member("evil.json", config)]

    _forged_base_is_refused_and_undone(engines, out, folder, beside, (
        r"the base release .*/1\.0: its archive loaded another image beside the image sha256:\w+ that its "
        r"manifest\.json records: victim:1 "))


def test_a_base_archive_that_puts_another_tag_on_the_base_is_refused_and_undone(engines, tmp_path, server):  # noqa: F811
    """The base folder's archive forged to give the base image a second tag, victim:1 (its manifest's archive record
    and SHA256SUMS rewritten to match): the base loaded as its manifest records, so nothing was refused, and
    victim:1 in the --verify-engine, which named an image of the engine's own, was moved onto the base (and gone
    with it when the run took the base out again)."""
    from ..forge import json_member, replace_member

    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    hotfix_image(engines, server.server_port)

    def retag(entries):
        manifest = json_member(entries, "manifest.json")
        manifest[0]["RepoTags"] = list(manifest[0].get("RepoTags") or []) + ["victim:1"]
        return replace_member(entries, "manifest.json", json.dumps(manifest).encode())

    _forged_base_is_refused_and_undone(engines, out, folder, retag, (
        r"the base release .*/1\.0: its archive put a tag on the image sha256:\w+ other than its release's "
        r"demo:1\.0: victim:1"))


def _forged_base_is_refused_and_undone(engines, out, folder, change, refusal: str) -> None:
    """The base folder's archive rewritten by ``change`` over its entries (its manifest's archive record and
    SHA256SUMS resummed to match), a victim:1 of the verify engine's own beside: the hotfix is refused with
    ``refusal`` and the verify engine holds its own image, and its tag, as before."""
    import io
    import tarfile

    import zstandard

    from ..forge import forge, write_tar
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO((folder / "demo-1.0.tar.zst").read_bytes()),
                                                     read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        entries = [(i, tar.extractfile(i).read() if i.isfile() else None) for i in tar.getmembers()]
    forge(folder, stream=write_tar(change(entries)))
    verify = engines["fake://verify"]
    mine = verify.add({"architecture": "amd64", "os": "linux", "mine": 1}, [b"mine"], tag="victim:1")
    with pytest.raises(VerificationError, match=refusal):
        hotfix_run(engines, out)
    assert verify.tags == {"victim:1": mine} and set(verify.images) == {mine}


def test_a_hotfix_on_a_release_of_every_profile_says_when_a_profile_added_since_gives_its_tag_a_suffix(
        busybox_product):
    # release 0.1.0 was made of every profile (tp1, tp2: tagged 0.1.0); a profile added since (tp3) makes those
    # two a selection, so `hotfix --from 0.1.0` was named 0.1.1-tp1-tp2 without a word
    from types import SimpleNamespace

    from unibake.pipeline import Results

    from .test_supply_chain import Quiet

    added = busybox_product / "tp3.yaml"
    added.write_text((busybox_product / "tp2.yaml").read_text().replace("profile: tp2", "profile: tp3"))

    def plan_on(base_tag, **request):
        base = SimpleNamespace(manifest=SimpleNamespace(platform="linux/amd64", profiles={"tp1": None, "tp2": None},
                                                        tag=base_tag, release="0.1.0", product="unibake-test"))
        reporter = Quiet()
        request = Request(env={}, cwd=busybox_product.parent, config=busybox_product, version="0.1.1", **request)
        plan = run_stages([BY_NAME["plan"]], request, reporter, given=Results(values={"base": base}))["plan"]
        return plan.tag, [line for line in reporter.stream.getvalue().splitlines() if line.startswith("warning:")]

    tag, warnings = plan_on("unibake-test:0.1.0")
    assert tag == "unibake-test:0.1.1-tp1-tp2"
    assert warnings == ["warning: the profiles now include tp3, which release 0.1.0 (made of every profile then: "
                        "tp1, tp2) did not have: this hotfix builds that release's profiles, so it is named "
                        "unibake-test:0.1.1-tp1-tp2, not unibake-test:0.1.1; give --profile all to build it too (or "
                        "--profile for the ones to build)"]
    # a base that was a selection already, or profiles named on the command line: nothing to say
    assert plan_on("unibake-test:0.1.0-tp1-tp2") == ("unibake-test:0.1.1-tp1-tp2", [])
    assert plan_on("unibake-test:0.1.0", profiles=("tp1", "tp2")) == ("unibake-test:0.1.1-tp1-tp2", [])
    assert plan_on("unibake-test:0.1.0", profiles=("all",)) == ("unibake-test:0.1.1", [])
    added.unlink()
    assert plan_on("unibake-test:0.1.0") == ("unibake-test:0.1.1", [])


def test_a_hotfix_round_trip_shows_its_base_release_loading_under_its_own_counter(
        engines, tmp_path, server, monkeypatch):  # noqa: F811
    # the round trip of a hotfix loads its base release first (a whole release's archive, 30 GiB) before its own:
    # that load was counted nowhere, so the round trip's bar stood at nothing for as long as it took
    import itertools

    out = tmp_path / "release"
    release(engines, out)
    hotfix_image(engines, server.server_port)
    base = load_manifest(out / "1.0")
    reporter = Quiet()
    clock = itertools.count(0.0, 6.0)  # (every counter's step is past its 5 s: each prints its line)
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    hotfix_run(engines, out, reporter)
    lines = [line.strip() for line in reporter.stream.getvalue().splitlines()]
    based = [line for line in lines if line.startswith("load 1.0 (the base): ")]
    whole = base.archive.uncompressed_bytes / 2**30
    assert based and based[-1].startswith(f"load 1.0 (the base): {whole:.2f} GiB of {whole:.2f} GiB"), lines
    first = next(i for i, line in enumerate(lines) if line.startswith("round trip: "))
    assert lines.index(based[0]) < first  # (the base first, then the hotfix's own load)


def test_a_hotfix_shows_its_base_release_s_archive_checked_beside_the_build(engines, tmp_path, server,  # noqa: F811
                                                                            monkeypatch):
    # "==> hotfix base" read the base release's whole archive against its SHA256SUMS (minutes for 30 GiB) with no
    # progress; it has a counter of its own, whose total is what it reads (the archive), and it reads in a thread
    # beside the plan and the build
    import itertools

    from unibake.console import Reporter

    out = tmp_path / "release"
    release(engines, out)
    hotfix_image(engines, server.server_port)
    read = []

    class Counting(Quiet):  # (the plain reporter, its counters' totals and bytes kept beside their lines)
        def counter(self, description, total):
            advance = Reporter.counter(self, description, total)
            read.append([description, total, 0])

            def counted(n):
                read[-1][2] += n
                advance(n)
            return counted

    reporter = Counting()
    clock = itertools.count(0.0, 6.0)
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    hotfix_run(engines, out, reporter)
    assert read[0][0] == "check 1.0 (the base)" and read[0][1] == read[0][2] > 0, read
    assert "check 1.0 (the base): " in reporter.stream.getvalue()


# a child that runs the export of a hotfix whose base release loads into a fresh engine that never ends the load (a
# scratch engine whose stop a third interrupt cut short: the exit does not wait for that load); the export itself is
# interrupted by a SIGTERM
_STUCK_PRELOAD = """
import os, signal, sys, threading
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, {repo!r})
from unibake import cli, pipeline
from unibake.builder import BuiltImage
from unibake.errors import UnibakeError
from unibake.hotfix import load_base
from tests.fake_engine import FakeEngine
from tests.unit.test_supply_chain import Quiet

class NeverEnding(FakeEngine):
    def load(self, chunks, stop=None):
        Path({mark!r}).write_text("")
        threading.Event().wait()

class Exporting(FakeEngine):
    def inspect_image(self, ref):
        Path({exporting!r}).write_text("")
        threading.Event().wait()  # until the interrupt

fresh = NeverEnding(address="fake://scratch")
pipeline._fresh_engine = lambda run, seed=None, keep=None: (fresh, None, "a scratch engine", None, None)
out = Path({out!r})
engines = {{None: Exporting(address="fake://source")}}
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, cli._terminate)
request = pipeline.Request(env={{}}, cwd=out.parent, out=out, image="demo:1.1", base="1.0", seed=False)
code = 0
try:
    with ExitStack() as stack:
        run = pipeline.Run(request, Quiet(), stack, engines.__getitem__)
        run.results.update(
            plan=SimpleNamespace(base_image="base:1", platform=None, product="demo"),
            built=BuiltImage(image_id="sha256:" + "1" * 64, tag="demo:1.1", diff_ids=(), steps=(), stage_images=(),
                             seconds=0.0),
            target=SimpleNamespace(archive_name="demo-1.1.tar.zst"), base=load_base(out, "1.0"),
            folder=SimpleNamespace(staging=Path({staging!r})), context=SimpleNamespace(selection="tp1"))
        pipeline._export(run)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    code = 130
except UnibakeError as exc:
    print(f"error: {{exc}}", flush=True)
    code = 1
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # as build.py, once main() has returned
    signal.signal(sig, signal.SIG_IGN)
sys.exit(code)
"""


def test_an_interrupted_hotfix_export_exits_without_waiting_for_a_base_release_load_that_never_ends(
        engines, tmp_path):  # noqa: F811
    # the load of the base release ran in a ThreadPoolExecutor's worker, which the interpreter joins at its exit: a
    # run interrupted while that load could not end (a scratch engine whose stop a third Ctrl-C cut short) said
    # "interrupted", then never exited (its signals ignored by then: only SIGKILL ended it; with Python's own
    # handler a Ctrl-C there printed a traceback)
    import signal
    import sys
    import time

    from ..conftest import REPO

    out = tmp_path / "release"
    release(engines, out)
    (tmp_path / "staging").mkdir()
    mark, exporting = tmp_path / "loading", tmp_path / "exporting"
    script = _STUCK_PRELOAD.format(repo=str(REPO), mark=str(mark), exporting=str(exporting), out=str(out),
                                   staging=str(tmp_path / "staging"))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (mark.exists() and exporting.exists()) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists() and exporting.exists(), child.communicate(timeout=10)
        child.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not exit: its exit waited for the base release's load")
        assert child.returncode == 130 and stdout == "interrupted\n" and "Traceback" not in stderr, (stdout, stderr)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def test_a_reference_whose_last_colon_is_not_its_tag_s_is_refused_not_read_as_latest(engines, tmp_path):  # noqa: F811
    # (before: --from demo:../../x, or host:5000/demo, was read as a reference without a tag, so as "latest": with
    # a latest link under --out, the hotfix was made on the release it names, without a word)
    out = tmp_path / "release"
    release(engines, out)
    (out / "latest").symlink_to("1.0")
    for name in ("demo:../../x", "localhost:5000/demo", "demo:1.0/"):
        request = Request(env={}, cwd=tmp_path, out=out, base=name, version="1.0.1")
        if name == "demo:1.0/":  # (a trailing slash, as a shell completes a folder's name, is still 1.0)
            assert run_stages([BY_NAME["hotfix base"]], request, Quiet())["base"].manifest.release == "1.0"
            continue
        with pytest.raises(InputError, match=rf"^--from '{re.escape(name)}': not the name of a release folder under "
                                             r"--out"):
            run_stages([BY_NAME["hotfix base"]], request, Quiet())


def test_build_without_from_finds_the_newest_full_release_of_its_product_platform_and_epoch(engines, tmp_path):  # noqa: F811
    """The releases a release made without --from is made on: of the same product, platform and profiles at its
    epoch, full, in one archive file that is there, not itself; newest published first; links and broken folders passed
    over."""
    from unibake.hotfix import earlier_releases

    out = tmp_path / "release"
    made = release(engines, out)["release"].folder
    record = json.loads((made / "manifest.json").read_text())
    shutil.rmtree(made)

    def folder(name: str, published: str, with_archive: bool = True, **changed) -> None:
        (out / name).mkdir()
        doc = {**record, "release": name, "version": name, "tag": f"demo:{name}", "published": published,
               "first_published": None, "source_date_epoch": 1700000000, **changed}
        (out / name / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n")
        if with_archive:  # (a fresh clone's release folder lacks it: archives are not tracked)
            (out / name / doc["archive"]["files"][0]["name"]).write_bytes(b"")

    two_parts = {**record["archive"], "files": record["archive"]["files"] * 2}
    folder("1.0", "2026-12-01T00:00:00Z")
    folder("1.1", "2026-12-03T00:00:00Z")
    folder("1.2", "2026-12-02T00:00:00Z")
    folder("other", "2026-12-05T00:00:00Z", product="other")
    folder("arm", "2026-12-05T00:00:00Z", platform="linux/arm64")
    folder("later", "2026-12-05T00:00:00Z", source_date_epoch=1700000060)
    folder("old", "2026-12-05T00:00:00Z", source_date_epoch=None)
    folder("parts", "2026-12-05T00:00:00Z", archive=two_parts)
    folder("misnamed", "2026-12-05T00:00:00Z", release="1.9")
    one = next(iter(record["profiles"].values()))
    folder("selection", "2026-12-05T00:00:00Z", profiles={**record["profiles"], "tp8": one})  # (its checks: another step)
    folder("another", "2026-12-05T00:00:00Z", profiles={"tp9": one})
    folder("cloned", "2026-12-05T00:00:00Z", with_archive=False)
    folder("broken", "2026-12-05T00:00:00Z")
    (out / "broken" / "manifest.json").write_text("{")
    (out / "latest").symlink_to("1.1")

    def found(epoch=1700000000, release="2.0"):  # (None: at any epoch)
        return [m.release for m in earlier_releases(out, product="demo", platform="linux/amd64",
                                                     profiles=list(record["profiles"]), release=release)
                if epoch in (None, m.source_date_epoch)]

    assert found() == ["1.1", "1.2", "1.0"]
    assert found(release="1.1") == ["1.2", "1.0"]  # (the release a --force run replaces is never its own base)
    assert found(epoch=1700000060) == ["later"]
    assert found(epoch=None) == ["later", "1.1", "1.2", "1.0"]
    assert [m.release for m in earlier_releases(out, product="demo", platform="linux/amd64",
                                                profiles=[*record["profiles"], "tp8"], release="2.0")] == ["selection"]
    assert earlier_releases(tmp_path / "none", product="demo", platform="linux/amd64", profiles=["tp1"],
                            release="2.0") == []


@pytest.mark.parametrize("asked, made_on", [
    ({}, True), ({"nocache": True}, False), ({"sequential": True}, False), ({"seed": False}, False),
    ({"verify_engine": "fake://verify"}, False), ({"roundtrip": False}, False), ({"base": "1.0"}, False)])
def test_a_release_is_made_on_an_earlier_one_only_where_that_gives_the_same_proof(asked, made_on, tmp_path):
    """A cold --no-cache release stays cold; --sequential, --no-seed, --verify-engine and --no-roundtrip ask for a
    round trip that holds nothing of this product (or none); --from names the release itself."""
    from unibake.pipeline import BUILD, SEQUENTIAL, on_earlier

    request = Request(env={}, cwd=tmp_path, **asked)
    names = SEQUENTIAL if asked.get("sequential") else BUILD
    got, stages = on_earlier(request, names)
    assert ("earlier release" in stages) is made_on and (got.earlier, got.whole) == (made_on, made_on)
    assert [s for s in stages if s != "earlier release"] == list(names)
    if made_on:
        assert stages.index("earlier release") == stages.index("folder") + 1
        selection(stages)  # (in the stages' order)


def test_no_from_goes_with_neither_from_nor_a_stage_that_writes_no_release(cli, busybox_product):
    both = cli("--config", str(busybox_product), "--version", "1.1", "--from", "1.0", "--no-from")
    assert both.code == 2 and both.error_lines == [
        "error: --no-from with --from 1.0: --from names the release this one is made on, --no-from makes it on "
        "none; leave out one of them"]
    staged = cli("--config", str(busybox_product), "--version", "1.1", "--stage", "build", "--no-from")
    assert staged.code == 2 and staged.error_lines[-1].startswith("error: --no-from with --stage build: --no-from "
                                                                 "chooses what the release is made on")


def test_a_hotfix_published_while_a_force_run_waited_for_its_base_s_lock_keeps_its_base(engines, tmp_path,  # noqa: F811
                                                                                       monkeypatch):
    # found by review: --force checked for hotfixes on the release it replaces before taking its lock, not after: a
    # hotfix published in between (here, as the lock is taken) lost its base
    from unibake import pipeline

    out = tmp_path / "release"
    folder = release(engines, out)["release"].folder
    before = (folder / "SHA256SUMS").read_bytes()
    real = pipeline.ReleaseFolder

    class HotfixPublishedMeanwhile(real):
        def __enter__(self):
            hotfix_of(out, folder)
            return super().__enter__()

    monkeypatch.setattr(pipeline, "ReleaseFolder", HotfixPublishedMeanwhile)
    with pytest.raises(InputError, match=r"release 1.0 is the base of the hotfix 1.1 under .*: --force would "
                                         r"replace its image sha256:"):
        release(engines, out, force=True)
    assert (folder / "SHA256SUMS").read_bytes() == before
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == ["1.0", "1.1"]
