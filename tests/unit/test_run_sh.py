"""run.sh, the script a release ships to start a profile, under hostile arguments and real multi-GPU/AMD stacks:
each run under dash (CI's /bin/sh) and, where installed, bash and bash --posix."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .test_publish import METADATA, make_release

SHELLS = [s for s in (["dash"], ["bash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])]


@pytest.fixture
def folder(tmp_path):
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"].update(vendor="amd", devices={"extra": [], "groups": ["render"]})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    return folder


def run_sh(shell, folder, *args, env=None):
    return subprocess.run([*shell, str(folder / "run.sh"), *args], capture_output=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


# this host's video and render groups, as getent answers them
GETENT = ('#!/bin/sh\ncase "$2" in video) echo video:x:44: ;; render) echo render:x:109: ;; *) exit 2 ;; esac\n')
# a docker that writes each word it is given, NUL-terminated
ECHO_DOCKER = "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n"


def fake_tools(tmp_path, **tools) -> str:
    """Writes each fake tool (its name: its script) into one folder; returns a PATH that finds them first."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    for name, script in tools.items():
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_an_error_line_shows_control_characters_of_what_it_quotes_as_escapes_one_line(folder, tmp_path, shell):
    # `--env-file $'x\e[2J'`, a mistyped -e or a GPUS holding a newline was printed raw: the terminal ran the escape
    # sequence, and a newline made a second line that could pass for another message
    cases = [
        ((["--env-file", "e\x1b[2J\x9b\n\terror: forged"], {}),
         b"error: --env-file e\\x1b[2J\\x9b\\n\\terror: forged: no such file\n"),
        ((["-e", "A\x07\r=1"], {}), b"error: -e needs NAME=VALUE with NAME like HF_HOME; got 'A\\x07\\r'\n"),
        ((["tp2"], {"GPUS": "0\n1"}), b"error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0\\n1'\n"),
        ((["tp1"], {"IMAGE": "demo\x1b]0;x\x07:1"}),
         b"error: IMAGE must be an image reference like demo-llm:1.3.1; got 'demo\\x1b]0;x\\x07:1'\n"),
        # UTF-8 stays as it is; C1 controls (U+0080-U+009F) and bytes that are no UTF-8 are escaped
        ((["--name", "caf\u00e9\u0085", "tp1"], {}),
         "error: the container name must be letters, digits, '_', '.' and '-'; got 'caf\u00e9\\x85'\n".encode()),
        ((["--name", b"caf\xe9".decode("utf-8", "surrogateescape"), "tp1"], {}),
         b"error: the container name must be letters, digits, '_', '.' and '-'; got 'caf\\xe9'\n"),
    ]
    for (args, env), stderr in cases:
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert (run.returncode, run.stdout, run.stderr) == (2, b"", stderr), (args, env)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@pytest.mark.parametrize("name, message", [
    ("HOME", "sets HOME, the home of the image's user, which docker sets"),
    ("HOSTNAME", "sets HOSTNAME, which docker sets to the container's host name"),
    ("SHLVL", "sets SHLVL, which bash or busybox as the image's /bin/sh sets or drops"),
    ("_", "sets _, which bash or busybox"), ("LINENO", "sets LINENO, which bash"), ("PS1", "sets PS1, which bash"),
    ("OLDPWD", "sets OLDPWD, which bash"),
])
def test_run_sh_refuses_docker_s_and_the_shells_own_variables_as_the_plan_does(folder, tmp_path, shell, name,
                                                                               message):
    # an env file written by `env` holds HOME, HOSTNAME, SHLVL and _: HOME and HOSTNAME passed to break the
    # container's identity (the plan refuses them in a profile's env), SHLVL and _ to be changed or dropped by the
    # image's shell
    env_file = tmp_path / "env.list"
    env_file.write_text(f"A=1\n{name}=/x\n")
    for args, where in ((["-e", f"{name}=/x"], "-e"), (["--env-file", str(env_file)], f"--env-file {env_file}")):
        run = run_sh(shell, folder, "--dry-run", *args, "tp1")
        assert run.returncode == 2 and run.stdout == b"" and run.stderr.count(b"\n") == 1, run.stderr
        assert run.stderr.decode().startswith(f"error: {where} {message}"), run.stderr


@pytest.mark.parametrize("key", ["SHLVL", "_", "LINENO", "PS1", "OLDPWD",
                                 # found by probing: bash as /bin/sh (RHEL, UBI, Fedora bases) sets or drops these too
                                 "SHELLOPTS", "RANDOM", "OPTERR", "BASH_VERSION", "EPOCHSECONDS"])
