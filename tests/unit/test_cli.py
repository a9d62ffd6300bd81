"""The command line contract: exit codes and one `error:` line that names the problem."""

from __future__ import annotations

import hashlib

import pytest

from unibake.pipeline import source_date_epoch
from unibake.errors import InputError


@pytest.mark.parametrize("args,message", [
    (["--profile", "tp8"], "error: unknown profile 'tp8' (--profile); known: tp1, tp2"),
    (["--profile", "all", "--profile", "tp1"], "error: --profile all cannot be combined"),
    (["--stage", "deploy"], "error: argument --stage: invalid choice: 'deploy'"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
    (["--version", "1.0 beta"], "error: --version '1.0 beta' is not a valid version"),
])
def test_bad_command_lines_exit_2_with_one_error_line(cli, busybox_product, args, message):
    result = cli("--stage", "render", "--config", str(busybox_product), *args)
    assert result.code == 2
    assert len(result.error_lines) == 1
    assert result.error_lines[0].startswith(message)


def test_bad_yaml_exits_2_and_renders_nothing(cli, busybox_product):
    (busybox_product / "tp2.yaml").write_text("profile: tp2\ngpus: two\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2
    assert result.error_lines == [f"error: {busybox_product}/tp2.yaml:2: key 'gpus' must be an integer, not str"]
    assert not (busybox_product.parent / "dockerfiles").exists()


def test_a_missing_profiles_folder_is_named(cli, tmp_path):
    result = cli("--stage", "render", "--config", str(tmp_path / "nowhere"))
    assert result.code == 2
    assert result.error_lines == [f"error: {tmp_path / 'nowhere'}: the profiles folder does not exist"]


@pytest.mark.parametrize("value", ["tp2,tp1", "tp2, tp1"])
def test_profiles_given_comma_separated_as_platforms_are_told_to_repeat_the_option(cli, busybox_product, value):
    # --platform takes a comma-separated list, --profile one name: 'tp2,tp1' was only "unknown profile"
    result = cli("--stage", "render", "--config", str(busybox_product), "--profile", value)
    assert result.code == 2
    assert result.error_lines == [f"error: unknown profile '{value}' (--profile); known: tp1, tp2; --profile takes one "
                                  "name: repeat it (--profile tp2 --profile tp1)"]
    assert not (busybox_product.parent / "dockerfiles").exists()


def test_render_stage_writes_the_reviewable_files(cli, busybox_product):
    result = cli("--stage", "render", "--config", str(busybox_product), "--profile", "tp2")
    assert result.code == 0, result.err
    folder = busybox_product.parent / "dockerfiles/rendered/tp2"
    assert sorted(p.name for p in folder.iterdir()) == ["Dockerfile", "entrypoint.sh", "self-check.sh"]
    assert "unibake-test:0.1.0-tp2" in (folder / "Dockerfile").read_text()


def test_source_date_epoch_must_be_a_number(cli, busybox_product):
    with pytest.raises(InputError, match="SOURCE_DATE_EPOCH='yesterday' is not a whole number"):
        source_date_epoch(busybox_product.parent, {"SOURCE_DATE_EPOCH": "yesterday"})
    assert source_date_epoch(busybox_product.parent, {"SOURCE_DATE_EPOCH": "1700000000"}) == 1700000000


# --- the command line itself: sub-commands, global options, JSON, the tool's version ----------

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tomllib  # noqa: E402

from ..conftest import REPO  # noqa: E402


def pyproject_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("flag", ["-V", "--tool-version"])
def test_the_tool_version_is_the_package_version(cli, flag):
    result = cli(flag)
    assert result.code == 0 and result.out == f"unibake {pyproject_version()}\n"


def test_help_lists_every_command_and_exits_0(cli):
    # each command on a line of its own under COMMAND, as the README names them (before: a name anywhere in the
    # text passed: "build" is in the usage line, "verify" in --json's help)
    result = cli("--help")
    assert result.code == 0
    listed = re.findall(r"^    ([a-z]+) ", result.out, re.M)
    assert listed == ["build", "hotfix", "archive", "repro", "verify", "kit", "rebuild", "releases", "lock", "prune",
                      "push", "pull", "deploy"]


def test_help_gives_every_exit_code_the_readme_gives(cli):
    # (before: the epilog left out 130, and verify's said "3 otherwise", where bad input is 2 and an engine error 1)
    assert "Exit codes: 0 success, 2 bad input, 3 a check failed, 1 anything else, 130 interrupted." in \
        " ".join(cli("--help").out.split())
    assert "Exit 0 when everything passes, 3 when a check fails (2: bad input; 1: anything else, an unreachable " \
           "engine)." in " ".join(cli("verify", "--help").out.split())


@pytest.mark.parametrize("args", [["--stage", "render", "--help"], ["--profile", "tp1", "--help"], ["--no-cache", "-h"]])
def test_help_after_builds_own_options_is_builds_help(cli, args):
    # build is the default command, so its options may come first; --help then means build's
    result = cli(*args)
    assert result.code == 0 and result.out.startswith("usage: build.py build ")



def test_hotfix_help_gives_the_defaults_a_hotfix_has(cli):
    # a hotfix builds its base release's profiles and platform: its help said 'all' and product.yaml's
    hotfix = " ".join(cli("hotfix", "--help").out.split())
    assert "'all' is the unified image (default: the base release's profiles)" in hotfix
    assert "(default: the base release's)" in hotfix and "product.yaml's platform" not in hotfix
    build = " ".join(cli("build", "--help").out.split())
    assert "'all' is the unified image (the default)" in build and "(default: product.yaml's platform" in build

def test_a_product_outside_git_is_warned_that_its_image_records_1970(cli, busybox_product):
    warned = cli("--stage", "render", "--config", str(busybox_product))
    assert warned.code == 0 and "is not in a git checkout: the image records the time 1970-01-01" in warned.err
    quiet = cli("--stage", "render", "--config", str(busybox_product), env={"CI": "true", "SOURCE_DATE_EPOCH": "1"})
    assert quiet.code == 0 and "git checkout" not in quiet.err
    # found by probing: a release made --from an earlier one was warned too, though it records that one's epoch
    made_on = cli("--from", "0.1.0", "--version", "0.2.0", "--config", str(busybox_product), "--out",
                  str(busybox_product.parent / "out"))
    assert made_on.code == 2 and "0.1.0/manifest.json does not exist" in made_on.err and "git checkout" not in made_on.err


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_go_before_or_after_the_command(cli, busybox_product, where):
    command = ["lock", "--config", str(busybox_product)]
    args = ["--quiet", "--json", *command] if where == "before" else [*command, "--quiet", "--json"]
    result = cli(*args)
    assert result.code == 0
    assert json.loads(result.out)["inputs"] == 7  # exactly one JSON document on stdout
    assert result.err.strip().splitlines() == [f"{busybox_product}/inputs.lock: 7 inputs (0 added, 0 changed, "
                                               "0 removed)"]  # --quiet: the final line only


def test_the_default_command_is_build(cli, busybox_product):
    plain = cli("--stage", "render", "--config", str(busybox_product), "--json")
    named = cli("build", "--stage", "render", "--config", str(busybox_product), "--json")
    assert plain.code == named.code == 0
    assert json.loads(plain.out) == json.loads(named.out)
    assert json.loads(plain.out)["image"] == "unibake-test:0.1.0"


def test_options_are_never_abbreviated(cli, busybox_product):
    result = cli("--stage", "render", "--config", str(busybox_product), "--prof", "tp1")
    assert result.code == 2 and "unrecognized arguments: --prof tp1" in result.error_lines[0]


def test_metadata_file_holds_the_same_document_as_json(cli, busybox_product, tmp_path):
    result = cli("--stage", "render", "--config", str(busybox_product), "--json", "--metadata-file",
                 str(tmp_path / "ci" / "meta.json"))
    assert result.code == 0
    assert json.loads((tmp_path / "ci" / "meta.json").read_text()) == json.loads(result.out)


def test_a_failure_with_json_is_still_one_json_document(cli, busybox_product):
    (busybox_product / "tp2.yaml").write_text("profile: tp2\ngpus: two\n")
    result = cli("--json", "--stage", "render", "--config", str(busybox_product))
    assert result.code == 2
    document = json.loads(result.out)
    assert document["exit_code"] == 2 and "key 'gpus' must be an integer" in document["error"]


def test_a_failed_check_with_json_is_its_report_with_the_error_and_exit_code_every_failure_has(cli, tmp_path):
    # found by review: a failed verify's document was its report alone; a script testing has("error") passed it
    import shutil

    folder = tmp_path / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    with open(folder / "RELEASE_NOTES.md", "a") as notes:
        notes.write("changed\n")
    result = cli("--json", "verify", str(folder))
    document = json.loads(result.out)
    assert result.code == 3 and document["exit_code"] == 3 and document["passed"] is False
    assert "RELEASE_NOTES.md" in document["error"] and document["checks"]  # the report kept whole
    listed = json.loads(cli("--json", "releases", "--out", str(tmp_path), "--check").out)
    assert listed["exit_code"] == 3 and listed["releases"] and "error" in listed

def test_build_py_reexecutes_itself_with_the_project_venv(tmp_path):
    """`python build.py` with a Python that lacks the dependencies (-S: no site-packages)."""
    run = subprocess.run([sys.executable, "-S", str(REPO / "build.py"), "-V"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"unibake {pyproject_version()}\n"


def test_build_py_without_a_venv_says_to_run_setup(tmp_path):
    (tmp_path / "build.py").write_text((REPO / "build.py").read_text())
    run = subprocess.run([sys.executable, "-S", str(tmp_path / "build.py"), "--help"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("error: the Python package 'docker' is not installed")
    assert "run scripts/setup.sh" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_the_version_comes_from_pyproject_in_a_checkout_and_from_the_install_otherwise(tmp_path):
    import unibake

    assert unibake._version() == pyproject_version()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\nversion = "9"\n')
    assert unibake._version(tmp_path / "pyproject.toml") in ("0+unknown", pyproject_version())
    (tmp_path / "broken.toml").write_text("[project\n")
    assert unibake._version(tmp_path / "broken.toml") in ("0+unknown", pyproject_version())


def test_python_m_unibake_is_the_same_command(tmp_path):
    run = subprocess.run([sys.executable, "-m", "unibake", "-V"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0 and run.stdout == f"unibake {pyproject_version()}\n"


@pytest.mark.parametrize("command", ["build", "hotfix", "archive"])
def test_no_smoke_reaches_the_request_and_leaves_the_round_trip_on(command, tmp_path):
    from unibake.cli import Context, _request, build_parser
    from unibake.console import Reporter

    extra = {"build": [], "hotfix": ["--from", "1.0", "--version", "1.1"], "archive": ["demo:1.0"]}[command]
    ctx = Context(env={"SOURCE_DATE_EPOCH": "0"}, cwd=tmp_path, reporter=Reporter(env={"CI": "1"}))
    for flags, smoke in (([], True), (["--no-smoke"], False)):
        request = _request(build_parser().parse_args([command, *extra, *flags]), ctx)
        assert (request.smoke, request.roundtrip) == (smoke, True)


@pytest.mark.parametrize("command", ["build", "hotfix", "archive"])
def test_a_scratch_dir_is_checked_before_any_work_only_where_the_round_trip_uses_it(command, tmp_path):
    from unibake.cli import Context, _request, build_parser
    from unibake.console import Reporter

    extra = {"build": [], "hotfix": ["--from", "1.0", "--version", "1.1"], "archive": ["demo:1.0"]}[command]
    ctx = Context(env={"SOURCE_DATE_EPOCH": "0"}, cwd=tmp_path, reporter=Reporter(env={"CI": "1"}))
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "file").write_text("")
    for given in ("private", "new/scratch"):  # a private folder, or one the round trip makes
        args = build_parser().parse_args([command, *extra, "--scratch-dir", given])
        assert _request(args, ctx).scratch_dir == tmp_path / given
    assert not (tmp_path / "new").exists()  # checked, not made
    for given, said in (("file", "is not a private folder of this user"),
                        ("file/scratch", f"cannot make it there ({tmp_path / 'file'} is not a folder)")):
        with pytest.raises(InputError, match=rf"^--scratch-dir {given}: .*{re.escape(said)}"):
            _request(build_parser().parse_args([command, *extra, "--scratch-dir", given]), ctx)
        for unused in [["--no-roundtrip"], ["--verify-engine", "tcp://verify:2375"]] + \
                ([["--stage", "build"]] if command == "build" else []):
            args = build_parser().parse_args([command, *extra, "--scratch-dir", given, *unused])
            assert _request(args, ctx).scratch_dir == tmp_path / given


@pytest.mark.parametrize("made", [True, False], ids=["there", "to be made"])
def test_a_scratch_dir_under_a_folder_another_user_may_write_is_refused(tmp_path, made):
    # (before: only the scratch folder itself was checked: a user who could write its parent could rename it and put
    # a tree of theirs in its place, where root's dockerd then kept its data)
    from unibake.cli import Context, _request, build_parser
    from unibake.console import Reporter

    ctx = Context(env={"SOURCE_DATE_EPOCH": "0"}, cwd=tmp_path, reporter=Reporter(env={"CI": "1"}))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # open to all, no sticky bit
    if made:
        (shared / "scratch").mkdir(mode=0o700)
    with pytest.raises(InputError, match=rf"^--scratch-dir shared/scratch: .*under {re.escape(str(shared))}, which "
                                         r"another user may write"):
        _request(build_parser().parse_args(["build", "--scratch-dir", "shared/scratch"]), ctx)
    shared.chmod(0o1777)  # as /var/tmp: no one may rename another's folder there
    assert _request(build_parser().parse_args(["build", "--scratch-dir", "shared/scratch"]), ctx).scratch_dir == \
        shared / "scratch"


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user's needs root to make")
def test_a_scratch_dir_through_a_link_another_user_owns_is_refused(tmp_path):
    # (the link's target was checked, not the link: its owner could point it elsewhere, in a sticky /tmp too)
    from unibake.cli import Context, _request, build_parser
    from unibake.console import Reporter

    ctx = Context(env={"SOURCE_DATE_EPOCH": "0"}, cwd=tmp_path, reporter=Reporter(env={"CI": "1"}))
    (tmp_path / "target" / "scratch").mkdir(parents=True, mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    os.lchown(tmp_path / "link", 65534, 65534)
    with pytest.raises(InputError, match=rf"^--scratch-dir link/scratch: .*under {re.escape(str(tmp_path / 'link'))}, "
                                         r"which another user may write"):
        _request(build_parser().parse_args(["build", "--scratch-dir", "link/scratch"]), ctx)
    os.lchown(tmp_path / "link", 0, 0)
    assert _request(build_parser().parse_args(["build", "--scratch-dir", "link/scratch"]), ctx).scratch_dir == \
        tmp_path / "link/scratch"


def test_text_from_outside_cannot_forge_a_second_error_line_or_drive_the_terminal(cli, tmp_path):
    # a path, an image's output, a file name in a layer: printed with its control characters escaped
    hostile = str(tmp_path / "a\nerror: everything is fine\x1b[2J\x1b]0;PWNED\x07")
    result = cli("verify", hostile)
    assert result.code == 2
    assert result.err.count("\n") == 1 and result.err.count("error:") == 2  # the real one and the quoted text
    assert "\\nerror: everything is fine\\x1b[2J\\x1b]0;PWNED\\x07" in result.err
    assert "\x1b" not in result.err and "\x07" not in result.err


def test_a_failed_builds_output_reprinted_at_the_end_is_escaped_too(cli, monkeypatch):
    # the tail of the build's output comes from the base image's programs: the same rule as every line
    import io

    import unibake.cli
    from unibake.errors import BuildFailed

    class Terminal(io.StringIO):  # a terminal: the build's lines went into a progress bar, not the screen
        def isatty(self) -> bool:
            return True

    def failing(args, ctx):
        raise BuildFailed("step 3 failed", output=("Step 3/9 : RUN x", "ok\x1b]0;PWNED\x07\nerror: all fine"))

    monkeypatch.setitem(unibake.cli.HANDLERS, "build", failing)
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    code = unibake.cli.main(["--stage", "render"], env={"NO_COLOR": "1"}, cwd=REPO)
    shown = screen.getvalue()
    assert code == 1 and "\x1b" not in shown and "\x07" not in shown
    assert "ok\\x1b]0;PWNED\\x07\\nerror: all fine" in shown
    assert [line for line in shown.splitlines() if line.startswith("error:")] == ["error: step 3 failed"]


def test_plain_output_does_not_print_a_failed_builds_tail_a_second_time(cli, monkeypatch):
    # plain output (CI, a pipe) printed every line of the build as it came; the tail printed again at the
    # end put up to 40 lines, the failing check's "error:" line among them, twice before the verdict
    import unibake.cli
    from unibake.errors import CheckFailed

    def failing(args, ctx):
        ctx.reporter.build_line("error: self-check[tp1]: python3 is not in the image")
        raise CheckFailed("in-image check failed during the build, so x:1 was not tagged: self-check[tp1]: python3 is "
                          "not in the image", output=("error: self-check[tp1]: python3 is not in the image",))

    monkeypatch.setitem(unibake.cli.HANDLERS, "build", failing)
    result = cli("--stage", "render")
    assert result.code == 3
    assert result.err.count("    error: self-check[tp1]: python3 is not in the image\n") == 1, result.err
    assert result.error_lines == ["error: in-image check failed during the build, so x:1 was not tagged: "
                                  "self-check[tp1]: python3 is not in the image"]


# --- values that would quietly do something else: a CI's unset variable, a folder where a file goes --


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_a_metadata_file_that_cannot_be_written_is_refused_before_any_work(cli, busybox_product, tmp_path, where):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x\n")
    target = tmp_path / "folder" if where == "a folder" else tmp_path / "file" / "meta.json"
    result = cli("--stage", "render", "--config", str(busybox_product), "--json", "--metadata-file", str(target))
    cause = f"{target} is a folder, not a file" if where == "a folder" else f"{tmp_path / 'file'} is not a folder"
    assert result.code == 2 and result.error_lines == [
        f"error: --metadata-file {target}: cannot write it there ({cause})"], result.err
    assert json.loads(result.out)["exit_code"] == 2  # one JSON document on stdout
    assert not (busybox_product.parent / "dockerfiles").exists(), "the run went on"
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == []


@pytest.mark.parametrize("target", ["profiles/tp1.yaml", "profiles/inputs.lock", "images/engine/serve.sh",
                                    "dockerfiles/rendered/all/Dockerfile"])
def test_a_metadata_file_naming_an_input_is_refused_and_the_input_kept(cli, busybox_product, target):
    # found by probing: `--metadata-file profiles/tp1.yaml` replaced the profile with the run's document, a failed
    # run's error too (a `gpus: x` in that very file), as it did the inputs lock or a source the image bakes
    root = busybox_product.parent
    path = root / target
    if not path.exists():  # (a copy of the product has no rendered files: an earlier render's)
        path.parent.mkdir(parents=True)
        path.write_text("FROM localhost/unibake-busybox:1\n")
    before = path.read_bytes()
    result = cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", str(path), cwd=root)
    assert result.code == 2 and result.error_lines == [
        f"error: --metadata-file {path}: a file there holds no JSON document, so it is no earlier run's document "
        "and is not replaced (an input, a profile or a lock would be lost); give another path, or remove that "
        "file first"], result.err
    assert path.read_bytes() == before
    assert not (root / "dockerfiles" / "rendered" / "all" / "entrypoint.sh").exists(), "the run went on"
    # an earlier run's document (a JSON object), or an empty file, is replaced as before
    earlier = root / "meta.json"
    earlier.write_text('{"error": "an earlier run", "exit_code": 2}\n')
    assert cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", str(earlier),
               cwd=root).code == 0
    assert "image" in json.loads(earlier.read_text())


def test_a_metadata_file_naming_a_json_input_or_a_releases_json_file_is_refused_and_the_file_kept(cli, busybox_product,
                                                                                                  tmp_path):
    # found by probing: a tune cache (a JSON object the lock pins, baked into the image) or a release's
    # manifest.json was taken for an earlier run's document and replaced: the next build refused the input, the
    # release no longer verified
    root = busybox_product.parent
    cache = root / "images/tune/tp1/cache-1.json"
    release = tmp_path / "release"
    release.mkdir()
    (release / "manifest.json").write_text('{"schema": 2}\n')
    (release / "SHA256SUMS").write_text(hashlib.sha256(b'{"schema": 2}\n').hexdigest() + "  manifest.json\n")
    for path, why in ((cache, f"an input {busybox_product.name}/inputs.lock pins (baked into the image)"),
                      (release / "manifest.json", "a release's file (listed in the SHA256SUMS beside it)")):
        before = path.read_bytes()
        result = cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", str(path), cwd=root)
        assert result.code == 2 and result.error_lines == [
            f"error: --metadata-file {path}: a file there is {why}, so it is no earlier run's document and is not "
            "replaced" + (" (the release would no longer verify)" if "release" in why else "") + "; give another path"
        ], result.err
        assert path.read_bytes() == before
    # an earlier document in the release folder, which SHA256SUMS does not list, is replaced as before
    (release / "build.json").write_text('{"error": "an earlier run", "exit_code": 2}\n')
    assert cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", str(release / "build.json"),
               cwd=root).code == 0
    assert "image" in json.loads((release / "build.json").read_text())


def test_a_metadata_file_that_fails_at_the_end_leaves_one_json_document(cli, monkeypatch, tmp_path):
    """Checked before the work, the place can still be taken while it runs: stdout then holds the
    error's document only, never the run's and then the error's."""
    from unibake import cli as cli_module

    target = tmp_path / "meta.json"

    def taken_meanwhile(args, ctx):
        target.mkdir()
        return cli_module.Outcome(document={"releases": []}, final="done")
    monkeypatch.setitem(cli_module.HANDLERS, "releases", taken_meanwhile)
    result = cli("releases", "--json", "--metadata-file", str(target))
    assert result.code == 1 and len(result.error_lines) == 1 and "--metadata-file" in result.error_lines[0]
    assert json.loads(result.out)["exit_code"] == 1


@pytest.mark.parametrize("args", [["verify", "{folder}", "--key", ""], ["verify", "{folder}", "--key="],
                                  ["verify", "{folder}", "--external", ""], ["kit", "{folder}", "--out", ""],
                                  ["push", "{folder}", "--to", "r.example/a", "--sign-minisign", ""],
                                  ["--metadata-file", "", "verify", "{folder}"], ["verify", ""]])
def test_a_value_given_empty_is_refused_not_taken_as_absent(cli, tmp_path, args):
    """An unset CI variable (--key "$PUBKEY") would skip the signature check, sign nothing, or mean
    the current folder."""
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    result = cli(*[a.format(folder=folder) for a in args], cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert "given empty (an unset variable?)" in result.error_lines[0]
    assert "verified" not in result.err


def test_a_refused_command_line_still_writes_its_failure_to_the_metadata_file(cli, tmp_path):
    document = tmp_path / "m.json"
    document.write_text('{"old": true}\n')
    result = cli("verify", str(tmp_path), "--metadata-file", str(document), "--bogus")
    assert result.code == 2 and json.loads(document.read_text()) == {  # (it named build.py --help, no command's)
        "error": "unrecognized arguments: --bogus (see: python build.py verify --help)", "exit_code": 2}
    hotfix = cli("hotfix", "--from", "1.3.1", "--version", "1.3.2", "--bogus")
    assert hotfix.error_lines == ["error: unrecognized arguments: --bogus (see: python build.py hotfix --help)"]
    equals = cli("verify", str(tmp_path), f"--metadata-file={document}", "--bogus", "--more")
    assert equals.code == 2 and "--more" in json.loads(document.read_text())["error"]
    # a value the parser refused is no path to write: nothing is made in its name
    missing = cli("verify", str(tmp_path), "--metadata-file", "--bogus", cwd=tmp_path)
    assert missing.code == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
    after = cli("verify", str(tmp_path), "--bogus", "--", "--metadata-file", str(tmp_path / "x.json"))
    assert after.code == 2 and not (tmp_path / "x.json").exists()  # after "--", an argument


def test_prune_refuses_an_out_folder_that_does_not_exist(cli, tmp_path):
    # "no releases" would keep no release image: a typo must not prune them all
    result = cli("prune", "--dry-run", "--out", str(tmp_path / "relaese"))
    assert result.code == 2 and result.error_lines == [f"error: --out {tmp_path / 'relaese'}: no such folder"]


def test_an_out_that_is_a_file_is_named_as_not_a_folder_not_as_missing(cli, tmp_path):
    # "--out release.tar: no such folder" of a file that is there sent the adopter looking for a typo
    (tmp_path / "release.tar").write_text("")
    for command in (("prune", "--dry-run"), ("releases",)):
        result = cli(*command, "--out", str(tmp_path / "release.tar"))
        assert result.code == 2 and result.error_lines == [f"error: --out {tmp_path / 'release.tar'}: not a folder"]


@pytest.mark.parametrize("args", [("verify", "{loop}"), ("releases", "--out", "{loop}"),
                                  ("prune", "--dry-run", "--out", "{loop}"), ("push", "{loop}", "--to", "localhost:1/a"),
                                  ("kit", "{loop}", "--out", "{loop}-kit"), ("verify", "{loop}/1.0")],
                         ids=["verify", "releases", "prune", "push", "kit", "below-it"])
def test_a_folder_that_is_a_loop_of_symbolic_links_is_one_error_line(cli, tmp_path, args):
    # (before: pathlib's RuntimeError "Symlink loop from ...", a traceback)
    loop = tmp_path / "release"
    loop.symlink_to("release")
    result = cli(*[a.format(loop=loop) for a in args])
    assert result.code == 2 and "Traceback" not in result.err
    assert result.error_lines == [f"error: {loop}{'/1.0' if args[-1].endswith('1.0') else ''}: a loop of symbolic "
                                  "links (a link that leads back to itself); give a folder"]


def test_a_json_document_naming_a_folder_that_is_not_utf8_is_read_by_a_strict_json_reader(cli, tmp_path):
    # (before: releases --json wrote the folder caf\xe9 as "caf\udce9", a lone surrogate escape that strict
    # JSON readers refuse; the error document of a run given that folder too)
    from .test_publish import make_release

    out = tmp_path / "release"
    make_release(out, "1.0")
    odd = out / os.fsdecode(b"caf\xe9")
    odd.mkdir()
    (odd / "manifest.json").write_text("{")
    for args in (("--json", "releases", "--out", str(out)), ("--json", "verify", str(odd))):
        result = cli(*args)
        assert "\\udc" not in result.out.lower()
        json.loads(result.out.encode("ascii"))  # as any reader would take it
    listed = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert [r["release"] for r in listed] == ["1.0", "caf\\xe9"]


def test_every_row_of_releases_json_has_the_same_keys_an_unreadable_one_nulls(cli, tmp_path):
    # (before: an unreadable release's row had only release, state and problem: r["image_id"] was a KeyError)
    from .test_publish import make_release

    out = tmp_path / "release"
    make_release(out, "1.0")
    (out / "2.0").mkdir()
    (out / "2.0/manifest.json").write_text("{")
    result = cli("--json", "releases", "--out", str(out))
    good, bad = json.loads(result.out)["releases"]
    assert list(good) == list(bad) == ["release", "folder", "product", "tag", "published", "first_published",
                                       "image_id", "archive_bytes", "previous", "state", "smoke_skipped", "problem"]
    assert (good["problem"], bad["state"], bad["image_id"], bad["smoke_skipped"]) == (None, "unreadable", None, {})
    assert result.err.splitlines()[1].split() == ["release", "published", "image", "ID", "archive", "previous", "state"]


def test_kit_refuses_an_out_that_is_a_file(cli, tmp_path):
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    (tmp_path / "file").write_text("x\n")
    for out in (tmp_path / "file", tmp_path / "file" / "kit"):
        result = cli("kit", str(folder), "--out", str(out))
        assert result.code == 2 and result.error_lines == [
            f"error: --out {out}: cannot write the kit there ({tmp_path / 'file'} is not a folder)"], result.err


@pytest.mark.parametrize("args,said", [
    (["kit", "{release}", "--out", "/proc/unibake-kit"], "error: --out /proc/unibake-kit: cannot write the kit there "
                                                         "(/proc "),
    (["kit", "{release}", "--out", "/proc"], "error: --out /proc: cannot write the kit there (/proc "),
    (["--config", "{profiles}", "--out", "/proc/unibake-release"],
     "error: --out /proc/unibake-release: cannot write the release there (/proc "),
    (["archive", "demo:1.0", "--out", "/sys/unibake-release"], "error: --out /sys/unibake-release: cannot write the "
                                                               "release there (/sys "),
    (["--metadata-file", "/proc/unibake.json", "--stage", "render", "--config", "{profiles}"],
     "error: --metadata-file /proc/unibake.json: cannot write it there (/proc "),
])
def test_an_output_path_the_system_refuses_is_bad_input_said_before_any_work(cli, tmp_path, busybox_product, args,
                                                                             said):
    # /proc and /sys take no new file, root's neither, though access() says root may write there (before: kit and
    # archive were exit 1, "/proc/unibake-kit: No such file or directory"; a build rendered first; the metadata
    # file failed at the end, after the work)
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    result = cli(*[a.format(release=folder, profiles=busybox_product) for a in args])
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(said), result.error_lines[0]
    assert not (busybox_product.parent / "dockerfiles").exists() and not os.path.lexists("/proc/unibake-kit")


def test_hotfix_help_says_its_version_is_required_not_defaulted(cli):
    hotfix, build = cli("hotfix", "--help"), cli("build", "--help")
    assert hotfix.code == build.code == 0
    assert "product.yaml's version" not in " ".join(hotfix.out.split())
    assert "(required: the new release's own, e.g. 1.3.2)" in " ".join(hotfix.out.split())
    assert "(default: product.yaml's version)" in " ".join(build.out.split())


def test_pull_says_in_its_own_words_that_an_unreachable_registry_changed_nothing(cli, tmp_path):
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    result = cli("pull", "127.0.0.1:1/demo-llm@sha256:" + "a" * 64, "--release", str(folder), "--retries", "1")
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert "did not answer" in line and "nothing was pulled, tagged or changed" in line
    assert "recorded" not in line and "uploaded" not in line


def test_retries_counts_the_tries_after_the_first_as_the_help_and_readme_say(cli, tmp_path):
    """``--retries N`` made N attempts in all (``--retries 1``: none repeated, and ``--retries 0`` was
    refused), where a retry is usually a try after the first: now N retries follow the first attempt."""
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    ref = "127.0.0.1:1/demo-llm@sha256:" + "a" * 64
    none = cli("pull", ref, "--release", str(folder), "--retries", "0")
    assert none.code == 1 and "retrying" not in none.err, none.err
    assert "(connection refused) after 1 attempt;" in none.error_lines[-1]
    one = cli("pull", ref, "--release", str(folder), "--retries", "1")
    assert one.code == 1 and "retrying in 1 s (attempt 2 of 2)" in one.err, one.err
    assert "(connection refused) after 2 attempts;" in one.error_lines[-1]
    assert "default 4: 5 attempts in all" in " ".join(cli("pull", "--help").out.split())


def test_a_metadata_file_that_is_a_stream_gets_the_document(tmp_path):
    # /dev/stdout passed the early check, then failed at the end (exit 1 after the work): resolved, it
    # names /proc/PID/fd/pipe:[N], which is no folder to write a file in
    import os

    from .test_publish import make_release

    folder = make_release(tmp_path / "release")[0]
    done = subprocess.run([sys.executable, str(REPO / "build.py"), "--quiet", "verify", str(folder),
                           "--metadata-file", "/dev/stdout"], capture_output=True, text=True,
                          env={**os.environ, "CI": "true"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"] is True


@pytest.mark.parametrize("out,inside", [
    ("images/engine", "'images/engine', a folder the image bakes"),
    ("images/engine/new/release", "'images/engine', a folder the image bakes"),
    ("images/tune/tp2/x", "'images/tune/tp2', a folder the image of another profile selection bakes")])
def test_an_out_inside_a_folder_the_image_bakes_is_refused_before_anything(
        cli, busybox_product, out, inside):
    # (before: the release and its lock were written there, and the next build refused them as inputs not in
    # inputs.lock; after `build.py lock`, as it says to run, the next image baked the last release's archive)
    root = busybox_product.parent
    before = sorted(root.rglob("*"))
    result = cli("--config", str(busybox_product), "--profile", "tp1", "--out", str(root / out))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f"error: --out {root / out}: inside {inside}")
    assert sorted(root.rglob("*")) == before  # nothing rendered, no release folder, no lock file


def test_the_folders_whose_every_file_is_an_input_are_the_folder_sources_of_every_profile(busybox_product, tmp_path):
    from unibake.pipeline import Request, _refuse_out_among_inputs
    from unibake.plan import make_plan

    root = busybox_product.parent.resolve()
    plan = make_plan(busybox_product, profiles=["tp1"], cwd=tmp_path)
    assert sorted(str(p.relative_to(root)) for _, p in plan.input_folders()) == \
        ["images/engine", "images/tune/tp1", "images/tune/tp2"]
    # beside them, above them, or in the profiles folder (its top-level YAML files and its lock are read, no more)
    for out in ("release", "images", ".", "images/tune", "images/engine-release", "profiles", "profiles/release"):
        _refuse_out_among_inputs(Request(env={}, cwd=tmp_path, out=root / out), plan)


@pytest.mark.parametrize("args,said", [
    (["verfy", "release/1.0"], "unrecognized arguments: verfy release/1.0 ('verfy' is not a command; the nearest is "
                               "'verify'; the commands are build, hotfix, archive, repro, verify, releases, lock, "
                               "prune, push, pull, deploy, kit, rebuild; see: python build.py --help)"),
    (["--quiet", "release"], "('release' is not a command; the nearest is 'releases'; the commands are build, "),
    (["status"], "('status' is not a command; the commands are build, "),
    (["--profile", "tp1", "tp2"], "unrecognized arguments: tp2 ('tp2' is not a command; the commands are build, "),
    (["build", "build"], "unrecognized arguments: build (see: python build.py build --help)"),  # a command twice
    (["verify", "a", "b"], "unrecognized arguments: b (see: python build.py verify --help)")])
def test_a_word_that_is_not_a_command_is_said_to_be_none_with_the_commands(cli, tmp_path, args, said):
    # (before: `build.py verfy DIR` was "unrecognized arguments: verfy DIR (see: python build.py build --help)",
    # the help of build, which lists no command)
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1
    assert said in result.error_lines[0]
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("command", [["releases"], ["prune", "--dry-run"], ["archive", "demo-llm:2.0"], ["build"],
                                     ["pull", "localhost:5000/demo-llm@sha256:" + "a" * 64]])
def test_an_out_that_is_a_release_folder_is_refused_naming_its_parent(cli, tmp_path, command):
    # (before: releases said "no releases under release/1.0", exit 0; a build or an archive wrote its release inside
    # that release, which push then refused; pull found no release recording the push)
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release", "1.0")
    listed = sorted(p.name for p in folder.iterdir())
    for given in ("release/1.0", "release/1.0/", str(folder)):
        engine = ["--engine", "unix:///nowhere.sock"] if command != ["releases"] else []  # (releases reaches none)
        result = cli(*command, "--out", given, *engine, cwd=tmp_path)
        parent = "release" if not given.startswith("/") else str(folder.parent)
        assert result.code == 2 and result.error_lines == [
            f"error: --out {given}: a release folder (it holds manifest.json and SHA256SUMS), not the folder that "
            f"holds the releases: give its parent, --out {parent}"], result.err
    assert sorted(p.name for p in folder.iterdir()) == listed


def _as_nobody_in(cwd, *args: str) -> str:
    """``build.py ARGS`` run as the user nobody: its exit code and last line."""
    import contextlib
    import io

    from unibake.cli import main

    from ..conftest import as_nobody

    def run():
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(list(args), env={"CI": "1"}, cwd=cwd)
        return f"{code} {err.getvalue().strip().splitlines()[-1]}"

    main(list(args), env={"CI": "1"}, cwd=cwd)  # as root first: every module the command loads is loaded
    return as_nobody(run)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot enter, as root can")
def test_a_file_to_write_in_a_folder_this_user_cannot_enter_is_bad_input_naming_the_option(capsys):
    # (before: exit 1 "error: .../locked/x.json: Permission denied", an OSError of Path.is_dir)
    import shutil
    import tempfile
    from pathlib import Path

    from .test_publish import make_release

    shared = Path(tempfile.mkdtemp(prefix="unibake-locked-"))
    try:
        shared.chmod(0o755)
        make_release(shared / "release", "1.0")
        locked = shared / "locked"
        locked.mkdir(mode=0o700)
        said = _as_nobody_in(shared, "--metadata-file", str(locked / "x.json"), "releases", "--out", "release")
        assert said == f"ok: 2 error: --metadata-file {locked / 'x.json'}: cannot write it there ({locked} is not " \
                       "writable)", said
        said = _as_nobody_in(shared, "kit", "release/1.0", "--out", str(locked / "kit"))
        assert said == f"ok: 2 error: --out {locked / 'kit'}: cannot write the kit there ({locked} is not writable)"
        assert os.listdir(locked) == ["x.json"]  # root's run: nobody's wrote nothing
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot read, as root can")
def test_a_folder_argument_this_user_cannot_read_is_bad_input_naming_it(capsys):
    # (before: exit 1 "error: PATH: Permission denied", from Path.is_dir or the first file read)
    import shutil
    import tempfile
    from pathlib import Path

    from .test_publish import make_release

    shared = Path(tempfile.mkdtemp(prefix="unibake-locked-"))
    try:
        shared.chmod(0o755)
        make_release(shared / "locked", "1.0")
        make_release(shared / "release", "1.0")
        (shared / "locked").chmod(0o700)
        (shared / "release/1.0").chmod(0o700)
        for args in (["verify", "locked/1.0"], ["verify", "release/1.0"], ["kit", "release/1.0", "--out", "kit"],
                     ["deploy", "locked/1.0", "--engine", "unix:///nowhere.sock"]):
            said = _as_nobody_in(shared, *args)
            assert said == f"ok: 2 error: {shared / args[1]}: cannot read it (Permission denied); give a release " \
                           "folder this user can read", said
        for args in (["releases", "--out", "locked"], ["prune", "--dry-run", "--out", "locked/1.0"]):
            said = _as_nobody_in(shared, *args, *(["--engine", "unix:///nowhere.sock"] if args[0] == "prune" else []))
            assert said == f"ok: 2 error: --out {args[-1]}: cannot read it (Permission denied)", said
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot read, as root can")
def test_a_release_folder_this_user_cannot_enter_is_listed_unreadable_and_keeps_prune_to_build_cache(capsys):
    # (before: skipped as no release: `releases` did not list it, and prune ranked the versions without it, so a
    # hotfix's base or the newest versions' images could go)
    import shutil
    import tempfile
    from pathlib import Path

    from unibake.prune import unreadable_releases

    from ..conftest import as_nobody
    from .test_publish import make_release

    shared = Path(tempfile.mkdtemp(prefix="unibake-locked-"))
    try:
        shared.chmod(0o755)
        make_release(shared / "release", "1.0")
        make_release(shared / "release", "1.1")
        (shared / "release/1.1").chmod(0o700)
        (shared / "release/lost+found").mkdir(mode=0o700)  # a disk's, as mkfs makes it: no release is named so
        said = _as_nobody_in(shared, "releases", "--out", "release")
        assert said == "ok: 0 2 releases under release; 1 verifies", said
        assert as_nobody(lambda: [p.name for p, _ in unreadable_releases(shared / "release")]) == "ok: ['1.1']"
        # a link into a folder this user cannot enter (found by review: Path.is_dir raised, and releases, prune and
        # a build's publish ended "error: ...: Permission denied", exit 1, nothing listed)
        (shared / "private/d").mkdir(parents=True)
        (shared / "private").chmod(0o700)
        (shared / "release/1.2").symlink_to(shared / "private/d")
        said = _as_nobody_in(shared, "releases", "--out", "release")
        assert said == "ok: 0 3 releases under release; 1 verifies", said
        assert as_nobody(lambda: sorted(p.name for p, _ in unreadable_releases(shared / "release"))) == \
            "ok: ['1.1', '1.2']"
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot read, as root can")
def test_a_profiles_folder_this_user_cannot_read_or_that_is_a_file_is_named_as_such(cli, capsys):
    # (before: "profiles/product.yaml: no such file" for a folder it could not read, exit 1 "Permission denied"
    # for one under a folder it could not enter, and "the profiles folder does not exist" for a file)
    import shutil
    import tempfile
    from pathlib import Path

    from ..conftest import BUSYBOX_PRODUCT, copy_product

    shared = Path(tempfile.mkdtemp(prefix="unibake-locked-"))
    try:
        shared.chmod(0o755)
        profiles = copy_product(BUSYBOX_PRODUCT, shared / "product")
        profiles.chmod(0o700)
        for command in (["--stage", "render"], ["lock"]):
            said = _as_nobody_in(shared, *command, "--config", "product/profiles")
            assert said == f"ok: 2 error: {profiles}: cannot read the profiles folder (Permission denied)", said
        profiles.chmod(0o755)
        profiles.parent.chmod(0o700)
        said = _as_nobody_in(shared, "lock", "--config", "product/profiles")
        assert said == f"ok: 2 error: {profiles}: cannot read the profiles folder (Permission denied)", said
        (shared / "file").write_text("")
        result = cli("lock", "--config", "file", cwd=shared)
        assert result.code == 2 and result.error_lines == [
            f"error: {shared / 'file'}: not a folder (--config names the profiles folder)"]
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("stdout", ["closed", "full", "a pipe its reader closed"])
def test_a_json_document_stdout_cannot_take_is_one_error_line_not_a_traceback(tmp_path, stdout):
    # (before: a traceback, AttributeError on a closed stdout; on a full one an OSError, then a second while the
    # error's own document was written to the same stdout; a BrokenPipeError for the error's document)
    from .test_publish import make_release

    make_release(tmp_path / "release", "1.0")
    problem = {"closed": "stdout is closed", "full": "No space left on device"}.get(stdout)
    redirect = {"closed": ">&-", "full": ">/dev/full"}.get(stdout, "| (exec 0<&-; sleep 3)")
    for args, code, said in ((["releases", "--out", "release"], 1 if problem else 0,
                              f"error: --json: cannot write the JSON document to stdout ({problem}); the releases "
                              "command itself succeeded (said above)" if problem else
                              None),  # a pipe closed by its reader (head) is not an error of ours
                             (["releases", "--out", "nowhere"], 2, "error: --out nowhere: no such folder")):
        run = subprocess.run(["bash", "-c", f'"$0" "$@" {redirect}; exit "${{PIPESTATUS[0]}}"',
                              sys.executable, str(REPO / "build.py"), "--json", *args],
                             capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "CI": "1"})
        assert run.returncode == code and "Traceback" not in run.stderr and "Exception" not in run.stderr, run.stderr
        assert [line for line in run.stderr.splitlines() if line.startswith("error:")] == ([said] if said else [])
        assert run.stderr.strip().splitlines()[-1] == said or said is None


def test_a_failed_verify_whose_stdout_reader_has_gone_keeps_its_verdict_and_exit_code(tmp_path):
    # found by probing: `verify DIR --json | head -c0` of a folder that fails was exit 0 with no error line (the
    # BrokenPipeError of its document went to "not an error of ours" and skipped the verdict)
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release", "1.0")
    with open(folder / "run.sh", "a") as f:
        f.write("echo x\n")
    run = subprocess.run(["bash", "-c", '"$0" "$@" | (exec 0<&-; sleep 3); exit "${PIPESTATUS[0]}"', sys.executable,
                          str(REPO / "build.py"), "--json", "verify", str(folder)],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "CI": "1"})
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("error:")] == [
        "error: run.sh: sha256 check failed: differs from SHA256SUMS"], run.stderr


@pytest.mark.parametrize("line", [["--bogus"], ["--out", "a", "--out", "b"], ["--engine", "unix:///nowhere.sock"],
                                  ["--no-seed"]], ids=["refused by the parser", "an option twice",
                                                       "an engine to a command that reaches none", "an unused option"])
def test_a_run_refused_before_its_metadata_file_was_checked_keeps_the_input_the_lock_pins(cli, busybox_product, line):
    # found by probing: the error's document was written without the check the run's gets: `--stage render --bogus
    # --metadata-file images/tune/.../x.json` replaced the tune cache, and the next build refused the changed input
    root = busybox_product.parent
    cache = root / "images/tune/tp1/cache-1.json"
    before = cache.read_bytes()
    result = cli("--stage", "render", "--config", str(busybox_product), *line, "--metadata-file", str(cache), cwd=root)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert cache.read_bytes() == before
    assert cli("--stage", "render", "--config", str(busybox_product), cwd=root).code == 0


def test_a_metadata_file_naming_a_notes_attachment_is_refused_at_the_plan_and_the_file_kept(cli, busybox_product):
    # found by probing: a JSON attachment (an eval's results), which the lock does not pin, was replaced by the
    # run's manifest, and the next release published that as its results
    root = busybox_product.parent
    results = root / "notes" / "gsm8k.json"
    results.parent.mkdir()
    results.write_text('{"accuracy": 0.81}\n')
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "notes: {attachments: [notes/gsm8k.json]}\n")
    for given in (str(results), "notes/../notes/gsm8k.json"):
        result = cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", given, cwd=root)
        assert result.code == 2 and result.error_lines == [
            "error: --metadata-file notes/gsm8k.json: a file this release is made from, which the run's document "
            "would replace; give another path"], result.err
        assert results.read_text() == '{"accuracy": 0.81}\n'
    assert cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", "notes/run.json",
               cwd=root).code == 0


@pytest.mark.parametrize("text, shown", [("clear \x1b[2J\x1b[31mred", "'\\x1b'"), ("a\u202eb", "U+202E"),
                                         ("over\rwritten", "'\\r'")], ids=["an escape", "a bidi override",
                                                                           "a bare CR"])
def test_a_changelog_holding_a_control_or_bidi_character_is_refused_naming_its_line(cli, busybox_product, text, shown):
    # found by probing: notes.changelog was copied into RELEASE_NOTES.md byte for byte: `cat` of the notes ran the
    # escape, a bare CR overwrote its line; the YAML refuses the same characters
    root = busybox_product.parent
    (root / "notes").mkdir()
    (root / "notes" / "CHANGELOG.md").write_bytes(f"# Changes\n\n- fine\r\n- {text}\n".encode())
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "notes: {changelog: notes/CHANGELOG.md}\n")
    result = cli("--stage", "render", "--config", str(busybox_product), cwd=root)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f"error: notes/CHANGELOG.md:4: holds {shown}"), result.err
    (root / "notes" / "CHANGELOG.md").write_bytes(b"# Changes\r\n\r\n- fine\tand tabbed\r\n")  # CRLF lines pass
    assert cli("--stage", "render", "--config", str(busybox_product), cwd=root).code == 0


def test_json_with_a_metadata_file_that_is_stdout_is_refused_as_two_documents_on_stdout(tmp_path):
    # found by probing: `--json --metadata-file /dev/stdout` wrote the document twice (not one JSON document), a
    # failure's too
    for args, said in ((["releases", "--out", "."], "error: --metadata-file /dev/stdout is stdout, where --json "
                        "writes the document too: give one of them"),
                       (["releases", "--bogus"], "error: unrecognized arguments: --bogus (see: python build.py "
                        "releases --help)")):
        run = subprocess.run([sys.executable, str(REPO / "build.py"), "--json", "--metadata-file", "/dev/stdout",
                              *args], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "CI": "1"})
        assert run.returncode == 2 and [line for line in run.stderr.splitlines() if line.startswith("error:")] == [said]
        assert json.loads(run.stdout)["exit_code"] == 2  # one document


