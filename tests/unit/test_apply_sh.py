"""A hotfix's apply.sh runs the checks and the load of scripts/verify-release.sh, which it carries:
what the shell verifier refuses, apply.sh refuses before any load (exit 3, one error line), a tool
it lacks is named, and an interrupt is exit 130 (an engine kept as files: test_hotfix.FAKE_DOCKER)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

from unibake.errors import UnibakeError
from unibake.templates import verify_release_sh

from ..conftest import REPO
from ..forge import also_tagging_the_victim, cut_archive, forge, json_member, member, resum
from ..savefixtures import layer_tar
from .test_hotfix import FAKE_DOCKER, hotfix_pair


@pytest.fixture
def hotfix(tmp_path):
    """(the hotfix folder, an environment whose docker is an engine holding its base release)."""
    base, folder, whole = hotfix_pair(tmp_path / "release")
    bin_dir, engine = tmp_path / "bin", tmp_path / "engine"
    bin_dir.mkdir()
    engine.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    base_id = (base / "IMAGE_ID").read_text().strip()
    (engine / base_id.replace(":", "_")).write_text(base_id + "\n")
    (engine / "demo-llm_1.0").write_text(base_id + "\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ENGINE": str(engine), "LOADS_AS": whole.id,
           "LOADS_TAG": "demo-llm:1.1"}
    return folder, env


def apply(folder, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "./apply.sh"], cwd=folder, capture_output=True, text=True, timeout=60, env=env, **kw)


def loaded(env) -> bool:
    return os.path.exists(os.path.join(env["ENGINE"], ".loads"))


def refused(folder, env, says: str) -> None:
    result = apply(folder, env)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and len(errors) == 1 and says in errors[0], result.stdout + result.stderr
    assert "ok:" not in result.stdout and not loaded(env)


def test_apply_sh_carries_the_shell_verifier_as_it_is(hotfix):
    folder, env = hotfix
    assert (REPO / "unibake" / "templates" / "verify-release.sh").resolve() == REPO / "scripts" / "verify-release.sh"
    assert verify_release_sh() in (folder / "apply.sh").read_text()  # one copy of the checks, not a second
    result = apply(folder, env)
    assert result.returncode == 0, result.stderr
    assert "== the sha256 of every blob" in result.stdout and loaded(env)
    assert result.stdout.endswith("(demo-llm:1.0 is unchanged; roll back with IMAGE=demo-llm:1.0 ./run.sh)\n")


def with_a_member_nothing_refers_to(entries):
    extra = layer_tar({"etc/cron.d/x": b"* * * * * root sh\n"})
    return entries + [member(f"blobs/sha256/{hashlib.sha256(extra).hexdigest()}", extra)]


def without_its_shipped_layer(entries):
    # the layer the hotfix ships, left out as if the base had it: the engine would use what it holds
    shipped = json_member(entries, "manifest.json")[0]["Layers"][-1]
    return [(i, d) for i, d in entries if i.name != shipped]


@pytest.mark.parametrize("change, says", [
    (also_tagging_the_victim, "a load would do more than the release says"),
    (with_a_member_nothing_refers_to, "which nothing refers to: refused before any load"),
    (without_its_shipped_layer, "manifest.json does not record it as left out by a hotfix"),
], ids=["another tag", "an unreferenced blob", "a shipped layer left out"])
def test_a_forged_hotfix_archive_is_refused_by_apply_sh_before_any_load(hotfix, change, says):
    # every sum rewritten to agree (before: sha256sum -c passed, and the archive was loaded as it was)
    folder, env = hotfix
    forge(folder, change)
    refused(folder, env, says)


def test_a_cut_hotfix_archive_is_refused_by_apply_sh_before_any_load(hotfix):
    folder, env = hotfix
    archive = folder / "demo-llm-1.1.tar.zst"
    kept = archive.read_bytes()
    archive.write_bytes(kept[:-40])
    refused(folder, env, "files differ from SHA256SUMS")
    archive.write_bytes(kept)
    # the sums and manifest.json's record of the file made to agree (before: the cut stream was loaded)
    cut_archive(folder, archive.name, 40)
    refused(folder, env, "the archive does not decompress (corrupted or truncated)")


def test_a_tool_apply_sh_lacks_is_named_not_blamed_on_the_release(hotfix, tmp_path):
    # (before: no zstd, "zstd: not found" and the engine's refusal of an empty load; busybox's
    # sha256sum, which takes no --quiet, as "files differ from SHA256SUMS; download them again")
    folder, env = hotfix
    bin_dir = tmp_path / "few"
    bin_dir.mkdir()
    for tool in ("sh", "awk", "cat", "cmp", "comm", "cut", "dd", "grep", "gzip", "head", "mkdir", "mkfifo",
                 "mktemp", "od", "paste", "rm", "sed", "sha256sum", "sort", "tail", "tar", "tee", "tr", "uniq", "wc"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "docker").symlink_to(tmp_path / "bin" / "docker")
    env = {**env, "PATH": str(bin_dir)}
    result = apply(folder, env)
    assert result.returncode == 1 and not loaded(env), result.stdout + result.stderr
    assert result.stderr == "error: zstd is not installed here; apply.sh needs it (see its --help)\n"
    helped = subprocess.run(["sh", "./apply.sh", "--help"], cwd=folder, capture_output=True, text=True, env=env)
    assert "zstd" in helped.stdout and "coreutils (sha256sum with --strict)" in helped.stdout
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox here")
    (bin_dir / "zstd").symlink_to(shutil.which("zstd"))
    (bin_dir / "sha256sum").unlink()
    (bin_dir / "sha256sum").write_text(f'#!/bin/sh\nexec {busybox} sha256sum "$@"\n')
    (bin_dir / "sha256sum").chmod(0o755)
    result = apply(folder, env)
    assert result.returncode == 1 and not loaded(env), result.stdout + result.stderr
    assert result.stderr == ("error: this sha256sum takes no --strict (busybox's?); apply.sh needs coreutils' "
                             "sha256sum\n")


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_apply_sh_interrupted_exits_130_having_loaded_nothing_and_left_no_work_folder(hotfix, tmp_path, sig):
    # as a terminal's ^C does: the whole process group told to stop while the sums are checked
    # (before: apply.sh died of the signal, killed by it, not exit 130)
    folder, env = hotfix
    hook = tmp_path / "hook"
    hook.mkdir()
    real = shutil.which("sha256sum")
    (hook / "sha256sum").write_text(f'#!/bin/sh\ncase "$*" in *-c*) kill -{sig} 0 ;; esac\nexec {real} "$@"\n')
    (hook / "sha256sum").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**env, "PATH": f"{hook}:{env['PATH']}", "TMPDIR": str(tmp_path / "tmp")}
    result = apply(folder, env, start_new_session=True)
    assert result.returncode == 130, (result.returncode, result.stdout + result.stderr)
    assert "ok:" not in result.stdout and "error" not in result.stderr and not loaded(env)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_apply_sh_sent_a_signal_while_its_tools_are_checked_exits_130(hotfix, tmp_path):
    # the carried verifier's first steps (before: its trap came after them, and a signal then ended
    # apply.sh by the signal itself: 143 in a shell, not the documented 130)
    folder, env = hotfix
    hook = tmp_path / "hook"
    hook.mkdir()
    real = shutil.which("sha256sum")
    (hook / "sha256sum").write_text(f'#!/bin/sh\ncase "$*" in *--version*) kill -TERM $PPID ;; esac\nexec {real} "$@"\n')
    (hook / "sha256sum").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**env, "PATH": f"{hook}:{env['PATH']}", "TMPDIR": str(tmp_path / "tmp")}
    result = apply(folder, env)
    assert result.returncode == 130, (result.returncode, result.stdout + result.stderr)
    assert result.stdout == result.stderr == "" and not loaded(env)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_apply_sh_never_runs_a_shell_or_docker_its_folder_holds(hotfix, tmp_path):
    # a PATH that starts with ':' (the current folder first) and a forger's sh and docker beside
    # apply.sh (before: apply.sh, once in its folder, ran them: "sh -c" the verifier, docker the engine)
    folder, env = hotfix
    ran = tmp_path / "ran"
    for tool in ("sh", "docker"):
        (folder / tool).write_text(f'#!/bin/sh\n: > {ran}\nexit 0\n')
        (folder / tool).chmod(0o755)
    result = subprocess.run([shutil.which("sh"), "./apply.sh"], cwd=folder, capture_output=True, text=True,
                            timeout=60, env={**env, "PATH": ":" + env["PATH"]})
    assert result.returncode == 0 and loaded(env) and not ran.exists(), result.stdout + result.stderr
    assert "note: sh is not listed in SHA256SUMS" in result.stdout


def test_apply_sh_applies_its_own_folder_whatever_cdpath_says(hotfix, tmp_path):
    # run as "sh 1.1/apply.sh" with CDPATH exported, naming a folder that holds another 1.1 (before: apply.sh
    # went there, to a folder it does not belong to: "SHA256SUMS is missing", or another release's checks)
    folder, env = hotfix
    (tmp_path / "decoy" / folder.name).mkdir(parents=True)
    result = subprocess.run(["sh", f"{folder.name}/apply.sh"], cwd=folder.parent, capture_output=True, text=True,
                            timeout=120, env={**env, "CDPATH": str(tmp_path / "decoy")})
    assert result.returncode == 0 and loaded(env), result.stdout + result.stderr
    assert "demo-llm-1.1.tar.zst: OK" in result.stdout


def test_apply_sh_in_a_folder_named_like_a_cd_option_applies_its_own_folder(hotfix, tmp_path):
    # (before: cd "$(dirname "$0")" took "-P" for an option and checked and loaded what $HOME holds)
    folder, env = hotfix
    named = tmp_path / "-P"
    shutil.copytree(folder, named)
    result = subprocess.run(["sh", "--", "-P/apply.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**env, "HOME": str(tmp_path / "nowhere"), "OLDPWD": str(tmp_path / "nowhere")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo-llm-1.1.tar.zst: OK" in result.stdout



@pytest.mark.parametrize("held", ["under another name", "with its tag on another image"])
def test_apply_sh_s_roll_back_names_the_base_as_the_engine_holds_it(hotfix, held):
    # (before: "demo-llm:1.0 is unchanged; roll back with IMAGE=demo-llm:1.0 ./run.sh", which ran no
    # image, or another one)
    import re
    import shlex

    folder, env = hotfix
    engine = env["ENGINE"]
    base_id = open(os.path.join(engine, "demo-llm_1.0")).read().strip()
    if held == "under another name":  # pulled from the publisher's registry, say
        os.rename(os.path.join(engine, "demo-llm_1.0"), os.path.join(engine, "registry.example_demo-llm_1.0"))
    else:
        with open(os.path.join(engine, "demo-llm_1.0"), "w") as f:
            f.write("sha256:" + "c" * 64 + "\n")
    result = apply(folder, env)
    assert result.returncode == 0, result.stderr
    line = re.search(r"roll back with ([^)]*\./run\.sh)\)$", result.stdout.splitlines()[-1])
    assert line and "but demo-llm:1.0 does not name it in this engine" in result.stdout, result.stdout
    words = shlex.split(line.group(1))
    run = subprocess.run(["sh", "./run.sh", "--dry-run"], cwd=folder, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **dict(w.split("=", 1) for w in words[:-1])})
    assert run.returncode == 0 and run.stdout.split()[-1] == base_id, run.stdout + run.stderr


def test_apply_sh_without_the_base_in_the_engine_says_what_a_roll_back_needs(hotfix):
    folder, env = hotfix
    engine = env["ENGINE"]
    for name in os.listdir(engine):  # the hotfix's image held whole, its base removed since
        os.unlink(os.path.join(engine, name))
    image_id = (folder / "IMAGE_ID").read_text().strip()
    for ref in (image_id, "demo-llm:1.1"):
        with open(os.path.join(engine, ref.replace(":", "_")), "w") as f:
            f.write(image_id + "\n")
    result = apply(folder, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"ok: demo-llm:1.1 is {image_id} (release 1.0's image is not in this engine; to roll back, import release "
        "1.0, then run IMAGE=demo-llm:1.0 ./run.sh)")  # (before: "demo-llm:1.0 is unchanged")


def test_a_listed_file_that_is_a_fifo_is_refused_at_once_not_waited_on(hotfix):
    # (before: sha256sum -c opened it and waited for a writer for ever)
    folder, env = hotfix
    (folder / "VALIDATION.json").unlink()
    os.mkfifo(folder / "VALIDATION.json")
    refused(folder, env, "VALIDATION.json: not a regular file")


@pytest.mark.parametrize("which", ["hotfix", "release"])
def test_the_shell_verifier_where_no_engine_answers_says_so_as_apply_sh_does(hotfix, which):
    # the checks apply.sh carries, run alone: (before: a hotfix's "this hotfix needs image ...; import
    # that release first", a release's "the engine's images cannot be listed", both exit 3)
    folder, env = hotfix
    env = {**os.environ, "DOCKER_HOST": f"unix://{folder}/no-engine.sock"}
    target = folder if which == "hotfix" else folder.parent / "1.0"
    result = subprocess.run(["sh", str(REPO / "scripts" / "verify-release.sh"), str(target)], capture_output=True,
                            text=True, timeout=60, env=env)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stdout + result.stderr
    assert errors[0].startswith(f"error: cannot reach the Docker engine (DOCKER_HOST=unix://{folder}/no-engine.sock)")
    assert apply(folder, env).stderr.startswith("error: cannot reach the Docker engine")


NO_ENGINE_DOCKER = """#!/bin/sh
# the docker CLI where the engine it picks does not answer; its current context is $CONTEXT ("NAME HOST")
case "$1 ${2:-}" in
  "version "*) echo "Cannot connect to the Docker daemon at ${DOCKER_HOST:-unix:///nowhere.sock}." >&2; exit 1 ;;
  "context inspect") [ -n "$CONTEXT" ] || exit 1; echo "$CONTEXT" ;;
  *) echo "fake docker: $*" >&2; exit 1 ;;