def test_an_env_key_some_shells_set_or_drop_is_refused_in_a_profile_as_run_sh_refuses_it(busybox_product, cli, key):
    # an env file written by `env` in a working container holds SHLVL and _: bash as the entrypoint's /bin/sh drops
    # _, PS1, OLDPWD and sets LINENO; busybox counts SHLVL up
    (busybox_product.parent / "images/dump.env").write_text(f"NCCL_DEBUG=INFO\n{key}=1\n")
    (busybox_product / "tp2.yaml").write_text((busybox_product / "tp2.yaml").read_text()
                                              + "env_file: images/dump.env\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: images/dump.env:2: env key '{key}' is a shell's own: bash or busybox as the entrypoint's /bin/sh "
        "sets or drops it, so this value may not reach the engine (an env file written by `env`?); remove it"], \
        result.err


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_takes_a_nul_byte_in_a_comment_line_as_docker_does_and_names_the_line_of_one_elsewhere(
        folder, tmp_path, shell):
    # docker skips a '#' line whatever it holds; run.sh refused any NUL byte in the file ("holds a NUL byte"), and
    # did not say which line held the one runc refuses
    env_file = tmp_path / "my.env"
    env_file.write_bytes(b"# saved by a tool\x00\n  \t# \x00\x00\r\nA=1\n")
    good = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "tp1")
    assert good.returncode == 0 and f"--env-file={env_file} demo-llm:1.3.1".encode() in good.stdout, good.stderr
    for text, line in ((b"# x\x00\nA=1\n  B\x00=1\n", 3), (b"\x00# not a comment: its name starts with NUL\n", 1),
                       (b"A=1\nB=2\x00\r\n", 2)):
        env_file.write_bytes(text)
        bad = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "tp1")
        assert (bad.returncode, bad.stdout, bad.stderr.decode()) == (
            2, b"", f"error: --env-file {env_file}: line {line} holds a NUL byte, which no variable can hold\n")


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_a_gpu_numbering_the_container_lacks_as_the_plan_refuses_it_in_a_profile(folder, tmp_path,
                                                                                               shell):
    # the container has only the GPUs of GPUS, numbered from 0: CUDA_VISIBLE_DEVICES=4,5,6,7 copied from a docker run
    # that gave every GPU (or the host's own, by -e NAME) hid every GPU from the engine, which then failed long
    # after the start; an empty value or a negative number hid them too; NVIDIA_VISIBLE_DEVICES chose GPUs past GPUS
    env_file = tmp_path / "gpu.env"
    env_file.write_text("A=1\n  CUDA_VISIBLE_DEVICES=4,5\r\n")
    (tmp_path / "from-env.env").write_text("ROCR_VISIBLE_DEVICES\n")
    tail = ", but the container of profile {} sees only the GPUs of GPUS ({}), numbered from 0 to {}: remove it, " \
           "or number them from 0\n"
    for args, env, stderr in (
        (["-e", "CUDA_VISIBLE_DEVICES=4,5,6,7", "tp4"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='4,5,6,7', which names GPU 7" + tail.format("tp4", 4, 3)),
        (["-e", "ROCR_VISIBLE_DEVICES= 0, 01 ,2", "tp2"], {},
         "error: -e sets ROCR_VISIBLE_DEVICES=' 0, 01 ,2', which names GPU 2" + tail.format("tp2", 2, 1)),
        (["-e", "CUDA_VISIBLE_DEVICES", "tp1"], {"CUDA_VISIBLE_DEVICES": "1"},
         "error: -e CUDA_VISIBLE_DEVICES, from this environment, sets CUDA_VISIBLE_DEVICES='1', which names GPU 1"
         + tail.format("tp1", 1, 0)),
        (["--env-file", str(env_file), "tp2"], {},
         f"error: --env-file {env_file} sets CUDA_VISIBLE_DEVICES='4,5', which names GPU 5" + tail.format("tp2", 2, 1)),
        (["--env-file", str(tmp_path / "from-env.env"), "tp1"], {"ROCR_VISIBLE_DEVICES": "9" * 30},
         f"error: --env-file {tmp_path / 'from-env.env'}, from this environment, sets ROCR_VISIBLE_DEVICES='{'9' * 30}', "
         "which names GPU 99999" + tail.format("tp1", 1, 0)),
        (["-e", "CUDA_VISIBLE_DEVICES= ", "tp1"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES=' ', which hides every GPU from the engine; remove it\n"),
        # white space of any kind is no GPU, as the plan strips it (a newline or a '\r' passed)
        (["-e", "CUDA_VISIBLE_DEVICES=\n\r", "tp1"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='\\n\\r', which hides every GPU from the engine; remove it\n"),
        (["-e", "ROCR_VISIBLE_DEVICES=0,-1", "tp2"], {},
         "error: -e sets ROCR_VISIBLE_DEVICES='0,-1': '-1' hides the GPUs after it from the engine; remove it\n"),
        # CUDA and ROCm stop at the first item that names no GPU, as at a negative one
        (["-e", "HIP_VISIBLE_DEVICES=0, ,1", "tp2"], {},
         "error: -e sets HIP_VISIBLE_DEVICES='0, ,1': its empty item hides the GPUs after it from the engine; remove "
         "it\n"),
        (["-e", "NVIDIA_VISIBLE_DEVICES=all", "tp1"], {},
         "error: -e sets NVIDIA_VISIBLE_DEVICES, which chooses the container's GPUs as GPUS does (run.sh gives docker "
         "--gpus from it): use GPUS\n"),
    ):
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", stderr), args
    # what the container does have: numbered from 0 within GPUS, UUIDs, or any number with GPUS=all
    for args, env in ((["-e", "CUDA_VISIBLE_DEVICES=3,2,1,0", "tp4"], {"GPUS": "4,5,6,7"}),
                      (["-e", "CUDA_VISIBLE_DEVICES=GPU-4f1c9a2e,1", "tp2"], {}),
                      (["-e", "CUDA_VISIBLE_DEVICES=6", "tp1"], {"GPUS": "all"}),
                      (["-e", "CUDA_VISIBLE_DEVICES=1,0,", "tp2"], {}),  # a comma at the end hides nothing
                      (["-e", "CUDA_VISIBLE_DEVICES", "--env-file", str(tmp_path / "from-env.env"), "tp2"],
                       {"CUDA_VISIBLE_DEVICES": "1,0", "ROCR_VISIBLE_DEVICES": "0,1"})):
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert run.returncode == 0 and run.stderr == b"", (args, run.stderr)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_a_gpu_numbering_that_names_fewer_gpus_than_the_profile_needs_as_the_plan_does(folder, tmp_path,
                                                                                                     shell):
    # CUDA_VISIBLE_DEVICES=0 on a profile of 2: the engine started on one GPU (GPUS=all too: it sees those named)
    (tmp_path / "one.env").write_text("\xa0HIP_VISIBLE_DEVICES=GPU-4f1c9a2e\n")
    for args, env, stderr in (
        (["-e", "CUDA_VISIBLE_DEVICES=0", "tp2"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='0', which names 1 GPU, but profile tp2 needs 2: the engine would see "
         "only those; remove it, or name 2, numbered from 0\n"),
        (["-e", "ROCR_VISIBLE_DEVICES=1,01,", "tp2"], {"GPUS": "all"},  # GPU 1 twice
         "error: -e sets ROCR_VISIBLE_DEVICES='1,01,', which names 1 GPU, but profile tp2 needs 2"),
        (["-e", "GPU_DEVICE_ORDINAL=2,0,1", "-e", "CUDA_VISIBLE_DEVICES=3,1", "tp4"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='3,1', which names 2 GPUs, but profile tp4 needs 4"),
        (["--env-file", str(tmp_path / "one.env"), "tp2"], {},
         f"error: --env-file {tmp_path / 'one.env'} sets HIP_VISIBLE_DEVICES='GPU-4f1c9a2e', which names 1 GPU, but "
         "profile tp2 needs 2"),
    ):
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert (run.returncode, run.stdout) == (2, b""), (args, run.stderr)
        assert run.stderr.decode().startswith(stderr) and run.stderr.count(b"\n") == 1, (args, run.stderr)
    run = run_sh(shell, folder, "--dry-run", "-e", "CUDA_VISIBLE_DEVICES=1,GPU-4f1c9a2e", "tp2")
    assert run.returncode == 0 and run.stderr == b"", run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_checks_rocms_gpu_device_ordinal_as_the_visible_devices(folder, tmp_path, shell):
    # ROCm's HIP runtime reads GPU_DEVICE_ORDINAL as HIP_VISIBLE_DEVICES: a host's numbering in it passed
    env_file = tmp_path / "rocm.env"
    env_file.write_text("GPU_DEVICE_ORDINAL=0,-1\n")
    tail = ", but the container of profile tp2 sees only the GPUs of GPUS (2), numbered from 0 to 1: remove it, " \
           "or number them from 0\n"
    for args, stderr in (
        (["-e", "GPU_DEVICE_ORDINAL=4,5", "tp2"], "error: -e sets GPU_DEVICE_ORDINAL='4,5', which names GPU 5" + tail),
        (["--env-file", str(env_file), "tp2"],
         f"error: --env-file {env_file} sets GPU_DEVICE_ORDINAL='0,-1': '-1' hides the GPUs after it from the engine; "
         "remove it\n"),
    ):
        run = run_sh(shell, folder, "--dry-run", *args)
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", stderr), args
    run = run_sh(shell, folder, "--dry-run", "-e", "GPU_DEVICE_ORDINAL=1,0", "tp2")
    assert run.returncode == 0 and run.stderr == b"", run.stderr


@pytest.mark.parametrize("group", ["2147483648", "4294967295", "9999999999"])
def test_a_group_number_past_what_runc_takes_is_refused_at_the_plan(busybox_product, cli, group):
    # GROUP_RE took up to ten digits: the release passed its gates (which start no AMD device) and every run.sh start
    # failed with docker's exit 125, runc's "Unable to find group"
    (busybox_product / "tp2.yaml").write_text((busybox_product / "tp2.yaml").read_text()
                                              + f"devices: {{vendor: amd, groups: [render, '{group}']}}\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: {busybox_product / 'tp2.yaml'}:7: group {group} is past 2147483647, the highest group number "
        f"docker's runtime takes: every start would fail with 'Unable to find group {group}'"], result.err


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_a_group_number_past_what_runc_takes(tmp_path, shell):
    # a host whose render group came from a directory service with large numbers (or a release made before the plan
    # checked a profile's numbers): docker failed the start with runc's "Unable to find group"
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"].update(vendor="amd", devices={"extra": [], "groups": ["render"]})
    metadata["profiles"]["tp2"].update(vendor="amd", devices={"extra": [], "groups": ["4294967295"]})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    path = fake_tools(tmp_path, getent=GETENT.replace("render:x:109:", '"render:x:$RENDER_GID:"'))
    for gid, stderr in (
        ("2147483648", "error: group render is number 2147483648 on this host, past the 2147483647 docker's runtime "
                       "takes: the container cannot join it (docker would fail the start with 'Unable to find group')\n"),
        ("99999999999999999999", "error: group render is number 99999999999999999999 on this host, past the "
                                 "2147483647"),
    ):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "RENDER_GID": gid})
        assert run.returncode == 2 and run.stdout == b"" and run.stderr.decode().startswith(stderr), run.stderr
    run = run_sh(shell, folder, "--dry-run", "tp2", env={"PATH": path})
    assert (run.returncode, run.stderr.decode()) == (2, (
        "error: profile tp2's group 4294967295 is past the 2147483647 docker's runtime takes (docker would fail the "
        "start with 'Unable to find group')\n"))
    run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "RENDER_GID": "2147483647"})
    assert run.returncode == 0 and b"--group-add 44 --group-add 2147483647 " in run.stdout, run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_with_docker_host_naming_another_machine_takes_that_machine_s_group_numbers(folder, tmp_path, shell):
    # run.sh looked video and render up on the machine that runs it, also with DOCKER_HOST naming another machine's
    # engine: the container joined this machine's numbers, not the groups the engine's device nodes belong to
    path = fake_tools(tmp_path, getent=GETENT)

    def groups(env):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, **env})
        assert run.returncode == 0 and run.stderr == b"", run.stderr
        words = run.stdout.decode().split()
        return [words[i + 1] for i, w in enumerate(words) if w == "--group-add"]

    assert groups({}) == groups({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}) == ["44", "109"]
    for host in ("tcp://gpu1.example:2376", "ssh://ops@gpu1.example"):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "DOCKER_HOST": host})
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
            f"error: DOCKER_HOST={host} names another machine's engine, and profile tp4 joins groups whose numbers "
            "there run.sh cannot look up; give ENGINE_GROUPS=video=NUMBER,render=NUMBER (getent group on that "
            "machine)\n"))
        assert groups({"DOCKER_HOST": host, "ENGINE_GROUPS": "xvideo=1,video=39,render=993"}) == ["39", "993"]
    assert run_sh(shell, folder, "--dry-run", "tp1", env={"PATH": path, "DOCKER_HOST": "tcp://gpu1:2376"}
                  ).returncode == 0  # an NVIDIA profile joins no group
    for value, stderr in (
        ("video=39", "error: ENGINE_GROUPS gives no number for group render, which profile tp4 joins; add "
                     "render=NUMBER (getent group render on the engine's machine)\n"),
        ("video=39;id", "error: ENGINE_GROUPS must be groups and their numbers on the engine's machine, like "
                        "video=44,render=109; got 'video=39;id'\n"),
        ("video=,render=1", "error: ENGINE_GROUPS: 'video=' is not NAME=NUMBER, like render=109\n"),
        ("video=4x,render=1", "error: ENGINE_GROUPS: 'video=4x' is not NAME=NUMBER\n"),
        # the same group twice: the first was taken, silently (a value pasted over an older one)
        ("video=39,render=993,video=44", "error: ENGINE_GROUPS gives group video twice; give each group once\n"),
    ):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "ENGINE_GROUPS": value})
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", stderr), value
    assert b"ENGINE_GROUPS   video=44,render=109" in run_sh(shell, folder, "--help").stdout
    readme = (folder / "README-DIST.md").read_text()
    # (the shipped guide names every way docker picks another machine's engine, not DOCKER_HOST alone)
    assert ("naming another machine's engine (not a unix socket, nor TCP to this machine's loopback), give that "
            "machine's numbers: `ENGINE_GROUPS=") in " ".join(readme.split())
    assert "(the value of a `-e NAME=VALUE` whose name says secret, like\n`HF_TOKEN`, shown as `<hidden>`, " in readme