@pytest.mark.parametrize("command", [["verify", "{folder}", "--load"], ["pull", "{ref}", "--release", "{folder}",
                                                                      "--retries", "0"],
                                     ["prune", "--dry-run", "--out", "{out}"]])
def test_a_malformed_engine_address_is_refused_before_any_work(cli, tmp_path, command):
    # (before: verify --load read and checked the whole archive first, and a folder that fails said only that;
    # pull asked the registry first)
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release", "1.0")
    archive = next(folder.glob("*.tar.zst"))
    archive.write_bytes(archive.read_bytes()[:-1] + b"\0")  # fails its sha256 if it is read
    ref = "localhost:1/demo-llm@sha256:" + "a" * 64
    for address, problem in (("foo://x", "Invalid bind address protocol: foo://x"),
                             ("tcp://host:99999", "Port out of range")):
        result = cli("--engine", address, *[a.format(folder=folder, ref=ref, out=folder.parent) for a in command])
        assert result.code == 2 and len(result.error_lines) == 1, result.err
        assert result.error_lines[0].startswith(f"error: --engine {address!r} is not an engine address: ")
        assert problem in result.error_lines[0] and "==>" not in result.err


@pytest.mark.parametrize("args,option", [
    (["--out", "a", "--out", "b", "--stage", "render"], "--out"),
    (["--stage", "render", "--stage", "build"], "--stage"),
    (["--engine", "unix:///a", "lock", "--engine", "unix:///b"], "--engine"),  # before and after the command
    (["--metadata-file=a.json", "releases", "--metadata-file", "b.json"], "--metadata-file"),
    (["prune", "--keep", "-1", "--keep", "2", "--dry-run"], "--keep"),
    (["releases", "--out=a", "--out=b"], "--out"),
])
def test_an_option_given_twice_is_refused_naming_it(cli, tmp_path, args, option):
    # (before: the last one was taken without a word: a CI line adding --out to one that had it wrote elsewhere)
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f"error: {option} given twice ("), result.error_lines[0]
    assert "give it once" in result.error_lines[0]
    assert not (tmp_path / "a.json").exists()


