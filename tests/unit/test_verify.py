"""`build.py verify` on release folders made in the test: what passes, and how each fault is named."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import zstandard

from ..savefixtures import docker_layout, layer_tar
from .test_publish import make_release


@pytest.fixture
def folder(tmp_path):
    return make_release(tmp_path / "release", split=None)[0]


def rewrite_sums(folder, name):
    """What a tamperer does: make SHA256SUMS agree with a changed file."""
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    lines = [f"{digest}  {name}" if line.endswith(f"  {name}") else line
             for line in (folder / "SHA256SUMS").read_text().splitlines()]
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def test_a_good_release_verifies(cli, folder):
    result = cli("verify", str(folder))
    assert result.code == 0, result.err
    for check in ("sha256", "size", "zstd", "structure"):
        assert f"{check} " in result.err


@pytest.mark.parametrize("garbage", [False, True])
def test_verify_counts_the_whole_archive_read_for_its_progress(folder, garbage):
    # a huge archive was minutes of silence; one zstd refuses at once is still read to its end (its digest)
    from contextlib import contextmanager

    from unibake.verify import verify_folder

    name = json.loads((folder / "manifest.json").read_text())["archive"]["name"]
    size = (folder / name).stat().st_size
    if garbage:
        (folder / name).write_bytes(os.urandom(size))
    seen = []

    @contextmanager
    def progress(description, total):
        seen.append([description, total, 0])
        yield lambda n: seen[-1].__setitem__(2, seen[-1][2] + n)

    report = verify_folder(folder, progress=progress)
    assert seen == [["read archive", size, size]]
    assert bool(report.failures) == garbage


def test_a_flipped_byte_names_the_file_and_the_check(cli, folder):
    archive = folder / "demo-llm-1.3.1.tar.zst"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    archive.write_bytes(bytes(data))
    result = cli("verify", str(folder))
    assert result.code == 3
    assert result.error_lines == ["error: demo-llm-1.3.1.tar.zst: sha256 check failed: differs from SHA256SUMS "
                                  "(and 2 more failed checks)"]


def test_a_truncated_download_is_reported_as_truncated(cli, folder):
    archive = folder / "demo-llm-1.3.1.tar.zst"
    size = archive.stat().st_size
    archive.write_bytes(archive.read_bytes()[: size - 100])
    result = cli("verify", str(folder))
    assert result.code == 3
    assert result.error_lines[0].startswith(f"error: demo-llm-1.3.1.tar.zst: size check failed: truncated: "
                                            f"{size - 100} of {size} bytes")


def test_sums_edited_to_match_a_tampered_archive_still_fail_the_structure_check(cli, folder):
    """Another image put in the archive's place and SHA256SUMS rewritten: manifest.json still knows."""
    evil, evil_id, _ = docker_layout([layer_tar({"bin/tool": b"backdoored"})], tag="demo-llm:1.3.1")
    (folder / "demo-llm-1.3.1.tar.zst").write_bytes(zstandard.ZstdCompressor().compress(evil))
    rewrite_sums(folder, "demo-llm-1.3.1.tar.zst")
    manifest = json.loads((folder / "manifest.json").read_text())
    result = cli("verify", str(folder))
    assert result.code == 3
    structure = next(line for line in result.err.splitlines() if line.lstrip().startswith("structure"))
    assert "FAILED" in structure and f"config digest {evil_id}" in structure
    assert manifest["image_id"][:19] in structure


def test_a_folder_without_sums_is_not_a_release(cli, folder):
    (folder / "SHA256SUMS").unlink()
    result = cli("verify", str(folder))
    assert result.code == 3 and result.error_lines == [f"error: {folder}/SHA256SUMS: missing; this is not a "
                                                       "complete release folder"]


def test_a_missing_part_is_named(cli, tmp_path):
    incompressible = [layer_tar({"weights.bin": os.urandom(3 << 20)})]
    folder, _ = make_release(tmp_path / "release", split=1 << 20, layers=incompressible)
    parts = sorted(p.name for p in folder.iterdir() if ".part-" in p.name)
    assert len(parts) == 4
    (folder / parts[-1]).unlink()
    result = cli("verify", str(folder))
    assert result.code == 3
    assert f"{parts[-1]}: " in result.error_lines[0] and "missing" in result.error_lines[0]


