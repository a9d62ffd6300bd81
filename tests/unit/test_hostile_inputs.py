"""Inputs from someone else (issue 12, classes 5, 7, 8, 9, 10): an image's labels, a profile's file
name, special files, out-of-range values, failures at the very end, secrets in every disguise."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unibake.errors import EngineError, UnibakeError, VerificationError
from unibake.metadata import METADATA_LABEL
from unibake.pipeline import ARCHIVE, Request, run_stages, selection
from unibake.sanitise import enforce, scan_bytes, scan_file, scan_text

from ..fake_engine import FakeEngine
from ..savefixtures import DEFAULT_LAYERS
from .test_pipeline import Quiet
from .test_smoke import metadata, server  # noqa: F401 - the fixture is used by name

EXAMPLES = int(os.environ.get("UNIBAKE_FUZZ_EXAMPLES", "150"))
HOSTILE = ["$(touch {canary})", "`touch {canary}`", "'; touch {canary}; '", "\"; touch {canary}; \"",
           "</code><script>alert(1)</script>", "| x | y |", "[link](javascript:alert(1))", "${{IFS}}touch${{IFS}}{canary}"]


def release_foreign(tmp_path, labels: dict, engines: dict | None = None):
    source = FakeEngine(address="fake://source")
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 3}, DEFAULT_LAYERS, tag="demo:1.0")
    engines = engines or {None: source, "fake://verify": FakeEngine(address="fake://verify")}
    engines[None] = source
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", image="demo:1.0",
                      verify_engine="fake://verify")
    return run_stages(selection(ARCHIVE), request, Quiet(), connect=engines.__getitem__)


# --- class 5: what reaches a shell script, a Dockerfile or Markdown is validated or escaped ------


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_labels_of_a_foreign_image_reach_the_notes_escaped(tmp_path, value):
    canary = tmp_path / "pwned"
    text = value.format(canary=canary)
    labels = {"org.opencontainers.image.revision": text, "org.opencontainers.image.created": text,
              "org.opencontainers.image.version": text, "com.example.note": text + "\nsecond line"}
    folder = release_foreign(tmp_path, labels)["release"].folder
    notes = (folder / "RELEASE_NOTES.md").read_text()
    outside_code = re.sub(r"(`+).*?\1", "", notes)  # inside a code span nothing is markup (CommonMark: shown as is)
    assert "<script>" not in outside_code and "[link](javascript" not in outside_code
    from markdown_it import MarkdownIt

    shown = MarkdownIt("commonmark").enable("table").render(notes)  # as a viewer renders it: no element of theirs
    assert "<script" not in shown and 'href="javascript' not in shown
    assert "\nsecond line" not in notes
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["labels"]["com.example.note"] == text + "\nsecond line"  # kept as data, where it is inert
    for script in folder.glob("*.sh"):
        subprocess.run(["sh", str(script), "--dry-run"], cwd=folder, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert not canary.exists()


@pytest.mark.parametrize("field,value", [("model_name", "x$(touch {canary})"), ("model_name", "a\nb"),
                                         ("tag", "demo:1;touch {canary}"), ("profile", "tp1$(id)")])
def test_hostile_image_metadata_is_refused_or_inert(tmp_path, server, field, value):  # noqa: F811
    canary = tmp_path / "pwned"
    meta = json.loads(metadata(server.server_port).to_json())
    if field == "model_name":
        meta["launch"]["model_name"] = value.format(canary=canary)
    elif field == "tag":
        meta["tag"] = value.format(canary=canary)
    else:
        meta["profiles"] = {value: meta["profiles"]["tp1"]}
        meta["default_profile"] = value
    labels = {METADATA_LABEL: json.dumps(meta), "io.unibake.profiles": "tp1"}
    try:
        folder = release_foreign(tmp_path, labels)["release"].folder
    except VerificationError as exc:
        assert "is not valid unibake metadata" in str(exc)
        return
    for args in (["--dry-run"], ["--dry-run", "tp1"], ["--help"]):
        subprocess.run(["sh", str(folder / "run.sh"), *args], cwd=folder, capture_output=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert not canary.exists()


NOTES_ELEMENTS = {"h1", "h2", "h3", "p", "code", "pre", "table", "thead", "tbody", "tr", "th", "td", "strong", "em",
                  "ul", "ol", "li", "br", "hr"}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(min_size=1, max_size=60))
def test_any_label_text_gives_a_release_or_one_clear_error(tmp_path_factory, value):
    tmp_path = tmp_path_factory.mktemp("label")
    labels = {"org.opencontainers.image.revision": value, "org.opencontainers.image.version": value}
    try:
        folder = release_foreign(tmp_path, labels)["release"].folder
    except UnibakeError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    notes = (folder / "RELEASE_NOTES.md").read_text()
    above = notes.split("## Verify")[0].replace("<none>", "")
    assert "<" not in re.sub(r"(`+).*?\1", "", above)  # no HTML from a label above the fold, outside a code span
    from markdown_it import MarkdownIt

    # rendered as a viewer renders it (CommonMark: a code span shows its text as it is), no element but the notes' own
    shown = MarkdownIt("commonmark").enable("table").render(above)
    assert set(re.findall(r"</?([A-Za-z][\w-]*)", shown)) <= NOTES_ELEMENTS, shown


def test_a_profile_file_name_holding_a_newline_is_refused(cli, busybox_product):
    (busybox_product / "tp3\nRUN id.yaml").write_text("profile: tp3\ngpus: 1\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and "is not a plain name" in result.error_lines[0]
    assert not (busybox_product.parent / "dockerfiles").exists()


# --- class 7: special files are refused before they are opened for reading ---------------------


@pytest.mark.parametrize("name", ["profiles\nRUN echo injected #", os.fsdecode(b"profiles-\xff")])
def test_a_profiles_folder_named_with_a_newline_or_not_utf8_is_refused_before_the_render(cli, busybox_product, name):
    # the folder's name heads the Dockerfile ("Rendered by unibake from FOLDER/product.yaml, ..."): a newline
    # began an instruction on the next line; a name that is not UTF-8 was a UnicodeEncodeError traceback
    from unibake.errors import InputError
    from unibake.plan import make_plan

    folder = busybox_product.rename(busybox_product.parent / name)
    with pytest.raises(InputError, match="has a name that is not UTF-8 or holds a control character; rename it"):
        make_plan(folder, cwd=folder.parent)
    if "\n" in name:  # (the console of the in-process CLI cannot print a name that is not UTF-8)
        result = cli("--stage", "render", "--config", str(folder))
        assert result.code == 2 and len(result.error_lines) == 1, result.err
        assert not (folder.parent / "dockerfiles").exists()


def test_a_profile_that_is_a_fifo_is_refused_not_waited_on(cli, busybox_product):
    os.mkfifo(busybox_product / "tp9.yaml")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and "not a regular file" in result.error_lines[0]


def test_an_inputs_lock_that_is_a_fifo_is_refused(cli, busybox_product):
    (busybox_product / "inputs.lock").unlink()
    os.mkfifo(busybox_product / "inputs.lock")
    result = cli("--stage", "build", "--config", str(busybox_product))
    assert result.code == 2 and "not a regular file" in result.error_lines[0]


@pytest.mark.parametrize("target", ["/etc/passwd", "/dev/zero"])
def test_a_profile_symlinked_out_of_the_folder_is_refused_unread(cli, busybox_product, target):
    os.symlink(target, busybox_product / "tp9.yaml")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and "points outside the profiles folder" in result.error_lines[0]


# --- class 8: ranges are checked at plan time --------------------------------------------------


@pytest.mark.parametrize("old,new,message", [
    ("gpus: 1", "gpus: 100000000", "key 'gpus' must be at most 1024"),
    ("port: 30000", "port: 70000", "key 'launch.port' must be at most 65535"),
    ("port: 30000", "port: 0", "key 'launch.port' must be at least 1"),
])
def test_values_out_of_range_are_refused_before_anything_is_built(cli, busybox_product, old, new, message):
    for name in ("tp1.yaml", "product.yaml"):
        path = busybox_product / name
        path.write_text(path.read_text().replace(old, new, 1))
    result = cli("--config", str(busybox_product))
    assert result.code == 2 and message in result.error_lines[0]


# --- class 9: nothing is committed until everything that can fail has run ----------------------


def test_a_checksums_record_that_cannot_be_written_publishes_nothing(tmp_path):
    (tmp_path / "checksums").write_text("a file where the folder should be")
    with pytest.raises(UnibakeError, match="cannot write the checksums record folder"):  # said before the work
        release_foreign(tmp_path, {})
    assert [p.name for p in (tmp_path / "release").iterdir()] == [".1.0.lock"]


def test_a_run_that_fails_leaves_no_checksums_folder_behind(tmp_path):
    class Unloadable(FakeEngine):
        def load(self, chunks, stop=None):
            raise EngineError("the verify engine refused the load (test)")

    with pytest.raises(EngineError, match="refused the load"):
        release_foreign(tmp_path, {}, {"fake://verify": Unloadable(address="fake://verify")})
    assert not (tmp_path / "checksums").exists()  # checked at the folder stage, made only when published
    assert [p.name for p in (tmp_path / "release").iterdir()] == [".1.0.lock"]


# --- class 10: secrets in every disguise --------------------------------------------------------


@pytest.mark.parametrize("text,kind", [
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----", "private key"),
    ("-----BEGIN ENCRYPTED PRIVATE KEY-----", "private key"),
    ("redis://:pw@cache.internal:6379/0", "password in a URL"),
    ("postgres://app:s3cret@db/app", "password in a URL"),
])
def test_secret_shapes_are_found(text, kind):
    assert [f.kind for f in scan_text(f"x = {text}\n", "f")] == [kind]


@pytest.mark.parametrize("key", ["DB_PASSWORD", "MYSQL_PWD", "NPM_AUTH", "SSH_KEY", "HF_TOKEN", "APP_SECRET",
                                 "GPG_PASSPHRASE"])
def test_secret_names_with_a_literal_value_are_refused_at_plan_time(cli, busybox_product, key):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace('env: {SHARED_SETTING: "on"}',
                                                   f'env: {{SHARED_SETTING: "on", {key}: "hunter22"}}'))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 3 and f"env.{key}: secret in the environment" in result.error_lines[0]
    assert "hunter22" not in result.err and not (busybox_product.parent / "dockerfiles").exists()


def test_a_private_address_in_an_env_value_is_refused_at_plan_time(cli, busybox_product):
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree, MASTER: 10.1.2.3}"))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 3 and "tp1.yaml:4: env.MASTER: private network address" in result.error_lines[0]


def test_a_key_after_a_nul_byte_or_deep_in_a_big_file_is_found(tmp_path):
    token = "hf_" + "Q" * 34
    assert [f.kind for f in scan_bytes(b"\x7fELF\x00\x01" + token.encode() + b"\x00", "lib.so")] == ["Hugging Face token"]
    big = tmp_path / "weights.bin"
    with open(big, "wb") as fh:
        fh.write(os.urandom(1 << 20) * 40)  # past the first part: 40 MiB, streamed in chunks
        fh.write(b"\x00" + token.encode() + b"\x00")
    found = [f for f in scan_file(big, "images/weights.bin") if f.kind == "Hugging Face token"]
    assert [f.where for f in found] == [f"images/weights.bin at byte {(40 << 20) + 1}"]


def test_the_error_shows_enough_to_write_an_allow_rule_and_the_rule_works():
    findings = scan_text("url = https://deploy:hunter2@pypi.example.com/simple\n", "setup.cfg")
    with pytest.raises(VerificationError) as caught:
        enforce(findings, (), "the build context")
    rule = str(caught.value).split("(e.g. '")[1].split("')")[0]
    assert "hunter2" not in str(caught.value)
    enforce(findings, (rule,), "the build context")  # the suggested rule lets exactly this value through


def test_a_render_that_cannot_replace_a_copy_writes_none_of_them(cli, busybox_product):
    cli("--stage", "render", "--config", str(busybox_product))
    rendered = busybox_product.parent / "dockerfiles" / "rendered" / "all"
    before = (rendered / "Dockerfile").read_text()
    (rendered / "entrypoint.sh").unlink()
    (rendered / "entrypoint.sh").mkdir()  # in the way
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text().replace("Tree", "Ring"))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: {rendered / 'entrypoint.sh'}: is not a regular file; the rendered copies replace only files: "
        "remove it"]
    assert (rendered / "Dockerfile").read_text() == before  # not half one render, half the next


def test_rendered_copies_are_never_written_through_a_link_out_of_the_project(cli, busybox_product, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    rendered = busybox_product.parent / "dockerfiles" / "rendered"
    rendered.mkdir(parents=True)
    (rendered / "all").symlink_to(outside)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and "rendered/all: is a symlink" in result.error_lines[-1], result.err
    assert list(outside.iterdir()) == []


def test_an_editors_lock_beside_the_profiles_is_not_a_profile(cli, busybox_product):
    os.symlink("root@host.1234:1700000000", busybox_product / ".#tp1.yaml")  # what Emacs leaves while editing
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err


@pytest.mark.parametrize("name", ["tp5.YAML", "tp5.Yml"])
def test_a_profile_file_whose_suffix_is_in_another_case_is_refused_not_left_out(cli, busybox_product, name):
    # tp5.YAML was silently no profile: the build went on without it
    (busybox_product / name).write_text((busybox_product / "tp2.yaml").read_text().replace("profile: tp2", "profile: tp5"))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines[-1] == (
        f"error: {busybox_product / name}: profile files end in .yaml (or .yml), in lower case; rename it to "
        "tp5.yaml, or move it out of the profiles folder"), result.err
    (busybox_product / name).rename(busybox_product / "tp5.yaml")
    assert cli("--stage", "render", "--config", str(busybox_product)).code == 0


def _within(seconds: float, fn, fifos) -> UnibakeError | None:
    """``fn()``'s UnibakeError, or None; a test failure (not a hung suite) if it waits on one of ``fifos``:
    each is then opened for writing and closed, which ends the reader's wait."""
    import threading

    outcome: dict = {}

    def run():
        try:
            fn()
        except UnibakeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(seconds)
        pytest.fail("it waited on a FIFO for a writer")
    return outcome.get("error")