def test_repeatable_options_and_flags_may_be_given_again(cli, busybox_product, tmp_path):
    # --profile, --platform, --allow, --external and deploy's --engine repeat by design; a flag twice changes nothing
    result = cli("--quiet", "--stage", "render", "--config", str(busybox_product), "--profile", "tp1", "--profile",
                 "tp1", "--allow", "^x1$", "--allow", "^x2$", "--quiet")
    assert "given twice" not in result.err
    deploy = cli("--engine", "unix:///nowhere/a.sock", "deploy", str(tmp_path), "--engine", "unix:///nowhere/b.sock",
                 "--from", "registry", "--ref", "x")
    assert "given twice" not in deploy.err and "SHA256SUMS: missing" in deploy.err, deploy.err  # (no release)
    assert "twice is exit 2" in " ".join(cli("--help").out.split())


@pytest.mark.parametrize("stage,option", [
    ("build", ["--sign", "0xKEY"]), ("build", ["--sign-minisign", "k.key"]), ("build", ["--split", "1900MiB"]),
    ("build", ["--level", "3"]), ("build", ["--long"]), ("build", ["--no-roundtrip"]), ("build", ["--no-smoke"]),
    ("build", ["--no-seed"]), ("build", ["--verify-engine", "tcp://verify:2375"]), ("build", ["--sequential"]),
    ("render", ["--sign", "0xKEY"]), ("render", ["--force"]), ("render", ["--no-cache"]), ("render", ["--level=19"]),
    ("build", ["--scratch-dir", "/var/tmp/s"]), ("render", ["--scratch-dir", "/tmp"]), ("render", ["--out", "r"]),
])
def test_an_option_a_stage_run_would_ignore_is_refused_naming_both(cli, busybox_product, stage, option):
    # (before: accepted and ignored: --stage build --sign KEY signed nothing, --stage render --force forced nothing;
    # --scratch-dir, unchecked, named a folder no scratch engine used; --stage render --out wrote nothing there)
    result = cli("--config", str(busybox_product), *option, "--stage", stage)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    name = option[0].split("=")[0]
    assert result.error_lines[0].startswith(f"error: {name} with --stage {stage}: "), result.error_lines[0]
    assert not (busybox_product.parent / "dockerfiles").exists()


