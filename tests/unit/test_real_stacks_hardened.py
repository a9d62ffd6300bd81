"""Issue 13's inputs (env files, overlays, patches, prebuilt files, smoke regexes) behind issue 12's
gates, and in issue 14's and 15's paths: one platform's prebuilt wheel per platform, and an SBOM that
lists what the real stacks bake (kernels of several libraries, patches, env files)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from unibake.contents import ImageContents, Library
from unibake.errors import InputError
from unibake.metadata import Component
from unibake.plan import make_plan
from unibake.platforms import KNOWN
from unibake.sbom import sbom_document


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


# --- hostile input: one error line, exit 2 (3 for a secret, as for any) ----------------------------


BACKTRACKS, MATCHES_EMPTY = "could backtrack without end", "matches an empty reply, so an engine that answers nothing would pass"


@pytest.mark.parametrize("regex,says", [
    *((r, BACKTRACKS) for r in ("(a+)+$", r"UNIFIED_(\w*)*OK", r"(x+y?)+", r"(TP)\1",
                                # overlapping alternatives: 0.2 s at 20 characters, doubling with each more
                                "UNIFIED_TP1_OK (a|a)*", "UNIFIED_TP1_OK (?:a|aa)*!",
                                # alike for their first three characters, then one a prefix of the other
                                "UNIFIED_TP1_OK (?:tp1|tp1x|tp2)+!", "UNIFIED_TP1_OK (?:ab(?:c|c)d)*!",
                                # bounded, but of optional or alternative parts: 2**30 ways, 37 s on 30 a's
                                "(a?){30}a{30}", "a?" * 30 + "a" * 30, "UNIFIED_TP1_OK (a|aa){30}!",
                                "UNIFIED_TP1_OK (?:a{1,2}){30}!", r"UNIFIED_TP1_OK (?:\w+ ?){3}!")),
    *((r, MATCHES_EMPTY) for r in (".*", "(?s).*", "x?", "(UNIFIED_TP1_OK)?")),  # an empty reply is refused too
])
def test_a_smoke_regex_that_could_backtrack_without_end_or_matches_an_empty_reply_is_refused(cli, busybox_product,
                                                                                            regex, says):
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}",
                                           f"smoke: {{expect_reply: '{regex}', match: regex}}"))
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert "tp1.yaml" in result.error_lines[0] and says in result.error_lines[0]
    assert "Traceback" not in result.err


@pytest.mark.parametrize("regex", [r"UNIFIED_TP1_OK (?:\d{1,3}\.){3}[0-9.]+ .*",
                                   # what people write: the example profiles' own, an address, a version, a score
                                   r"UNIFIED_TP2_OK .* score=[0-9.]+",
                                   r"UNIFIED_TP2_OK model=demo-llm tp=2 kernels=\[flash_attn@260602 .*\] "
                                   r"tune_caches=7 score=[0-9.]+",
                                   "SGLANG_ROCE_OK profile=tp16 .* transport=roce adapter=87",
                                   r"^UNIFIED_TP1_OK (?:\d+\.){3}\d+$", r"UNIFIED_TP1_OK v[0-9]+(?:\.[0-9]+)*",
                                   r"UNIFIED_TP1_OK (sk|pk)-[a-z0-9]+", r"(?i)unified_tp1_ok\s*", "UNIFIED_TP1_OK a?b?c?",
                                   r"UNIFIED_TP1_OK [0-9a-f]{64}", r"UNIFIED_TP1_OK (?:[0-9a-f]{2}:){5}[0-9a-f]{2}",
                                   # alternatives that start alike but differ further on (before: refused, "an
                                   # alternation inside a repeated group")
                                   "UNIFIED_TP1_OK (?:tp1|tp2|tp4)+", "UNIFIED_TP1_OK (?:ready|reply|idle)(?:, (?:ready|reply))*"])
def test_a_smoke_regex_without_nesting_is_accepted(busybox_product, regex):
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}",
                                           f"smoke: {{expect_reply: '{regex}', match: regex}}"))
    assert make_plan(busybox_product, verify_lock=False).profile("tp1").smoke.prompts[0].match == "regex"


def test_a_secret_in_an_env_file_is_refused_naming_the_file_and_line(cli, busybox_product):
    (busybox_product.parent / "images/stack.env").write_text("NCCL_IB_GID_INDEX=3\nHF_TOKEN=hunter22\n")
    append(busybox_product / "tp1.yaml", "env_file: images/stack.env\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 3 and len(result.error_lines) == 1, result.err
    assert "images/stack.env:2: env.HF_TOKEN: secret in the environment" in result.error_lines[0]
    assert "hunter22" not in result.err


def test_a_private_address_in_an_env_file_is_refused(cli, busybox_product):
    (busybox_product.parent / "images/stack.env").write_text("MASTER_HINT=192.168.7.20\n")
    append(busybox_product / "product.yaml", "env_file: images/stack.env\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 3 and "images/stack.env:1: env.MASTER_HINT: private network address" in result.err


@pytest.mark.parametrize("key,yaml", [
    ("env_file", "env_file: ../../etc/passwd\n"),
    ("overlays", "overlays:\n  - {source: ../outside, target: pkg/x}\n"),
    ("patches", "patches:\n  - {file: ../outside.patch}\n"),
])
def test_a_path_out_of_the_product_folder_is_refused(cli, busybox_product, key, yaml):
    (busybox_product.parent.parent / "outside").mkdir(exist_ok=True)
    (busybox_product.parent.parent / "outside.patch").write_text("")
    append(busybox_product / "product.yaml", yaml)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert "product.yaml:" in result.error_lines[0] and key in result.error_lines[0], result.error_lines


@pytest.mark.parametrize("key,yaml", [
    ("env_file", "env_file: images/linked.env\n"),
    ("overlay", "overlays:\n  - {source: images/linked.env, target: pkg/x.env}\n"),
])
def test_a_symlink_out_of_the_project_is_refused(cli, busybox_product, tmp_path_factory, key, yaml):
    outside = tmp_path_factory.mktemp("elsewhere") / "secret.env"
    outside.write_text("A=1\n")
    os.symlink(outside, busybox_product.parent / "images/linked.env")
    append(busybox_product / "product.yaml", yaml)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert "resolves outside the project" in result.error_lines[0] and "symlinks must point inside it" in \
        result.error_lines[0]


# --- arm64: a prebuilt kernel names each platform's file --------------------------------------------


def test_each_platform_takes_its_own_prebuilt_wheel_and_the_lock_pins_both(cli, demo_product):
    plans = {name: make_plan(demo_product, platform=p) for name, p in KNOWN.items()}
    wheel = {name: next(k for k in plan.kernels if k.name == "demo_quant").prebuilt.file.path
             for name, plan in plans.items()}
    assert wheel == {"linux/amd64": "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl",
                     "linux/arm64": "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_aarch64.whl"}
    (demo_product / "inputs.lock").unlink()
    assert cli("lock", "--config", str(demo_product)).code == 0
    locked = (demo_product / "inputs.lock").read_text()
    assert all(path in locked for path in wheel.values())
    for p in KNOWN.values():
        make_plan(demo_product, platform=p)  # both plans pass the one lock


def test_platforms_on_a_kernel_built_here_is_refused(demo_product):
    product = demo_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "  - {name: rmsnorm, version: \"2.1.0\", source: images/kernels/rmsnorm}",
        "  - {name: rmsnorm, version: \"2.1.0\", source: images/kernels/rmsnorm, platforms: {linux/arm64: x.so}}"))
    with pytest.raises(InputError, match=r"product\.yaml:\d+: kernel 'rmsnorm' is built here.*platforms names prebuilt files"):
        make_plan(demo_product, verify_lock=False)


def test_a_prebuilt_kernel_of_platforms_alone_takes_its_file_there_and_names_the_platform_it_lacks(demo_product, cli):
    # a wheel for arm64 only (an amd64 build of the stack does not use the kernel): "needs either source: or
    # prebuilt:", though platforms named the one file the build needs
    product = demo_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "    prebuilt: images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl\n", ""))
    arm64 = make_plan(demo_product, platform=KNOWN["linux/arm64"], verify_lock=False)
    assert next(k for k in arm64.kernels if k.name == "demo_quant").prebuilt.file.path == \
        "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_aarch64.whl"
    with pytest.raises(InputError) as refused:
        make_plan(demo_product, platform=KNOWN["linux/amd64"], verify_lock=False)
    assert re.search(r"product\.yaml:\d+: kernel 'demo_quant' has no file for linux/amd64: its platforms names "
                     r"linux/arm64 only; add platforms\.linux/amd64, or prebuilt: \(the file of every platform "
                     r"platforms does not name\)$", str(refused.value)), str(refused.value)
    product.write_text(product.read_text().replace("platforms: {linux/arm64: images/prebuilt/demo_quant-1.0.0+cpu-py3-"
                                                   "none-linux_aarch64.whl}", "platforms: {}"))
    with pytest.raises(InputError, match="has no file for linux/amd64: its platforms is empty; add"):
        make_plan(demo_product, platform=KNOWN["linux/amd64"], verify_lock=False)


# --- the SBOM lists what real stacks bake -------------------------------------------------------------


def test_the_sbom_lists_kernels_of_several_libraries_patches_and_env_files():
    root = "/opt/unibake"
    sha = "ab" * 32
    components = (
        Component(kind="kernel", name="lightop", version="0.3.1+das", digest=sha),
        Component(kind="kernel", name="demo_quant", version="1.0.0+cpu", digest=sha),
        Component(kind="patch", name="fix.patch", version="2 files", digest="cd" * 32),
        Component(kind="env_file", name="images/env/tp4.env", version="56 keys", digest="ef" * 32),
        Component(kind="overlay", name="sglang/adapter", version="87 files", digest="01" * 32),
    )
    libs = (Library(path=f"{root}/kernels/lightop/lib/liblightop_gemm.so", sha256="11" * 32, size=1, layer="l"),
            Library(path=f"{root}/kernels/lightop/lib/liblightop_moe.so", sha256="22" * 32, size=1, layer="l"),
            Library(path=f"{root}/kernels/demo_quant/demo_quant/libdemo_quant.so", sha256="33" * 32, size=1,
                    layer="l"))
    contents = ImageContents(packages=(), libraries=libs, os=None, layers=1, not_inspected=())
    doc = json.loads(sbom_document(product="p", release="1", tag="p:1", version="1", image_id="sha256:" + sha,
                                   diff_ids=(), components=components, contents=contents, base=None,
                                   engine_version="", install_root=root, epoch=0))
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    assert by_ref["kernel:demo_quant"]["hashes"][0]["content"] == "33" * 32  # a wheel's one .so is the kernel's
    assert by_ref["kernel:lightop"].get("hashes", []) == []  # several: each listed as a file with its own hash
    for lib in libs[:2]:
        assert by_ref[f"file:{lib.path}"]["hashes"][0]["content"] == lib.sha256
    assert by_ref["patch:fix.patch"]["hashes"][0]["content"] == "cd" * 32
    assert by_ref["env_file:images/env/tp4.env"]["version"] == "56 keys"
    assert by_ref["overlay:sglang/adapter"]["name"] == "overlay-sglang/adapter"


def test_a_prebuilt_archive_is_listed_from_the_bytes_the_plan_hashed(tmp_path):
    # found by review: the archive's sha256 (inputs.lock's, the release's records) was never compared with the bytes
    # its members were listed from: one replaced between the hash and the listing, or taken for unchanged by the
    # file digests' memo, gave the image another archive's files under this one's name
    import hashlib
    import zipfile

    from unibake.errors import InputError
    from unibake.inputs import InputFile
    from unibake.prebuilt import read_prebuilt

    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "print('demo')\n")
    data = wheel.read_bytes()
    hashed = InputFile(path="images/demo-1.0-py3-none-any.whl", absolute=wheel,
                       sha256=hashlib.sha256(data).hexdigest(), size=len(data), mode=0o644)
    assert [m.path for m in read_prebuilt(hashed, "product.yaml: kernels.demo.prebuilt").members] == \
        ["demo/__init__.py"]
    with zipfile.ZipFile(wheel, "w") as zf:  # another wheel in its place since the plan hashed it
        zf.writestr("demo/__init__.py", "import os; os.system('id')\n")
    with pytest.raises(InputError, match=r"^input 'images/demo-1.0-py3-none-any.whl' changed since it was hashed"):
        read_prebuilt(hashed, "product.yaml: kernels.demo.prebuilt")