def test_the_shipped_readme_names_docker_context_too_for_engine_groups(folder):
    # run.sh asks for ENGINE_GROUPS when DOCKER_HOST, DOCKER_CONTEXT or the current `docker context` names another
    # machine's engine; the README-DIST a downloader reads named DOCKER_HOST only, so one who switched with
    # `docker context use gpu1` found no word of why run.sh refused, nor that the numbers must be gpu1's
    readme = " ".join((folder / "README-DIST.md").read_text().split())
    assert ("with `DOCKER_HOST`, `DOCKER_CONTEXT` or the current `docker context` (`docker context use`) naming "
            "another machine's engine (not a unix socket, nor TCP to this machine's loopback), give that machine's "
            "numbers: `ENGINE_GROUPS=video=44,render=109`") in readme


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_gives_an_amd_gpu_the_render_node_the_kernel_gives_it_not_128_plus_its_number(tmp_path, shell):
    # GPUS=0,1 gave /dev/dri/renderD128 and renderD129; on a host whose BMC or integrated GPU holds renderD128, GPU 0
    # (as rocm-smi and HIP number it: the KFD topology's GPU nodes in order) is renderD129: the container got the
    # BMC's node and one GPU, and the engine failed to find the second
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"].update(vendor="hygon", devices={"extra": [], "groups": []})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    nodes = tmp_path / "topology" / "nodes"  # the kernel's /sys/class/kfd/kfd/topology/nodes, as amdgpu writes it
    for node, gpu_id, minor in (("0", 0, 0), ("1", 15209, 129), ("2", 17126, 130), ("10", 40111, 140), ("3", 0, 0)):
        (nodes / node).mkdir(parents=True)
        (nodes / node / "gpu_id").write_text(f"{gpu_id}\n")
        (nodes / node / "properties").write_text(f"cpu_cores_count 0\nsimd_count 304\ndrm_render_minor {minor}\n")
    script = (folder / "run.sh").read_text()
    assert "\nkfd_nodes=/sys/class/kfd/kfd/topology/nodes\n" in script
    (folder / "run.sh").write_text(script.replace("\nkfd_nodes=/sys/class/kfd/kfd/topology/nodes\n",
                                                  f"\nkfd_nodes={nodes}\n"))

    def devices(env):
        run = run_sh(shell, folder, "--dry-run", "tp2", env={"ENGINE_GROUPS": "video=44", **env})
        assert run.returncode == 0 and run.stderr == b"", run.stderr
        words = run.stdout.decode().split()
        return [words[i + 1] for i, w in enumerate(words) if w == "--device" and "/dri/" in words[i + 1]]

    assert devices({}) == ["/dev/dri/renderD129", "/dev/dri/renderD130"]
    assert devices({"GPUS": "2,0"}) == ["/dev/dri/renderD140", "/dev/dri/renderD129"]  # node 10 after node 2
    # another machine's engine: its topology is not this host's; 128+N as before
    assert devices({"GPUS": "2,0", "DOCKER_HOST": "tcp://gpu1:2376"}) == ["/dev/dri/renderD130", "/dev/dri/renderD128"]
    assert devices({"GPUS": "2,0", "DOCKER_CONTEXT": "gpu1"}) == ["/dev/dri/renderD130", "/dev/dri/renderD128"]
    run = run_sh(shell, folder, "--dry-run", "tp2", env={"GPUS": "0,3", "ENGINE_GROUPS": "video=44"})
    assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
        "error: GPUS names GPU 3, but this host has 3 GPUs, numbered from 0 (its KFD topology, as rocm-smi shows "
        "them)\n"))


@pytest.mark.parametrize("shell", [s for s in SHELLS if s[0] != "busybox"], ids=" ".join)  # (busybox has its awk)
def test_run_sh_says_its_error_on_a_host_without_awk(folder, tmp_path, shell):
    # the escaping of an error line's control characters needs awk: without it the line was "error: " alone
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sed", "sort", "uniq", "head", "tr", "grep", "cut", "cat", "printf", "env", "printenv", "wc"):
        found = next((d / tool for d in (Path("/usr/bin"), Path("/bin")) if (d / tool).exists()), None)
        if found:
            (bare / tool).symlink_to(found)
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "tp2",
                 env={"PATH": str(bare), "GPUS": "0\n\x1b1"})
    assert (run.returncode, run.stdout, run.stderr) == (
        2, b"", b"error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0??1'\n")
    # --dry-run's line too: each control character as '?', one line
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "-e", "A=x\x1b[2J\nq'\u009b\u00e9", "tp1",
                 env={"PATH": str(bare)})
    assert run.returncode == 0 and run.stdout.endswith(" -e 'A=x?[2J?q'\\''?\u00e9' demo-llm:1.3.1\n".encode()), run
    # C1 control characters (U+0080 to U+009F, two bytes in UTF-8) too: tr alone passed them raw
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "tp2",
                 env={"PATH": str(bare), "GPUS": "0\u009b2J\u0085,1"})
    assert (run.returncode, run.stdout, run.stderr) == (
        2, b"", b"error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0?2J?,1'\n")


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_every_env_name_the_plan_refuses_in_a_profile(folder, tmp_path, shell):
    # the plan refused LD_LIBRARY_PATH, PYTHONPATH and PYTHONDONTWRITEBYTECODE in a profile's env (the image sets
    # them), run.sh let -e and an env file set them: -e LD_LIBRARY_PATH=/opt/x replaced the image's, and the engine
    # failed to load its libraries after the start
    from unibake.plan import SHELL_ENV, SOME_SHELLS_ENV
    from unibake.schema import RESERVED_ENV, RESERVED_ENV_PREFIX
    env_file = tmp_path / "env.list"
    for name in sorted(RESERVED_ENV | SHELL_ENV | SOME_SHELLS_ENV | {RESERVED_ENV_PREFIX + "X"}):
        env_file.write_text(f"A=1\n{name}=/x\n")
        for args, where in ((["-e", f"{name}=/x"], "-e"), (["--env-file", str(env_file)], f"--env-file {env_file}")):
            run = run_sh(shell, folder, "--dry-run", *args, "tp1")
            assert run.returncode == 2 and run.stdout == b"" and run.stderr.count(b"\n") == 1, (name, run.stderr)
            assert run.stderr.decode().startswith(f"error: {where} sets {name}, "), run.stderr
    run = run_sh(shell, folder, "--dry-run", "-e", "LD_LIBRARY_PATH=/opt/x", "tp1")
    assert run.stderr.decode() == (
        "error: -e sets LD_LIBRARY_PATH, which the image sets: the value would replace the image's, where the engine "
        "finds its libraries and modules\n")


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_with_a_docker_context_naming_another_machine_takes_that_machine_s_group_numbers(folder, tmp_path,
                                                                                               shell):
    # only DOCKER_HOST was read: with `docker context use gpu1` (or DOCKER_CONTEXT=gpu1) naming another machine's
    # engine, as docker picks it when DOCKER_HOST is unset, run.sh joined this host's group numbers and gave this
    # host's KFD render nodes
    docker = (  # docker context inspect --format ... -- NAME, as docker 20.10 answers it
        '#!/bin/sh\n[ "$1 $2 $3" = "context inspect --format" ] || exit 9\ncase "$6" in '
        'gpu1) echo tcp://gpu1.example:2376 ;; rootless) echo unix:///run/user/1000/docker.sock ;; '
        '*) echo "context \\"$6\\" does not exist" >&2; exit 1 ;; esac\n')
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    path = fake_tools(tmp_path, getent=GETENT, docker=docker)

    def run(env):
        return run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "HOME": str(home), **env})

    def groups(env):
        done = run(env)
        assert done.returncode == 0 and done.stderr == b"", done.stderr
        words = done.stdout.decode().split()
        return [words[i + 1] for i, w in enumerate(words) if w == "--group-add"]

    tail = (" names another machine's engine, and profile tp4 joins groups whose numbers there run.sh cannot look up; "
            "give ENGINE_GROUPS=video=NUMBER,render=NUMBER (getent group on that machine)\n")
    (home / ".docker/config.json").write_text('{\n\t"auths": {},\n\t"currentContext": "gpu1"\n}\n')
    for env, where in (({}, "docker context 'gpu1' (tcp://gpu1.example:2376)"),
                       ({"DOCKER_CONTEXT": "gpu1"}, "docker context 'gpu1' (tcp://gpu1.example:2376)"),
                       ({"DOCKER_CONTEXT": "gone\x1b[2J"}, "docker context 'gone\\x1b[2J' (which docker could not "
                                                           "show here)")):
        done = run(env)
        assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", f"error: {where}{tail}"), env
    assert groups({"ENGINE_GROUPS": "video=39,render=993"}) == ["39", "993"]
    # this host's engine: DOCKER_HOST (docker's first choice), the default context, a context of a socket here
    assert groups({"DOCKER_HOST": "unix:///var/run/docker.sock"}) == ["44", "109"]
    assert groups({"DOCKER_CONTEXT": "default"}) == groups({"DOCKER_CONTEXT": "rootless"}) == ["44", "109"]
    (home / ".docker/config.json").write_text('{"currentContext": "rootless"}')
    assert groups({}) == ["44", "109"]
    done = run({"DOCKER_CONTEXT": "gpu1", "DOCKER_CONFIG": str(tmp_path / "none")})
    assert done.returncode == 2 and done.stderr.decode().startswith("error: docker context 'gpu1' (tcp://"), done.stderr
    assert run_sh(shell, folder, "--dry-run", "tp1", env={"PATH": path, "DOCKER_CONTEXT": "gpu1"}).returncode == 0