@pytest.fixture
def split_folder(tmp_path):
    incompressible = [layer_tar({"weights.bin": os.urandom(3 << 20)})]
    return make_release(tmp_path / "release", split=1 << 20, layers=incompressible)[0]


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_a_flipped_byte_in_any_part_is_named(cli, split_folder, index):
    part = sorted(split_folder.glob("*.part-*"))[index]
    data = bytearray(part.read_bytes())
    data[len(data) // 3] ^= 0x10
    part.write_bytes(bytes(data))
    result = cli("verify", str(split_folder))
    assert result.code == 3
    assert result.error_lines[0].startswith(f"error: {part.name}: sha256 check failed")


def test_a_part_from_another_release_is_refused(cli, tmp_path, split_folder):
    other = make_release(tmp_path / "other", "1.3.2", split=1 << 20,
                         layers=[layer_tar({"weights.bin": os.urandom(3 << 20)})])[0]
    mine = sorted(split_folder.glob("*.part-*"))[1]
    theirs = sorted(other.glob("*.part-*"))[1]
    mine.write_bytes(theirs.read_bytes())
    result = cli("verify", str(split_folder))
    assert result.code == 3 and mine.name in result.error_lines[0]


def test_a_zstd_stream_with_a_huge_window_is_refused(cli, folder):
    """A frame that declares a 2 GiB window would make a decoder allocate it: refused, not decoded."""
    archive = folder / "demo-llm-1.3.1.tar.zst"
    stream = zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=31, enable_ldm=True)
    with open(archive, "wb") as fh, zstandard.ZstdCompressor(compression_params=params).stream_writer(fh) as out:
        out.write(stream)
    rewrite_sums(folder, archive.name)
    result = cli("verify", str(folder))
    assert result.code == 3
    zstd_line = next(line for line in result.err.splitlines() if line.lstrip().startswith("zstd"))
    assert "FAILED" in zstd_line and "window" in zstd_line.lower()


@pytest.mark.parametrize("change,message", [
    (lambda m: m.pop("image_id"), "image_id: Field required"),
    (lambda m: m.update(diff_ids="sha256:x"), "diff_ids: Input should be a valid array"),
    (lambda m: m["archive"]["files"][0].update(name="../../etc/passwd"), "archive.files.0.name: String should match"),
    (lambda m: m.update(schema=1), "manifest schema '1', not 2"),
    # (was "manifest schema '<unibake.manifest._N', not 2")
    (lambda m: m.update(schema=2.0), "manifest schema a number written with a fraction or an exponent, not 2"),
    (lambda m: m.update(extra="x"), "extra: Extra inputs are not permitted"),
])
def test_a_malformed_manifest_is_refused_with_one_line(cli, folder, change, message):
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    rewrite_sums(folder, "manifest.json")
    result = cli("verify", str(folder))
    assert result.code == 3 and "Traceback" not in result.err
    assert len(result.error_lines) == 1 and message in result.error_lines[0]


def test_verify_json_is_the_report(cli, folder):
    result = cli("--quiet", "verify", str(folder), "--json")
    assert result.code == 0
    report = json.loads(result.out)
    assert report["passed"] and {c["check"] for c in report["checks"]} == {"sha256", "size", "zstd", "structure", "image id"}
    assert result.err.strip().startswith("verified ")  # --quiet: the final line only


def test_verify_load_never_passes_a_tag_that_names_another_image(folder):
    # the engine held the release's image under another name and the release's tag on another image:
    # verify --load said "already has it" and passed, while run.sh (by tag) would run the other one
    from unibake.archive_reader import read_archive
    from unibake.manifest import load_manifest
    from unibake.verify import load_and_compare, verify_folder

    from ..fake_engine import FakeEngine

    manifest = load_manifest(folder)
    engine = FakeEngine(address="fake://local")
    engine.load(read_archive(folder, [f.name for f in manifest.archive.files]))
    engine.tag(manifest.image_id, "copy:1")
    engine.untag(manifest.tag)
    other = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b""], tag=manifest.tag)
    report = load_and_compare(verify_folder(folder), engine)
    assert [f"{c.name} {c.detail}" for c in report.failures] == [
        f"load the engine's {manifest.tag} is {other}, another image: loading would move that tag (nothing was "
        "loaded)"]
    assert engine.inspect_image(manifest.tag).id == other
    engine.untag(manifest.tag)  # the tag gone, the image still there under its other name: tagged, not loaded
    report = load_and_compare(verify_folder(folder), engine)
    assert not report.failures and engine.inspect_image(manifest.tag).id == manifest.image_id
    assert report.checks[-1].detail == f"the engine already has {manifest.image_id}; tagged {manifest.tag}, not " \
                                       "loaded again"


def test_verify_load_never_loads_an_archive_changed_after_it_was_checked(folder, tmp_path):
    # the check reads the archive, the load reads it again: swapped in between, another image tagged
    # as the release and as an image the engine holds was loaded (and the victim's tag left moved)
    from unibake.manifest import load_manifest
    from unibake.verify import load_and_compare, verify_folder

    from ..fake_engine import FakeEngine
    from ..forge import also_tagging_the_victim, forge
    from ..savefixtures import layer_tar
    from .test_publish import make_release

    other = make_release(tmp_path / "other", layers=[layer_tar({"opt/app/x": b"not the release\n"})])[0]
    forge(other, also_tagging_the_victim)
    engine = FakeEngine(address="fake://local")
    victim = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b""], tag="victim:1")
    report = verify_folder(folder)
    assert not report.failures
    name = load_manifest(folder).archive.name
    (folder / name).write_bytes((other / name).read_bytes())
    report = load_and_compare(report, engine)
    assert [c.name for c in report.failures] == ["load"]
    assert "changed after it was checked" in report.failures[0].detail, report.failures[0].detail
    assert engine.loads == 1 and engine.tags == {"victim:1": victim} and list(engine.images) == [victim]


