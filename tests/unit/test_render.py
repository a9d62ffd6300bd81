"""Rendering: goldens kept in git, layer order, and values that cannot add an instruction."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.platforms import KNOWN
from unibake.render import render, write_context_tar, write_rendered

from ..conftest import BUSYBOX_PRODUCT, REPO

AMD64, ARM64 = KNOWN["linux/amd64"], KNOWN["linux/arm64"]
GOLDEN_SETS = [
    (REPO / "profiles", ["all"], AMD64),
    (REPO / "profiles", ["all"], ARM64),
    (REPO / "profiles", ["tp4"], AMD64),
    (BUSYBOX_PRODUCT / "profiles", ["all"], AMD64),
] + [(p, ["all"], AMD64) for p in sorted((REPO / "examples").glob("*/profiles"))]


def golden_id(case) -> str:
    config, profiles, platform = case
    return f"{config.parent.relative_to(REPO)}:{'-'.join(profiles)}:{platform.architecture}"


@pytest.mark.parametrize("case", GOLDEN_SETS, ids=golden_id)
def test_rendered_files_match_the_goldens_in_git(case):
    """A stale golden fails here: re-render with make render and review the diff."""
    config, profiles, platform = case
    context = render(make_plan(config, profiles=profiles, cwd=REPO, platform=platform))
    folder = config.parent / "dockerfiles" / "rendered" / context.selection
    # the very files a render gives (before: a render giving none passed, and so did a golden left over
    # from a file no longer rendered, which make render does not remove)
    kept = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())
    assert kept == sorted(context.rendered), f"{folder.relative_to(REPO)} holds {kept}, a render gives " \
                                             f"{sorted(context.rendered)}: run make render, remove what it does not write"
    for name, text in context.rendered.items():
        golden = folder / name
        assert golden.exists(), f"{golden} is missing: run make render"
        assert golden.read_text() == text, f"{golden.relative_to(REPO)} is stale: run make render and review the diff"


def test_a_changed_profile_makes_the_golden_stale(busybox_product):
    before = render(make_plan(busybox_product))
    write_rendered(before, busybox_product.parent)
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace("NCCL_ALGO: Ring", "NCCL_ALGO: CollNet"))
    after = render(make_plan(busybox_product))
    golden = busybox_product.parent / "dockerfiles/rendered/all/entrypoint.sh"
    assert golden.read_text() != after.entrypoint
    assert "CollNet" in after.entrypoint and "CollNet" not in golden.read_text()


def test_rendering_does_not_depend_on_the_working_directory(busybox_product, tmp_path):
    a = render(make_plan(busybox_product, cwd=busybox_product.parent))
    b = render(make_plan(busybox_product, cwd=tmp_path))
    assert a.rendered == b.rendered


def runtime_instructions(dockerfile: str) -> list[str]:
    stage = dockerfile.split("\nFROM ")[-1]
    joined = re.sub(r"\\\n", " ", stage)
    return [line.strip() for line in joined.splitlines()[1:] if line.strip() and not line.startswith("#")]


def test_layers_go_from_least_to_most_often_changed():
    dockerfile = render(make_plan(REPO / "profiles", cwd=REPO)).dockerfile
    order = [
        "COPY ctx/engine/", "COPY --from=kernels /out/kernels/", "COPY --from=kernels /out/profiles/",
        "ENTRYPOINT", "CMD ", "COPY ctx/overlays/", "ENV ", "COPY --from=kernels /out/kernels.sha256",
        "COPY ctx/upper/ /opt/unibake/", "RUN ", "ARG ", "LABEL ",
    ]
    lines = runtime_instructions(dockerfile)
    positions = [next(i for i, line in enumerate(lines) if line.startswith(prefix)) for prefix in order]
    assert positions == sorted(positions), lines


def test_only_the_profiles_sidecar_replaces_the_shared_kernel():
    entrypoint = render(make_plan(REPO / "profiles", cwd=REPO)).entrypoint
    tp2 = entrypoint.split("  tp2)")[1].split(";;")[0]
    tp4 = entrypoint.split("  tp4)")[1].split(";;")[0]
    assert "/opt/unibake/profiles/tp2/kernels/flash_attn/libflash_attn.so" in tp2
    assert "/opt/unibake/kernels/flash_attn/libflash_attn.so" not in tp2
    assert "/opt/unibake/kernels/flash_attn/libflash_attn.so" in tp4
    assert "profiles/tp2" not in tp4


HOSTILE = 'a"b $HOME `id` \\c \'d\' ${X:-y} RUN rm -rf /'


def add_env(profiles: Path, file: str, value: str) -> None:
    path = profiles / file
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    path.write_text(path.read_text().replace("env: {", f'env: {{HOSTILE: "{escaped}", ', 1))


def test_a_hostile_shared_env_value_stays_one_escaped_dockerfile_word(busybox_product):
    add_env(busybox_product, "product.yaml", HOSTILE)
    dockerfile = render(make_plan(busybox_product)).dockerfile
    line = next(line for line in dockerfile.splitlines() if "HOSTILE=" in line)
    assert line.strip() == r'''HOSTILE="a\"b \$HOME `id` \\c 'd' \${X:-y} RUN rm -rf /"''' + " \\"
    assert sum(1 for line in dockerfile.splitlines() if line.startswith("RUN ")) == 1


def test_a_hostile_profile_env_value_reaches_the_engine_unchanged(busybox_product, tmp_path):
    add_env(busybox_product, "tp2.yaml", HOSTILE)
    entrypoint = tmp_path / "entrypoint.sh"
    entrypoint.write_text(render(make_plan(busybox_product, verify_lock=False)).entrypoint)
    out = subprocess.run(["sh", str(entrypoint), "printenv", "HOSTILE"], capture_output=True, text=True,
                         env={"PROFILE": "tp2", "PATH": "/usr/bin:/bin", "HOME": "/root"}, check=True).stdout
    assert out == HOSTILE + "\n"
    overridden = subprocess.run(["sh", str(entrypoint), "printenv", "HOSTILE"], capture_output=True, text=True,
                                env={"PROFILE": "tp2", "PATH": "/usr/bin:/bin", "HOSTILE": "mine"},
                                check=True).stdout
    assert overridden == "mine\n"  # docker run -e wins over the profile's default


def test_no_env_value_turns_the_builds_ledger_check_off(busybox_product, tmp_path):
    # the checks' RUN gave the first profile ${skip:-}: product.yaml's env (or the base image's ENV)
    # "skip: --skip-ledgers" made every profile skip the file ledgers, and a patched-away engine file passed
    path = busybox_product / "product.yaml"
    path.write_text(path.read_text().replace("env: {", 'env: {skip: "--skip-ledgers", ', 1))
    dockerfile = render(make_plan(busybox_product, verify_lock=False)).dockerfile
    checks = next(line for line in dockerfile.splitlines() if "self-check" in line and line.startswith("RUN "))
    assert 'skip: "--skip-ledgers"' in path.read_text() and "skip=" in dockerfile.split(checks)[0]
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta/entrypoint.sh").write_text('#!/bin/sh\necho "$PROFILE: $*"\n')
    (tmp_path / "meta/entrypoint.sh").chmod(0o755)
    out = subprocess.run(["sh", "-c", checks[len("RUN "):].replace("/opt/unibake", str(tmp_path))],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "skip": "--skip-ledgers"},
                         check=True).stdout
    assert out == "tp1: self-check\ntp2: self-check --skip-ledgers\n"


def test_a_hostile_label_value_is_escaped(busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "labels: {com.example.note: 'x\" \\\\ $PATH'}\n")
    dockerfile = render(make_plan(busybox_product)).dockerfile
    assert r'com.example.note="x\" \\\\ \$PATH"' in dockerfile


def test_the_entrypoint_refuses_an_unknown_profile_naming_the_known_ones(busybox_product, tmp_path):
    entrypoint = tmp_path / "entrypoint.sh"
    entrypoint.write_text(render(make_plan(busybox_product)).entrypoint)
    result = subprocess.run(["sh", str(entrypoint), "true"], capture_output=True, text=True,
                            env={"PROFILE": "tp3; rm -rf /", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert result.stderr == "error: unknown PROFILE 'tp3; rm -rf /'; known profiles: tp1, tp2\n"
    # found by probing: PROFILE set but empty (docker run -e PROFILE=$P, $P empty) started the default layout
    empty = subprocess.run(["sh", str(entrypoint), "true"], capture_output=True, text=True,
                           env={"PROFILE": "", "PATH": "/usr/bin:/bin"})
    assert (empty.returncode, empty.stderr) == (2, "error: unknown PROFILE ''; known profiles: tp1, tp2\n")
    unset = subprocess.run(["sh", str(entrypoint), "sh", "-c", "echo $PROFILE"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert (unset.returncode, unset.stdout) == (0, "tp1\n"), unset.stderr  # unset: the default


@pytest.mark.parametrize("where,text,message", [
    ("product.yaml", "labels: {io.unibake.tag: mine}\n", r"label 'io\.unibake\.tag' is set by unibake"),
    ("product.yaml", "labels: {org.opencontainers.image.version: '9'}\n", r"is set by unibake"),
    ("product.yaml", "labels: {org.opencontainers.image.created: '2020'}\n", r"is set by unibake"),
    ("tp2.yaml", "env: {PORT: '1'}\n", r"env key 'PORT' is set by the image itself"),
    ("tp2.yaml", "env: {UNIBAKE_KERNELS: x}\n", r"env key 'UNIBAKE_KERNELS' is set by the image itself"),
])
def test_keys_the_image_sets_itself_cannot_be_taken_over(busybox_product, where, text, message):
    path = busybox_product / where
    content = path.read_text()
    if where == "tp2.yaml":
        content = content.replace("env: {NCCL_ALGO: Ring}\n", "")
    path.write_text(content + text)
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


def test_an_oci_label_unibake_does_not_set_is_the_products_to_give(busybox_product, cli):
    # org.opencontainers.image.source (which links a registry's package to its repository), .licenses, .vendor were
    # refused as "set by unibake", which sets only title, version, revision and created
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "labels: {org.opencontainers.image.source: 'https://git.example/acme', "
                                             "org.opencontainers.image.licenses: Apache-2.0}\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    dockerfile = (busybox_product.parent / "dockerfiles/rendered/all/Dockerfile").read_text()
    assert 'org.opencontainers.image.source="https://git.example/acme"' in dockerfile
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile
    assert dockerfile.count("org.opencontainers.image.title=") == 1  # still the product's name, once


def context_tar(context, mtime=1700000000) -> bytes:
    buf = io.BytesIO()
    write_context_tar(context, buf, mtime=mtime)
    return buf.getvalue()


def test_the_build_context_tar_is_reproducible_and_root_owned(busybox_product):
    context = render(make_plan(busybox_product))
    first, second = context_tar(context), context_tar(context)
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
        assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
        assert {m.mtime for m in members} == {1700000000}
        names = [m.name for m in members]
        assert "Dockerfile" in names and "ctx/engine/serve.sh" in names
        assert tar.getmember("ctx/engine/serve.sh").mode == 0o755
        assert tar.getmember("ctx/upper/profiles/tp2/tune/cache-1.json").mode == 0o644


def test_an_input_edited_after_planning_is_caught_while_tarring(busybox_product):
    context = render(make_plan(busybox_product))
    (busybox_product.parent / "images/tune/tp1/cache-1.json").write_text('{"tp1_cache": 9}\n')
    with pytest.raises(InputError, match=r"cache-1\.json: changed while the build context was written"):
        context_tar(context)


def test_the_image_manifest_lists_every_baked_file_with_its_digest(busybox_product):
    context = render(make_plan(busybox_product))
    manifest = next(f.data for f in context.files if f.name == "ctx/upper/meta/files.sha256").decode()
    paths = [line.split("  ", 1)[1] for line in manifest.splitlines()]
    assert paths == sorted(paths)
    assert {"engine/serve.sh", "engine/handle.sh", "profiles/tp1/tune/cache-1.json",
            "profiles/tp2/tune/cache-3.json", "meta/entrypoint.sh", "meta/self-check.sh"} <= set(paths)
    # every file the context bakes (under the install root: ctx/, its upper part ctx/upper/), with its sha256, and
    # no other (the list itself and the Dockerfile are not baked files)
    listed = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in manifest.splitlines()}
    baked = {re.sub(r"^ctx/(upper/)?", "", f.name): f.sha256 for f in context.files
             if f.name not in ("Dockerfile", "ctx/upper/meta/files.sha256")}
    assert listed == baked
    for f in context.files:  # each digest the very bytes'
        if f.data is not None and f.name != "Dockerfile" and f.name != "ctx/upper/meta/files.sha256":
            assert hashlib.sha256(f.data).hexdigest() == listed[re.sub(r"^ctx/(upper/)?", "", f.name)]


def test_engine_words_expand_only_braced_variables_at_start(busybox_product, tmp_path):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
        "command: [echo, '--port=${PORT}', '${MODEL_NAME}', 'lit$HOME', '`id`', '${WEIGHTS}x']"))
    entrypoint = tmp_path / "entrypoint.sh"
    entrypoint.write_text(render(make_plan(busybox_product)).entrypoint)
    env = {"PROFILE": "tp1", "PATH": "/usr/bin:/bin", "PORT": "8080", "MODEL_NAME": "m 1", "HOME": "/root"}
    run = subprocess.run(["sh", str(entrypoint), "serve", "extra arg"], capture_output=True, text=True,
                         env={**env, "WEIGHTS": "/w"})
    assert run.stdout == "--port=8080 m 1 lit$HOME `id` /wx extra arg\n"
    unset = subprocess.run(["sh", str(entrypoint)], capture_output=True, text=True, env=env)
    assert unset.returncode != 0 and "WEIGHTS" in unset.stderr  # an unset variable stops the start


def test_engine_words_a_shell_would_expand_and_the_entrypoint_does_not_are_warned_at_the_plan(busybox_product, cli):
    # a command copied from a shell script ('--port', '$PORT', '${TP:-1}') reached the engine as written,
    # silently: only ${NAME} is expanded at start
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
        "command: [echo, '--port=${PORT}', 'lit$HOME', '${TP:-1}', 'cost$', '$$']"))
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text() + "args: ['$(id)', x]\n")
    assert make_plan(busybox_product).warnings == tuple(
        f"{what}: {word!r} is passed as it is written but for its ${{NAME}} parts: only ${{NAME}} is expanded when "
        "the container starts (not $NAME, ${NAME:-default} or $(...))"
        for what, word in (("engine.command", "lit$HOME"), ("engine.command", "${TP:-1}"),
                           ("args of tp1, tp2", "$(id)")))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0 and "warning: engine.command: '${TP:-1}' is passed as it is written" in result.err


@pytest.mark.parametrize("command, args, where", [
    ("[/bin/sh, /opt/unibake/engine/serve.sh, --port, '8000']", "", "product.yaml:10"),
    ("[/bin/sh, /opt/unibake/engine/serve.sh, --port, '${PORT}']", "args: [--tp, '1', --port=8000]\n", "tp1.yaml:6"),
])
def test_a_port_written_as_another_number_than_launch_port_is_refused_at_the_plan(busybox_product, cli, command,
                                                                                   args, where):
    # the engine served on 8000 while the image's PORT, the smoke gate and run.sh used launch.port 30000: the gate
    # waited out its timeout, after the build and the round trip
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   f"command: {command}"))
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text() + args)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1 and result.error_lines[0].endswith(
        f"/profiles/{where}: --port 8000 of profile 'tp1' is not launch.port 30000, where the image's PORT, the "
        "smoke gate and run.sh expect the engine: write --port ${PORT} (expanded when the container starts), or set "
        "launch.port"), result.err


def test_a_port_written_as_launch_port_s_number_is_warned_and_a_later_port_variable_wins(busybox_product):
    # --port 30000 served, but run.sh's PORT=9000 published 9000 with the engine still on 30000, without a word
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   "command: [/bin/sh, /opt/unibake/engine/serve.sh, --port, '30000']"))
    assert make_plan(busybox_product).warnings == (
        "engine.command: --port 30000 is written as a number, so a PORT given at run time (run.sh's PORT, docker run "
        "-e PORT=...) would not move the engine: write --port ${PORT}",)
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text() + "args: ['--port=${PORT}']\n")  # the last --port is the one a parser keeps
    assert make_plan(busybox_product).warnings == ()  # (tp2 extends tp1, its args too)
    (busybox_product / "tp2.yaml").write_text((busybox_product / "tp2.yaml").read_text() + "args: [--tp, '2']\n")
    assert make_plan(busybox_product).warnings == (
        "engine.command: --port 30000 is written as a number, so a PORT given at run time (run.sh's PORT, docker run "
        "-e PORT=...) would not move the engine: write --port ${PORT}",)


def test_a_served_model_name_written_out_that_is_not_launch_model_name_is_warned_at_the_plan(busybox_product):
    # vLLM served 'qwen' while the smoke gate asked for launch.model_name 'tiny': a 404, after the build and the
    # model's load, without a word at the plan
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   "command: [/bin/sh, /opt/unibake/engine/serve.sh, "
                                                   "--served-model-name, qwen, --tp, '1']"))
    warning = ("engine.command: --served-model-name qwen does not name launch.model_name 'tiny', the model the smoke "
               "gate and clients ask for (MODEL_NAME): an engine that checks it answers 404; write "
               "--served-model-name ${MODEL_NAME}, or set launch.model_name")
    assert make_plan(busybox_product).warnings == (warning,)
    tp1 = busybox_product / "tp1.yaml"
    for args, said in (("[--served-model-name=tiny]", ()), ("[--served-model-name, qwen, tiny]", ()),
                       ("['--served-model-name=${MODEL_NAME}']", ()),
                       ("[--served-model-name, q2]", (warning.replace("engine.command", "args of tp1, tp2")
                                                      .replace("name qwen", "name q2"),))):
        tp1.write_text(tp1.read_text().split("args:")[0] + f"args: {args}\n")  # (tp2 extends tp1)
        assert make_plan(busybox_product).warnings == said, args


def test_private_ipc_without_shm_size_on_several_gpus_is_warned_at_the_plan(busybox_product):
    # docker's 64 MiB /dev/shm, which NCCL and the engine's workers outgrow: said first on the GPU machine
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text() + "topology: {ipc: private}\n")
    assert make_plan(busybox_product, cwd=busybox_product.parent).warnings == (
        "profiles/tp2.yaml: profile tp2 runs 2 GPUs with ipc: private and no shm_size, so "
        "its /dev/shm is docker's 64 MiB, which NCCL/RCCL and the engine's worker processes outgrow: set "
        "topology.shm_size (like 16g), or ipc: host",)
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text() + "topology: {ipc: shareable}\n")  # one GPU: nothing to share between ranks
    tp2.write_text(tp2.read_text().replace("topology: {ipc: private}", "topology: {shm_size: 16g}"))
    assert make_plan(busybox_product).warnings == ()


def test_a_braced_variable_no_one_sets_is_warned_at_the_plan(busybox_product, cli, tmp_path):
    # ${HF_TOKEN} in the command passed the plan and the build and stopped the engine's start (set -u) only
    # at the smoke gate; what the image, the entrypoint or the profile's env sets is not warned
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
        "command: [echo, '${PORT}', '${MODEL_NAME}', '${UNIBAKE_MOUNT_TARGET}', '${SHARED_SETTING}', '${PROFILE}', "
        "'${UNIBAKE_TUNE_DIR}', '${NCCL_ALGO}', '${HOME}', '--token=${HF_TOKEN}']"))
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text() + "args: ['${RANK_X}']\n")
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace("env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring, RANK_X: '1'}") +
                   "topology: {nodes: 2}\nargs: ['${RANK_X}', '${NODE_RANK}', '${MASTER_ADDR}']\n")
    hint = ("unless the base image sets it, it must be given at run time (docker run -e {0}=...), or the engine does "
            "not start")
    assert make_plan(busybox_product).warnings == (
        "engine.command: ${HF_TOKEN} is set neither by unibake nor by the env of profile tp1, tp2: " +
        hint.format("HF_TOKEN"),
        "args: ${RANK_X} is set neither by unibake nor by the env of profile tp1: " + hint.format("RANK_X"))
    entrypoint = tmp_path / "entrypoint.sh"  # what is not warned is set at start indeed
    entrypoint.write_text(render(make_plan(busybox_product)).entrypoint)
    run = subprocess.run(["sh", str(entrypoint)], capture_output=True, text=True,
                         env={"PROFILE": "tp2", "PATH": "/usr/bin:/bin", "HF_TOKEN": "t", "UNIBAKE_MOUNT_TARGET": "/m",
                              "PORT": "1", "MODEL_NAME": "m", "SHARED_SETTING": "on", "HOME": "/root"})
    assert run.returncode == 0 and run.stdout.split()[4:] == ["tp2", "/opt/unibake/profiles/tp2/tune", "Ring",
                                                             "/root", "--token=t", "1", "0", "127.0.0.1"], run
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0 and "warning: engine.command: ${HF_TOKEN} is set neither by unibake" in result.err


def test_a_braced_variable_the_base_image_sets_is_not_warned_by_a_build(busybox_product, tmp_path):
    # the plan warned of ${HF_HOME} although the base image's ENV sets it: a build reads the base's ENV from
    # the engine and warns only of what nothing sets; a run that does not build keeps "unless the base sets it"
    from unibake.errors import EngineError
    from unibake.pipeline import BUILD, Request, run_stages, selection
    from unibake.targets import run_platforms

    from ..fake_engine import FakeEngine
    from .test_pipeline import Quiet

    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
        "command: [/bin/sh, /opt/unibake/engine/serve.sh, '--cache=${HF_HOME}', '--token=${HF_TOKEN}']"))
    fake = FakeEngine()
    fake.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin", "HF_HOME=/cache"]}},
             [b"x" * 1024], tag="localhost/unibake-busybox:1")
    request = Request(env={}, cwd=tmp_path, config=busybox_product, out=tmp_path / "release", version="0.2.0")
    for run in (lambda reporter: run_stages(selection(BUILD), request, reporter, connect=lambda address: fake),
                lambda reporter: run_platforms(selection(BUILD), request, (KNOWN["linux/amd64"],), reporter,
                                               connect=lambda address: fake)):
        reporter = Quiet()
        with pytest.raises(EngineError, match="the fake engine does not build"):
            run(reporter)
        said = reporter.stream.getvalue()
        assert "HF_HOME" not in said, said
        assert said.count("${HF_TOKEN}") == 1 and ("engine.command: ${HF_TOKEN} is set neither by unibake, nor by "
                                                   "the env of profile tp1, tp2, nor by the base image "
                                                   "localhost/unibake-busybox:1: it must be given at run time "
                                                   "(docker run -e HF_TOKEN=...)") in " ".join(said.split()), said
    reporter = Quiet()
    run_stages(selection(BUILD, "render"), request, reporter)
    said = " ".join(reporter.stream.getvalue().split())
    assert "${HF_HOME} is set neither by unibake nor by the env of profile tp1, tp2: unless the base image sets it" \
        in said, said


def elf_header(e_type: int, machine: int, elf_class: int = 2) -> bytes:
    """The first 64 bytes of an ELF file: class, little-endian, version 1, its type and machine."""
    return (b"\x7fELF" + bytes([elf_class, 1, 1]) + bytes(9) + e_type.to_bytes(2, "little")
            + machine.to_bytes(2, "little") + bytes(44))


@pytest.mark.parametrize("platform", [AMD64, ARM64], ids=lambda p: p.architecture)
def test_a_base_without_python_checks_each_kernels_elf_header_instead_of_refusing(busybox_product, tmp_path,
                                                                                   platform):
    """A busybox or distroless base has no python3 to load kernels with: the self-check reads each kernel's ELF
    header (a shared object of the image's platform) instead of failing every build with 'python3 is not in
    the image' (an adopter's busybox product with native kernels could never be released)."""
    (busybox_product.parent / "images/kernels/fastmix").mkdir(parents=True)
    (busybox_product.parent / "images/kernels/fastmix/build.sh").write_text("true\n")
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "kernels:\n  - {name: fastmix, version: '1.2.0', "
                       "source: images/kernels/fastmix, build: {image: 'localhost/unibake-busybox:1', run: 'sh build.sh'}}\n")
    context = render(make_plan(busybox_product, verify_lock=False, platform=platform))
    root = tmp_path / "root"
    (root / "kernels").mkdir(parents=True)
    script = root / "self-check.sh"
    script.write_text(context.self_check.replace("/opt/unibake", str(root)))
    bin_dir = tmp_path / "bin"  # the image's tools, and no python3
    bin_dir.mkdir()
    for tool in ("sh", "od", "tr", "uname", "head", "grep", "cat"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    (bin_dir / "uname").unlink()
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {platform.machine}\n")  # the image's own machine
    (bin_dir / "uname").chmod(0o755)
    kernels = {
        "good.so": elf_header(3, platform.elf_machine),
        "script.so": b"#!/bin/sh\n# a .so-like file a shell script wrote\n" + bytes(40),
        "other-arch.so": elf_header(3, 183 if platform.elf_machine == 62 else 62),
        "executable.so": elf_header(2, platform.elf_machine),
        "32-bit.so": elf_header(3, platform.elf_machine, elf_class=1),
        "short.so": b"\x7fELF\x02\x01",
    }
    for name, data in kernels.items():
        (root / "kernels" / name).write_bytes(data)

    def self_check(*names: str) -> subprocess.CompletedProcess:
        env = {"PATH": str(bin_dir), "UNIBAKE_KERNELS": ":".join(str(root / "kernels" / n) for n in names)}
        return subprocess.run([str(bin_dir / "sh"), str(script), "tp1", "--skip-ledgers"], capture_output=True,
                              text=True, env=env)

    good = self_check("good.so", "good.so")
    assert good.returncode == 0, good.stderr
    assert (f"self-check[tp1]: ok: 2 kernels are {platform.name} shared objects (their ELF headers; python3 is "
            "not in the image to load them)") in good.stdout
    assert "python3 is not in the image;" not in good.stderr
    for name in kernels:
        if name == "good.so":
            continue
        bad = self_check("good.so", name)
        assert bad.returncode == 1, (name, bad.stdout)
        assert bad.stderr == (f"error: self-check[tp1]: kernel {root}/kernels/{name} is not a {platform.name} "
                              "shared object (its ELF header, read with od; python3 is not in the image to load "
                              "it)\n"), name


def test_an_executable_engine_file_may_start_the_engine_itself(busybox_product):
    """engine.command[0] naming an engine file by its path in the image: the plan takes it when the file is baked
    executable (a script missing its bit, or a misspelt name, is refused: test_bad_input)."""
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   "command: [/opt/unibake/engine/./serve.sh, '${PORT}']"))
    plan = make_plan(busybox_product)
    assert plan.engine.command[0] == "/opt/unibake/engine/./serve.sh"
    assert "exec /opt/unibake/engine/./serve.sh" in render(plan).entrypoint


@pytest.mark.parametrize("command,words", [
    ("[serve.sh]", ["serve.sh"]),
    ("[./serve.sh, --port, '${PORT}']", ["./serve.sh"]),
    ("[/bin/sh, serve.sh, ./handle.sh]", ["serve.sh", "./handle.sh"]),
    ("[/bin/sh, /opt/unibake/engine/serve.sh]", []),
    ("[sh, -c, 'exec serve.sh']", []),
])
def test_an_engine_file_named_relative_to_the_engine_folder_is_warned_at_the_plan(busybox_product, cli, command,
                                                                                   words):
    """The engine starts in the base image's working directory (a bare name looked up on its PATH), not in
    /opt/unibake/engine: 'serve.sh' was built, exported and round-tripped, then not found at every smoke gate."""
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("command: [/bin/sh, /opt/unibake/engine/serve.sh]",
                                                   f"command: {command}"))
    assert make_plan(busybox_product).warnings == tuple(
        f"engine.command: {word!r} is the engine folder's {word.removeprefix('./')}, but the engine starts in the "
        "base image's working directory (a bare program name is looked up on its PATH), not in /opt/unibake/engine: "
        f"write /opt/unibake/engine/{word.removeprefix('./')}" for word in words)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0
    assert result.err.count("warning: engine.command: ") == len(words)


def _ledger_check(busybox_product: Path, tmp_path: Path, *, python: bool) -> tuple[Path, callable]:
    """The rendered self-check with its install root in ``tmp_path``, run with the image's tools only:
    coreutils' sha256sum (its calls recorded), and python3 when ``python``."""
    context = render(make_plan(busybox_product, verify_lock=False))
    root = tmp_path / "root"
    (root / "meta").mkdir(parents=True)
    script = root / "self-check.sh"
    script.write_text(context.self_check.replace("/opt/unibake", str(root)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "grep", "head", "tr", "uname", "cat"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    if python:
        (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    calls = tmp_path / "sha256sum-calls"
    real = subprocess.run(["sh", "-c", "command -v sha256sum"], capture_output=True, text=True, check=True).stdout.strip()
    (bin_dir / "sha256sum").write_text(f"#!{bin_dir}/sh\necho \"$*\" >> {calls}\nexec {real} \"$@\"\n")
    (bin_dir / "sha256sum").chmod(0o755)

    def run() -> tuple[subprocess.CompletedProcess, list[str]]:
        calls.unlink(missing_ok=True)
        done = subprocess.run([str(bin_dir / "sh"), str(script), "tp1"], capture_output=True, text=True,
                              env={"PATH": str(bin_dir)}, cwd=tmp_path)
        return done, calls.read_text().splitlines() if calls.exists() else []
    return root, run


def _write_ledger(root: Path, files: dict[str, bytes], *, lied: str | None = None) -> None:
    import hashlib

    lines = []
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digest = hashlib.sha256(b"other" if name == lied else data).hexdigest()
        escaped = "\\" in name or "\n" in name
        shown = name.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(("\\" if escaped else "") + f"{digest}  {shown}\n")
    (root / "meta/files.sha256").write_text("".join(lines))


def test_the_file_ledger_is_checked_by_python3_s_hashlib_where_the_image_has_it(busybox_product, tmp_path):
    """coreutils' sha256sum uses no SHA instructions: a 0.43 GB library took 1.7 s of every build's checks and of
    every hotfix's, python3's hashlib (OpenSSL) 0.35 s. Where every file matches, sha256sum is not run at all."""
    root, run = _ledger_check(busybox_product, tmp_path, python=True)
    _write_ledger(root, {"engine/lib/libbig.so": bytes(range(256)) * 4096, "engine/serve.sh": b"#!/bin/sh\n"})
    done, calls = run()
    assert done.returncode == 0, done.stderr
    assert "self-check[tp1]: ok: 2 files match meta/files.sha256" in done.stdout
    assert calls == []


@pytest.mark.parametrize("python", [True, False], ids=["python3", "no-python3"])
def test_a_file_that_differs_from_the_ledger_is_named_by_sha256sum_with_or_without_python3(busybox_product, tmp_path,
                                                                                           python):
    root, run = _ledger_check(busybox_product, tmp_path, python=python)
    _write_ledger(root, {"engine/serve.sh": b"#!/bin/sh\n", "engine/model.py": b"x = 1\n"}, lied="engine/model.py")
    done, calls = run()
    assert done.returncode == 1
    assert done.stderr.startswith("error: self-check[tp1]: files differ from meta/files.sha256: engine/model.py: "
                                  "FAILED ")
    assert done.stderr.endswith("sha256sum: WARNING: 1 computed checksum did NOT match \n")
    assert calls == ["-c meta/files.sha256"]
    (root / "engine/model.py").unlink()  # a file gone: sha256sum's words, not Python's
    done, _ = run()
    assert done.returncode == 1
    assert "sha256sum: engine/model.py: No such file or directory engine/model.py: FAILED open or read " in done.stderr


@pytest.mark.parametrize("ledger", ["escaped", "empty", "stdin"])
def test_a_ledger_that_is_not_plain_lines_gets_sha256sum_s_verdict(busybox_product, tmp_path, ledger):
    """The first look answers only "every file matches", for plain lines: sha256sum's escaped names, an empty
    ledger and the name "-" (sha256sum's standard input) are sha256sum's to judge, as before."""
    root, run = _ledger_check(busybox_product, tmp_path, python=True)
    if ledger == "escaped":
        _write_ledger(root, {"engine/a\\b.py": b"a\n", "engine/serve.sh": b"#!/bin/sh\n"})
    elif ledger == "empty":
        (root / "meta/files.sha256").write_text("")
    else:
        (root / "meta/files.sha256").write_text(f"{'0' * 64}  -\n")
    done, calls = run()
    assert calls == ["-c meta/files.sha256"]
    if ledger == "escaped":
        assert done.returncode == 0, done.stderr
        assert "self-check[tp1]: ok: 2 files match meta/files.sha256" in done.stdout
    else:
        assert done.returncode == 1
        assert "error: self-check[tp1]: files differ from meta/files.sha256: " in done.stderr


def test_a_smoke_prompt_its_own_check_passes_is_warned_at_the_plan(busybox_product):
    # found by review: prompt "Reply with exactly: UNIFIED_TP1_OK" with match contains UNIFIED_TP1_OK: an engine that
    # echoes the prompt (or an error that quotes it) passes the gate, without a word
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace(
        "smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}",
        "smoke: {timeout: 20, prompts: [{prompt: 'Say it.', expect: UNIFIED_TP1_OK},\n"
        "  {prompt: 'Reply with exactly: UNIFIED_TP1_OK', expect: UNIFIED_TP1_OK, match: contains},\n"
        "  {prompt: 'Answer UNIFIED_TP1_OK', expect: 'Answer \\w+', match: regex},\n"
        "  {prompt: ' UNIFIED_TP1_OK', expect: UNIFIED_TP1_OK}]}"))
    warnings = tuple(w.replace(f"{busybox_product}/", "") for w in make_plan(busybox_product).warnings)
    assert warnings == (
        "tp1.yaml: smoke prompt 2: the prompt itself passes its check (match: contains 'UNIFIED_TP1_OK'): an engine "
        "that echoes the prompt, or an error message that quotes it, would pass the gate; use match: exact, or an "
        "expected text the prompt does not hold",
        "tp1.yaml: smoke prompt 3: the prompt itself passes its check (match: regex 'Answer \\\\w+'): an engine that "
        "echoes the prompt, or an error message that quotes it, would pass the gate; use match: exact, or an expected "
        "text the prompt does not hold",
        "tp1.yaml: smoke prompt 4: the prompt itself passes its check (match: exact 'UNIFIED_TP1_OK'): an engine that "
        "echoes the prompt, or an error message that quotes it, would pass the gate; ask for a reply the prompt does "
        "not hold"), warnings