@pytest.mark.parametrize("where", ["env", "env_file"])
def test_nvidia_visible_devices_is_refused_in_a_profile_as_run_sh_refuses_it(busybox_product, cli, where):
    # run.sh refused -e NVIDIA_VISIBLE_DEVICES (GPUS chooses the GPUs); the plan took it in a profile's env, where it
    # never took effect: docker sets it from --gpus, and the entrypoint gives a profile's value only where none is set
    tp2 = busybox_product / "tp2.yaml"
    if where == "env":
        tp2.write_text(tp2.read_text().replace("env: {NCCL_ALGO: Ring}",
                                               "env: {NCCL_ALGO: Ring, NVIDIA_VISIBLE_DEVICES: '0,1'}"))
    else:
        (busybox_product.parent / "images/gpus.env").write_text("NCCL_DEBUG=INFO\nNVIDIA_VISIBLE_DEVICES=0,1\n")
        tp2.write_text(tp2.read_text() + "env_file: images/gpus.env\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].endswith(
        "env key 'NVIDIA_VISIBLE_DEVICES' chooses the container's GPUs, which docker sets from run.sh's GPUS (--gpus), "
        "so this value would never take effect; remove it (GPUS chooses them)"), result.err
    assert ("images/gpus.env:2: " if where == "env_file" else "tp2.yaml:") in result.error_lines[0], result.err


@pytest.mark.parametrize("vendor, refused", [("hygon", True), ("amd", False), ("nvidia", False)])
def test_hip_visible_devices_is_refused_in_a_hygon_profile_whose_run_sh_sets_it(busybox_product, cli, vendor, refused):
    # run.sh gives a hygon profile's container -e HIP_VISIBLE_DEVICES=0,..,N-1 (and refuses -e of it): a profile's
    # own value passed the plan and never took effect, as the entrypoint gives it only where none is set
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace("env: {NCCL_ALGO: Ring}",
                                           "env: {NCCL_ALGO: Ring, HIP_VISIBLE_DEVICES: '1,0'}")
                   + f"devices: {{vendor: {vendor}}}\n")
    result = cli("lock", "--config", str(busybox_product))
    if refused:
        assert result.code == 2 and result.error_lines == [
            f"error: {tp2}:5: env key 'HIP_VISIBLE_DEVICES' is set by run.sh for a hygon profile (to its 2 GPUs from "
            "0, unless GPUS=all), so this value would not take effect; remove it"], result.err
    else:
        assert result.code == 0, result.err


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_takes_the_topology_variables_on_a_single_node_profile_as_the_plan_does(tmp_path, shell):
    # run.sh refused -e MASTER_PORT (NNODES, NODE_RANK, MASTER_ADDR) on every profile, "which run.sh or the image
    # sets": on a profile of one node neither sets them, and the plan takes them in such a profile's env
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"]["topology"] = {"nodes": 2, "network": "host"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    env_file = tmp_path / "dist.env"
    env_file.write_text("A=1\nMASTER_PORT=29600\nPATH=/x\n")
    run = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "tp1")  # the file's other names: checked
    assert (run.returncode, run.stderr.decode()) == (2, (
        f"error: --env-file {env_file} sets PATH, which would replace the image's, where the engine is found\n"))
    env_file.write_text("A=1\nMASTER_PORT=29600\n")
    for args in (["-e", "MASTER_PORT=29600", "-e", "NNODES=1"], ["--env-file", str(env_file)]):
        run = run_sh(shell, folder, "--dry-run", *args, "tp1")
        assert run.returncode == 0 and run.stderr == b"", (args, run.stderr)
        run = run_sh(shell, folder, "--dry-run", *args, "tp4", env={"NODE_RANK": "0", "MASTER_ADDR": "node0"})
        where = "-e" if args[0] == "-e" else f"--env-file {env_file}"
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
            f"error: {where} sets MASTER_PORT, which run.sh sets on profile tp4 of 2 nodes; use the variable run.sh "
            "reads (see ./run.sh --help)\n")), args


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_takes_an_engine_on_this_machine_s_loopback_as_this_machine_s(folder, tmp_path, shell):
    # DOCKER_HOST=tcp://127.0.0.1:2375 (a dockerd listening on loopback, or docker's own default for a bare port) was
    # taken as another machine's engine: exit 2 asking for ENGINE_GROUPS, which this machine's getent knows, and the
    # render nodes were 128+N, not this host's KFD topology
    docker = (  # docker context inspect --format ... -- NAME, as docker 20.10 answers it
        '#!/bin/sh\n[ "$1 $2 $3" = "context inspect --format" ] || exit 9\ncase "$6" in '
        'here) echo tcp://127.0.0.1:2375 ;; *) echo tcp://gpu1.example:2376 ;; esac\n')
    path = fake_tools(tmp_path, getent=GETENT, docker=docker)
    for env in ({"DOCKER_HOST": host} for host in (
            "tcp://127.0.0.1:2375", "tcp://localhost:2376", "tcp://[::1]:2375", "tcp://127.8.9.10:2375/",
            "tcp://127.255.0.1", "tcp://:2375", "tcp://", "localhost:2375", "127.0.0.1")):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, **env})
        assert run.returncode == 0 and run.stderr == b"", (env, run.stderr)
        assert b" --group-add 44 --group-add 109 " in run.stdout, (env, run.stdout)
    run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "DOCKER_CONTEXT": "here"})
    assert run.returncode == 0 and b" --group-add 44 --group-add 109 " in run.stdout, run.stderr
    # another machine's, or not certainly this one's: ENGINE_GROUPS asked for, as before
    for host in ("tcp://127.0.0.256:2375", "tcp://127.0.0:2375", "tcp://127.0.0.1.gpu1.example:2375",
                 "tcp://localhost.example:2375", "tcp://[::2]:2375", "tcp://10.0.0.1:2375", "ssh://127.0.0.1",
                 "gpu1:2375", "tcp://1270.0.0.1:2375", "tcp://127.00.0.1:2375"):
        run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "DOCKER_HOST": host})
        assert (run.returncode, run.stdout) == (2, b""), host
        assert run.stderr.decode() == (
            f"error: DOCKER_HOST={host} names another machine's engine, and profile tp4 joins groups whose numbers "
            "there run.sh cannot look up; give ENGINE_GROUPS=video=NUMBER,render=NUMBER (getent group on that "
            "machine)\n"), host
    run = run_sh(shell, folder, "--dry-run", "tp4", env={"PATH": path, "DOCKER_CONTEXT": "gpu1"})
    assert run.returncode == 2 and b"docker context 'gpu1' (tcp://gpu1.example:2376) names" in run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_takes_only_a_render_node_s_number_from_the_kfd_topology(tmp_path, shell):
    # drm_render_minor was taken as any digits: 0 (a card's or no node), 0129, 64 or a number of 30 digits became
    # --device /dev/dri/renderD0129 ..., which docker refused at the start (exit 125) or gave a card node
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"].update(vendor="amd", devices={"extra": [], "groups": []})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    nodes = tmp_path / "topology" / "nodes"
    script = (folder / "run.sh").read_text()
    (folder / "run.sh").write_text(script.replace("\nkfd_nodes=/sys/class/kfd/kfd/topology/nodes\n",
                                                  f"\nkfd_nodes={nodes}\n"))
    for node, gpu_id in (("0", 0), ("1", 15209), ("2", 17126)):
        (nodes / node).mkdir(parents=True)
        (nodes / node / "gpu_id").write_text(f"{gpu_id}\n")

    def run(minor):
        (nodes / "1" / "properties").write_text("simd_count 304\ndrm_render_minor 129\n")
        (nodes / "2" / "properties").write_text(f"simd_count 304\ndrm_render_minor {minor}\n")
        return run_sh(shell, folder, "--dry-run", "tp2", env={"ENGINE_GROUPS": "video=44"})

    for minor in ("130", "191", "192", "1048575"):
        done = run(minor)
        assert done.returncode == 0 and f" --device /dev/dri/renderD129 --device /dev/dri/renderD{minor} ".encode() \
            in done.stdout, (minor, done.stderr)
    for minor in ("0", "127", "0130", "00", "1048576", "9" * 30, "-1", "130 ", "13x", "1e3", "\x1b[2J"):
        done = run(minor)
        shown = minor.replace("\x1b", "\\x1b")
        assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", (
            f"error: GPUS: GPU 1's drm_render_minor in {nodes}/2/properties is '{shown}', not a render node's number "
            "(128 to 1048575)\n")), minor


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_dry_run_shows_control_characters_as_escapes_and_reads_back_as_the_words_docker_gets(tmp_path, shell):
    # --dry-run printed each word raw in '...': an -e value, an env file's path, a weight path or an engine argument
    # holding ESC drove the terminal, and a newline split the one line into two, the second free text
    metadata = json.loads(json.dumps(METADATA))
    metadata["launch"]["mounts"] = {"draft": "/models/draft"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    path = fake_tools(tmp_path, docker=ECHO_DOCKER)
    env_file = tmp_path / "e\x1b[2J\u0085 it's\udce9.env"  # (docker reads the file here: its name need not be UTF-8)
    env_file.write_text("A=1\n")
    weights = "/w/caf\u00e9 \u00a0"  # (a weight path holds no control character, and is UTF-8: run.sh refuses others)
    args = ["-e", "A=x\x1b[2J\r\nerror: forged\t", "-e", "B=it's \u00fc\u0085\\ $(id) `id` \"q\"",
            "--env-file", str(env_file), "tp1", "--flag", "\x9b31m", "-e", "NOT_OURS=\x07"]
    env = {"PATH": path, "MODEL_DRAFT": weights}
    environ = {k: v.encode("utf-8", "surrogateescape") for k, v in env.items()}
    dry = subprocess.run([*shell, str(folder / "run.sh"), "--dry-run", *args], capture_output=True, env=environ)
    assert dry.returncode == 0 and dry.stderr == b"", dry.stderr
    line = dry.stdout
    assert line.endswith(b"\n") and line.count(b"\n") == 1, line
    assert not [b for b in line[:-1] if b < 32 or b == 127], line  # no C0 control character
    assert b"\xc2\x85" not in line and b"\xc2\x9b" not in line  # no C1 either
    assert b""" -e 'A=x'"$(printf '\\033')"'[2J'"$(printf '\\r\\n\\145')"'rror: forged'"$(printf '\\t')" """ in line
    assert "'type=bind,source=/w/caf\u00e9 \u00a0,".encode() in line
    ran = subprocess.run([*shell, str(folder / "run.sh"), *args], capture_output=True, env=environ)
    assert ran.returncode == 0, ran.stderr
    words = ran.stdout.split(b"\0")[:-1]
    assert words[words.index(b"demo-llm:1.3.1") + 1:] == [b"serve", b"--flag", "\x9b31m".encode(), b"-e",
                                                          b"NOT_OURS=\x07"]
    # the line, read back by every sh (dash has no $'...'), is the very words docker was given
    for reader in SHELLS:
        read_back = subprocess.run([*reader, "-c", b"for a in " + line[len(b"docker "):-1] + b"; do printf '%s\\0' \"$a\"; done"],
                                   capture_output=True)
        assert read_back.returncode == 0 and read_back.stdout.split(b"\0")[:-1] == words, (reader, read_back, words)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_dry_run_hides_the_value_of_an_e_whose_name_says_secret_as_unibake_s_sanitiser_reads_names(folder, shell):
    # --dry-run printed -e HF_TOKEN=hf_... in clear, a line people paste into tickets and logs; the names are those the
    # plan's secret check reads (TOKENIZERS_PARALLELISM, MAX_TOKENS are none); the engine's own -e after the profile
    # and -e NAME (from the environment, never shown) are as before
    from unibake.sanitise import SECRET_NAME_RE
    names = ["HF_TOKEN", "hf_token", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "WANDB_APIKEY", "AWS_SECRET_ACCESS_KEY",
             "DB_PASSWORD", "PGPASSWD", "GPG_PASSPHRASE", "MYSQL_PWD", "PWD_X", "NPM_AUTH", "AUTH_X", "SSH_KEY",
             "GCP_CREDENTIALS", "MY_PRIVATE_KEY", "TOKENTOKENS", "TOKENIZERS_PARALLELISM", "MAX_TOKENS", "TOKENISE",
             "KEYS_DIR", "KEY", "KEY_X", "PWDX", "AUTHOR", "MONKEY", "HF_HOME", "NCCL_DEBUG", "X_AUTH_Y", "SMTP_PASS",
             "BYPASS_CACHE", "HTTP_AUTHORIZATION", "AUTHORIZATION_MODE", "AZURE_STORAGE_CONNECTION_STRING", "DB_CONN_STR",
             "KAFKA_CONNECTION_STRATEGY"]
    args = [w for n in names for w in ("-e", f"{n}=v@l ue")]
    run = run_sh(shell, folder, "--dry-run", "-e", "EMPTY_TOKEN=", *args, "tp1", "-e", "HF_TOKEN=engine")
    assert run.returncode == 0 and run.stderr == b"", run.stderr
    line = run.stdout.decode()
    for name in names:
        shown = f" -e '{name}=<hidden>' " if SECRET_NAME_RE.search(name) else f" -e '{name}=v@l ue' "
        assert shown in line, (name, line)
    assert (SECRET_NAME_RE.search("TOKENIZERS_PARALLELISM"), bool(SECRET_NAME_RE.search("HF_TOKEN"))) == (None, True)
    assert " -e EMPTY_TOKEN= " in line and line.endswith(" demo-llm:1.3.1 serve -e 'HF_TOKEN=<hidden>'\n"), line


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_takes_hip_visible_devices_on_an_amd_or_nvidia_profile_as_the_plan_does(tmp_path, shell):
    # run.sh refused -e HIP_VISIBLE_DEVICES (and an env file's line) on every profile, "which run.sh or the image sets":
    # it sets it on a hygon profile only, and the plan takes it in an amd or nvidia profile's env (numbered within the
    # profile's GPUs, as CUDA_/ROCR_VISIBLE_DEVICES)
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"].update(vendor="amd", devices={"extra": [], "groups": []})
    metadata["profiles"]["tp2"].update(vendor="hygon", devices={"extra": [], "groups": []})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    env_file = tmp_path / "amd.env"
    env_file.write_text("A=1\nHIP_VISIBLE_DEVICES=3,1,0,2\n")
    env = {"ENGINE_GROUPS": "video=44"}
    for args in (["-e", "HIP_VISIBLE_DEVICES=3,2,1,0", "tp4"], ["--env-file", str(env_file), "tp4"],
                 ["-e", "HIP_VISIBLE_DEVICES=0", "tp1"]):
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert run.returncode == 0 and run.stderr == b"", (args, run.stderr)
        assert (b"HIP_VISIBLE_DEVICES" if args[0] == "-e" else b"amd.env") in run.stdout
    run = run_sh(shell, folder, "--dry-run", "-e", "HIP_VISIBLE_DEVICES=4,5", "tp4", env=env)
    assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
        "error: -e sets HIP_VISIBLE_DEVICES='4,5', which names GPU 5, but the container of profile tp4 sees only the "
        "GPUs of GPUS (4), numbered from 0 to 3: remove it, or number them from 0\n"))
    for args, where in ((["-e", "HIP_VISIBLE_DEVICES=1,0"], "-e"), (["--env-file", str(env_file)], f"--env-file {env_file}")):
        run = run_sh(shell, folder, "--dry-run", *args, "tp2", env=env)
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
            f"error: {where} sets HIP_VISIBLE_DEVICES, which run.sh sets on hygon profile tp2 (to the GPUs of GPUS, "
            "numbered from 0); choose the GPUs with GPUS\n")), args