def test_verify_load_undoes_a_load_that_brought_another_image(folder, tmp_path):
    # an engine that loads other bytes than it is fed: what it tagged was left so
    from unibake.verify import load_and_compare, verify_folder

    from ..fake_engine import FakeEngine
    from ..savefixtures import docker_layout, layer_tar

    class Rogue(FakeEngine):
        def load(self, chunks, stop=None):
            list(chunks)
            data = docker_layout([layer_tar({"o": b"other\n"})], tag="demo-llm:1.3.1")[0]
            first = super().load([data])
            self.tags["victim:1"] = self.tags["demo-llm:1.3.1"]
            return type(first)(image_ids=first.image_ids, tags=first.tags + ("victim:1",), messages=first.messages)

    engine = Rogue(address="fake://rogue")
    victim = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b""], tag="victim:1")
    report = load_and_compare(verify_folder(folder), engine)
    assert [c.name for c in report.failures] == ["load"]
    assert "what the load tagged was put back" in report.failures[0].detail
    assert engine.tags == {"victim:1": victim} and list(engine.images) == [victim]


def test_verify_parses_the_manifest_it_checked_against_the_sums(folder, monkeypatch):
    # manifest.json was hashed by one read and parsed from a second: a file swapped in between was
    # trusted. The swap is played right after the hash, wherever it is taken (of the file, or of
    # the bytes read)
    import unibake.verify as verify

    checked = json.loads((folder / "manifest.json").read_text())
    manifest = folder / "manifest.json"
    original = manifest.read_bytes()

    def swap_once():
        if manifest.read_bytes() == original:
            manifest.write_text(json.dumps({**checked, "revision": "not the release's"}, indent=2) + "\n")

    def file_hashed(path, *rest, real=verify._sha256_of):
        digest = real(path, *rest)
        if path == manifest:
            swap_once()
        return digest

    def bytes_hashed(*data, real=hashlib.sha256):
        if data and data[0] == original:
            swap_once()
        return real(*data)

    monkeypatch.setattr(verify, "_sha256_of", file_hashed)
    monkeypatch.setattr(verify.hashlib, "sha256", bytes_hashed)
    report = verify.verify_folder(folder)
    assert manifest.read_bytes() != original, "the swap was never played: the test proved nothing"
    assert report.manifest.revision == checked["revision"]


def _within(seconds, fn, fifo):
    """``fn()`` in a thread, given ``seconds``: one that hangs opening ``fifo`` is let go (a writer opens
    it) and the test fails, rather than the suite hanging."""
    import threading

    said = {}

    def run():
        try:
            said["ok"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            said["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the reader waits: it takes this writer, then EOF
        os.close(fd)
        thread.join(seconds)
        pytest.fail(f"hung opening {fifo} (a FIFO put in place of an archive file)")
    if "raised" in said:
        raise said["raised"]
    return said["ok"]


@pytest.mark.parametrize("when", ["after its checks", "before the load"])
def test_an_archive_file_swapped_for_a_fifo_after_it_was_hashed_is_refused_not_waited_on(folder, monkeypatch, when):
    # (before: verify, and the load of verify --load (push, a hotfix's base alike), opened the archive to read
    # it with a plain open(): a FIFO put in its place after it was hashed held the run for ever)
    from unibake import verify
    from unibake.errors import VerificationError
    from unibake.manifest import load_manifest

    from ..fake_engine import FakeEngine

    name = load_manifest(folder).archive.name
    fifo = folder / name

    def swap():
        os.unlink(fifo)
        os.mkfifo(fifo)

    if when == "after its checks":  # hashed, its size and kind checked: swapped as the read begins
        class SwappedAsItIsRead(verify.ArchiveReader):
            def __init__(self, *args, **kwargs):
                swap()
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(verify, "ArchiveReader", SwappedAsItIsRead)
        with pytest.raises(VerificationError, match=rf"{name}: not a regular file now \(it was replaced since it was "
                                                    r"hashed, by a FIFO"):
            _within(10, lambda: verify.verify_folder(folder), fifo)
    else:
        report = verify.verify_folder(folder)
        assert not report.failures
        swap()
        engine = FakeEngine(address="fake://local")
        report = _within(10, lambda: verify.load_and_compare(report, engine), fifo)
        assert [c.name for c in report.failures] == ["load"] and "not a regular file now" in report.failures[0].detail
        assert engine.loads == 0 or not engine.images