@pytest.mark.parametrize("args,said", [
    (["releases", "--out", "{tmp}"], "--engine with releases: releases reaches no engine (it reads the release "
                                     "folders); leave out --engine"),
    (["lock", "--config", "{tmp}"], "--engine with lock: lock reaches no engine (it hashes the profiles' inputs)"),
    (["kit", "{tmp}", "--out", "{tmp}/kit"], "--engine with kit: kit reaches no engine (it writes the kit from the "
                                             "release folder and the checkout)"),
    (["push", "{tmp}", "--to", "registry.example:5000/demo-llm"], "--engine with push: push reaches no engine (it "
                                                                  "uploads the image from the release's archive"),
    (["verify", "{tmp}"], "--engine with verify: verify reaches an engine only with --load (the archive loaded there "
                          "and its image ID compared); add --load, or leave out --engine"),
    (["build", "--stage", "render"], "--engine with --stage render: --engine names the engine that builds the image, "
                                     "and --stage render builds nothing; leave out one of them"),
])
@pytest.mark.parametrize("where", ["before", "after"])
def test_an_engine_given_to_a_command_that_reaches_none_is_refused(cli, tmp_path, args, said, where):
    # (before: accepted and ignored: a CI line `build.py --engine ssh://ci verify DIR` checked nothing there)
    engine = ["--engine", "tcp://ci.example:2375"]
    line = [a.format(tmp=tmp_path) for a in args]
    result = cli(*(engine + line if where == "before" else line + engine), cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f"error: {said}"), result.error_lines[0]
    assert os.listdir(tmp_path) == []


