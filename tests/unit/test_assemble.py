"""The assembled hotfix's parts that need no engine: the record of the memo image's normalised layers,
the base release's archive read for its bottom layers, the small base, the in-image checks' verdict.
(That an assembled hotfix is the image a whole build gives is held on the real engine:
tests/engine/test_hotfix_repro.py.)"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from unibake import buildmemo
from unibake.assemble import Assembly, _small_base, assembled_stream, run_checks
from unibake.docker_engine import _first_folder
from unibake.engine import RunOutcome
from unibake.errors import ArchiveError, CheckFailed, VerificationError
from unibake.imagetar import CAPTURE, DROP, PASS, filter_members

from ..fake_engine import FakeEngine

KEY = b"k" * 32
LOWER = "sha256:" + "a" * 64
IDS = ("sha256:" + "1" * 64, "sha256:" + "2" * 64)


def test_the_normalised_lower_record_is_found_for_its_image_and_epoch_alone(tmp_path):
    buildmemo.remember_lower(tmp_path, "all", "linux/amd64", LOWER, 1700, IDS, KEY)
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/amd64", LOWER, 1700, KEY) == IDS
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/amd64", LOWER, 1701, KEY) is None  # another epoch
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/amd64", "sha256:" + "b" * 64, 1700, KEY) is None
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/arm64", LOWER, 1700, KEY) is None  # another platform
    # another epoch recorded keeps the first (a hotfix takes its base release's)
    buildmemo.remember_lower(tmp_path, "all", "linux/amd64", LOWER, 1800, IDS[:1], KEY)
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/amd64", LOWER, 1700, KEY) == IDS
    assert buildmemo.remembered_lower(tmp_path, "all", "linux/amd64", LOWER, 1800, KEY) == IDS[:1]


def test_a_normalised_lower_record_not_signed_with_this_user_s_key_is_not_taken(tmp_path):
    # a record a checkout brought (or one edited: the diffIDs of another image's layers) would have a hotfix
    # assembled on layers the memo's image does not give
    buildmemo.remember_lower(tmp_path, "all", None, LOWER, 1700, IDS, b"x" * 32)
    assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 1700, KEY) is None
    buildmemo.remember_lower(tmp_path, "all", None, LOWER, 1700, IDS, KEY)
    path = next(tmp_path.glob("*.lower.json"))
    record = json.loads(path.read_text())
    record["entries"][0]["diff_ids"] = list(reversed(IDS))
    path.write_text(json.dumps(record))
    assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 1700, KEY) is None
    for junk in ("not json", "[" * 100_000):  # (nested deeper than the stack: a RecursionError, no ValueError)
        path.write_text(junk)
        assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 1700, KEY) is None
    # found by review: a mac of non-ASCII text was a TypeError from compare_digest, a traceback in every build
    # assembled on that memo image
    path.write_text(json.dumps({"version": buildmemo.VERSION, "entries": [
        {"lower": LOWER, "epoch": 1700, "diff_ids": list(IDS), "mac": "\u00e9" * 64}]}))
    assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 1700, KEY) is None
    buildmemo.remember_lower(tmp_path, "all", None, LOWER, 1700, IDS, KEY)  # written over the junk
    assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 1700, KEY) == IDS


def test_the_normalised_lower_record_keeps_its_latest_entries_only(tmp_path):
    for epoch in range(buildmemo.LOWER_RECORDS + 5):
        buildmemo.remember_lower(tmp_path, "all", None, LOWER, epoch, IDS, KEY)
    entries = json.loads(next(tmp_path.glob("*.lower.json")).read_text())["entries"]
    assert len(entries) == buildmemo.LOWER_RECORDS and entries[0]["epoch"] == buildmemo.LOWER_RECORDS + 4
    assert buildmemo.remembered_lower(tmp_path, "all", None, LOWER, 0, KEY) is None


def _tar(members: list[tuple[str, bytes]], *, fmt=tarfile.USTAR_FORMAT, pax: dict | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _chunks(data: bytes, size: int = 700):
    return [data[i:i + size] for i in range(0, len(data), size)]


def _bottom(archive: bytes, captured: dict[str, bytes]):
    # as the assembled stream reads the base release's archive: its bottom layer "aa" passed on, its config
    # "cc" captured, the rest left out
    return filter_members(_chunks(archive), lambda n: {"blobs/sha256/aa": PASS, "blobs/sha256/cc": CAPTURE}.get(n, DROP),
                          strict="the base release's archive", captured=captured, capture_limit=1 << 20)


def test_the_base_release_s_archive_gives_its_bottom_layers_as_they_are_and_its_config():
    layer = b"L" * 1300
    archive = _tar([("blobs/sha256/aa", layer), ("blobs/sha256/bb", b"other" * 200),
                    ("blobs/sha256/cc", b'{"config": 1}'), ("manifest.json", b"[]")])
    captured: dict[str, bytes] = {}
    out = b"".join(_bottom(archive, captured))
    assert captured == {"blobs/sha256/cc": b'{"config": 1}'}
    with tarfile.open(fileobj=io.BytesIO(out + bytes(1024))) as tar:  # (the end blocks are the caller's)
        assert tar.getnames() == ["blobs/sha256/aa"]
        assert tar.extractfile("blobs/sha256/aa").read() == layer
    assert len(out) == 512 + 1536  # header, content, padding: nothing else, no end-of-archive blocks


@pytest.mark.parametrize("damage,says", [
    (lambda a: a[:1024], "ends without its end-of-archive blocks"),  # the member, then nothing
    (lambda a: _tar([("blobs/sha256/aa", b"x")], fmt=tarfile.PAX_FORMAT, pax={"path": "blobs/sha256/zz"}),
     "which is no file or folder"),
    (lambda a: b"\x01" * 512 + a, "does not parse"),
])
def test_a_base_release_archive_that_is_not_the_canonical_form_is_an_error(damage, says):
    archive = _tar([("blobs/sha256/aa", b"L" * 100)])
    with pytest.raises(ArchiveError, match=says):
        list(_bottom(damage(archive), {}))


@pytest.mark.parametrize("config", [b"[" * 100_000, b"[]", b'{"history": [1]}'])
def test_a_base_release_config_that_proves_its_id_but_is_no_image_config_is_an_error(config, tmp_path):
    """A release folder under --out is anyone's: its config hashes to the ID its manifest names, and may still be
    nested deeper than the stack, or not an object; the assembly refuses it in one error, its spool removed."""
    from types import SimpleNamespace as NS

    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    base = NS(manifest=NS(diff_ids=IDS, image_id=image_id, release="1.0"))
    assembly = NS(lower_layers=1, lower_history=("RUN x",), checks_at=1, checks_created_by="RUN checks")
    spool = tmp_path / "small.tar"
    spool.write_bytes(b"")
    stream = assembled_stream(assembly, base, NS(path=spool), "t:1", NS(layers=[("blobs/sha256/aa",)], config=config))
    with pytest.raises(VerificationError, match=r"release 1\.0's config sha256:[0-9a-f]{12} is not an image config"):
        list(stream)
    assert not spool.exists()


def test_a_base_release_config_over_the_bound_is_an_error_not_held_in_memory():
    archive = _tar([("blobs/sha256/cc", b"{" + b" " * 4000 + b"}")])
    with pytest.raises(ArchiveError, match="blobs/sha256/cc is over 1024 bytes"):
        list(filter_members(_chunks(archive), lambda n: CAPTURE, strict="the base release's archive", captured={},
                            capture_limit=1024))


def test_the_small_base_holds_the_folders_as_given_and_the_memo_image_s_settings():
    settings = {"config": {"Env": ["PATH=/bin"], "Shell": ["/bin/bash", "-c"]}, "architecture": "amd64", "os": "linux"}
    raw, archive = _small_base([("/opt", (0o750, 7, 8)), ("/opt/unibake", (0o755, 0, 0))], settings,
                               ["FROM x", "RUN a", "COPY b"], 1700000000, "unibake-cache/p:all-assembled-base")
    config = json.loads(raw)
    assert config["config"] == settings["config"] and config["architecture"] == "amd64"
    # Engine 20.10 refuses more non-empty history entries than layers: one layer, the last entry alone non-empty
    assert [h.get("empty_layer", False) for h in config["history"]] == [True, True, False]
    assert [h["created_by"] for h in config["history"]] == ["FROM x", "RUN a", "COPY b"]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == ["unibake-cache/p:all-assembled-base"]
        layer = tarfile.open(fileobj=io.BytesIO(tar.extractfile(manifest[0]["Layers"][0]).read()))
        assert [(m.name, m.isdir(), m.mode, m.uid, m.gid, m.mtime) for m in layer.getmembers()] == [
            ("opt", True, 0o750, 7, 8, 1700000000), ("opt/unibake", True, 0o755, 0, 0, 1700000000)]


def test_a_folder_s_header_is_read_from_the_start_of_its_archive():
    def folder(name, **fields):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fields.pop("fmt", tarfile.USTAR_FORMAT)) as tar:
            info = tarfile.TarInfo(name)
            info.type = fields.pop("type", tarfile.DIRTYPE)
            for key, value in fields.items():
                setattr(info, key, value)
            tar.addfile(info)
        return out.getvalue()

    assert _first_folder(folder("opt/", mode=0o2775, uid=1000, gid=50)) == (0o2775, 1000, 50)
    # a uid too big for the header's field comes in a PAX header before it
    assert _first_folder(folder("opt/", mode=0o755, uid=3_000_000, gid=0, fmt=tarfile.PAX_FORMAT)) == \
        (0o755, 3_000_000, 0)
    assert _first_folder(folder("opt", type=tarfile.SYMTYPE, linkname="usr/opt")) is None  # a link, not a folder
    assert _first_folder(b"") is None


def _assembly() -> Assembly:
    return Assembly(small="sha256:" + "5" * 64, lower_layers=2, lower_history=("FROM x",),
                    checks="for p in tp1; do check; done", shell=("/bin/sh", "-c"),
                    checks_created_by="/bin/sh -c for p in tp1; do check; done", checks_at=4)


def _engine_running(outcome: RunOutcome) -> tuple[FakeEngine, list]:
    ran = []

    def runner(image, args, env):
        ran.append((image, args))
        return outcome

    engine = FakeEngine(runner=runner)
    engine.add({"architecture": "amd64", "os": "linux"}, [b"l"], tag="demo:1.1")
    return engine, ran


def test_the_in_image_checks_run_on_the_assembled_image_as_its_build_would_run_them():
    engine, ran = _engine_running(RunOutcome(exit_code=0, output="ok"))
    run_checks(engine, "demo:1.1", _assembly())
    assert ran == [("demo:1.1", ["for p in tp1; do check; done"])]


def test_a_failing_in_image_check_on_the_assembled_image_names_the_check():
    engine, _ = _engine_running(RunOutcome(exit_code=1, output="x\nerror: self-check[tp1]: tune cache missing\n"))
    with pytest.raises(CheckFailed, match=r"in-image check failed on the assembled hotfix, so it was not "
                                          r"released: self-check\[tp1\]: tune cache missing"):
        run_checks(engine, "demo:1.1", _assembly())


def test_in_image_checks_that_change_the_image_fail_the_assembled_hotfix():
    # the whole build records what its RUN changed as a layer: the assembled image would not be that image
    engine, _ = _engine_running(RunOutcome(exit_code=0, output="", changes=("C /tmp", "A /tmp/cache")))
    with pytest.raises(VerificationError, match=r"the in-image checks changed the assembled hotfix \(C /tmp, A /tmp/"
                                                r"cache\).*--full-build"):
        run_checks(engine, "demo:1.1", _assembly())


def _found():
    from unibake.contents import _Found

    found = _Found()
    found.files["var/lib/dpkg/status"] = ("text", b"Package: a\nStatus: install ok installed\n")
    found.files["opt/unibake/kernels/libk.so"] = ("library", ("ab" * 32, 1234))
    found.whiteouts.append("etc/old")
    found.problems.append("/x is a link")
    return found


def test_a_layer_s_record_is_taken_back_only_as_this_user_signed_it(tmp_path):
    from unibake.assemble import remember_layers, remembered_layer

    diff_id = "sha256:" + "d" * 64
    remember_layers(tmp_path, KEY, [(diff_id, 4096, _found())])
    size, found = remembered_layer(tmp_path, KEY, diff_id)
    assert size == 4096 and dict(found.files) == dict(_found().files)
    assert found.whiteouts == ["etc/old"] and list(found.problems) == ["/x is a link"]
    assert remembered_layer(tmp_path, b"x" * 32, diff_id) is None  # another user's key (a checkout brought it)
    assert remembered_layer(tmp_path, KEY, "sha256:" + "e" * 64) is None
    path = next((tmp_path / "layers").glob("*.json"))
    mac, body = path.read_bytes().split(b"\n", 1)
    record = json.loads(body)
    record["found"]["files"][0][2] = "UGFja2FnZTogZXZpbA=="  # another package list, the signature as it was
    path.write_bytes(mac + b"\n" + json.dumps(record).encode())
    assert remembered_layer(tmp_path, KEY, diff_id) is None
    path.write_text("{")
    assert remembered_layer(tmp_path, KEY, diff_id) is None


def test_a_layer_record_is_checked_before_it_is_parsed(tmp_path, monkeypatch):
    # (before: a record a checkout planted was parsed first, up to a GiB, six times that in memory, then refused)
    from unibake import assemble

    diff_id = "sha256:" + "d" * 64
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / f"{'d' * 64}.json").write_text('{"version": 1, "found": [' + "0, " * 100_000 + '0]}')
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(assemble.json, "loads", lambda text, *a, **k: parsed.append(len(text)) or real_loads(text))
    assert assemble.remembered_layer(tmp_path, KEY, diff_id) is None
    assert parsed == []  # never parsed
    assemble.remember_layers(tmp_path, KEY, [(diff_id, 4096, _found())])
    assert assemble.remembered_layer(tmp_path, KEY, diff_id)[0] == 4096 and len(parsed) == 1


def test_a_released_config_is_taken_back_only_when_its_digest_is_the_image_id(tmp_path):
    import hashlib

    from unibake.assemble import remember_config, remembered_config

    config = b'{"rootfs": {"type": "layers", "diff_ids": []}}'
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    remember_config(tmp_path, config)
    assert remembered_config(tmp_path, image_id) == config
    (tmp_path / "configs" / f"{image_id[7:]}.json").write_bytes(config + b" ")  # changed: not that image's
    assert remembered_config(tmp_path, image_id) is None
    assert remembered_config(tmp_path, "sha256:" + "f" * 64) is None


@pytest.mark.parametrize("linked", [".cache", ".cache/build-memo", ".cache/build-memo/configs"])
def test_records_are_neither_written_nor_evicted_through_a_link_a_checkout_brought(tmp_path, linked):
    # (before: a .cache linked to a folder of the user's got the records written there, and every *.json in it
    # but the newest 16 was removed by the eviction)
    from unibake.assemble import remember_config, remember_layers

    victim = tmp_path / "victim"
    (victim / "build-memo" / "configs").mkdir(parents=True)
    mine = victim / "build-memo" / "configs" if linked.endswith("configs") else \
        victim / "build-memo" if linked.endswith("memo") else victim
    for n in range(20):
        (mine / f"notes-{n}.json").write_text("{}")
    project = tmp_path / "project"
    (project / linked).parent.mkdir(parents=True, exist_ok=True)
    (project / linked).symlink_to(mine)
    memo = project / ".cache" / "build-memo"
    for n in range(20):
        remember_config(memo, json.dumps({"n": n}).encode())
    remember_layers(memo, KEY, [(f"sha256:{n:064x}", 10, _found()) for n in range(80)])
    assert sorted(p.name for p in mine.glob("*.json")) == sorted(f"notes-{n}.json" for n in range(20))
    assert not list(victim.rglob("layers")) and len(list(victim.rglob("*.json"))) == 20


def test_a_record_not_signed_so_or_not_of_its_digest_is_replaced_not_kept_as_used(tmp_path):
    # (before: a record a checkout planted, or one signed with an old key, was found to exist and only touched:
    # newest for ever, never rewritten, and every hotfix on that base read its archive whole again)
    import hashlib

    from unibake.assemble import remember_config, remember_layers, remembered_config, remembered_layer

    diff_id = "sha256:" + "d" * 64
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / f"{'d' * 64}.json").write_text('{"planted": true}')
    remember_layers(tmp_path, KEY, [(diff_id, 4096, _found())])
    assert remembered_layer(tmp_path, KEY, diff_id)[0] == 4096
    config = b'{"rootfs": {"type": "layers", "diff_ids": []}}'
    digest = hashlib.sha256(config).hexdigest()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / f"{digest}.json").write_bytes(b"{}")
    remember_config(tmp_path, config)
    assert remembered_config(tmp_path, f"sha256:{digest}") == config


def test_the_records_of_a_release_every_later_one_is_made_on_outlive_any_number_of_later_releases(tmp_path):
    """The configs and layer records are evicted oldest first, and one taken back counts as new: release 1.0's
    config and layers stay however many releases are made on it since (before: its config went after 16 of them,
    and every later hotfix or --from release on 1.0 read its archive whole again, 7-10 s against 3 s)."""
    import hashlib
    import time
    from types import SimpleNamespace

    from unibake.assemble import CONFIGS_KEPT, LAYER_RECORDS_KEPT, held_bottom, remember_config, remember_layers

    def config(n: int) -> bytes:
        return json.dumps({"rootfs": {"type": "layers", "diff_ids": [f"sha256:{n:064x}"]}}).encode()

    bottom = ["sha256:" + "b" * 64, "sha256:" + "c" * 64]
    remember_config(tmp_path, config(0))
    remember_layers(tmp_path, KEY, [(d, 4096, _found()) for d in bottom])
    base = SimpleNamespace(manifest=SimpleNamespace(image_id="sha256:" + hashlib.sha256(config(0)).hexdigest(),
                                                    diff_ids=bottom))
    per_release = 4  # layer records a release made on 1.0 writes (its own top layers)
    releases = max(CONFIGS_KEPT, LAYER_RECORDS_KEPT // per_release) + 2
    for n in range(1, releases + 1):
        assert held_bottom(tmp_path, KEY, SimpleNamespace(lower_layers=2), base) is not None, \
            f"1.0's records went after {n - 1} releases made on it"
        time.sleep(0.005)  # (file times: the kernel's clock moves in steps of a few milliseconds)
        remember_config(tmp_path, config(n))
        remember_layers(tmp_path, KEY, [(f"sha256:{n * 100 + i:064x}", 10, _found()) for i in range(per_release)])
        time.sleep(0.005)
    assert len(list((tmp_path / "configs").glob("*.json"))) == CONFIGS_KEPT  # the others were evicted
    assert len(list((tmp_path / "layers").glob("*.json"))) == LAYER_RECORDS_KEPT
    assert held_bottom(tmp_path, KEY, SimpleNamespace(lower_layers=2), base) is not None


def test_the_small_save_gets_a_second_name_for_the_checks_even_where_hard_links_are_refused(tmp_path, monkeypatch):
    from unibake import assemble

    spool = tmp_path / ".assembled-small.tar.tmp"
    spool.write_bytes(b"layers" * 100)
    small = assemble.SmallSave(path=spool, config={}, layers=("a", "b"), diff_ids=("x", "y"))
    linked = small.linked(".assembled-checks.tar.tmp")
    assert linked.path.read_bytes() == spool.read_bytes() and linked.path.stat().st_ino == spool.stat().st_ino
    linked.path.unlink()

    def refused(*args):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(assemble.os, "link", refused)  # (a file system without hard links: vfat, some shares)
    copied = small.linked(".assembled-checks.tar.tmp")
    assert copied.path.read_bytes() == spool.read_bytes() and copied.layers == small.layers
    spool.unlink()  # each reader removes its own name: the other stays whole
    assert copied.path.read_bytes() == b"layers" * 100


class _Folders:
    """An engine that answers only folder_header, from a table, counting what it was asked."""

    def __init__(self, table: dict[str, tuple[int, int, int] | None]):
        self.table, self.asked = table, []

    def folder_header(self, image: str, path: str):
        self.asked.append((image, path))
        return self.table[path]


def test_the_memo_image_s_folders_are_read_once_then_taken_from_a_record_signed_with_this_user_s_key(tmp_path):
    from unibake.assemble import FOLDERS, _folders_of

    paths = ["/opt", "/opt/unibake"]
    engine = _Folders({"/opt": (0o755, 0, 0), "/opt/unibake": None})
    found = _folders_of(engine, tmp_path, KEY, LOWER, paths)
    assert found == [("/opt", (0o755, 0, 0))] and len(engine.asked) == 2
    assert _folders_of(engine, tmp_path, KEY, LOWER, paths) == found and len(engine.asked) == 2  # not asked again
    # another image, or other folders asked for: read from the engine
    assert _folders_of(engine, tmp_path, KEY, "sha256:" + "b" * 64, paths) == found and len(engine.asked) == 4
    assert _folders_of(engine, tmp_path, KEY, LOWER, paths[:1]) == found and len(engine.asked) == 5
    # a record a checkout brings (its mode changed, its MAC not this user's): not taken, the engine asked
    record = tmp_path / FOLDERS / f"{LOWER.removeprefix('sha256:')}.json"
    raw = json.loads(record.read_text())
    raw["folders"][0][1][0] = 0o777
    record.write_text(json.dumps(raw))
    assert _folders_of(engine, tmp_path, KEY, LOWER, paths) == found and len(engine.asked) == 7
    # signed with another key: not taken either
    assert _folders_of(engine, tmp_path, b"o" * 32, LOWER, paths) == found and len(engine.asked) == 9
    # what the engine says is not a folder is the reason not to assemble, and is not recorded
    engine.table["/opt/unibake"] = "not a folder (a link, a file, or a header not read)"
    assert _folders_of(engine, tmp_path, KEY, "sha256:" + "c" * 64, paths).startswith("/opt/unibake in the build")
    assert not (tmp_path / FOLDERS / f"{'c' * 64}.json").exists()


def test_a_lower_record_that_cannot_be_written_is_said_and_the_release_goes_on(tmp_path):
    """The record a later hotfix's assembly checks its base release against is a cache: a full disk or a read-only
    .cache/build-memo once ended a release, its archive made and checked, with that OSError."""
    from types import SimpleNamespace as NS

    from unibake.builder import BuiltImage
    from unibake.pipeline import BUILD_MEMO, _remember_lower

    engine = FakeEngine()
    lower = engine.add({"architecture": "amd64", "os": "linux"}, [b"base"])
    said: list[str] = []

    class FakeRun(dict):
        request = NS(hold=False, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        reporter = NS(info=said.append)
        epoch = 1700

    run = FakeRun(context=NS(selection="all"))
    run.engine = engine
    plan = NS(project_root=tmp_path, platform=NS(name="linux/amd64"))
    built = BuiltImage(image_id=lower, tag="demo:1", diff_ids=(), steps=(), stage_images=(), seconds=0,
                       memo_lower=lower)
    record = buildmemo._lower_file(tmp_path / BUILD_MEMO, "all", "linux/amd64")
    record.mkdir(parents=True)  # where the record goes, a folder: its write fails
    _remember_lower(run, plan, built, IDS)
    assert said and said[0].startswith("    the build memo's layer record was not kept (")
    record.rmdir()
    _remember_lower(run, plan, built, IDS)
    assert buildmemo.remembered_lower(tmp_path / BUILD_MEMO, "all", "linux/amd64", lower, 1700,
                                      buildmemo.secret(run.request.env)) == IDS[:1]