@pytest.mark.parametrize("step", ["context", "scan", "rendered-prebuilt"])
def test_an_input_swapped_for_a_fifo_after_the_plan_is_refused_not_waited_on(demo_product, step):
    """The plan hashes every input; the scan, the kit and the build context open each again by its path.
    One swapped for a FIFO in between held the run for ever (a tar of the context, the secret scan)."""
    import io

    from unibake.errors import InputError
    from unibake.plan import make_plan
    from unibake.render import context_files, render, write_context_tar
    from unibake.sanitise import scan_context

    plan = make_plan(demo_product)
    context = render(plan)
    root = demo_product.parent
    swapped = root / ("images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl" if step == "rendered-prebuilt"
                      else "images/engine/demo_engine/__init__.py")
    assert swapped.is_file()
    swapped.unlink()
    os.mkfifo(swapped)
    if step == "scan":
        error = _within(10, lambda: scan_context(context_files(context, root), ()), [swapped])
    else:
        error = _within(10, lambda: write_context_tar(context, io.BytesIO(), mtime=0), [swapped])
    assert isinstance(error, InputError), error
    assert str(error).startswith(f"{swapped}: not a regular file now"), str(error)


def test_a_prebuilt_archive_replaced_after_the_plan_by_one_without_the_member_is_named(demo_product):
    """The member named at the plan is looked up in the archive again for the context: a KeyError traceback."""
    import io
    import zipfile

    from unibake.errors import InputError
    from unibake.plan import make_plan
    from unibake.render import render, write_context_tar

    context = render(make_plan(demo_product))
    wheel = demo_product.parent / "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(InputError, match=r"demo_quant-1\.0\.0\+cpu-py3-none-linux_x86_64\.whl: no longer holds "):
        write_context_tar(context, io.BytesIO(), mtime=0)