def test_what_a_stage_run_uses_is_still_accepted(cli, busybox_product, tmp_path):
    # --allow is the render's context scan's; --force and --no-cache are the build's (--stage build --force moves a
    # released tag)
    from unibake.cli import _check_unused_options, _given_options, build_parser

    result = cli("--config", str(busybox_product), "--stage", "render", "--allow", "^x1$")
    assert result.code == 0, result.err
    argv = ["build", "--stage", "build", "--force", "--no-cache", "--out", "o", "--allow", "^x$"]
    parser = build_parser()
    _check_unused_options(parser.parse_args(argv), _given_options(argv, parser))


def test_pull_refuses_out_with_release(cli, tmp_path):
    # (before: --out was ignored without a word when --release named the folder)
    result = cli("pull", "registry.example:5000/demo-llm@sha256:" + "a" * 64, "--release", str(tmp_path), "--out",
                 str(tmp_path / "elsewhere"))
    assert result.code == 2 and result.error_lines == [
        "error: --out with --release: --out is where pull looks for the release recording the digest, and --release "
        "names that release; leave out one of them"], result.err


def test_metadata_file_dash_is_stdout_as_docker_buildx_has_it(cli, busybox_product, tmp_path):
    # (before: a file named '-' in the current folder, and nothing on stdout)
    as_json = cli("--stage", "render", "--config", str(busybox_product), "--json", cwd=tmp_path)
    dash = cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", "-", cwd=tmp_path)
    assert dash.code == as_json.code == 0, dash.err
    assert json.loads(dash.out) == json.loads(as_json.out)
    assert not (tmp_path / "-").exists()
    for args in (["--metadata-file=-", "releases", "--out", "nowhere"], ["--metadata-file", "-", "--bogus"]):
        failed = cli(*args, cwd=tmp_path)  # a failure's document, and a refused command line's, there too
        assert failed.code == 2 and json.loads(failed.out)["exit_code"] == 2, failed.out
        assert not (tmp_path / "-").exists()
    named = cli("--stage", "render", "--config", str(busybox_product), "--metadata-file", "./-", cwd=tmp_path)
    assert named.code == 0 and named.out == "" and json.loads((tmp_path / "-").read_text())["image"]