esac
"""


@pytest.mark.parametrize("env, says", [
    ({"DOCKER_HOST": "tcp://gpu1.example:2376"}, "(DOCKER_HOST=tcp://gpu1.example:2376)"),
    ({"DOCKER_CONTEXT": "gpu1"}, "(DOCKER_CONTEXT=gpu1)"),
    ({"CONTEXT": "gpu1 ssh://ops@gpu1.example"}, "(docker context gpu1, ssh://ops@gpu1.example)"),
    ({"CONTEXT": "default unix:///var/run/docker.sock"}, "(DOCKER_HOST=the default socket)"),
    ({"CONTEXT": ""}, "(DOCKER_HOST=the default socket)"),
], ids=["DOCKER_HOST", "DOCKER_CONTEXT", "docker context use", "the default context", "no context shown"])
def test_apply_sh_and_the_shell_verifier_name_the_engine_docker_picks_when_it_does_not_answer(hotfix, tmp_path,
                                                                                               env, says):
    # with DOCKER_CONTEXT set, or a context chosen with `docker context use`, docker reaches that context's engine;
    # the error said "DOCKER_HOST=the default socket" all the same, pointing the adopter at the wrong engine
    folder, _ = hotfix
    bin_dir = tmp_path / "no-engine-bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(NO_ENGINE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CONTEXT": "", **env}
    for result in (apply(folder, env), subprocess.run(["sh", str(REPO / "scripts" / "verify-release.sh"),
                                                       str(folder)], capture_output=True, text=True, timeout=60,
                                                      env=env)):
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 1 and len(errors) == 1, result.stdout + result.stderr
        assert errors[0].startswith(f"error: cannot reach the Docker engine {says}: Cannot connect"), errors[0]


def test_a_link_to_the_verifier_checked_out_as_a_plain_file_is_refused_not_carried(tmp_path):
    # git without links writes the link's target as the file's text: apply.sh would have run that path
    plain = tmp_path / "verify-release.sh"
    plain.write_text("../../scripts/verify-release.sh")
    with pytest.raises(UnibakeError, match=r"is not scripts/verify-release.sh, which a hotfix's apply.sh carries"):
        verify_release_sh(plain)


@pytest.mark.parametrize("link", ["bin/apply-hotfix", "apply-hotfix"])
def test_apply_sh_run_through_a_link_to_it_applies_its_own_folder(hotfix, tmp_path, link):
    # (before: it changed into the link's folder and stopped with exit 3 "./SHA256SUMS is missing")
    folder, env = hotfix
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "apply-hotfix").symlink_to(folder / "apply.sh")
    (tmp_path / link).symlink_to(tmp_path / "links" / "apply-hotfix")  # a link to a link
    result = subprocess.run(["sh", link], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo-llm-1.1.tar.zst: OK" in result.stdout and loaded(env)


def minisigned(folder, secret) -> None:
    made = subprocess.run(["minisign", "-S", "-s", str(secret), "-m", str(folder / "SHA256SUMS"), "-t",
                           "demo-llm 1.1 SHA256SUMS"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr


def test_apply_sh_key_checks_the_signature_as_the_shell_verifier_does_before_any_load(hotfix, tmp_path,
                                                                                    minisign_key):
    # (before: "it takes no arguments", exit 2: the signature had to be checked by another script first)
    folder, env = hotfix
    secret, public = minisign_key
    shutil.copy(public, tmp_path / "publisher.pub")
    where = os.path.relpath(folder / "apply.sh", tmp_path)

    def keyed(*key: str) -> subprocess.CompletedProcess:  # the key named from where apply.sh is run, not its folder
        return subprocess.run(["sh", where, *key], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)

    unsigned = keyed("--key", "publisher.pub")
    assert unsigned.returncode == 3 and not loaded(env), unsigned.stdout + unsigned.stderr
    assert unsigned.stderr.endswith("SHA256SUMS is not signed (no SHA256SUMS.minisig)\n")
    minisigned(folder, secret)
    forged = tmp_path / "forged"
    shutil.copytree(folder, forged)
    forge(forged, with_a_member_nothing_refers_to)  # every sum rewritten: the signature no longer covers them
    result = subprocess.run(["sh", "./apply.sh", "--key", str(tmp_path / "publisher.pub")], cwd=forged,
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 3 and not loaded(env), result.stdout + result.stderr
    assert result.stderr.endswith(f"SHA256SUMS.minisig is not a good signature of SHA256SUMS by {tmp_path}/publisher.pub\n")
    assert "== sha256sum -c" not in result.stdout  # nothing else read
    good = keyed("--key", "publisher.pub")
    assert good.returncode == 0 and loaded(env), good.stdout + good.stderr
    assert "== minisign -Vm SHA256SUMS" in good.stdout and "Trusted comment: demo-llm 1.1 SHA256SUMS" in good.stdout


def test_apply_sh_key_checks_the_signature_before_it_asks_the_engine_anything(hotfix, tmp_path, minisign_key):
    # (before: apply.sh asked the engine first, its version, the base and the tag: an engine without the
    # base said "import release 1.0 first" of a folder whose signature no longer covers its sums)
    folder, env = hotfix
    secret, public = minisign_key
    asked = tmp_path / "asked"
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "docker").write_text(f'#!/bin/sh\necho "$*" >> {asked}\nexec {tmp_path}/bin/docker "$@"\n')
    (spy / "docker").chmod(0o755)
    env = {**env, "PATH": f"{spy}:{env['PATH']}"}
    for name in os.listdir(env["ENGINE"]):  # no base: apply.sh's own engine check refuses
        os.unlink(os.path.join(env["ENGINE"], name))
    minisigned(folder, secret)
    forge(folder, with_a_member_nothing_refers_to)  # every sum rewritten: the signature no longer covers them

    def keyed() -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "./apply.sh", "--key", str(public)], cwd=folder, capture_output=True,
                              text=True, timeout=60, env=env)

    result = keyed()
    assert result.returncode == 3 and not loaded(env), result.stdout + result.stderr
    assert result.stderr.endswith(f"\nerror: .: SHA256SUMS.minisig is not a good signature of SHA256SUMS by {public}\n")
    assert not asked.exists()  # nothing of the engine asked
    minisigned(folder, secret)  # signed as it is: the engine's checks come next, before anything else is read
    result = keyed()
    assert result.returncode == 3 and not loaded(env), result.stdout + result.stderr
    assert "error: this hotfix needs image sha256:" in result.stderr and "== sha256sum -c" not in result.stdout
    assert "== minisign -Vm SHA256SUMS" in result.stdout and asked.read_text().startswith("version ")


@pytest.mark.parametrize("args, says", [
    (["--key"], "error: usage: ./apply.sh [--key PUBKEY]"),
    (["--key", ""], "error: --key given empty (an unset variable?)"),
    (["--key", "nowhere.pub"], "error: --key nowhere.pub: no such file"),
    (["--key", "apply.sh", "--key", "apply.sh"], "error: --key given twice"),
    (["--no-load"], "error: usage: ./apply.sh [--key PUBKEY]"),
], ids=["no value", "empty", "no such file", "twice", "another option"])
def test_apply_sh_s_bad_usage_is_one_error_line_exit_2_before_the_engine_is_asked(hotfix, args, says):
    folder, env = hotfix
    env = {**env, "DOCKER_HOST": f"unix://{folder}/no-engine.sock", "PATH": os.environ["PATH"]}  # no engine at all
    result = subprocess.run(["sh", "./apply.sh", *args], cwd=folder, capture_output=True, text=True, timeout=60,
                            env=env)
    assert result.returncode == 2 and result.stderr.startswith(says) and result.stderr.count("\n") == 1, result.stderr
    helped = subprocess.run(["sh", "./apply.sh", "--help"], cwd=folder, capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and "Usage: ./apply.sh [--key PUBKEY]" in helped.stdout
    assert "With --key PUBKEY, the signature of SHA256SUMS is checked first" in helped.stdout


def test_apply_sh_sent_a_signal_alone_stops_at_the_end_of_the_step_it_is_in_loading_nothing(hotfix, tmp_path):
    # `kill PID` of apply.sh alone (a supervisor's terminate(), not ^C or timeout, which signal the process
    # group) while the sums are checked (before: the carried verifier, a child apply.sh waited on, went on
    # through every check and the load, and apply.sh exited 130 after it)
    import signal
    import time

    folder, env = hotfix
    hook = tmp_path / "hook"
    hook.mkdir()
    real = shutil.which("sha256sum")
    (hook / "sha256sum").write_text(f'#!/bin/sh\ncase "$*" in *-c*) : > {tmp_path}/checking; sleep 2 ;; esac\n'
                                    f'exec {real} "$@"\n')
    (hook / "sha256sum").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**env, "PATH": f"{hook}:{env['PATH']}", "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(["sh", "./apply.sh"], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "checking").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, out + err)
    assert "== its structure" not in out and "ok:" not in out and not loaded(env), out + err
    assert list((tmp_path / "tmp").iterdir()) == []


def test_apply_sh_where_the_base_is_held_only_under_the_hotfix_s_tag_names_the_way_that_keeps_it(hotfix):
    # (before: "remove or retag it first": docker rmi demo-llm:1.1 would delete the base, its only name;
    # the real engine's side: test_apply_sh_load::test_apply_sh_s_way_out_of_a_tag_held_by_another_image_keeps_that_image)
    folder, env = hotfix
    engine = env["ENGINE"]
    os.rename(os.path.join(engine, "demo-llm_1.0"), os.path.join(engine, "demo-llm_1.1"))
    base_id = open(os.path.join(engine, "demo-llm_1.1")).read().strip()
    refused(folder, env, f"loading would move that tag (nothing was loaded); it is release 1.0's image, which this "
                         f"hotfix needs: name it as its release, then free the tag (docker tag {base_id} demo-llm:1.0 "
                         "&& docker rmi demo-llm:1.1; docker rmi alone would delete it), then run apply.sh again")


def test_apply_sh_shows_a_key_path_s_control_characters_as_question_marks_on_one_line(hotfix):
    # `--key $'k\e[2J\nerror: ...'` that is no file was printed raw: the escape drove the terminal and the newline
    # made a second error line apply.sh never wrote
    folder, env = hotfix
    # (and a bidirectional override or a C1 control, which reorder or hide what follows, as verify-release.sh hides them)
    result = subprocess.run(["sh", "./apply.sh", "--key", "k\x1b[2J\nerror: forged\x7f\u202egp.\x9b"], cwd=folder,
                            capture_output=True, text=True, timeout=60, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", "error: --key k?[2J?error: forged??gp.?: no such file\n")
    assert not loaded(env)


@pytest.mark.parametrize("other_tag", ["1.1", "0.9"])
def test_apply_sh_beside_another_release_refuses_it_before_any_load(hotfix, tmp_path, other_tag):
    # found by probing: a whole, consistent release (apply.sh not in its sums) given the hotfix's apply.sh was
    # checked and loaded, and only then compared: demo-llm:1.1 moved to another image and was left so (exit 3,
    # "nothing loaded, or the load undone" says its header); of another tag, docker's raw error and exit 1
    from ..savefixtures import layer_tar
    from .test_publish import make_release

    folder, env = hotfix
    other, _ = make_release(tmp_path / "other", other_tag, layers=[layer_tar({"other": b"other" * 100})])
    shutil.copy(folder / "apply.sh", other / "apply.sh")
    want = (folder / "IMAGE_ID").read_text().strip()
    got = (other / "IMAGE_ID").read_text().strip()
    refused(other, env, f"holds release demo-llm:{other_tag} ({got}), not the one this apply.sh is for: demo-llm:1.1 "
                        f"({want}); nothing was loaded")


def test_apply_sh_help_from_a_folder_named_like_an_option_prints_its_help(hotfix, tmp_path):
    # found by probing: sed read the folder "-n" as its option and printed its own usage (exit 0)
    folder, env = hotfix
    named = tmp_path / "-n"
    shutil.copytree(folder, named)
    for script in ("apply.sh", "run.sh"):
        shown = subprocess.run(["sh", "--", f"-n/{script}", "--help"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=60, env=env)
        assert shown.returncode == 0 and shown.stderr == "" and shown.stdout.startswith(
            "Apply hotfix" if script == "apply.sh" else ""), shown.stdout + shown.stderr
    (named / "verify-release.sh").write_bytes((REPO / "scripts/verify-release.sh").read_bytes())
    shown = subprocess.run(["sh", "--", "-n/verify-release.sh", "--help"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env)
    assert shown.returncode == 0 and shown.stderr == "" and "Usage: scripts/verify-release.sh" in shown.stdout, shown