def _damaged_wheel(wheel: Path) -> None:
    """``wheel`` written again deflated, with the same members, its largest member's deflate stream damaged
    (its first block of a type that does not exist): zlib.error as it is read, not BadZipFile or OSError."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        members = [(info.filename, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    with zipfile.ZipFile(wheel) as zf:
        largest = max(zf.infolist(), key=lambda info: info.compress_size)
    raw = bytearray(wheel.read_bytes())
    at = largest.header_offset + 30 + int.from_bytes(raw[largest.header_offset + 26:largest.header_offset + 28], "little") \
        + int.from_bytes(raw[largest.header_offset + 28:largest.header_offset + 30], "little")
    raw[at] = 0xFF
    wheel.write_bytes(bytes(raw))


def test_a_prebuilt_wheel_whose_deflate_stream_is_damaged_is_one_error_line_at_the_plan(cli, demo_product):
    """A partial download of a kernel's prebuilt wheel: zlib.error, which is neither an OSError nor BadZipFile,
    was a traceback."""
    wheel = demo_product.parent / "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl"
    _damaged_wheel(wheel)
    result = cli("lock", "--config", str(demo_product))
    assert result.code == 2 and "Traceback" not in result.err, result.err
    [line] = [x for x in result.err.splitlines() if x.startswith("error:")]
    assert "prebuilt images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl is not a readable zip archive" \
        in line and "profiles/product.yaml:" in line, line


def test_a_prebuilt_wheel_damaged_after_the_plan_is_named_when_the_context_reads_it(demo_product):
    import io

    from unibake.errors import InputError
    from unibake.plan import make_plan
    from unibake.render import render, write_context_tar

    context = render(make_plan(demo_product))
    wheel = demo_product.parent / "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl"
    _damaged_wheel(wheel)
    with pytest.raises(InputError, match=r"demo_quant-1\.0\.0\+cpu-py3-none-linux_x86_64\.whl: .* no longer reads as it "
                                         r"did when it was hashed"):
        write_context_tar(context, io.BytesIO(), mtime=0)