@pytest.mark.parametrize("order", [["--json", "--metadata-file", "-"], ["--metadata-file", "-", "lock", "--json"]])
def test_metadata_file_dash_with_json_is_refused_with_one_document_on_stdout(cli, busybox_product, tmp_path, order):
    # both would write the document to stdout: two documents one after the other
    args = [*order, "--config", str(busybox_product)] if "lock" in order else \
        [*order, "--stage", "render", "--config", str(busybox_product)]
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2 and result.error_lines == [
        "error: --metadata-file - writes the document to stdout, where --json writes it too: give one of them"]
    assert json.loads(result.out)["exit_code"] == 2  # exactly one document
    assert not (busybox_product.parent / "dockerfiles").exists() and not (tmp_path / "-").exists()


@pytest.mark.parametrize("stderr", ["closed", "full"])
@pytest.mark.parametrize("entry", [["build.py"], ["-m", "unibake"]])
def test_a_run_started_with_stderr_closed_or_full_keeps_its_exit_code_and_json_document(tmp_path, entry, stderr):
    # 2>&- or 2>/dev/full: the error line has nowhere to go, but the exit code and --json still say it (before:
    # exit 1 for every run, a bad input's and a good one's alike: the reporter failed on the missing stderr, or
    # the error line's own write failed)
    def run(*args):
        with open("/dev/full", "w") as full:
            return subprocess.run([sys.executable, *[str(REPO / e) if e.endswith(".py") else e for e in entry],
                                   *args], stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "CI": "1"},
                                  stderr=full if stderr == "full" else None,
                                  preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None)

    bad = run("--json", "verify", str(tmp_path / "absent"))
    assert bad.returncode == 2 and json.loads(bad.stdout)["exit_code"] == 2, bad.stdout
    good = run("--json", "releases", "--out", str(tmp_path))
    assert good.returncode == 0 and json.loads(good.stdout) == {"folder": str(tmp_path), "releases": []}