def test_the_plan_s_warning_of_a_variable_no_one_sets_never_asks_for_one_run_sh_refuses(busybox_product, tmp_path):
    # the ${NAME} warning said "give it at run time (docker run -e NAME=...)" of names run.sh refuses in -e (a shell's
    # own SHLVL, NVIDIA_VISIBLE_DEVICES on an AMD profile, HIP_VISIBLE_DEVICES on a hygon one), and warned of ${PWD},
    # which the entrypoint's shell sets, and of ${NVIDIA_VISIBLE_DEVICES} on an NVIDIA profile, which docker sets
    from unibake.plan import make_plan
    from unibake.render import render
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
        "command: [echo, '${PWD}', '${OPTIND}', '${NVIDIA_VISIBLE_DEVICES}', '${SHLVL}', '${HF_TOKEN}']"))
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text() + "devices: {vendor: hygon}\nargs: ['${HIP_VISIBLE_DEVICES}']\n")
    (busybox_product / "tp3.yaml").write_text("profile: tp3\nextends: tp1.yaml\ndevices: {vendor: amd}\n"
                                              "args: ['${HIP_VISIBLE_DEVICES}']\n")
    plan = make_plan(busybox_product)
    hint = ("unless the base image sets it, it must be given at run time (docker run -e {0}=...), or the engine does "
            "not start")
    assert plan.unset_warnings() == (
        "engine.command: ${SHLVL} of profile tp1, tp2, tp3 is a shell's own: bash or busybox as the entrypoint's "
        "/bin/sh sets or drops it, and run.sh refuses -e SHLVL, so the engine may not start; remove it",
        "engine.command: ${HF_TOKEN} is set neither by unibake nor by the env of profile tp1, tp2, tp3: "
        + hint.format("HF_TOKEN"),
        "engine.command: ${NVIDIA_VISIBLE_DEVICES} of profile tp2, tp3 is set by docker for an NVIDIA profile only "
        "(from run.sh's GPUS), and run.sh refuses -e NVIDIA_VISIBLE_DEVICES: the engine does not start; remove it",
        "args: ${HIP_VISIBLE_DEVICES} of profile tp2 is set by run.sh on a hygon profile unless GPUS=all, and run.sh "
        "refuses -e HIP_VISIBLE_DEVICES there: with GPUS=all the engine does not start",
        "args: ${HIP_VISIBLE_DEVICES} is set neither by unibake nor by the env of profile tp3: "
        + hint.format("HIP_VISIBLE_DEVICES"))
    # what a build knows the base sets is not warned, refused or not
    assert plan.unset_warnings({"SHLVL", "HF_TOKEN", "HIP_VISIBLE_DEVICES"}, "base:1") == (
        "engine.command: ${NVIDIA_VISIBLE_DEVICES} of profile tp2, tp3 is set by docker for an NVIDIA profile only "
        "(from run.sh's GPUS), and run.sh refuses -e NVIDIA_VISIBLE_DEVICES: the engine does not start; remove it",)
    entrypoint = tmp_path / "entrypoint.sh"  # ${PWD} and ${OPTIND}, not warned, are set at start indeed
    entrypoint.write_text(render(plan).entrypoint)
    run = subprocess.run(["sh", str(entrypoint)], capture_output=True, text=True, cwd=tmp_path,
                         env={"PROFILE": "tp1", "PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "0", "SHLVL": "1",
                              "HF_TOKEN": "t"})
    assert run.returncode == 0 and run.stdout.split()[:3] == [str(tmp_path), "1", "0"], run


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_a_value_docker_would_pass_changed_as_it_is_not_utf8(tmp_path, shell):
    # docker sends a container's variables, command and mounts as JSON, which turns each byte that is no UTF-8 into
    # U+FFFD (Engine 20.10: -e A=$'x\xe9y' gives the container "x\ufffdy"): the engine got another value than the one
    # given, without a word, and a weight folder of such a name was "bind source path does not exist" (exit 125)
    metadata = json.loads(json.dumps(METADATA))
    metadata["launch"]["mounts"] = {"draft": "/models/draft"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    env_file = tmp_path / "from-env.env"
    env_file.write_text("A=1\nHF_HOME\n")
    latin1 = "caf\udce9"  # café in Latin-1
    not_utf8 = "is not UTF-8: docker would pass it changed (each byte that is no UTF-8 as U+FFFD)"
    for args, env, stderr in (
        (["-e", f"HF_HOME=/{latin1}", "tp1"], {}, f"-e HF_HOME: the value {not_utf8}; give it in UTF-8"),
        (["-e", "HF_TOKEN", "tp1"], {"HF_TOKEN": f"hf_{latin1}"},
         f"-e HF_TOKEN: its value in this environment {not_utf8}; give it in UTF-8"),
        (["--env-file", str(env_file), "tp1"], {"HF_HOME": f"/{latin1}"},
         f"--env-file {env_file}: HF_HOME (a line without '='): its value in this environment {not_utf8}; give it "
         "in UTF-8"),
        (["tp1"], {"MODEL_NAME": latin1}, f"MODEL_NAME {not_utf8}; give it in UTF-8"),
        (["tp1"], {"MODEL_DRAFT": f"/w/{latin1}"},
         f"MODEL_DRAFT {not_utf8}, so the engine would look for another folder; got '/w/caf\\xe9'"),
        # (named by its place: its value may be a secret, which --dry-run hides; found by probing)
        (["tp1", "--served-model-name", latin1], {}, f"the engine's argument 2 (counted after the profile) {not_utf8}; "
                                                      "give it in UTF-8"),
    ):
        environ = {"PATH": "/usr/bin:/bin", **{k: v.encode("utf-8", "surrogateescape") for k, v in env.items()}}
        argv = [a.encode("utf-8", "surrogateescape") for a in args]
        for dry in (["--dry-run"], []):
            run = subprocess.run([*shell, str(folder / "run.sh"), *dry, *argv], capture_output=True, env=environ)
            assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", f"error: {stderr}\n"), (args, env)
    # UTF-8 of any script passes, as before
    run = run_sh(shell, folder, "--dry-run", "-e", "A=caf\u00e9 \u4e2d\u6587 \U0001f600", "--env-file", str(env_file),
                 "tp1", "--served-model-name=\u00e9", env={"HF_HOME": "/\u00e9", "MODEL_NAME": "\u00e9", "MODEL_DRAFT": "/w/\u00e9"})
    assert run.returncode == 0 and run.stderr == b"", run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@pytest.mark.parametrize("c1", ["\u0085", "\u009b", "\u0080", "\u009f"], ids=["NEL", "CSI", "PAD", "APC"])
def test_a_weight_path_holding_a_c1_control_character_is_refused_under_every_shell(tmp_path, shell, c1):
    # [[:cntrl:]] is the shell's and the locale's: dash and busybox passed a MODEL_* path holding U+0085 (NEL) that
    # bash refused in a UTF-8 locale
    metadata = json.loads(json.dumps(METADATA))
    metadata["launch"]["mounts"] = {"draft": "/models/draft"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    for lang in ({}, {"LC_ALL": "C.UTF-8"}):
        run = run_sh(shell, folder, "--dry-run", "tp1", env={"MODEL_DRAFT": f"/w/a{c1}b", **lang})
        assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
            "error: MODEL_DRAFT must not hold ':', ',', '\"' or a control character; got "
            f"'/w/a\\x{ord(c1):02x}b'\n")), lang
    run = run_sh(shell, folder, "--dry-run", "tp1", env={"MODEL_DRAFT": "/w/\u00a0\u00e9\u0100"})  # (U+00A0 on: kept)
    assert run.returncode == 0 and run.stderr == b"", run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_names_each_profile_s_container_apart_whatever_name_the_environment_holds(folder, shell):
    # run.sh named the container after $NAME, which WSL (and some logins) set to the computer's name: every profile
    # got one name, and a second profile on that machine failed with docker's "name in use" (exit 125)
    for env in ({"NAME": "DESKTOP-4F2K9"}, {"CONTAINER_NAME": "uid-abc"}, {}):
        names = []
        for profile in ("tp1", "tp2"):
            run = run_sh(shell, folder, "--dry-run", profile, env=env)
            assert run.returncode == 0 and run.stderr == b"", run.stderr
            names.append(run.stdout.split()[4])
        assert names == [b"demo-llm-tp1", b"demo-llm-tp2"], (env, names)
    named = run_sh(shell, folder, "--dry-run", "--name", "mybox", "tp2", env={"NAME": "DESKTOP-4F2K9"})
    assert named.stdout.startswith(b"docker run --rm --name mybox "), named
    helped = run_sh(shell, folder, "--help").stdout.decode()
    assert "the container is named demo-llm-PROFILE, or by --name; no variable names it" in helped, helped
    readme = " ".join((folder / "README-DIST.md").read_text().split())
    assert "`--name NAME` names the container (else `demo-llm-PROFILE`: no variable names it)" in readme


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_a_profile_set_but_empty_is_refused_not_the_default_one(folder, shell):
    # found by probing: PROFILE=$P with $P empty ran the default profile (4 GPUs in the demo) without a word
    empty = run_sh(shell, folder, "--dry-run", env={"PROFILE": ""})
    assert (empty.returncode, empty.stdout) == (2, b"") and empty.stderr.startswith(b"error: unknown profile ''"), empty
    unset = run_sh(shell, folder, "--dry-run")
    assert unset.returncode == 0 and b" PROFILE=tp4 " in unset.stdout, unset  # unset: the default
    given = run_sh(shell, folder, "--dry-run", "tp1", env={"PROFILE": ""})
    assert given.returncode == 0 and b" PROFILE=tp1 " in given.stdout, given  # the argument names it


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_an_env_file_line_naming_a_variable_sh_cannot_read_has_its_value_checked_too(tmp_path, shell):
    # an env file's line `A.B` (no '=') takes A.B from the environment, which bash passes on to docker: run.sh did not
    # check that value (sh cannot read such a name), so one that is not UTF-8 reached the container changed; dash and
    # busybox sh pass no such variable on, so docker would drop the line
    folder, _ = make_release(tmp_path / "release")
    env_file = tmp_path / "my.env"
    env_file.write_text("A=1\nA.B\n")
    passes_it_on = shell[0] == "bash"
    for value, ok in ((b"caf\xc3\xa9", True), (b"caf\xe9", False)):
        run = subprocess.run([*shell, str(folder / "run.sh"), "--dry-run", "--env-file", str(env_file), "tp1"],
                             capture_output=True, env={b"PATH": b"/usr/bin:/bin", b"A.B": value})
        if passes_it_on and ok:
            assert run.returncode == 0 and run.stderr == b"", run.stderr
        elif passes_it_on:
            assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
                f"error: --env-file {env_file}: A.B (a line without '='): its value in this environment is not UTF-8: "
                "docker would pass it changed (each byte that is no UTF-8 as U+FFFD); give it in UTF-8\n"))
        else:
            assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", (
                f"error: --env-file {env_file}: A.B (a line without '=') is not set in this environment (dash and "
                "busybox sh pass no variable of a name like it on), so docker would drop it; set it or give "
                "A.B=VALUE\n"))


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_dry_run_hides_the_value_of_an_engine_option_whose_name_says_secret(tmp_path, shell):
    # --dry-run hid only a -e's value: `--api-key sk-...`, `--hf-token=hf_...` or `--password X` for the engine were
    # shown in clear on a line people paste into tickets; an option's name is read as a -e's name, '-' as '_'
    from unibake.sanitise import SECRET_NAME_RE
    folder, _ = make_release(tmp_path / "release")
    path = fake_tools(tmp_path, docker=ECHO_DOCKER)
    names = ["api-key", "hf-token", "password", "api_key", "admin-password", "ssl-key", "auth", "max-tokens",
             "tokenizer", "tokenizers-parallelism", "port", "model", "keys-dir", "author"]
    args = []
    for name in names:
        args += [f"--{name}", "s3cr et", f"--{name}=s3cr=et"]
    args += ["--auth", "--api-key", "sk-1", "--password=", "--api-key", "", "-e", "HF_TOKEN=x", "HF_TOKEN=y",
             "MAX_TOKENS=5", "--x-api-key"]
    dry = run_sh(shell, folder, "--dry-run", "tp1", *args)
    assert dry.returncode == 0 and dry.stderr == b"", dry.stderr
    line = dry.stdout.decode()
    served = line[line.index(" serve ") + len(" serve "):-1]
    expected = []
    for name in names:
        secret = bool(SECRET_NAME_RE.search(name.replace("-", "_")))
        expected += [f"--{name}", "'<hidden>'" if secret else "'s3cr et'",
                     f"'--{name}=<hidden>'" if secret else f"--{name}=s3cr=et"]
    expected += ["--auth", "--api-key", "'<hidden>'", "--password=", "--api-key", "''", "-e", "'HF_TOKEN=<hidden>'",
                 "'HF_TOKEN=<hidden>'", "MAX_TOKENS=5", "--x-api-key"]
    assert served == " ".join(expected), served
    readme = " ".join((folder / "README-DIST.md").read_text().split())
    assert "shown as `<hidden>`, as is that of an engine argument named so, like `--api-key`;" in readme
    # the real run passes every value as given
    ran = subprocess.run([*shell, str(folder / "run.sh"), "tp1", *args], capture_output=True,
                         env={"PATH": path})
    assert ran.returncode == 0, ran.stderr
    words = ran.stdout.split(b"\0")[:-1]
    assert words[words.index(b"serve") + 1:] == [a.encode() for a in args]


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_checks_the_gpu_numbering_that_reaches_the_container_not_one_a_later_e_overrides(folder, tmp_path,
                                                                                                  shell):
    # docker reads the env files in order, then each -e, and the last value of a name wins; run.sh checked every value
    # it saw, so a team's env file holding the host's CUDA_VISIBLE_DEVICES=4,5 (or an empty one) was refused even where
    # a -e gave the value the container would get; and a file's value that a later file replaced was checked too
    host = tmp_path / "host.env"
    host.write_text("A=1\nCUDA_VISIBLE_DEVICES=4,5\n")
    empty = tmp_path / "empty.env"
    empty.write_text("CUDA_VISIBLE_DEVICES=\n")
    good = tmp_path / "good.env"
    good.write_text("CUDA_VISIBLE_DEVICES=1,0\n")
    tail = (", but the container of profile tp2 sees only the GPUs of GPUS (2), numbered from 0 to 1: remove it, or "
            "number them from 0\n")
    for args, env, stderr in (
        (["--env-file", str(host), "-e", "CUDA_VISIBLE_DEVICES=1,0"], {}, ""),
        (["-e", "CUDA_VISIBLE_DEVICES=1,0", "--env-file", str(host)], {}, ""),  # (-e wins wherever it stands)
        (["--env-file", str(empty), "-e", "CUDA_VISIBLE_DEVICES"], {"CUDA_VISIBLE_DEVICES": "1,0"}, ""),
        (["--env-file", str(host), "--env-file", str(good)], {}, ""),
        (["--env-file", str(good), "--env-file", str(host)], {},
         f"error: --env-file {host} sets CUDA_VISIBLE_DEVICES='4,5', which names GPU 5" + tail),
        (["--env-file", str(good), "-e", "CUDA_VISIBLE_DEVICES=3"], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='3', which names GPU 3" + tail),
        (["--env-file", str(good), "-e", "CUDA_VISIBLE_DEVICES="], {},
         "error: -e sets CUDA_VISIBLE_DEVICES='', which hides every GPU from the engine; remove it\n"),
        (["--env-file", str(host), "-e", "ROCR_VISIBLE_DEVICES=0"], {},
         f"error: --env-file {host} sets CUDA_VISIBLE_DEVICES='4,5', which names GPU 5" + tail),
    ):
        run = run_sh(shell, folder, "--dry-run", *args, "tp2", env=env)
        if stderr:
            assert (run.returncode, run.stdout, run.stderr.decode()) == (2, b"", stderr), args
        else:
            assert run.returncode == 0 and run.stderr == b"", (args, run.stderr)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_dry_run_s_line_reads_back_under_dash_too_as_the_words_docker_gets(tmp_path, shell):
    # --dry-run wrote a word holding a control character as $'...', which dash 0.5.12 (Debian's and Ubuntu's /bin/sh,
    # the shell run.sh is written for) reads as a '$' and the escapes as written: pasted there, docker got other words
    folder, _ = make_release(tmp_path / "release")
    path = fake_tools(tmp_path, docker=ECHO_DOCKER)
    args = ["A=x\x1b[2J\r\nerror: forged\t", "a\n\nb!c%d\\e'\\n", "it's", "--chat-template=x\n\n", "\u0085caf\u00e9\n\u0085",
            "", "\n", "\n\u00e9\n", "-x\x07", "%s\\n", "\n'\n", "\t-", "\x7f!"]
    env = {"PATH": path}
    dry = run_sh(shell, folder, "--dry-run", "tp1", "--", *args, env=env)
    assert dry.returncode == 0 and dry.stderr == b"", dry.stderr
    line = dry.stdout
    assert not [b for b in line[:-1] if (b < 32 and b != 10) or b == 127], line  # no control character but \n
    assert b"\xc2\x85" not in line and b"$'" not in line
    # a newline only where a word ends in newlines (no sh has one-line quoting for them), and there before a "'"
    assert [line[i + 1:i + 2] for i in range(len(line) - 1) if line[i] == 10] == [b"\n", b"'", b"'", b"'", b"'"], line
    ran = run_sh(shell, folder, "tp1", "--", *args, env=env)
    assert ran.returncode == 0, ran.stderr
    words = ran.stdout.split(b"\0")[:-1]
    assert words[words.index(b"serve") + 1:] == [a.encode() for a in args]
    for reader in SHELLS:
        read_back = subprocess.run([*reader, "-c", b"for a in " + line[len(b"docker "):-1] + b"; do printf '%s\\0' \"$a\"; done"],
                                   capture_output=True)
        assert read_back.returncode == 0 and read_back.stdout.split(b"\0")[:-1] == words, (reader, read_back)


@pytest.mark.parametrize("shell", [s for s in SHELLS if s[0] != "busybox"], ids=" ".join)  # (busybox has its awk)
def test_run_sh_reads_an_env_file_on_a_host_without_awk(folder, tmp_path, shell):
    # run.sh measured an env file's lines with awk: on a host without it (a slim image, a minimal install) every
    # --env-file ended with the shell's "awk: not found", exit 127, and no error line
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sed", "sort", "uniq", "head", "tr", "grep", "cut", "cat", "printf", "env", "printenv", "wc"):
        found = next((d / tool for d in (Path("/usr/bin"), Path("/bin")) if (d / tool).exists()), None)
        if found:
            (bare / tool).symlink_to(found)
    env_file = tmp_path / "my.env"
    env_file.write_text("A=1\n")
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "--env-file", str(env_file), "tp1",
                 env={"PATH": str(bare)})
    assert run.returncode == 0 and run.stderr == b"", run.stderr
    assert run.stdout.endswith(f" --env-file={env_file} demo-llm:1.3.1\n".encode()), run.stdout
    env_file.write_text("A=1\nB=" + "x" * 65533 + "\nC=" + "y" * 65534 + "\n")  # (lines of 65535 and 65536 bytes)
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "--env-file", str(env_file), "tp1",
                 env={"PATH": str(bare)})
    assert (run.returncode, run.stdout, run.stderr.decode()) == (
        2, b"", f"error: --env-file {env_file}: line 3 is longer than docker reads (65535 bytes)\n")


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_on_a_host_without_docker_says_so_in_one_error_line(folder, tmp_path, shell):
    # the shell's own "run.sh: 660: exec: docker: not found" (exit 127) was all: no error line, a line number of run.sh
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sed", "sort", "uniq", "head", "tr", "grep", "cut", "cat", "printf", "env", "printenv", "wc", "awk"):
        found = next((d / tool for d in (Path("/usr/bin"), Path("/bin")) if (d / tool).exists()), None)
        if found:
            (bare / tool).symlink_to(found)
    run = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "tp1", env={"PATH": str(bare)})
    assert (run.returncode, run.stdout, run.stderr) == (
        127, b"", b"error: docker is not on PATH: install Docker Engine's client (./run.sh --dry-run prints the command)\n")
    dry = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "--dry-run", "tp1", env={"PATH": str(bare)})
    assert dry.returncode == 0 and dry.stdout.startswith(b"docker run --rm --name demo-llm-tp1 "), dry
    bad = run_sh([shutil.which(shell[0]), *shell[1:]], folder, "tp1", env={"PATH": str(bare), "PORT": "x"})
    assert (bad.returncode, bad.stderr) == (2, b"error: PORT must be a number from 1 to 65535; got 'x'\n")


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@pytest.mark.parametrize("line", ["-x", "--help", "-0"])
def test_an_env_file_line_that_looks_like_an_option_gets_one_error_line(folder, tmp_path, shell, line):
    # run.sh asked `printenv -x` whether the line's variable was set: printenv took it as its option and printed its
    # own two lines of usage above run.sh's error
    env_file = tmp_path / "my.env"
    env_file.write_text(f"A=1\n{line}\n")
    run = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "tp1")
    assert (run.returncode, run.stdout) == (2, b""), run.stderr
    assert run.stderr.decode().startswith(f"error: --env-file {env_file}: {line} (a line without '=') is not set in "
                                          "this environment") and run.stderr.count(b"\n") == 1, run.stderr
    # busybox's printenv (Alpine's) takes no "--": it looks every argument up, "--" too, and fails when one is unset
    path = fake_tools(tmp_path, printenv=(
        "#!/bin/sh\nrc=0\nfor a in \"$@\"; do awk -v n=\"$a\" "
        "'BEGIN { if (n in ENVIRON) { print ENVIRON[n]; exit 0 }; exit 1 }' || rc=1; done\nexit $rc\n"))
    env_file.write_text("A=1\nHF_HOME\n")
    env = {"PATH": path, "HF_TOKEN": "hf_x", "HF_HOME": "/h"}
    run = run_sh(shell, folder, "--dry-run", "-e", "HF_TOKEN", "--env-file", str(env_file), "tp1", env=env)
    assert run.returncode == 0 and run.stderr == b"", run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_an_empty_name_as_given_by_an_unset_variable(folder, shell):
    # `--name "$BOX"` with BOX unset named the container demo-llm-tp1 without a word, as if --name were not given
    for args in (["--name", ""], ["--name="], ["tp1", "--name", ""]):
        run = run_sh(shell, folder, "--dry-run", *args)
        assert (run.returncode, run.stdout, run.stderr) == (
            2, b"", b"error: --name given empty (an unset variable?): give a container name, or leave --name out\n"), args
    run = run_sh(shell, folder, "--dry-run", "--name=box", "tp1")
    assert run.returncode == 0 and run.stdout.startswith(b"docker run --rm --name box "), run


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_runs_grep_as_it_calls_it_whatever_grep_options_says(folder, tmp_path, shell):
    # grep before 3.6 (Ubuntu 20.04 has 3.4) reads GREP_OPTIONS, warning on every call: an old .bashrc's
    # GREP_OPTIONS=--color=auto printed "grep: warning: GREP_OPTIONS is deprecated" many times over run.sh's line, and
    # -v or -i would turn its checks around. The fake grep does what such a grep does; docker still gets the variable
    real_grep = shutil.which("grep")
    path = fake_tools(tmp_path, grep=(
        '#!/bin/sh\nif [ -n "${GREP_OPTIONS+set}" ]; then\n'
        '  echo "grep: warning: GREP_OPTIONS is deprecated; please use an alias or script" >&2\n'
        f'  exec {real_grep} $GREP_OPTIONS "$@"\nfi\nexec {real_grep} "$@"\n'),
        docker="#!/bin/sh\nprintf '%s\\n' \"GREP_OPTIONS=$GREP_OPTIONS\"\n")
    env_file = tmp_path / "my.env"
    env_file.write_text("A=1\nCUDA_VISIBLE_DEVICES=1,0\n")
    env = {"PATH": path, "GREP_OPTIONS": "--color=auto"}
    run = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "-e", "HF_TOKEN=x", "tp2", env=env)
    assert run.returncode == 0 and run.stderr == b"", run.stderr
    ran = run_sh(shell, folder, "--env-file", str(env_file), "tp2", env=env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"GREP_OPTIONS=--color=auto\n", b""), ran
    bad = tmp_path / "bad.env"
    bad.write_bytes(b"A=1\nB=caf\xe9\n")
    run = run_sh(shell, folder, "--dry-run", "--env-file", str(bad), "tp2", env={**env, "GREP_OPTIONS": "-v"})
    assert (run.returncode, run.stderr.decode()) == (
        2, f"error: --env-file {bad}: line 2 is not UTF-8, which docker reads (save the file as UTF-8)\n"), run.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_refuses_a_variable_set_empty_a_one_letter_name_and_shows_no_secret_of_a_bad_env_file_line(
        tmp_path, shell):
    # found by probing: MODEL_DRAFT= started the engine without its weights (taken as unset), GPUS=, PORT= and IMAGE=
    # fell back to their defaults; --name a passed run.sh and docker refused it (exit 125); a line "HF_TOKEN hf_..."
    # of an env file was printed whole in the error
    metadata = json.loads(json.dumps(METADATA))
    metadata["launch"]["mounts"] = {"draft": "/models/draft"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    for name in ("GPUS", "PORT", "IMAGE", "MODEL_NAME", "MODEL_DRAFT"):
        run = run_sh(shell, folder, "--dry-run", "tp1", env={name: ""})
        assert (run.returncode, run.stderr.decode()) == (
            2, f"error: {name} is set but empty (an unset variable?): give it a value, or unset it for its default\n")
    run = run_sh(shell, folder, "--dry-run", "tp1", env={"MODEL_DRAFT": "/w/draft", "MODEL_DRAF": "/w/x"})
    assert run.returncode == 0 and run.stderr.decode() == (
        "warning: MODEL_DRAF is set, but no mount of this release is called that (its mounts: MODEL_DRAFT); it is "
        "not used\n"), run.stderr
    metadata["launch"]["mounts"] = {}
    bare, _ = make_release(tmp_path / "bare", metadata=metadata)
    run = run_sh(shell, bare, "--dry-run", "tp1", env={"MODEL_X": "/w/x", "MODEL_NAME": "m"})
    assert run.returncode == 0 and run.stderr.decode() == (
        "warning: MODEL_X is set, but no mount of this release is called that (it has none); it is not used\n"), run
    run = run_sh(shell, folder, "--dry-run", "--name", "a", "tp1")
    assert (run.returncode, run.stderr.decode()) == (
        2, "error: the container name must be at least 2 characters (docker refuses one of 1); got 'a'\n")
    assert run_sh(shell, folder, "--dry-run", "--name", "ab", "tp1").returncode == 0
    env_file = tmp_path / "secrets.env"
    env_file.write_text("A=1\nHF_TOKEN hf_abcdefSECRET\n")
    run = run_sh(shell, folder, "--dry-run", "--env-file", str(env_file), "tp1")
    assert (run.returncode, run.stderr.decode()) == (
        2, f"error: --env-file {env_file}: a line whose name holds a space or a tab (it begins 'HF_TOKEN'), so no "
           "variable name (docker reads NAME=VALUE lines: no export, no space)\n")


def test_the_entrypoint_gives_options_first_on_the_command_line_to_the_engine(busybox_product, tmp_path):
    # found by review: `docker run -e PROFILE=tp1 IMAGE --port 9000`, as inference images take options, ran
    # "--port" as a command: "exec: --port: not found", exit 127, no error line
    from unibake.plan import make_plan
    from unibake.render import render
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   "command: [echo, serving]"))
    entrypoint = tmp_path / "entrypoint.sh"
    entrypoint.write_text(render(make_plan(busybox_product)).entrypoint)
    for args in (["--port", "9000"], ["serve", "--port", "9000"]):
        run = subprocess.run(["sh", str(entrypoint), *args], capture_output=True, text=True, cwd=tmp_path,
                             env={"PROFILE": "tp1", "PATH": "/usr/bin:/bin"})
        assert run.returncode == 0 and run.stdout.split()[0] == "serving" and run.stdout.split()[-2:] == \
            ["--port", "9000"], run
    run = subprocess.run(["sh", str(entrypoint), "echo", "mine"], capture_output=True, text=True, cwd=tmp_path,
                         env={"PROFILE": "tp1", "PATH": "/usr/bin:/bin"})
    assert run.stdout == "mine\n"  # a command of the user's, as before


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_run_sh_runs_no_program_of_the_current_folder_through_an_empty_or_relative_path_entry(folder, tmp_path, shell):
    # found by review: PATH=":$PATH" (PATH=$EXTRA:$PATH with EXTRA unset) and a 'sed' in the folder run.sh was run
    # from: run.sh ran it, as apply.sh (which keeps absolute entries only) did not
    here = tmp_path / "here"
    here.mkdir()
    for tool in ("sed", "awk", "grep", "docker"):
        (here / tool).write_text(f"#!/bin/sh\necho PLANTED-{tool} >&2\nexit 0\n")
        (here / tool).chmod(0o755)
    docker = fake_tools(tmp_path, docker=ECHO_DOCKER).split(":")[0]
    for path in (f":{docker}:/usr/bin:/bin", f".:{docker}:/usr/bin:/bin", f"{docker}:/usr/bin:/bin:"):
        done = subprocess.run([*shell, str(folder / "run.sh"), "--dry-run", "tp1"], capture_output=True, cwd=here,
                              env={"PATH": path})
        assert b"PLANTED" not in done.stdout + done.stderr, (path, done.stderr)
        assert done.returncode == 0 and b"docker run" in done.stdout, (path, done.stdout, done.stderr)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_a_variable_of_the_user_s_named_path_reaches_docker_as_it_was(folder, tmp_path, shell):
    # found by review: the PATH filter used a variable "path" before the environment was saved: a user's exported
    # path went to docker as '' (run.sh's own variables must not replace the user's of one name)
    docker = fake_tools(tmp_path, docker='#!/bin/sh\nprintf "path=%s\\n" "${path-unset}"\n')
    done = subprocess.run([*shell, str(folder / "run.sh"), "-e", "path", "tp1"], capture_output=True,
                          env={"PATH": docker, "path": "/opt/mine"})
    assert done.returncode == 0 and done.stdout == b"path=/opt/mine\n", (done.stdout, done.stderr)