@pytest.mark.parametrize("args,said", [
    (["--no-seed", "--sequential"], "error: --no-seed with --sequential: "),
    (["--no-roundtrip", "--no-seed"], "error: --no-seed with --no-roundtrip: "),
    (["hotfix", "--from", "1.0", "--version", "1.1", "--no-seed", "--verify-engine", "tcp://verify:2375"],
     "error: --no-seed with --verify-engine: "),
    (["archive", "demo:1.0", "--no-seed"], "error: --no-seed with archive: "),
    (["--no-roundtrip", "--scratch-dir", "s"], "error: --scratch-dir with --no-roundtrip: --scratch-dir is where the "
                                               "round trip's scratch engine keeps its data, and with --no-roundtrip no "
                                               "round trip runs; leave out one of them"),
    (["archive", "demo:1.0", "--scratch-dir", "s", "--verify-engine", "tcp://verify:2375"],
     "error: --scratch-dir with --verify-engine: "),
    (["hotfix", "--from", "1.0", "--version", "1.1", "--verify-engine", "tcp://verify:2375", "--scratch-dir", "s"],
     "error: --scratch-dir with --verify-engine: "),
    (["deploy", "{tmp}", "--from", "registry", "--temp-dir", "{tmp}"], "error: --temp-dir with --from registry goes "
                                                                       "with --ref: "),
    (["deploy", "{tmp}", "--engine", "unix:///nowhere.sock", "--retries", "99"],
     "error: --retries with --from archive: --retries is for the registry a pull reaches, and --from archive loads "
     "the release's archive, asking no registry; leave out one of them (or give --from registry)"),
    (["deploy", "{tmp}", "--from", "archive", "--engine", "unix:///nowhere.sock", "--auth-file", "{tmp}/none.json"],
     "error: --auth-file with --from archive: "),
    (["deploy", "{tmp}", "--ca-file", "{tmp}/ca.pem", "--engine", "unix:///nowhere.sock"],
     "error: --ca-file with --from archive: "),
])
def test_options_that_contradict_each_other_are_refused_naming_both(cli, tmp_path, args, said):
    # (before: --no-seed was taken and ignored where no seeded engine is used (archive's round trip, the
    # sequential one, a --verify-engine, none); deploy's --temp-dir without --ref, where nothing is compressed;
    # --scratch-dir where no scratch engine is started; deploy's registry options with --from archive, unchecked)
    result = cli(*[a.format(tmp=tmp_path) for a in args], cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(said), result.error_lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, option, command", [
    (["--keep", "2", "prune"], "--keep", "prune"),
    (["--jobs", "5", "deploy", "x"], "--jobs", "deploy"),
    (["--engine-timeout", "5", "deploy", "x"], "--engine-timeout", "deploy"),
    (["--json", "--profile", "tp4", "build", "--stage", "render"], "--profile", "build"),
])
def test_a_commands_option_given_before_the_command_is_named_as_such(cli, tmp_path, args, option, command):
    # (before: argparse took the option's value for the command: "argument COMMAND: invalid choice: '2'")
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2 and result.error_lines == [
        f"error: {option} is an option of '{command}', given before the command: write it after it, as in: "
        f"build.py {command} {option} ..."], result.err


@pytest.mark.parametrize("args, said", [
    (["--keep", "2", "releases"], "--keep is not an option of 'releases' (it is an option of 'prune')"),
    (["--stage", "render", "lock"], "--stage is not an option of 'lock' (it is an option of 'build')"),
    (["--profile", "tp1", "verify", "x"], "--profile is not an option of 'verify' (it is an option of 'build', "),
])
def test_another_commands_option_given_before_a_command_is_named_not_its_value(cli, tmp_path, args, said):
    # found by review: argparse took the option's value for the command ("invalid choice: '2'")
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1 and result.error_lines[0].startswith(f"error: {said}"), \
        result.err

def test_every_option_that_takes_a_value_is_known_to_the_default_commands_finder():
    # with_command skips an option's value to find the command; one it does not know takes its value for
    # the command (before: --engine-timeout and --pull-deadline were missing)
    from unibake.cli import VALUE_OPTIONS, build_parser
    parser = build_parser()
    taking = {name for sub in parser._actions if isinstance(sub, argparse._SubParsersAction)
              for command in sub.choices.values() for action in command._actions if action.nargs != 0
              for name in action.option_strings if name.startswith("--")}
    assert taking - VALUE_OPTIONS == set()


@pytest.mark.parametrize("args,message", [
    (["--stage", "build"], "error: --from makes a release on an earlier one; it goes with --stage release, not "
                           "--stage build"),
    (["--platform", "linux/amd64,linux/arm64"], "error: --from makes one release on an earlier one of the same "
                                                "platform; give one --platform"),
    ([], "error: --from 9.9: "),  # no such release: named before anything is built
])
def test_a_release_on_an_earlier_one_is_refused_up_front_where_it_cannot_be(cli, busybox_product, tmp_path, args,
                                                                             message):
    result = cli("--from", "9.9", "--version", "2.0", "--config", str(busybox_product), "--out", str(tmp_path / "r"),
                 *args)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(message), result.error_lines
    assert not (tmp_path / "r" / "2.0").exists()
