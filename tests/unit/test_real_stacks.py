"""What real stacks need, on copies of the products: names and versions as upstream spells them, kernels
from any toolchain or prebuilt, folder overlays and their ledgers, patches, env files, devices and
topology in run.sh, release notes that carry attachments and external artifacts, and tags that never move."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from unibake.envfile import fingerprint, parse_env
from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.render import render, write_context_tar

from ..conftest import REPO


def lock(cli, profiles: Path) -> None:
    result = cli("lock", "--config", str(profiles))
    assert result.code == 0, result.err


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


# --- 1. versions and names as packages spell them -------------------------------------------------


def test_versions_and_names_as_upstream_spells_them_are_accepted(demo_product, cli):
    product = demo_product / "product.yaml"
    product.write_text(product.read_text().replace('version: "2.1.0"', 'version: "2.8.3+das.opt1.dtk2604"')
                       .replace("version: 0.5.12", 'version: "1:0.5.12~rc1"'))
    tp2 = demo_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace(
        "sidecars:                    # an older flash_attn build that only TP2 loads\n",
        "sidecars:\n  - {name: tp2_row_LDSx, version: '1.0+das', source: images/kernels/rmsnorm}\n"))
    lock(cli, demo_product)
    context = render(make_plan(demo_product))
    assert "-DUNIBAKE_KERNEL_VERSION='\"2.8.3+das.opt1.dtk2604\"'" in context.dockerfile
    assert "/opt/unibake/profiles/tp2/kernels/tp2_row_LDSx/libtp2_row_LDSx.so" in context.entrypoint
    assert context.metadata.profiles["tp2"].sidecars[0].name == "tp2_row_LDSx"


@pytest.mark.parametrize("text,message", [
    ('version: "1.3.1+local"', "'1.3.1+local': expected letters, digits, '.', '_' and '-'"),
    ("kernels:\n  - {name: 'x y', version: '1', source: images/kernels/rmsnorm}\n", "key 'kernels[0].name'"),
    ("kernels:\n  - {name: x, version: '1;rm', source: images/kernels/rmsnorm}\n", "key 'kernels[0].version'"),
    ("overlays:\n  - {source: images/overlays/sampling.py, target: ../escape.py}\n", "key 'overlays[0].target'"),
])
def test_what_reaches_a_tag_a_path_or_a_shell_is_still_validated(demo_product, text, message):
    product = demo_product / "product.yaml"
    content = product.read_text()
    if text.startswith("version"):
        content = content.replace("version: 1.3.1", text)
    else:
        key = text.split(":", 1)[0]
        end = {"kernels": "overlays:", "overlays": "env:"}  # the key after the block replaced
        content = content[:content.index(f"{key}:")] + text + content[content.index(f"\n{end[key]}") + 1:] \
            if key in end else content + text
    product.write_text(content)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)").replace("+", r"\+")):
        make_plan(demo_product, verify_lock=False)


# --- 2. kernels from any toolchain, or prebuilt ---------------------------------------------------


def wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def elf(machine: str | None = None) -> bytes:
    """The first bytes of a 64-bit little-endian ELF shared library for ``machine`` (uname -m; the host's)."""
    from unibake.platforms import host
    from unibake.prebuilt import ELF_MACHINES

    number = {name: n for n, name in ELF_MACHINES.items()}[machine or host().machine]
    return b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + number.to_bytes(2, "little") + bytes(44)


@pytest.mark.parametrize("data,message", [
    (b"#!/bin/sh\n", r"prebuilt images/x\.so is not an ELF shared library"),
    ("other", r"prebuilt images/x\.so is built for (aarch64, not for x86_64|x86_64, not for aarch64), the platform's "
              "architecture"),
])
def test_a_prebuilt_so_that_is_not_a_library_of_the_platform_is_refused_at_the_plan(busybox_product, data, message):
    from unibake.platforms import host

    if data == "other":
        data = elf("aarch64" if host().machine == "x86_64" else "x86_64")
    (busybox_product.parent / "images/x.so").write_bytes(data)
    append(busybox_product / "product.yaml", "kernels:\n  - {name: x, version: '1', prebuilt: images/x.so}\n")
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: {message}"):
        make_plan(busybox_product, verify_lock=False)
    (busybox_product.parent / "images/x.so").write_bytes(elf())
    assert make_plan(busybox_product, verify_lock=False).kernels[0].outputs == ("x.so",)


def test_a_prebuilt_library_is_scanned_from_its_file_not_read_whole_into_memory(busybox_product, tmp_path):
    # a prebuilt .so (hundreds of MB for a CUDA library) was read whole into memory and scanned in Python at
    # every release, never remembered; it is a file: grep finds the anchors, the memo keeps its findings
    from unibake.render import context_files, render
    from unibake.sanitise import scan_context

    token = "hf_" + "a" * 34
    (busybox_product.parent / "images/x.so").write_bytes(elf() + b"\0" * 100 + f"token = {token}\n".encode())
    append(busybox_product / "product.yaml", "kernels:\n  - {name: x, version: '1', prebuilt: images/x.so}\n")
    context = render(make_plan(busybox_product, verify_lock=False))
    [(where, content, sha256)] = [entry for entry in context_files(context, busybox_product.parent)
                                  if "x.so" in entry[0]]
    assert (where, content) == ("images/x.so", busybox_product.parent / "images/x.so")
    cache = tmp_path / "cache"
    found = scan_context([(where, content, sha256)], (), cache=cache)
    assert [(f.where.split(":")[0], f.value) for f in found] == [("images/x.so", token)]
    assert [m.name for m in cache.iterdir()] == [m.name for m in cache.iterdir() if m.name.endswith(f"{sha256}.json")]
    assert len(list(cache.iterdir())) == 1


def test_a_big_library_in_a_prebuilt_wheel_is_scanned_as_a_stream_remembered_and_hash_checked(busybox_product,
                                                                                               tmp_path):
    # a wheel's 700 MB .so was read whole into memory for the scan, at every release (bytes had no memo); and
    # the bytes scanned were not checked against the plan's hash
    import re

    from unibake.render import context_files, render
    from unibake.sanitise import TEXT_LIMIT, scan_context

    token = "hf_" + "a" * 34
    big = elf() + b"\0" * (TEXT_LIMIT + (1 << 20)) + f"token = {token}\n".encode() + b"\0" * 4096
    path = wheel(busybox_product.parent / "images/x-1.0-py3-none-any.whl", {"x/libx.so": big})
    append(busybox_product / "product.yaml", f"kernels:\n  - {{name: x, version: '1', prebuilt: images/{path.name}}}\n")
    context = render(make_plan(busybox_product, verify_lock=False))
    [(where, content, sha256)] = [entry for entry in context_files(context, busybox_product.parent)
                                  if "libx.so" in entry[0]]
    assert callable(content) and not isinstance(content, bytes)  # opened when scanned, never held whole
    cache = tmp_path / "cache"
    found = scan_context([(where, content, sha256)], (), cache=cache)
    assert [(f.where, f.value) for f in found] == [(f"{where} at byte {len(elf()) + TEXT_LIMIT + (1 << 20) + 8}",
                                                    token)]
    assert len(list(cache.iterdir())) == 1  # remembered by its sha256: the next release does not read it
    wheel(path, {"x/libx.so": big.replace(token.encode(), b"x" * len(token))})  # swapped for a clean one
    with pytest.raises(InputError, match=rf"^{re.escape(where)}: changed after the plan hashed it"):
        scan_context([(where, content, sha256)], ())


def test_a_make_target_and_a_prebuilt_tarball_with_a_link_render_as_they_should(busybox_product, cli, tmp_path):
    root = busybox_product.parent
    (root / "images/k").mkdir(parents=True)
    (root / "images/k/Makefile").write_text("all:\n\tcc -shared -o $(OUT)/liba.so a.c\n")
    (root / "images/k/a.c").write_text("int a(void) { return 1; }\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("lib/libv.so.3", elf() + b"-v3"), ("include/v.h", b"int v(void);\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("lib/libv.so")
        link.type, link.linkname = tarfile.SYMTYPE, "libv.so.3"
        tar.addfile(link)
    (root / "images/v.tar.gz").write_bytes(buf.getvalue())
    append(busybox_product / "product.yaml",
           "builder: {image: 'localhost/unibake-demo-builder:bookworm'}\n"
           "kernels:\n  - {name: alpha, version: '1.0', source: images/k, build: {make: all}, outputs: [liba.so],"
           " cflags: [-O3]}\n  - {name: vendor, version: '3.0+cu12', prebuilt: images/v.tar.gz}\n")
    lock(cli, busybox_product)
    context = render(make_plan(busybox_product))
    assert "make -C /src/kernels/alpha all OUT=\"$out\" CFLAGS=-O3 UNIBAKE_KERNEL_NAME=alpha" in context.dockerfile
    assert "COPY ctx/prebuilt/ /opt/unibake/" in context.dockerfile
    baked = dict(context.baked)
    assert baked["kernels/vendor/lib/libv.so"] == baked["kernels/vendor/lib/libv.so.3"] == \
        hashlib.sha256(elf() + b"-v3").hexdigest()  # the link is baked as a copy of what it names
    assert "/opt/unibake/kernels/vendor/lib/libv.so:" in context.entrypoint + ":"  # both .so are loaded
    out = io.BytesIO()
    write_context_tar(context, out, mtime=0)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        assert tar.extractfile("ctx/prebuilt/kernels/vendor/include/v.h").read() == b"int v(void);\n"


def test_a_make_kernel_without_cflags_keeps_its_makefile_s_own_cflags(busybox_product, cli, tmp_path):
    # `make ... CFLAGS=''` was rendered for a kernel without cflags: a value on make's command line overrides
    # every assignment in the Makefile, so `CFLAGS ?= -O3` and `CFLAGS += -fPIC` were dropped and the kernel was
    # built unoptimised (or, without -fPIC, failed to link as a shared object)
    root = busybox_product.parent
    (root / "images/k").mkdir(parents=True)
    (root / "images/k/Makefile").write_text(
        "CFLAGS ?= -O3\nCFLAGS += -fPIC\nall:\n\tprintf '%s\\n' '$(CFLAGS)' > $(OUT)/libflags.so\n")
    append(busybox_product / "product.yaml",
           "builder: {image: 'localhost/unibake-demo-builder:bookworm'}\n"
           "kernels:\n  - {name: alpha, version: '1.0', source: images/k, build: {make: all}, outputs: [libflags.so]}\n"
           "  - {name: beta, version: '1.0', source: images/k, build: {make: all}, outputs: [libflags.so],"
           " cflags: [-O1]}\n")
    lock(cli, busybox_product)
    dockerfile = render(make_plan(busybox_product)).dockerfile
    for name, flags in (("alpha", "-O3 -fPIC"), ("beta", "-O1")):  # given cflags replace the Makefile's, as documented
        command = next(line for line in dockerfile.splitlines() if f"make -C /src/kernels/{name} " in line)
        command = command.split("if ! ", 1)[1].split(" >/tmp/", 1)[0].replace(f"/src/kernels/{name}", str(root / "images/k"))
        out = tmp_path / name
        out.mkdir()
        subprocess.run(["sh", "-c", command], env={"out": str(out), "PATH": os.environ["PATH"]}, check=True,
                       capture_output=True)
        assert (out / "libflags.so").read_text() == flags + "\n", name


def test_two_kernels_giving_one_library_name_are_warned_once_naming_both(busybox_product, cli):
    # a built kernel and a vendor's prebuilt copy of it under another kernel name both gave libq.so: accepted
    # without a word, though LD_LIBRARY_PATH let the engine's dlopen("libq.so") find only the first
    root = busybox_product.parent
    for name in ("a", "b"):
        (root / f"images/{name}").mkdir(parents=True)
        (root / f"images/{name}/q.c").write_text("int q(void) { return 1; }\n")
    append(busybox_product / "product.yaml",
           "builder: {image: 'localhost/unibake-demo-builder:bookworm'}\n"
           "kernels:\n  - {name: quant, version: '1', source: images/a, outputs: [libq.so]}\n"
           "  - {name: quant_vendor, version: '1', source: images/b, outputs: [lib/libq.so]}\n")
    lock(cli, busybox_product)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    warnings = [line for line in result.err.splitlines() if line.startswith("warning:") and "libq.so" in line]
    assert warnings == ["warning: kernels 'quant' and 'quant_vendor' both give libq.so (profile tp1, tp2): "
                        "LD_LIBRARY_PATH lists quant's folder first, so a library or engine that loads libq.so by "
                        "name gets quant's alone; give each library its own name, or drop one kernel"]


def test_kernels_whose_names_differ_only_in_case_each_have_their_folder_on_the_library_path(busybox_product):
    # found by review: Jinja's unique ignores case by default, so RMSNorm's folder was left off LD_LIBRARY_PATH
    # while UNIBAKE_KERNELS listed its library: an engine that loads it by name failed on the GPU machine
    root = busybox_product.parent
    for name in ("k", "K"):
        (root / f"images/lib{name}.so").write_bytes(elf())
    append(busybox_product / "product.yaml", "kernels:\n  - {name: rmsnorm, version: '1', prebuilt: images/libk.so}\n"
                                             "  - {name: RMSNorm, version: '1', prebuilt: images/libK.so}\n")
    entrypoint = render(make_plan(busybox_product, verify_lock=False)).entrypoint
    dirs = [line for line in entrypoint.splitlines() if "UNIBAKE_KERNEL_DIRS=" in line]
    assert dirs and all("/opt/unibake/kernels/rmsnorm:/opt/unibake/kernels/RMSNorm" in line or
                        "/opt/unibake/kernels/RMSNorm:/opt/unibake/kernels/rmsnorm" in line for line in dirs), dirs

@pytest.mark.parametrize("member,message", [
    ("../evil.so", "would leave the kernel's folder"),
    ("/abs.so", "would leave the kernel's folder"),
    # found by probing: called "would leave the kernel's folder", which it would not
    ("lib/a\nb.so", r"'lib/a\\nb.so' holds a control character or a backslash, which no file name the image bakes"),
    # found by review: passed, and baked into the ledgers, where every other file the image bakes is refused
    ("lib/\u202etxt.so", r"'lib/\\u202etxt.so' holds .*U\+202E.*, a control or invisible format character"),
    ("lib/a\u0085b.so", r"'lib/a\\x85b.so' holds '\\x85', a control or invisible format character"),
])
def test_a_prebuilt_archive_cannot_write_outside_its_folder(busybox_product, member, message):
    root = busybox_product.parent
    wheel(root / "images/x.whl", {member: b"x"})
    append(busybox_product / "product.yaml", "kernels:\n  - {name: x, version: '1', prebuilt: images/x.whl}\n")
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


def test_a_prebuilt_tarball_member_whose_name_is_not_utf8_is_refused_at_the_plan_not_a_traceback_at_render(
        busybox_product):
    # found by review: the plan took it, and the render's ledger (files.sha256) could not write it: a traceback
    root = busybox_product.parent
    with tarfile.open(root / "images/x.tar", "w", encoding="utf-8", errors="surrogateescape") as tar:
        for name in ("k/libk.so", "k/notes-\udcff.txt"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"\x7fELF"))
    append(busybox_product / "product.yaml", "kernels:\n  - {name: x, version: '1', prebuilt: images/x.tar}\n")
    with pytest.raises(InputError, match=r"product\.yaml:\d+: the archive member 'k/notes-\\xff\.txt' is not a UTF-8 "
                                         "name; rename it in the archive"):
        make_plan(busybox_product, verify_lock=False)

@pytest.mark.parametrize("kind", ["whl", "tar"])
def test_a_prebuilt_archive_holding_a_file_and_a_folder_of_one_name_is_refused(busybox_product, kind):
    root = busybox_product.parent
    members = {"k/extra": b"x", "k/extra/inner.txt": b"y", "k/libk.so": b"\x7fELF"}
    if kind == "whl":
        wheel(root / "images/x.whl", members)
    else:
        with tarfile.open(root / "images/x.tar", "w") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    append(busybox_product / "product.yaml", f"kernels:\n  - {{name: x, version: '1', prebuilt: images/x.{kind}}}\n")
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: prebuilt images/x\.{kind} holds both the file 'k/extra' "
                                         "and 'k/extra/inner.txt' inside it"):
        make_plan(busybox_product, verify_lock=False)


def test_an_overlay_file_where_another_overlay_puts_a_folder_is_refused(busybox_product):
    root = busybox_product.parent
    (root / "images/ovA").mkdir()
    (root / "images/ovA/fileA").write_text("x\n")
    (root / "images/ovB/b").mkdir(parents=True)
    (root / "images/ovB/b/c").write_text("y\n")
    append(busybox_product / "product.yaml", "overlays:\n  - {source: images/ovA/fileA, target: a/b}\n"
                                             "  - {source: images/ovB, target: a}\n")
    with pytest.raises(InputError, match=r"overlay 'a' \(\S*product\.yaml:\d+\) puts engine/a/b/c, so engine/a/b "
                                         r"must be a folder, but overlay 'a/b' \(\S*product\.yaml:\d+\) puts a file "
                                         "there"):
        make_plan(busybox_product, verify_lock=False)
    # inside a folder overlay too: a folder where the engine has a file
    (root / "images/ovB/serve.sh").mkdir()
    (root / "images/ovB/serve.sh/x").write_text("z\n")
    (busybox_product / "product.yaml").write_text((busybox_product / "product.yaml").read_text().replace(
        "  - {source: images/ovA/fileA, target: a/b}\n", "").replace("target: a}", "target: .}"))
    with pytest.raises(InputError, match=r"overlay '.' .* puts engine/serve.sh/x, .* but the engine puts a file there"):
        make_plan(busybox_product, verify_lock=False)


def test_a_prebuilt_file_in_a_home_folder_is_refused_at_the_plan_not_after_the_build(busybox_product, cli, tmp_path):
    # its absolute path is a material of the provenance, whose scan failed the release after the build,
    # the export and the gates; the plan says it, naming the key, and sanitise.allow lets it through
    from unibake.errors import VerificationError

    big = tmp_path / "home/alice/artifacts/libbig.so"
    big.parent.mkdir(parents=True)
    big.write_bytes(elf())
    append(busybox_product / "product.yaml", f"kernels:\n  - {{name: big, version: '1.0', prebuilt: {big}}}\n")
    with pytest.raises(VerificationError, match=r"product\.yaml:\d+: kernels\[0\]\.prebuilt: home folder "):
        make_plan(busybox_product, verify_lock=False)
    make_plan(busybox_product, verify_lock=False, allow=("^/home/alice$",))


def test_a_prebuilt_file_in_the_builders_own_home_outside_home_and_root_is_refused_at_the_plan(busybox_product, cli,
                                                                                               tmp_path):
    # HOME=/srv/ci (a CI runner's): the path is no /home/... one, but the provenance's scan knows the
    # builder's home and failed the release after the build; the plan knows it too now
    from unibake.errors import VerificationError
    from unibake.sanitise import builder_identity

    home = tmp_path / "srv" / "ci"
    big = home / "artifacts" / "libbig.so"
    big.parent.mkdir(parents=True)
    big.write_bytes(elf())
    append(busybox_product / "product.yaml", f"kernels:\n  - {{name: big, version: '1.0', prebuilt: {big}}}\n")
    lock(cli, busybox_product)
    make_plan(busybox_product)  # nobody's home as such
    for identity in (builder_identity({"HOME": f"{home}/", "USER": "ci"}, account_home="/root"),
                     builder_identity({"HOME": "/tmp/job-1", "USER": "ci"}, account_home=str(home))):  # the passwd entry's
        with pytest.raises(VerificationError, match=r"product\.yaml:\d+: kernels\[0\]\.prebuilt: the builder's home or "
                                                    r"user name "):
            make_plan(busybox_product, identity=identity)
    result = cli("build", "--config", str(busybox_product), "--version", "0.2.0", "--out", str(tmp_path / "out"),
                 env={"CI": "true", "HOME": str(home)})
    assert result.code == 3 and result.err.count("error:") == 1, result.err  # at the plan: no engine was reached
    assert "kernels[0].prebuilt: the builder's home or user name" in result.err
    assert not (tmp_path / "out").exists()


def test_a_prebuilt_file_outside_the_project_is_locked_by_its_absolute_path(busybox_product, cli, tmp_path):
    big = wheel(tmp_path / "vendor-1.0-py3-none-any.whl",
                {"vendor/libbig.so": elf() + b"big", "vendor/__init__.py": b""})
    append(busybox_product / "product.yaml", f"kernels:\n  - {{name: big, version: '1.0', prebuilt: {big}}}\n")
    lock(cli, busybox_product)
    assert f"  {big}\n" in (busybox_product / "inputs.lock").read_text()
    plan = make_plan(busybox_product)
    assert plan.kernels[0].outputs == ("vendor/libbig.so",) and plan.kernels[0].is_wheel
    assert "UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/big" in render(plan).entrypoint  # a wheel is importable
    wheel(big, {"vendor/libbig.so": elf() + b"changed"})
    with pytest.raises(InputError, match=f"input '{big}' differs from"):
        make_plan(busybox_product)


@pytest.mark.parametrize("kernel,message", [
    ("{name: x, version: '1', source: images/engine, prebuilt: images/engine/serve.sh}", "needs either source:"),
    ("{name: x, version: '1', source: images/engine}", "holds no .c file; kernels in other languages say"),
    ("{name: x, version: '1', source: images/engine, build: {make: all}}", "holds no Makefile"),
    ("{name: x, version: '1', source: images/engine, build: {run: x, make: all}}", "give exactly one"),
    ("{name: x, version: '1', prebuilt: images/engine/serve.sh}", "is not a .so, a tarball"),
    # cc writes one library: the second was 'not built', at the build
    ("{name: x, version: '1', source: images/kernels/x, outputs: [liba.so, libb.so]}",
     r"product.yaml:\d+: kernel 'x' is built by cc into one library, but outputs names 2 \(liba.so, libb.so\); "
     "name one, or build them with build.run or build.make"),
])
def test_a_kernel_that_cannot_be_built_is_refused_at_the_plan(busybox_product, kernel, message):
    (busybox_product.parent / "images/kernels/x").mkdir(parents=True)
    (busybox_product.parent / "images/kernels/x/x.c").write_text("int x(void) { return 1; }\n")
    append(busybox_product / "product.yaml", f"builder: {{image: b}}\nkernels:\n  - {kernel}\n")
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


def test_a_kernel_built_by_cc_into_a_subfolder_of_outputs_is_built_there(busybox_product, tmp_path):
    # cc -o "$out"/lib/libx.so without the folder: "cannot open output file", the build failing on a folder
    (busybox_product.parent / "images/kernels/x").mkdir(parents=True)
    (busybox_product.parent / "images/kernels/x/x.c").write_text("int x(void) { return 1; }\n")
    append(busybox_product / "product.yaml", "builder: {image: b}\nkernels:\n"
           "  - {name: x, version: '1', source: images/kernels/x, outputs: [lib/cpu/libx.so]}\n")
    dockerfile = render(make_plan(busybox_product, verify_lock=False)).dockerfile
    lines = dockerfile[dockerfile.index("RUN set -eu; out=/out/kernels/x;") + 4:].splitlines()
    script = "\n".join(lines[:next(i for i, line in enumerate(lines) if not line.endswith(" \\")) + 1])
    script = script.replace(" \\\n", "\n")
    (tmp_path / "src/kernels").mkdir(parents=True)
    os.symlink(busybox_product.parent / "images/kernels/x", tmp_path / "src/kernels/x")
    script = script.replace("/out/", f"{tmp_path}/out/").replace("/src/", f"{tmp_path}/src/")
    built = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "out/kernels/x/lib/cpu/libx.so").read_bytes()[:4] == b"\x7fELF"


# --- 4. folder overlays, ledgers and patches ------------------------------------------------------


def test_a_folder_overlay_with_dot_files_gets_a_sha256_and_an_md5_ledger(busybox_product, cli):
    adapter = busybox_product.parent / "images/adapter"
    (adapter / "sub").mkdir(parents=True)
    for name in (".version", "a.py", "sub/b.json"):
        (adapter / name).write_text(f"{name}\n")
    append(busybox_product / "product.yaml",
           "overlays:\n  - {source: images/adapter, target: pkg/adapter, md5: true}\n"
           "  - {source: images/adapter/a.py, target: pkg/adapter/a.py, name: hotfix-a}\n")
    lock(cli, busybox_product)
    context = render(make_plan(busybox_product))
    files = {f.name: f for f in context.files}
    md5 = files["ctx/upper/meta/overlays.md5"].data.decode()
    names = (".version", "sub/b.json")  # a.py is the later overlay's now, which keeps no md5
    assert md5 == "".join(f"{hashlib.md5((n + chr(10)).encode()).hexdigest()}  engine/pkg/adapter/{n}\n" for n in names)
    assert "engine/pkg/adapter/.version" in files["ctx/upper/meta/overlays.sha256"].data.decode()
    assert "md5sum -c meta/overlays.md5" in context.self_check
    names = [c.name for c in make_plan(busybox_product).components if c.kind == "overlay"]
    assert names == ["pkg/adapter", "hotfix-a"]  # compared by name in the notes, never by position


PATCH = """\
--- a/serve.sh
+++ b/serve.sh
@@ -1,3 +1,3 @@
 #!/bin/sh
-# A tiny engine for tests: busybox nc serves /health, /v1/models and /v1/chat/completions.
+# A patched engine: busybox nc serves /health, /v1/models and /v1/chat/completions.
 set -eu
--- /dev/null
+++ b/NEW.txt
@@ -0,0 +1 @@
+added by the patch
"""


def test_patches_change_the_engine_files_and_a_failing_hunk_is_named(busybox_product, cli):
    root = busybox_product.parent
    (root / "images/patches").mkdir()
    (root / "images/patches/fix.patch").write_text(PATCH)
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/patches/fix.patch}\n")
    lock(cli, busybox_product)
    context = render(make_plan(busybox_product))
    files = {f.name: f for f in context.files}
    assert files["ctx/engine/serve.sh"].data.startswith(b"#!/bin/sh\n# A patched engine:")
    assert files["ctx/engine/serve.sh"].mode == 0o755
    assert files["ctx/engine/NEW.txt"].data == b"added by the patch\n"
    assert dict(context.baked)["engine/NEW.txt"] == hashlib.sha256(b"added by the patch\n").hexdigest()

    (root / "images/patches/fix.patch").write_text(PATCH.replace("-# A tiny engine", "-# Another engine"))
    assert cli("lock", "--config", str(busybox_product)).code == 2  # the lock is refused alike
    with pytest.raises(InputError, match=r"fix\.patch: hunk #1 \(@@ -1,3 \+1,3 @@\) does not apply to serve\.sh: "
                                         r"line 2 is '# A tiny engine.*', the patch expects '# Another engine"):
        make_plan(busybox_product, verify_lock=False)



def test_hunks_out_of_order_or_overlapping_are_refused_not_applied_at_another_line(busybox_product):
    # found by probing: the second hunk of a patch (for line 1) listed after one for line 6 was moved by the first's
    # added line, and where lines repeat its context matched there: line 2 changed, a line the patch never names
    # (GNU patch: "misordered hunks! output would be garbled")
    from unibake.inputs import read_source
    from unibake.patches import apply_patches, read_patch

    root = busybox_product.parent
    (root / "images/engine/cfg.py").write_text("x = 0\n" * 7)
    (root / "images/patches").mkdir()
    hunks = {"low": "@@ -6,2 +6,3 @@\n x = 0\n x = 0\n+e = 5\n", "top": "@@ -1,2 +1,2 @@\n-x = 0\n+x = 9\n x = 0\n",
             "over": "@@ -2,1 +2,1 @@\n-x = 0\n+x = 8\n"}

    def applied(*order):
        (root / "images/patches/fix.patch").write_text("--- a/cfg.py\n+++ b/cfg.py\n" + "".join(hunks[h] for h in order))
        patch = read_patch(root, {"file": "images/patches/fix.patch"}, lambda path: "product.yaml:12")
        return apply_patches(read_source(root, "images/engine", "product.yaml:9"), (patch,))["cfg.py"].data.decode()

    assert applied("top", "low") == "x = 9\n" + "x = 0\n" * 6 + "e = 5\n"  # in order: where each says
    for order in (("low", "top"), ("top", "over")):
        with pytest.raises(InputError, match=r"^images/patches/fix\.patch: hunk #2 \(@@ -[12],[12] @@\) of cfg\.py "
                                             r"starts inside or above the hunk before it \(which ends at line [27]\): "
                                             r"hunks must be in the file's order and must not overlap"):
            applied(*order)


def test_a_patch_that_deletes_a_file_must_show_all_of_it(busybox_product):
    # found by probing: "+++ /dev/null" with a hunk of 2 of the file's 4 lines deleted all 4, 2 of them unseen by
    # whoever reviewed the patch (GNU patch: "Not deleting file ... as content differs from patch")
    from unibake.inputs import read_source
    from unibake.patches import apply_patches, read_patch

    root = busybox_product.parent
    (root / "images/engine/cfg.py").write_text("x = 0\ny = 1\nz = 2\nw = 3\n")
    (root / "images/patches").mkdir()

    def applied(hunk):
        (root / "images/patches/rm.patch").write_text("--- a/cfg.py\n+++ /dev/null\n" + hunk)
        patch = read_patch(root, {"file": "images/patches/rm.patch"}, lambda path: "product.yaml:12")
        return apply_patches(read_source(root, "images/engine", "product.yaml:9"), (patch,))["cfg.py"].data

    assert applied("@@ -1,4 +0,0 @@\n-x = 0\n-y = 1\n-z = 2\n-w = 3\n") is None
    with pytest.raises(InputError, match=r"^images/patches/rm\.patch: deletes cfg\.py, but its hunks show 2 of its 4 "
                                         r"lines: a deletion must show the whole file$"):
        applied("@@ -1,2 +0,0 @@\n-x = 0\n-y = 1\n")


def test_an_engine_file_edited_between_its_hash_and_its_patch_or_too_big_to_patch_is_refused(busybox_product):
    # the plan hashes the engine folder, then reads the file a patch changes again: an edit in between was
    # patched and baked unchecked, under the digest of the file as it was hashed
    from unibake.inputs import read_source
    from unibake.patches import apply_patches, read_patch

    root = busybox_product.parent
    (root / "images/patches").mkdir()
    (root / "images/patches/fix.patch").write_text(PATCH)
    engine = read_source(root, "images/engine", "product.yaml:9")
    patch = read_patch(root, {"file": "images/patches/fix.patch"}, lambda path: "product.yaml:12")
    serve = root / "images/engine/serve.sh"
    assert apply_patches(engine, (patch,))["serve.sh"].data.startswith(b"#!/bin/sh\n# A patched engine:")
    serve.write_text(serve.read_text() + "echo an edit\n")  # the hunk still applies: only the hash tells
    with pytest.raises(InputError, match=r"^images/patches/fix\.patch: images/engine/serve\.sh changed after it was hashed"):
        apply_patches(engine, (patch,))
    # a file of gigabytes is never read whole to be patched
    os.truncate(serve, 65 << 20)
    with pytest.raises(InputError, match=r"^images/patches/fix\.patch: changes serve\.sh, a file of 68157440 bytes; patches "
                                         r"apply to text files of at most 64 MiB"):
        apply_patches(read_source(root, "images/engine", "product.yaml:9"), (patch,))


def test_an_overlay_that_replaces_a_file_a_patch_changes_is_refused(busybox_product):
    # the overlays are copied over the patched engine: the patch would be listed in the notes but lost
    root = busybox_product.parent
    (root / "images/patches").mkdir()
    (root / "images/patches/fix.patch").write_text(PATCH)
    (root / "images/ov").mkdir()
    (root / "images/ov/serve.sh").write_text("#!/bin/sh\n")
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/patches/fix.patch}\n"
                                             "overlays:\n  - {source: images/ov, target: ., name: ov}\n")
    with pytest.raises(InputError, match=r"product\.yaml:\d+: overlay 'ov' replaces engine/serve\.sh, which the patch "
                                         r"fix\.patch \(images/patches/fix\.patch\) changes"):
        make_plan(busybox_product, verify_lock=False)
    (root / "images/ov/serve.sh").unlink()  # a file the patch does not touch is the overlay's to give
    (root / "images/ov/other.sh").write_text("#!/bin/sh\n")
    make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("target", ["serve.sh/extra.py", "sub"])
def test_a_patch_that_adds_a_file_where_the_engine_has_a_file_or_folder_is_refused_naming_it(busybox_product, target):
    # (before: planned and rendered; the build context made the engine's serve.sh a folder, the engine's file
    # was lost, and the build failed only at its in-image check, "serve.sh: Is a directory", naming no patch)
    root = busybox_product.parent
    (root / "images/engine/sub").mkdir(exist_ok=True)
    (root / "images/engine/sub/inner.txt").write_text("x\n")
    (root / "images/patches").mkdir()
    (root / "images/patches/add.patch").write_text(f"--- /dev/null\n+++ b/{target}\n@@ -0,0 +1 @@\n+X = 1\n")
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/patches/add.patch}\n")
    if target == "sub":
        message = (r"the engine puts engine/sub/inner\.txt, so engine/sub must be a folder, but the patch add\.patch "
                   r"\(images/patches/add\.patch\) puts a file there")
    else:
        message = (r"the patch add\.patch \(images/patches/add\.patch\) puts engine/serve\.sh/extra\.py, so "
                   r"engine/serve\.sh must be a folder, but the engine puts a file there")
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


GIT_MODE_PATCH = """\
diff --git a/handle.sh b/handle.sh
old mode 100755
new mode 100644
diff --git a/tool.sh b/tool.sh
new file mode 100755
index 0000000..05cfd7f
--- /dev/null
+++ b/tool.sh
@@ -0,0 +1,2 @@
+#!/bin/sh
+echo tool
"""


def test_a_git_patch_s_file_modes_are_applied_and_a_symbolic_link_is_refused(busybox_product, cli):
    """``git diff`` of a chmod and of a new executable script: the context has the modes the patch
    gives (before: the chmod was dropped and the new script baked 0644, not executable)."""
    root = busybox_product.parent
    (root / "images/patches").mkdir()
    (root / "images/patches/modes.patch").write_text(GIT_MODE_PATCH)
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/patches/modes.patch}\n")
    lock(cli, busybox_product)
    files = {f.name: f for f in render(make_plan(busybox_product)).files}
    assert files["ctx/engine/tool.sh"].mode == 0o755 and files["ctx/engine/tool.sh"].data == b"#!/bin/sh\necho tool\n"
    assert files["ctx/engine/handle.sh"].mode == 0o644
    assert files["ctx/engine/serve.sh"].mode == 0o755

    (root / "images/patches/modes.patch").write_text(GIT_MODE_PATCH.replace("new file mode 100755", "new file mode 120000"))
    with pytest.raises(InputError, match=r"modes\.patch: gives tool\.sh the mode 120000 \(a symbolic link"):
        make_plan(busybox_product, verify_lock=False)


def test_a_patch_over_and_to_a_last_line_without_a_newline_applies_as_diff_wrote_it(busybox_product, cli, tmp_path):
    """``\\ No newline at end of file`` (before: "line 2 is 'two', the patch expects 'two'", and a
    line the patch left without a newline got one)."""
    root = busybox_product.parent
    (root / "images/engine/f.txt").write_text("one\ntwo")
    (root / "images/engine/g.txt").write_text("x\n")
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "f.txt").write_text("one\nTWO")
    (changed / "g.txt").write_text("x\ny")
    patch = "".join(subprocess.run(["diff", "-u", "--label", f"a/{n}", "--label", f"b/{n}", str(root / "images/engine" / n),
                                    str(changed / n)], capture_output=True, text=True).stdout for n in ("f.txt", "g.txt"))
    assert patch.count("\\ No newline at end of file") == 3
    (root / "images/patches").mkdir()
    (root / "images/patches/nl.patch").write_text(patch)
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/patches/nl.patch}\n")
    lock(cli, busybox_product)
    files = {f.name: f for f in render(make_plan(busybox_product)).files}
    assert files["ctx/engine/f.txt"].data == b"one\nTWO"
    assert files["ctx/engine/g.txt"].data == b"x\ny"


def test_a_patch_counts_lines_as_diff_does_across_a_form_feed_and_a_unicode_line_separator(busybox_product, cli):
    root = busybox_product.parent
    serve = root / "images/engine/serve.sh"
    lines = serve.read_text().split("\n")
    serve.write_text("\n".join(lines[:1] + ["\x0c", "# a \x85 b \u2028 c"] + lines[1:]))
    made = subprocess.run(["diff", "-u", "--label", "a/serve.sh", "--label", "b/serve.sh", str(serve), "-"],
                          input=serve.read_text().replace("set -eu", "set -eux", 1), capture_output=True, text=True)
    assert made.returncode == 1 and "+set -eux" in made.stdout
    (root / "images/fix.patch").write_text(made.stdout)
    append(busybox_product / "product.yaml", "patches:\n  - {file: images/fix.patch}\n")
    lock(cli, busybox_product)
    files = {f.name: f for f in render(make_plan(busybox_product)).files}
    assert files["ctx/engine/serve.sh"].data == serve.read_bytes().replace(b"set -eu", b"set -eux", 1)

# --- 5. env files ---------------------------------------------------------------------------------


def test_env_files_layer_under_each_files_env_and_are_counted_and_fingerprinted(busybox_product, cli):
    root = busybox_product.parent
    (root / "images/common.env").write_text("# shared\nA=1\nB=two words\nSHARED_SETTING=from-file\n")
    (root / "images/tp2.env").write_text("A=2\nC=\"quoted\"\n")
    append(busybox_product / "product.yaml", "env_file: images/common.env\n")
    append(busybox_product / "tp2.yaml", "env_file: images/tp2.env\n")
    lock(cli, busybox_product)
    plan = make_plan(busybox_product)
    tp1, tp2 = plan.profile("tp1").env, plan.profile("tp2").env
    assert tp1 == {"A": "1", "B": "two words", "SHARED_SETTING": "on", "NCCL_ALGO": "Tree"}  # env: wins in its file
    assert tp2 == {"A": "2", "B": "two words", "SHARED_SETTING": "on", "NCCL_ALGO": "Ring", "C": '"quoted"'}
    assert plan.profile("tp2").env_sha256 == fingerprint(tp2)
    assert [(c.name, c.version) for c in plan.components if c.kind == "env_file"] == [
        ("images/common.env", "3 keys"), ("images/tp2.env", "2 keys")]
    assert len(render(plan).metadata.profiles["tp2"].env) == 5


@pytest.mark.parametrize("text,message", [
    ("A=1\nJUST_A_KEY\n", r"x\.env:2: 'JUST_A_KEY' has no '=VALUE'"),
    ("export A=1\n", r"x\.env:1: 'export' is shell"),
    ("A=1\nA=2\n", r"x\.env:2: A is set twice in this file \(first on line 1\)"),
    ("1A=x\n", r"x\.env:1: '1A' is not a variable name"),
    ("A=a\tb\n", r"x\.env:1: the value of A contains a control character"),
])
def test_an_env_file_line_that_cannot_be_baked_is_named(text, message):
    with pytest.raises(InputError, match=message):
        parse_env(text, "x.env")


def test_an_env_file_is_split_into_lines_as_docker_splits_it():
    # docker's --env-file: lines end at "\n" only ("\r\n" too); a byte-order mark at the start is dropped
    text = "\ufeffA=1\r\nB=xy\u2028z\nC=\u2029\n"
    assert parse_env(text, "x.env")[0] == {"A": "1", "B": "xy\u2028z", "C": "\u2029"}
    # U+0085 (next line) splits no line either, but is a C1 control: refused as the other controls are
    with pytest.raises(InputError, match=r"x\.env:1: the value of B contains a control character \('\\x85'\)"):
        parse_env("B=x\x85y\n", "x.env")
    with pytest.raises(InputError, match=r"x\.env:1: the value of A contains a control character \('\\x0c'\)"):
        parse_env("A=x\x0cB=y\n", "x.env")


def test_an_env_file_line_indented_with_unicode_white_space_is_read_as_docker_reads_it():
    # docker's reader drops a line's leading white space by Go's unicode.IsSpace: a no-break space (an editor's or a
    # web page's copy), \v, \f, an ideographic space; such a line was refused as no variable name, and such a comment
    # as a line without '=', where docker takes both
    text = "\xa0A=1\n\u3000# from the wiki\n\x0bB=2\n\x0c\u2003C= x\n\u202f\u205f\u1680\x85D=4\n \t\xa0\n"
    assert parse_env(text, "x.env") == ({"A": "1", "B": "2", "C": " x", "D": "4"}, {"A": 1, "B": 3, "C": 4, "D": 5})
    # what Go's IsSpace does not count stays the name's (docker would set a variable of that name): refused
    for line in ("\u200bE=1", "\ufeffE=1", "\x1cE=1"):
        with pytest.raises(InputError, match=r"x\.env:2: '\\(u200b|ufeff|x1c)E' is not a variable name"):
            parse_env(f"A=1\n{line}\n", "x.env")
    # the value's own checks are kept
    with pytest.raises(InputError, match=r"x\.env:1: the value of A contains U\+202E"):
        parse_env("\xa0A=x\u202eB\n", "x.env")


@pytest.mark.parametrize("args, topology, message", [
    ('[--tp, "4"]', "", "tp2.yaml:7: --tp 4 of profile 'tp2' starts the engine on 4 GPUs, but the profile has 2 "
                        "(gpus: 2): the engine would fail at start on the GPU machine (the smoke gate has no GPUs to "
                        "show it); set gpus, or write a size that fits"),
    ('[--tp-size=3]', "", "--tp-size 3 of profile 'tp2' starts the engine on 3 GPUs"),
    ('[-tp, "2", -pp, "2"]', "", "-tp 2 times -pp 2 of profile 'tp2' starts the engine on 4 GPUs, but the profile "
                                 "has 2 (gpus: 2)"),
    ('[--tensor-parallel-size, "2", --pipeline-parallel-size=3]', "topology: {nodes: 2}\n",
     "starts the engine on 6 GPUs, but the profile has 2 on each of 2 nodes, 4 in all (gpus: 2)"),
    ('[--tp, "1", --tp, "4"]', "", "--tp 4 of profile"),  # the last one is the parser's
])
def test_a_tensor_parallel_size_needing_more_gpus_than_the_profile_has_is_refused(busybox_product, args, topology,
                                                                                   message):
    # vLLM and SGLang start one rank per GPU of --tensor-parallel-size (times --pipeline-parallel-size): one larger
    # than the container's GPUs failed at start on the GPU machine alone (the smoke gate has none)
    text = (busybox_product / "tp2.yaml").read_text()
    (busybox_product / "tp2.yaml").write_text(f"{text}args: {args}\n{topology}")
    with pytest.raises(InputError, match="tp2.yaml:7: ") as refused:
        make_plan(busybox_product, verify_lock=False)
    assert message in str(refused.value)
    # what fits: as many GPUs or fewer, across the nodes, or a size given at run time
    for fits, topology in (('[--tp, "2"]', ""), ('[--tp-size, "4"]', "topology: {nodes: 2}\n"),
                           ('[-tp, "1", -pp, "2"]', ""), ('[--tp, "4", --tp, "2"]', ""), ('[--tp, "${TP}"]', "")):
        (busybox_product / "tp2.yaml").write_text(f"{text}args: {fits}\n{topology}")
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("args, message", [
    # argparse's type=int is Python's int(): a sign, spaces, '_' and other scripts' digits are a number to the engine
    ('[--port, "+8080"]', "key 'args[1]' gives --port the value '+8080', which an engine reads as a number"),
    ('[--port, " 8080"]', "key 'args[1]' gives --port the value ' 8080'"),
    ('[--port, "8_080"]', "key 'args[1]' gives --port the value '8_080'"),
    ('[--port, "\uff18\uff10\uff18\uff10"]', "key 'args[1]' gives --port the value '\uff18\uff10\uff18\uff10'"),
    ('[--port=+8080]', "key 'args[0]' gives --port the value '+8080'"),
    ('[--tp, "+4"]', "key 'args[1]' gives --tp the value '+4'"), ('[--tp, " 4"]', "gives --tp the value ' 4'"),
    ('[--tp=+4]', "gives --tp the value '+4'"), ('[--tensor-parallel-size, "-1"]', "the value '-1'"),
    # argparse takes a long option cut short for the one it begins (the demo engine's --t for its --tp)
    ('[--por, "8080"]', "key 'args[0]' is --por, which an engine's argument parser (Python's argparse) takes for "
                        "--port when no other option of the engine begins so; write the option in full"),
    ('[--po=8080]', "is --po, which"), ('[--t, "4"]', "is --t, which an engine's argument parser (Python's argparse) "
                                                      "takes for --tensor-parallel-size or --tp-size or --tp"),
    ('[--tensor-parallel, "4"]', "takes for --tensor-parallel-size when"),
    ('[--tp-s, "4"]', "takes for --tp-size when"), ('[--pipeline-p, "4"]', "takes for --pipeline-parallel-size"),
])
def test_a_port_or_parallel_size_spelt_past_the_plans_checks_is_refused(busybox_product, args, message):
    # the checks of --port (launch.port) and --tp (the profile's GPUs) read plain digits after the option in full:
    # --port +8080, --port 8_080, --por 8080 and --tp ' 4' on one GPU passed them, and the engine read them all
    text = (busybox_product / "tp1.yaml").read_text()
    (busybox_product / "tp1.yaml").write_text(f"{text}args: {args}\n")
    with pytest.raises(InputError, match="tp1.yaml:6: ") as refused:
        make_plan(busybox_product, verify_lock=False)
    assert message in str(refused.value)
    # what the plan reads, or leaves to the start: plain digits, ${NAME}, and options that only begin alike
    for fine in ('[--port, "30000"]', '["--port=${PORT}"]', '[--tp, "1", --pp, "1"]', '[--tp, "${TP}"]',
                 '[--p2p-check, --tokenizer, x, --port-range, "1-2", "--"]'):
        (busybox_product / "tp1.yaml").write_text(f"{text}args: {fine}\n")
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("path, message", [
    ("/usr", "would hide the image's /usr, its programs and libraries"),
    ("/usr/local/cuda", "would hide the image's /usr/local/cuda, its programs and libraries"),
    ("/etc", "would hide the image's /etc"), ("/dev", "would hide the image's /dev, the device nodes"),
    ("/dev/shm", "would hide the image's /dev/shm, the shared memory NCCL/RCCL and the engine's workers write (the "
                 "mount is read-only)"),
    ("/tmp", "would hide the image's /tmp, a folder the engine writes"),
    ("/proc/weights", "lies inside /proc, where the container runtime cannot mount it"),
    ("/sys/weights", "lies inside /sys, where the container runtime cannot mount it (runc: 'read-only file system')"),
])
def test_a_weight_mount_over_a_system_folder_is_refused(busybox_product, path, message):
    # the weights are mounted read-only by run.sh alone (the smoke gate mounts none): over /usr the engine found no
    # shell or Python, inside /proc runc refused to start the container, on the GPU machine only
    text = (busybox_product / "product.yaml").read_text()
    (busybox_product / "product.yaml").write_text(text.replace("mounts: {target: /models/target}",
                                                               f"mounts: {{target: {path}}}"))
    with pytest.raises(InputError, match=r"product\.yaml:12: mount 'target' at " + path) as refused:
        make_plan(busybox_product, verify_lock=False)
    assert message in str(refused.value) and str(refused.value).endswith("mount weights elsewhere, like "
                                                                         "/models/target")
    # inside a system folder that is no system folder itself, a mount hides nothing the image needs
    for fine in ("/tmp/weights", "/usr/share/models", "/root/hf", "/dev/shm/weights"):
        (busybox_product / "product.yaml").write_text(text.replace("mounts: {target: /models/target}",
                                                                   f"mounts: {{target: {fine}}}"))
        # (a path under /root is a home folder's to the secret scan, which names it by its key: allowed here)
        assert make_plan(busybox_product, verify_lock=False,
                         allow=(r"^/root/hf$",)).launch.mounts == {"target": fine}


def test_a_reserved_key_in_an_env_file_is_refused_naming_its_line(busybox_product):
    (busybox_product.parent / "images/x.env").write_text("OK=1\nPORT=8080\n")
    append(busybox_product / "tp1.yaml", "env_file: images/x.env\n")
    with pytest.raises(InputError, match=r"images/x\.env:2: env key 'PORT' is set by the image itself"):
        make_plan(busybox_product, verify_lock=False)


# --- 3. devices and topology; run.sh --------------------------------------------------------------


@pytest.mark.parametrize("text,message", [
    ("topology: {shm_size: 16g}\n", "shm_size has no effect with ipc: host"),
    ("topology: {nodes: 2, network: bridge}\n", "a profile on 2 nodes needs network: host"),
    ("devices: {vendor: intel}\n", "must be one of nvidia, amd, hygon"),
    ("devices: {extra: ['/dev/a:/dev/b']}\n", r"key 'devices\.extra\[0\]'"),
    # the ROCm docs' --device /dev/dri copied into extra: every GPU in every profile, GPUS ignored
    ("devices: {vendor: amd, extra: [/dev/kfd, /dev/dri]}\n",
     r"tp2\.yaml:\d+: devices\.extra names /dev/dri, a GPU device: run\.sh gives an amd profile "
     r"/dev/dri/renderD<128\+N> for each GPU N of GPUS \(GPUS=all: every GPU\), so /dev/dri would give the "
     r"container GPUs GPUS did not choose; remove it"),
    ("devices: {vendor: hygon, extra: [/dev/mkfd, /dev/dri/renderD128]}\n", "names /dev/dri/renderD128, a GPU device"),
    # RDMA's devices without its memlock: ibv_reg_mr failed on the GPU nodes
    ("devices: {extra: [/dev/infiniband/uverbs0]}\n",
     r"tp2\.yaml:\d+: devices\.extra names /dev/infiniband/uverbs0, but RDMA needs more locked memory than docker's "
     r"default limit allows: set topology\.rdma: true, which gives the container /dev/infiniband and unlimited "
     r"memlock, and remove it"),
    ("devices: {extra: [/dev/infiniband]}\ntopology: {nodes: 2, rdma: false}\n", "names /dev/infiniband, but RDMA"),
    # docker reads a size without a unit as bytes: a /dev/shm of one page ('Bus error' on the GPU node)
    ("topology: {ipc: private, shm_size: '16'}\n",
     r"tp2\.yaml:\d+: shm_size '16' is 16 bytes \(docker reads a size without a unit as bytes\), less than any "
     r"engine's shared memory needs; write it with its unit, like 16g"),
    ("topology: {ipc: private, shm_size: 1023k}\n", "shm_size '1023k' is 1047552 bytes"),
    ("topology: {ipc: private, shm_size: 9999999999g}\n", "is more than docker can take"),
])
def test_devices_and_topology_that_make_no_sense_are_refused(busybox_product, text, message):
    append(busybox_product / "tp2.yaml", text)
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


# --- 6. smoke specs -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,message", [
    ("smoke: {prompts: [{prompt: a, expect: b}], expect_reply: c}\n", "smoke.prompts replaces smoke.prompt"),
    ("smoke: {expect_reply: '[unclosed', match: regex}\n", "is not a regular expression"),
    ("smoke: {prompts: [{prompt: a, match: contains}]}\n", "match: contains needs the expected reply"),
])
def test_a_smoke_spec_that_cannot_be_checked_is_refused(busybox_product, text, message):
    path = busybox_product / "tp1.yaml"
    path.write_text(path.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}\n", text))
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("parent,child,expect", [
    ("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}", "smoke: {prompts: [{prompt: a, expect: B}]}", ("a", "B")),
    ("smoke: {timeout: 20, prompts: [{prompt: a, expect: UNIFIED_TP1_OK}]}", "smoke: {expect_reply: B}",
     ("Say the smoke-test phrase.", "B")),
])
def test_a_profile_replaces_the_smoke_gate_of_the_profile_it_extends_with_its_own(busybox_product, parent, child,
                                                                                   expect):
    # tp2 extends tp1: its own prompts (or expect_reply) replace tp1's expect_reply (or prompts), as its own
    # keys replace its parent's; before, the merged smoke held both and tp2 was refused
    path = busybox_product / "tp1.yaml"
    path.write_text(path.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}", parent))
    path = busybox_product / "tp2.yaml"
    path.write_text(path.read_text().replace("smoke: {expect_reply: UNIFIED_TP2_OK}", child))
    plan = make_plan(busybox_product, verify_lock=False)
    assert [(p.prompt, p.expect) for p in plan.profile("tp2").smoke.prompts] == [expect]
    assert plan.profile("tp2").smoke.timeout == 20


def test_a_smoke_gate_whose_prompts_and_expected_reply_mix_across_files_names_where_the_prompts_are_set(
        busybox_product):
    # match from product.yaml, prompts from tp1, expect_reply from tp2: no file's gate is whole; both are named
    (busybox_product / "product.yaml").write_text((busybox_product / "product.yaml").read_text() +
                                                  "smoke: {match: exact}\n")
    path = busybox_product / "tp1.yaml"
    path.write_text(path.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}\n",
                                             "smoke: {timeout: 20, prompts: [{prompt: a, expect: UNIFIED_TP1_OK}]}\n"))
    with pytest.raises(InputError, match=r"tp2\.yaml:\d+: smoke\.prompts replaces smoke\.prompt, expect_reply and "
                                         r"match; give one or the other \(prompts is set at [^ ]*tp1\.yaml:\d+\)$"):
        make_plan(busybox_product, verify_lock=False)


# --- 8. bases pinned by image ID; --stage render needs no lock -------------------------------------


def test_a_base_pinned_by_image_id_is_what_from_names(busybox_product, cli):
    image_id = "sha256:" + "ab" * 32
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        'base: {image: "localhost/unibake-busybox:1"}',
        f'base: {{image: "localhost/unibake-busybox:1", id: "{image_id}", require_digest: true}}'))
    dockerfile = render(make_plan(busybox_product)).dockerfile
    assert f"# base localhost/unibake-busybox:1, pinned by image ID\nFROM {image_id}\n" in dockerfile


def test_render_needs_no_lock_but_a_build_does(busybox_product, cli):
    (busybox_product / "inputs.lock").unlink()
    assert cli("--config", str(busybox_product), "--stage", "render").code == 0
    build = cli("--config", str(busybox_product), "--stage", "build")
    assert build.code == 2 and "the inputs lock is missing" in build.error_lines[-1]


# --- 9. released tags never move -------------------------------------------------------------------


def test_a_build_under_a_released_tag_is_refused_before_the_engine_is_reached(busybox_product, cli, tmp_path):
    out = tmp_path / "release"
    (out / "0.1.0").mkdir(parents=True)
    (out / "0.1.0/manifest.json").write_text("{}")
    result = cli("--config", str(busybox_product), "--stage", "build", "--out", str(out))
    assert result.code == 2  # the unit tests' guard would have failed the test had the engine been reached
    assert result.error_lines[-1].startswith(f"error: unibake-test:0.1.0 is released ({out}/0.1.0, its manifest.json "
                                             "unreadable): a released tag never moves")


# --- the examples mirroring real stacks: what they must hold --------------------------------------


def test_the_sglang_roce_example_holds_what_its_stack_needs():
    plan = make_plan(REPO / "examples/sglang-arm64-roce/profiles", cwd=REPO)
    overlay = plan.overlays[0]
    assert len(overlay.source.files) == 87 and overlay.md5
    assert any(Path(f.path).name.startswith(".") for f in overlay.source.files)
    assert len(plan.profile("tp4").env_files[0].values) == 56
    tp16 = plan.profile("tp16")
    assert (tp16.topology.nodes, tp16.topology.rdma, tp16.topology.network) == (4, True, "host")
    assert [k.name for k in tp16.sidecars] == ["deep_ep"]
    assert [(k.name, bool(k.prebuilt), k.build.make if k.build else None) for k in plan.kernels] == [
        ("sgl_kernel", False, None), ("deep_gemm", False, "all"), ("nvshmem", True, None)]
    assert plan.patched["sglang/srt/distributed.py"].data.count(b'TRANSPORT = "roce"') == 1


def test_the_hygon_example_holds_what_its_stack_needs():
    plan = make_plan(REPO / "examples/hygon-dcu-tp/profiles", cwd=REPO)
    compiled = [o for k in plan.kernels if not k.prebuilt for o in k.outputs]
    assert len(compiled) == 7
    assert {p.vendor for p in plan.profiles} == {"hygon"}
    assert plan.profile("tp2").devices.extra == ("/dev/mkfd",)
    assert [(k.name, k.version) for k in plan.profile("tp2").sidecars] == [
        ("flash_attn", "2.0.4+das.dtk2404"), ("tp2_row_LDSx", "1.0.0+das")]
    assert next(k for k in plan.kernels if k.name == "flash_attn").version == "2.8.3+das.opt1.dtk2604"
    assert next(k for k in plan.kernels if k.name == "lmslim").is_wheel
    # tp4's own env file is tp4's in the notes and the image's metadata; the product's is every profile's
    assert [(c.name, c.profile) for c in plan.components if c.kind == "env_file"] == [
        ("images/env/dcu-common.env", ""), ("images/env/tp4.env", "tp4")]


def test_the_notes_name_the_profiles_the_previous_release_had_and_this_one_has_not(tmp_path):
    # the unified 1.3.1 drops tp2: its notes said only "No component changed"
    from .test_publish import METADATA, make_release

    make_release(tmp_path / "release", "1.3.0")
    after = json.loads(json.dumps(METADATA))
    del after["profiles"]["tp2"]
    after["components"] = [c for c in after["components"] if c["profile"] != "tp2"]
    folder, _ = make_release(tmp_path / "release", "1.3.1", after)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert ("Profiles 1.3.0 has that this image does not: `tp2`; to run one, use 1.3.0's image and its own "
            "`run.sh`.") in notes
    same, _ = make_release(tmp_path / "release", "1.3.2", after)
    assert "this image does not" not in (same / "RELEASE_NOTES.md").read_text()


def test_an_env_file_some_profiles_read_is_each_of_theirs_not_the_images(busybox_product, cli):
    # tp2 and tp3 read images/nodes.env, tp1 does not: the notes must not say "all" of it
    root = busybox_product.parent
    (root / "images/nodes.env").write_text("A=1\n")
    append(busybox_product / "tp2.yaml", "env_file: images/nodes.env\n")
    (busybox_product / "tp3.yaml").write_text("profile: tp3\nextends: tp2.yaml\ngpus: 3\n")
    lock(cli, busybox_product)
    plan = make_plan(busybox_product)
    assert [(c.name, c.profile) for c in plan.components if c.kind == "env_file"] == [
        ("images/nodes.env", "tp2"), ("images/nodes.env", "tp3")]
    assert {c.label[0] for c in plan.components if c.kind == "env_file"} == {
        "io.unibake.env-file.tp2.images/nodes.env", "io.unibake.env-file.tp3.images/nodes.env"}


def test_run_sh_for_multi_node_and_hygon_profiles_validates_its_environment(tmp_path):
    from .test_publish import METADATA, make_release

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"]["topology"] = {"nodes": 4, "network": "host", "rdma": True, "master_port": 20000}
    metadata["profiles"]["tp4"].update(vendor="hygon", devices={"extra": ["/dev/mkfd"], "groups": ["render"]},
                                       topology={"ipc": "private", "shm_size": "32g"})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    fake_bin = _fake_getent(tmp_path, {"video": 44, "render": 109})

    def run(*args, **env):
        return subprocess.run(["sh", str(folder / "run.sh"), *args], capture_output=True, text=True,
                              env={"PATH": f"{fake_bin}:/usr/bin:/bin", **env})

    ok = run("tp2", "--dry-run", NODE_RANK="3", MASTER_ADDR="node0.example")  # --dry-run after the profile
    assert ok.returncode == 0, ok.stderr
    assert ("-e NNODES=4 -e NODE_RANK=3 -e MASTER_ADDR=node0.example -e MASTER_PORT=20000 --network host --ipc=host "
            "--device /dev/infiniband --ulimit memlock=-1:-1 --gpus '\"device=0,1\"'") in ok.stdout
    assert "-p " not in ok.stdout
    for env, message in (({}, "set NODE_RANK (0 to 3) and MASTER_ADDR"),
                         ({"NODE_RANK": "4", "MASTER_ADDR": "n0"}, "NODE_RANK must be a number from 0 to 3"),
                         ({"NODE_RANK": "0", "MASTER_ADDR": "$(id)"}, "MASTER_ADDR must be a host name or an IP"),
                         ({"NODE_RANK": "0", "MASTER_ADDR": "::::"}, "MASTER_ADDR must be a host name or an IP"),
                         ({"NODE_RANK": "0", "MASTER_ADDR": "....."}, "MASTER_ADDR must be a host name or an IP"),
                         ({"NODE_RANK": "0", "MASTER_ADDR": "n0", "MASTER_PORT": "70000"}, "MASTER_PORT must be")):
        bad = run("--dry-run", "tp2", **env)
        assert bad.returncode == 2 and message in bad.stderr, (env, bad.stderr)

    hygon = run("--dry-run", "tp4", GPUS="2,3,4,5")
    assert ("--ipc=private --shm-size=32g --device /dev/kfd --security-opt seccomp=unconfined "
            "--device /dev/dri/renderD130 --device /dev/dri/renderD131 --device /dev/dri/renderD132 "
            "--device /dev/dri/renderD133 -e HIP_VISIBLE_DEVICES=0,1,2,3 --device /dev/mkfd --group-add 44 "
            "--group-add 109") in hygon.stdout
    uuid = run("--dry-run", "tp4", GPUS="GPU-1,GPU-2,GPU-3,GPU-4")
    assert uuid.returncode == 2 and "hygon GPUs are chosen by number, not UUID" in uuid.stderr
    nvidia = run("--dry-run", "tp1", GPUS="MIG-4f1c9a2e-1b2c-4d5e-8f90-aabbccddeeff")
    assert "--gpus '\"device=MIG-4f1c9a2e-1b2c-4d5e-8f90-aabbccddeeff\"'" in nvidia.stdout
    assert "--gpus all" in run("--dry-run", "tp1", GPUS="all").stdout
    named = run("--name", "mine.1", "tp1", "--dry-run")
    assert "--name mine.1 " in named.stdout
    for args, env, message in ((["--name", "-x", "tp1"], {}, "must start with a letter or digit"),
                               (["tp1"], {"PORT": "80; id"}, "PORT must be a number from 1 to 65535"),
                               (["tp1"], {"GPUS": "01"}, "no leading zeros"),
                               (["tp1"], {"MODEL_TARGET": "weights"}, "must be an absolute path"),
                               (["tp1"], {"IMAGE": "--privileged"}, "IMAGE must be an image reference")):
        bad = run("--dry-run", *args, **env)
        assert bad.returncode == 2 and message in bad.stderr, (args, env, bad.stderr)
    helped = run("tp1", "--help")
    assert helped.returncode == 0 and "Usage: ./run.sh" in helped.stdout and "Profiles: tp1, tp2, tp4" in helped.stdout


def test_run_sh_passes_other_variables_and_env_files_to_the_container_each_one_word(tmp_path):
    # run.sh passed no variable but its own: HF_TOKEN, HF_HOME or an NCCL setting needed a hand-written docker run
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    bin_dir = tmp_path / "bin"  # a docker that prints each word it is given on its own line
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nfor a in \"$@\"; do printf '[%s]\\n' \"$a\"; done\n"
                                    "printf -- '--end--\\nHF_TOKEN=%s\\n' \"${HF_TOKEN:-}\"\n")
    (bin_dir / "docker").chmod(0o755)
    env_file = tmp_path / "my env.list"
    env_file.write_text("\ufeff# settings\r\nNCCL_ALGO=Ring\r\n")

    def run(*args, **env):
        return subprocess.run(["sh", str(folder / "run.sh"), *args], capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})

    hostile = "it's $(id) `id` \"x\" ü\nline"
    ran = run("-e", f"HF_HOME={hostile}", "--env-file", str(env_file), "-e", "HF_TOKEN", "--env=B=", "tp1", "-e",
              "x", HF_TOKEN="s3cret")
    assert ran.returncode == 0, ran.stderr
    words = ran.stdout.split("\n--end--\n")[0][1:-1].split("]\n[")
    at = words.index(f"--env-file={env_file}")
    assert words[at:at + 7] == [f"--env-file={env_file}", "-e", f"HF_HOME={hostile}", "-e", "HF_TOKEN", "-e", "B="]
    assert words[at + 7:at + 11] == ["demo-llm:1.3.1", "serve", "-e", "x"]  # after the profile: the engine's
    assert ran.stdout.endswith("\n--end--\nHF_TOKEN=s3cret\n")  # -e NAME: the engine reads it from run.sh's environment
    dry = run("--dry-run", "-e", "HF_TOKEN", "tp1", HF_TOKEN="s3cret")
    assert dry.returncode == 0 and " -e HF_TOKEN demo-llm:1.3.1" in dry.stdout and "s3cret" not in dry.stdout
    (tmp_path / "own.env").write_text("A=1\n  PORT=8000\r\n")
    for args, message in ((["-e", "PORT=1"], "-e sets PORT, which run.sh or the image sets"),
                          (["-e", "UNIBAKE_GPUS=1"], "-e sets UNIBAKE_GPUS, which run.sh or the image sets"),
                          (["-e", "A;id=1"], "-e needs NAME=VALUE with NAME like HF_HOME; got 'A;id'"),
                          (["-e", "1A=1"], "got '1A'"), (["-e", "=1"], "got ''"),
                          (["-e", "A=1", "-e", "A=2"], "-e gives A twice"),
                          (["-e", "MISSING"], "-e MISSING: MISSING is not set in this environment"),
                          (["--env-file", str(tmp_path / "none")], "none: no such file"),
                          (["--env-file", str(tmp_path)], "a folder, not a file of NAME=VALUE lines"),
                          (["--env-file", str(tmp_path / "own.env")], "own.env sets PORT, which run.sh")):
        bad = run("--dry-run", *args, "tp1")
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and message in bad.stderr, (args, bad.stderr)
        assert bad.stdout == "" and bad.stderr.count("\n") == 1
    bad = run("--dry-run", "--env-file")
    assert bad.returncode == 2 and bad.stderr == "error: --env-file needs a value\n"
    helped = run("--help")
    assert "-e NAME=VALUE" in helped.stdout and "--env-file FILE" in helped.stdout



@pytest.mark.parametrize("text, message", [
    (b"\xef\xbb\xbfUNIBAKE_GPUS=1\n", "sets UNIBAKE_GPUS, which run.sh"),  # docker drops the first line's byte-order mark
    (b"A=1\n\xc2\xa0MODEL_NAME=x\n", "sets MODEL_NAME, which run.sh"),  # and Unicode white space before a name
    (b"\xe2\x80\x80\xe3\x80\x80UNIBAKE_X=1\r\n", "sets UNIBAKE_X, which run.sh"),
    (b"\x0b\x0cPORT\r\n", "sets PORT, which run.sh"),
    (b"export A=1\n", "(it begins 'export'), so no variable name (docker reads NAME=VALUE lines"),  # docker: exit 125
    (b"A=1\n=2\n", "a line has no name before its '='"),
    (b"A\tB=1\n", "a line whose name holds a space or a tab (it begins 'A'), so no variable name"),
])
def test_run_sh_reads_an_env_file_s_names_as_docker_reads_them(tmp_path, text, message):
    # the names were read with ASCII white space only: a byte-order mark or a no-break space before UNIBAKE_GPUS
    # let a file set what run.sh refuses, and a line docker refuses ("variable 'export A' contains whitespaces")
    # passed --dry-run, to fail at the engine's client with exit 125
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    env_file = tmp_path / "my.env"
    env_file.write_bytes(text)
    run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", str(env_file), "tp1"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert run.stderr.startswith(f"error: --env-file {env_file}") and message in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1
    env_file.write_bytes(b"\xef\xbb\xbf# a comment\r\n \t\n  # PORT=1\nPORTS=1\nA=\xc2\xa0PORT\nB= PORT=1\nC\n")
    run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", str(env_file), "tp1"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "C": ""})
    assert run.returncode == 0 and f"--env-file={env_file} demo-llm:1.3.1" in run.stdout, run.stderr


@pytest.mark.parametrize("text, message", [
    (b"A=1\nB=caf\xe9\n", "line 2 is not UTF-8"),  # saved as Latin-1: docker's "invalid utf8 bytes at line 2"
    (b"A=\xed\xa0\x80\n", "line 1 is not UTF-8"), (b"A=\xc0\x80\n", "line 1 is not UTF-8"),  # a surrogate, overlong
    (b"A=\xf4\x90\x80\x80\n", "line 1 is not UTF-8"),  # past U+10FFFF
    (b"A=" + b"x" * 65534 + b"\n", "line 1 is longer than docker reads (65535 bytes)"),  # "token too long"
    (b"A=" + b"x" * 65533 + b"\r\n", "line 1 is longer than docker reads"),
    (b"A=1\x00x\n", "holds a NUL byte"),  # runc: "environment variable value can't contain null"
])
def test_run_sh_refuses_an_env_file_docker_or_runc_would_refuse(tmp_path, text, message):
    # each passed run.sh (and --dry-run) to fail as docker's exit 125 at the start
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    env_file = tmp_path / "my.env"
    env_file.write_bytes(text)

    def run():
        return subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", str(env_file), "tp1"],
                              capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})

    bad = run()
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith(f"error: --env-file {env_file}: ") and message in bad.stderr, bad.stderr
    env_file.write_bytes(b"A=" + b"x" * 65533 + b"\nB=\xf0\x9f\x98\x80 \xe4\xb8\xad \xc3\xa9 \xef\xbb\xbf\xf4\x8f\xbf\xbf\n")
    good = run()  # what docker takes: a line of 65535 bytes, any UTF-8
    assert good.returncode == 0 and f"--env-file={env_file} " in good.stdout, good.stderr


def test_run_sh_refuses_an_env_file_line_without_value_whose_variable_is_not_set_as_it_refuses_e_name(tmp_path):
    # "HF_TOKEN" alone on a line takes HF_TOKEN from the environment; unset, docker dropped it without a word
    # (the engine then failed its gated download), while -e HF_TOKEN unset was exit 2
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    env_file = tmp_path / "my.env"
    env_file.write_bytes(b"\xef\xbb\xbfA=1\r\n  HF_TOKEN\r\n")

    def run(**env):
        return subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", str(env_file), "tp1"],
                              capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})

    bad = run()
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr == (
        f"error: --env-file {env_file}: HF_TOKEN (a line without '=') is not set in this environment, so docker "
        "would drop it; set it or give HF_TOKEN=VALUE\n"), bad.stderr
    good = run(HF_TOKEN="s3cret")
    assert good.returncode == 0 and "s3cret" not in good.stdout and f"--env-file={env_file} " in good.stdout
    assert run(HF_TOKEN="").returncode == 0  # set, empty: docker passes it so


@pytest.mark.parametrize("name, message", [
    ("PATH", "sets PATH, which would replace the image's, where the engine is found"),
    ("PWD", "sets PWD, which the image's /bin/sh sets itself: the value would not reach the engine"),
    ("IFS", "sets IFS, which the image's /bin/sh"), ("PPID", "sets PPID"), ("OPTIND", "sets OPTIND"),
])
def test_run_sh_refuses_the_images_path_and_its_shells_own_variables_as_the_plan_does(tmp_path, name, message):
    # the plan refuses them in a profile's env; -e PATH=... (or an env file written by `env`, which holds PATH
    # and PWD) replaced the image's PATH, and PWD/IFS/PPID/OPTIND never reached the engine
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    env_file = tmp_path / "env.list"
    env_file.write_text(f"A=1\n{name}=/x\n")
    for args, where in ((["-e", f"{name}=/x"], "-e"), (["--env-file", str(env_file)], f"--env-file {env_file}")):
        run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", *args, "tp1"], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin"})
        assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
        assert run.stderr.startswith(f"error: {where} {message}"), run.stderr


def test_run_sh_passes_the_users_value_of_a_name_run_sh_uses_itself(tmp_path):
    # -e NAME and an env file's NAME line take NAME from the environment docker is started with: run.sh's own
    # variables (name, gpus, port, ...) replaced the user's (the container got name=demo-llm-tp1), and one the
    # user had not exported (-e dry_run) passed run.sh's check, to be dropped by docker without a word
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    bin_dir = tmp_path / "bin"  # a docker that shows the variables it would hand the container
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nprintf '%s|' \"$name\" \"$gpus\" \"$port\" \"${HF_TOKEN-unset}\"\n")
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "my.env").write_text("port\n")

    def run(*args, **env):
        return subprocess.run(["sh", str(folder / "run.sh"), *args], capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})

    hostile = "it's $(id)\n`x`"
    ran = run("-e", "name", "-e", "gpus", "--env-file", str(tmp_path / "my.env"), "tp1", name=hostile, gpus="g",
              port="p")
    assert ran.returncode == 0 and ran.stdout == f"{hostile}|g|p|unset|", (ran.stdout, ran.stderr)
    ran = run("-e", "HF_TOKEN", "tp1", HF_TOKEN="")  # set, empty: passed as set
    assert ran.returncode == 0 and ran.stdout == "||||", (ran.stdout, ran.stderr)
    # bash, and bash as sh, with a read-only SHELLOPTS (and BASHOPTS) exported: still starts, with the user's value
    # (bash as sh cannot set them back: run.sh leaves them out, which it never set; before, it put nothing back)
    for shell in (["bash"], ["bash", "--posix"]):
        for opts in ({"SHELLOPTS": "braceexpand:hashall"}, {"SHELLOPTS": "hashall", "BASHOPTS": "checkwinsize"}):
            ran = subprocess.run([*shell, str(folder / "run.sh"), "-e", "name", "tp1"], capture_output=True,
                                 text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "name": "n\nexport x=1", **opts})
            assert ran.returncode == 0 and ran.stdout.startswith("n\nexport x=1|") and ran.stderr == "", (
                shell, ran.stdout, ran.stderr)
    for unset in ("dry_run", "ea_name", "env_args"):
        bad = run("--dry-run", "-e", unset, "tp1")
        assert bad.returncode == 2 and bad.stderr == (
            f"error: -e {unset}: {unset} is not set in this environment; give -e {unset}=VALUE\n"), bad.stderr


def test_run_sh_says_an_env_file_that_is_a_pipe_is_one_not_that_it_does_not_exist(tmp_path):
    # --env-file <(sops -d secrets.env), or a FIFO: "no such readable file" for a file that is plainly there;
    # run.sh reads it to check its names, so docker would find the pipe empty: it is refused, saying why
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    fifo = tmp_path / "secrets.env"
    os.mkfifo(fifo)
    read, write = os.pipe()
    os.write(write, b"A=1\n")
    os.close(write)
    try:
        for path in (str(fifo), f"/dev/fd/{read}"):
            run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", path, "tp1"],
                                 capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, pass_fds=(read,),
                                 timeout=30)
            assert run.returncode == 2 and run.stdout == "" and run.stderr == (
                f"error: --env-file {path}: not a regular file: run.sh reads it to check its names, so a pipe "
                "(like <(...)) would reach docker empty; save it as a file\n"), run.stderr
    finally:
        os.close(read)
    # found by probing: /dev/null was called a pipe
    run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "--env-file", "/dev/null", "tp1"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert run.returncode == 2 and run.stderr == (
        "error: --env-file /dev/null: not a regular file (a device or a socket): save the variables as a file\n"), run


def test_run_sh_passes_a_variable_by_name_on_a_host_without_printenv(tmp_path):
    # Debian's busybox has no printenv applet: -e HF_TOKEN (and an env file's HF_TOKEN line) was refused as
    # "not set in this environment" with HF_TOKEN set
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sed", "sort", "uniq", "head", "tr", "grep", "cut", "cat", "printf", "env", "awk", "wc"):
        found = next((d / tool for d in (Path("/usr/bin"), Path("/bin")) if (d / tool).exists()), None)
        if found:
            (bare / tool).symlink_to(found)
    (tmp_path / "my.env").write_text("A=1\nHF_HOME\n")

    def run(**env):
        return subprocess.run(["/bin/sh", str(folder / "run.sh"), "--dry-run", "-e", "HF_TOKEN", "--env-file",
                               str(tmp_path / "my.env"), "tp1"], capture_output=True, text=True,
                              env={"PATH": str(bare), **env})

    ran = run(HF_TOKEN="s3cret", HF_HOME="/h")
    assert ran.returncode == 0 and ran.stderr == "" and " -e HF_TOKEN demo-llm:1.3.1" in ran.stdout, ran.stderr
    assert "s3cret" not in ran.stdout
    assert "error: -e HF_TOKEN: HF_TOKEN is not set in this environment" in run(HF_HOME="/h").stderr
    assert "HF_HOME (a line without '=') is not set" in run(HF_TOKEN="s3cret", X="\nHF_HOM=").stderr


def _fake_getent(tmp_path, groups: dict[str, int]):
    """A folder holding a ``getent`` that knows only ``groups``: run.sh looks the host's groups up with it."""
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    lines = "".join(f"  {name}) echo '{name}:x:{gid}:' ;;\n" for name, gid in groups.items())
    (fake_bin / "getent").write_text(f'#!/bin/sh\n[ "$1" = group ] || exit 2\ncase "$2" in\n{lines}  *) exit 2 ;;\nesac\n')
    (fake_bin / "getent").chmod(0o755)
    return fake_bin


def test_run_sh_gives_an_amd_profile_the_hosts_groups_by_number_each_once(tmp_path):
    # `--group-add video --group-add render` by name: the engine looks the names up in the image's /etc/group,
    # so a base without them (busybox, debootstrap's minbase has no render) failed every start with exit 125
    # ("Unable to find group render") after the release had passed its gates, and a group the image numbers
    # otherwise than the host gave no access to the host's device nodes; video was given twice when the
    # profile named it too
    from .test_publish import METADATA, make_release

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"].update(vendor="amd", devices={"extra": [], "groups": ["render", "video", "2000"]})
    metadata["profiles"]["tp4"].update(vendor="amd", devices={"extra": [], "groups": ["rdma"]})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    fake_bin = _fake_getent(tmp_path, {"video": 44, "render": 109})

    def run(*args):
        return subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", *args], capture_output=True, text=True,
                              env={"PATH": f"{fake_bin}:/usr/bin:/bin"})

    amd = run("tp2")
    assert amd.returncode == 0, amd.stderr
    assert ("--device /dev/kfd --security-opt seccomp=unconfined --device /dev/dri/renderD128 "
            "--device /dev/dri/renderD129 --group-add 44 --group-add 109 --group-add 2000 ") in amd.stdout
    assert "video" not in amd.stdout and "render " not in amd.stdout
    missing = run("tp4")  # a group this host lacks stays a name: the image's own group of that name, if any
    assert missing.returncode == 0, missing.stderr
    assert "--group-add 44 --group-add rdma " in missing.stdout


def test_run_sh_passes_a_device_it_gives_already_once_when_devices_extra_names_it_too(tmp_path):
    # a ROCm docker run's --device /dev/kfd copied into devices.extra (the plan takes it: not a GPU's node), and
    # /dev/infiniband's own node on an rdma profile: run.sh passed docker each device twice
    from .test_publish import METADATA, make_release

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"].update(vendor="amd", devices={"extra": ["/dev/kfd", "/dev/mkfd"], "groups": []},
                                       topology={"nodes": 2, "network": "host", "rdma": True, "master_port": 20000})
    metadata["profiles"]["tp4"].update(vendor="hygon", devices={"extra": ["/dev/kfd", "/dev/infiniband/uverbs0"],
                                                                "groups": []})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    fake_bin = _fake_getent(tmp_path, {"video": 44})

    def run(*args):
        return subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", *args], capture_output=True, text=True,
                              env={"PATH": f"{fake_bin}:/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "n0"})

    amd = run("tp2")
    assert amd.returncode == 0, amd.stderr
    assert amd.stdout.count("--device /dev/kfd ") == 1 and amd.stdout.count("--device /dev/infiniband") == 1
    assert "--device /dev/mkfd " in amd.stdout
    hygon = run("tp4")  # no rdma: its extra /dev/infiniband/uverbs0 is its own to give
    assert hygon.returncode == 0, hygon.stderr
    assert hygon.stdout.count("--device /dev/kfd ") == 1 and "--device /dev/infiniband/uverbs0 " in hygon.stdout
    guide = (folder / "README-DIST.md").read_text()  # the devices run.sh gives, each once
    assert "AMD (/dev/kfd, /dev/dri/renderD*), `/dev/mkfd`, RDMA (/dev/infiniband) |" in guide


@pytest.mark.parametrize("image, takes", [
    ("demo-llm:1.3.1", True), ("localhost:5000/team/demo-llm:1.3.1", True), ("Registry.Example:443/demo:v1", True),
    ("demo-llm@sha256:" + "a" * 64, True), ("demo-llm:1.3.1@sha256:" + "a" * 64, True), ("a__b/c--d.e:T_1", True),
    ("Demo-LLM:1.3.1", False), ("team/Demo:1", False), ("demo:1.3.1@sha256:" + "A" * 64, False),
    ("demo@sha256:abc", False), ("demo@md5:" + "a" * 32, False), ("demo:.1", False), ("demo:" + "1" * 129, False),
    ("demo..llm:1", False), ("demo._llm", False), ("demo/", False), ("/demo", False), ("demo//llm", False),
    ("localhost:/demo", False), ("localhost:50a0/demo", False), (".host/demo", False), ("demo___llm", False),
    ("demo:1:2", False), ("demo-llm:", False), ("demo-llm@", False), ("my_host.com/x", False), ("-h.com/x", False),
    ("h-.com/x", False), ("MyHost/demo:1", True), ("a.b-c.example:5000/x/y:1", True),
])
def test_run_sh_takes_exactly_the_image_references_the_engine_takes(tmp_path, image, takes):
    # upper case in a repository, or a short digest, passed the old character check and failed as the engine's exit 125
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "tp1"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "IMAGE": image})
    if takes:
        assert run.returncode == 0 and run.stdout.rstrip().rstrip("'").endswith(image), run.stderr
    else:
        assert run.returncode == 2 and "IMAGE must be an image reference like demo-llm:1.3.1" in run.stderr, run.stderr


@pytest.mark.parametrize("name, value", [("PORT", "00080"), ("PORT", "08080"), ("NODE_RANK", "00")])
def test_run_sh_refuses_numbers_with_leading_zeros(tmp_path, name, value):
    from .test_publish import METADATA, make_release

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"]["topology"] = {"nodes": 2, "network": "host"}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "tp2"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "NODE_RANK": "1", "MASTER_ADDR": "n0", name: value})
    assert run.returncode == 2 and f"{name} must be a number from" in run.stderr, run.stderr


# --- 7. notes: attachments, changelog, known limits, external artifacts ----------------------------


def test_notes_carry_attachments_and_external_artifacts_and_verify_checks_copies(tmp_path, cli):
    from unibake.notes import Attachment, External, Notes

    from .test_publish import METADATA, make_release

    results = tmp_path / "results.json"
    results.write_text('{"accuracy": 0.95}\n')
    weights = tmp_path / "w" / "model.bin"
    weights.parent.mkdir()
    weights.write_bytes(b"weights" * 100)
    from unibake.inputs import read_source

    notes = Notes(changelog="- faster\n", known_limits="- none known\n",
                  attachments=(Attachment(name="results.json", file=read_source(tmp_path, "results.json", "x").files[0]),),
                  external=(External(name="model.bin", bytes=700,
                                     sha256=hashlib.sha256(b"weights" * 100).hexdigest()),))
    folder, _ = make_release(tmp_path / "release", metadata=METADATA, notes=notes)
    text = (folder / "RELEASE_NOTES.md").read_text()
    assert "## What changed\n\n- faster\n" in text and "## Known limits\n\n- none known\n" in text
    assert "| [results.json](results.json) | 19 |" in text and "| `model.bin` | 700 |" in text
    # the command the notes give: "verify . --external PATH" run where build.py is (unibake's project) checked
    # the project's folder, not the release's
    assert " ".join(text.split()).count("`python build.py verify DIR --external PATH`, run in unibake's project "
                                        "(DIR: this release's folder; PATH: a file, or the folder that holds them)") == 1
    assert "verify . " not in text
    assert (folder / "results.json").read_text() == '{"accuracy": 0.95}\n'
    assert "  results.json\n" in (folder / "SHA256SUMS").read_text()
    assert cli("verify", str(folder), "--external", str(weights)).code == 0
    assert cli("verify", str(folder), "--external", str(weights.parent)).code == 0
    weights.write_bytes(b"weights" * 99 + b"WEIGHTS")
    bad = cli("verify", str(folder), "--external", str(weights))
    assert bad.code == 3 and "model.bin: external check failed: sha256" in bad.error_lines[-1]
    other = tmp_path / "other.bin"
    other.write_bytes(b"x")
    assert "not an artifact of this release" in cli("verify", str(folder), "--external", str(other)).err


@pytest.mark.parametrize("key,name", [("changelog", "CHANGELOG.md"), ("attachments", "results.json")])
def test_a_finding_in_the_notes_files_is_said_at_the_plan_naming_the_repository_file(busybox_product, key, name):
    # it failed the release at publish, after the build and the gates, naming RELEASE_NOTES.md:23
    from unibake.errors import VerificationError

    notes = busybox_product.parent / "notes"
    notes.mkdir()
    (notes / name).write_text("# notes\n\n- validated on the cluster at 192.168.1.20\n")
    value = f"[notes/{name}]" if key == "attachments" else f"notes/{name}"
    append(busybox_product / "product.yaml", f"notes: {{{key}: {value}}}\n")
    with pytest.raises(VerificationError, match=rf"^sanitisation: notes/{name}:3: private network address .* in "
                                                r"the notes' files; remove it"):
        make_plan(busybox_product, verify_lock=False)
    make_plan(busybox_product, verify_lock=False, allow=(r"^192\.168\.1\.20$",))


@pytest.mark.parametrize("names", [["sbom.cdx.json"], ["provenance.intoto.json"], ["SHA256SUMS.asc"],
                                   ["SHA256SUMS.minisig"], ["provenance.intoto.json.asc"], ["sha256sums"],
                                   ["Manifest.json"], ["x.TAR.ZST"], ["results.json", "Results.json"]])
def test_an_attachment_named_like_a_file_of_the_release_folder_is_refused_at_the_plan(busybox_product, names):
    # sbom.cdx.json replaced the SBOM at publish (summed and signed as the release's); SHA256SUMS.asc stood as
    # a signature; 'sha256sums' and 'Results.json' are one file on a disk that does not tell case apart
    import re

    from unibake import provenance, sbom
    from unibake.notes import SUPPLY_CHAIN_FILES

    assert SUPPLY_CHAIN_FILES == (sbom.SBOM, provenance.PROVENANCE)
    notes = busybox_product.parent / "notes"
    notes.mkdir()
    for name in names:
        (notes / name).write_text('{"fake": true}\n')
    listed = ", ".join(f"notes/{name}" for name in names)
    append(busybox_product / "product.yaml", f"notes: {{attachments: [{listed}]}}\n")
    message = "two attachments are named Results.json" if len(names) > 1 else \
        rf"an attachment cannot be named '{re.escape(names[0])}' in the release folder"
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: {message}"):
        make_plan(busybox_product, verify_lock=False)


def test_an_attachment_rewritten_after_the_plan_is_refused_at_publish_not_published(busybox_product, tmp_path):
    # the plan hashed and scanned results.json; a benchmark job wrote it again during the build: the release
    # carried the new bytes, which no plan had read
    from unibake.errors import InputError

    from .test_publish import make_release

    notes = busybox_product.parent / "notes"
    notes.mkdir()
    (notes / "results.json").write_text('{"accuracy": 0.95}\n')
    append(busybox_product / "product.yaml", "notes: {attachments: [notes/results.json]}\n")
    plan = make_plan(busybox_product, verify_lock=False)
    (notes / "results.json").write_text('{"accuracy": 0.40}\n')
    with pytest.raises(InputError, match=r"^attachment 'notes/results\.json' changed after the plan read it \(sha256 "
                                         r"[0-9a-f]{12}, now [0-9a-f]{12}\); the release carries the files the plan "
                                         r"read and scanned: run again$"):
        make_release(tmp_path / "release", notes=plan.notes)
    assert not (tmp_path / "release" / "1.3.1").exists()
    (notes / "results.json").write_text('{"accuracy": 0.95}\n')  # as planned: published
    folder, _ = make_release(tmp_path / "release", notes=plan.notes)
    assert (folder / "results.json").read_text() == '{"accuracy": 0.95}\n'


def test_the_notes_show_env_changes_key_by_key_and_overlays_by_name(tmp_path):
    from .test_publish import METADATA, make_release

    before = json.loads(json.dumps(METADATA))
    before["profiles"]["tp1"]["env"] = {"NCCL_ALGO": "Tree", "OLD": "1", "SAME": "x"}
    before["components"].append({"kind": "overlay", "name": "adapter", "version": "87 files", "digest": "d" * 64,
                                 "profile": ""})
    make_release(tmp_path / "release", "1.3.0", before)
    after = json.loads(json.dumps(before))
    after["profiles"]["tp1"]["env"] = {"NCCL_ALGO": "Ring|Tree", "NEW": "`x`", "SAME": "x"}
    after["components"][-1]["digest"] = "e" * 64
    folder, _ = make_release(tmp_path / "release", "1.3.1", after)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "| overlay `adapter` | all | `87 files dddddddddddd` | `87 files eeeeeeeeeeee` |" in notes
    assert "| `NCCL_ALGO` | `Tree` | `Ring\\|Tree` |" in notes  # a '|' cannot split the table
    assert "| `NEW` | (unset) | `` `x` `` |" in notes and "| `OLD` | `1` | (removed) |" in notes
    assert "SAME" not in notes.split("keys changed")[1]
    assert f"3 keys, `{fingerprint(after['profiles']['tp1']['env'])[:12]}`" in notes


def test_the_notes_show_keys_added_to_a_profile_whose_previous_release_recorded_an_empty_env(tmp_path):
    # the previous manifest says "env": {} for tp1: that is an env of 0 keys, not an env never recorded,
    # so the key the new release adds is listed (it read "not recorded" and hid the new key)
    from .test_publish import METADATA, make_release

    before = json.loads(json.dumps(METADATA))
    before["profiles"]["tp1"]["env"] = {}
    make_release(tmp_path / "release", "1.3.0", before)
    assert json.loads((tmp_path / "release/1.3.0/manifest.json").read_text())["profiles"]["tp1"]["env"] == {}
    after = json.loads(json.dumps(before))
    after["profiles"]["tp1"]["env"] = {"NEW": "1"}
    folder, _ = make_release(tmp_path / "release", "1.3.1", after)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "not recorded" not in notes
    assert f"| `tp1` | 0 keys, `{fingerprint({})[:12]}` | 1 keys, `{fingerprint({'NEW': '1'})[:12]}` | 1 |" in notes
    assert "| `NEW` | (unset) | `1` |" in notes


def test_the_notes_call_a_profile_the_previous_release_did_not_have_new_not_unrecorded(tmp_path):
    from .test_publish import METADATA, make_release

    before = json.loads(json.dumps(METADATA))
    del before["profiles"]["tp1"]
    make_release(tmp_path / "release", "1.3.0", before)
    folder, _ = make_release(tmp_path / "release", "1.3.1", METADATA)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "| `tp1` | (new profile) | 0 keys," in notes and "not recorded" not in notes


@pytest.mark.parametrize("change,message", [
    (lambda p: p.update(devices={"extra": ["/dev/x; rm -rf /"], "groups": []}), "devices.extra.0"),
    (lambda p: p.update(topology={"ipc": "host", "shm_size": "1g$(id)"}), "topology.shm_size"),
    (lambda p: p.update(env={"A B": "x"}), "env key 'A B' is not a variable name"),
    (lambda p: p["smoke"].update(prompts=[{"prompt": "p", "expect": "(", "match": "regex"}]), "not a regular expression"),
])
def test_hostile_image_labels_cannot_reach_run_sh(change, message):
    """What run.sh and the gates read comes from an image's labels when releasing an image built elsewhere."""
    from unibake.errors import VerificationError
    from unibake.metadata import ImageMetadata

    from .test_publish import METADATA

    document = json.loads(json.dumps(METADATA))
    change(document["profiles"]["tp1"])
    with pytest.raises(VerificationError, match=message.replace("(", r"\(")):
        ImageMetadata.from_labels({"io.unibake.metadata": json.dumps(document)}, "evil:1")


def test_the_images_kernels_are_compiled_in_besides_the_builder_are_the_plans_toolchain_images(cli, busybox_product):
    # they are materials of the release (provenance, kit.json) like the builder; the builder is not repeated
    (busybox_product.parent / "images/k").mkdir()
    (busybox_product.parent / "images/k/k.c").write_text("int k;\n")
    append(busybox_product / "product.yaml",
           "builder: {image: 'localhost/b:1'}\n"
           "kernels:\n  - {name: a, version: '1', source: images/k}\n"
           "  - {name: b, version: '1', source: images/k, build: {image: 'localhost/rocm:6', run: 'true'}}\n"
           "  - {name: c, version: '1', source: images/k, build: {image: 'localhost/b:1', run: 'true'}}\n"
           "  - {name: d, version: '1', source: images/k, build: {image: 'localhost/cuda:12', run: 'true'}}\n")
    lock(cli, busybox_product)
    plan = make_plan(busybox_product)
    assert plan.builder_image == "localhost/b:1"
    assert plan.toolchain_images == ("localhost/cuda:12", "localhost/rocm:6")


def test_an_external_copy_is_checked_against_the_artifact_of_its_name_when_two_share_a_file_name(tmp_path, cli):
    # two shards named alike in two folders (tp1/model.bin, tp2/model.bin), and one at the top: a copy
    # of the second was checked against the first listed, and a good copy FAILED
    from unibake.notes import External, Notes

    from .test_publish import METADATA, make_release

    data = {"tp1": b"one" * 100, "tp2": b"two" * 100}

    def release(where, top: bool):
        records = [External(name="model.bin", bytes=5, sha256=hashlib.sha256(b"other").hexdigest())] if top else []
        records += [External(name=f"{p}/model.bin", bytes=len(d), sha256=hashlib.sha256(d).hexdigest())
                    for p, d in data.items()]
        return make_release(where, metadata=METADATA, notes=Notes(external=tuple(records)))[0]

    folder = release(tmp_path / "release", top=True)
    for p, d in data.items():
        (tmp_path / "w" / p).mkdir(parents=True)
        (tmp_path / "w" / p / "model.bin").write_bytes(d)
    (tmp_path / "w" / "model.bin").write_bytes(b"other")
    for p in data:
        result = cli("verify", str(folder), "--external", str(tmp_path / "w" / p / "model.bin"))
        assert result.code == 0 and f"{p}/model.bin" in result.err, result.err
    assert cli("verify", str(folder), "--external", str(tmp_path / "w" / "model.bin")).code == 0
    assert cli("verify", str(folder), "--external", str(tmp_path / "w")).code == 0
    (tmp_path / "w" / "tp2" / "model.bin").write_bytes(data["tp1"])  # tp1's shard where tp2's belongs
    bad = cli("verify", str(folder), "--external", str(tmp_path / "w" / "tp2" / "model.bin"))
    assert bad.code == 3 and "tp2/model.bin: external check failed" in bad.error_lines[-1], bad.err
    # a copy under no folder of its name, where no artifact has that name alone: whichever it copies
    folder = release(tmp_path / "other", top=False)
    loose = tmp_path / "model.bin"
    loose.write_bytes(data["tp2"])
    result = cli("verify", str(folder), "--external", str(loose))
    assert result.code == 0 and "tp2/model.bin" in result.err, result.err
    loose.write_bytes(b"neither")
    bad = cli("verify", str(folder), "--external", str(loose))
    assert bad.code == 3 and "model.bin: external check failed" in bad.error_lines[-1], bad.err


@pytest.mark.parametrize("vendor, device", [("hygon", "/dev/dri"), ("amd", "/dev/dri"), ("amd", "/dev/dri/renderD128"),
                                            ("hygon", "/dev/dri/card0"), ("nvidia", "/dev/nvidia0")])
def test_a_gpu_device_in_devices_extra_is_refused_it_would_give_gpus_gpus_did_not_choose(busybox_product, cli,
                                                                                          vendor, device):
    # a DTK or ROCm docker run's --device /dev/kfd --device /dev/dri --device /dev/mkfd copied into devices.extra:
    # run.sh gave the chosen GPUs' render nodes and then /dev/dri, every GPU of the host, to a profile of one
    append(busybox_product / "tp1.yaml", f"devices: {{vendor: {vendor}, extra: [/dev/kfd, /dev/mkfd, {device}]}}\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: {busybox_product / 'tp1.yaml'}:6: devices.extra names {device}, a GPU device: run.sh gives {'an' if vendor == 'amd' else 'a'} {vendor} "
        f"profile {'--gpus device=GPUS' if vendor == 'nvidia' else '/dev/dri/renderD<128+N> for each GPU N of GPUS'} "
        f"(GPUS=all: every GPU), so {device} would give the container GPUs GPUS did not choose; remove it"], result.err
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text().replace(f", {device}]", "]"))
    assert cli("--stage", "render", "--config", str(busybox_product)).code == 0  # /dev/kfd, /dev/mkfd: not GPUs


@pytest.mark.parametrize("line, message", [
    ("CUDA_VISIBLE_DEVICES=4,5", "env CUDA_VISIBLE_DEVICES=4,5 names GPU 4, but the container of profile 'tp2' sees "
                                 "only its 2 GPUs, numbered from 0 to 1 (run.sh gives it those of GPUS): remove it, or "
                                 "number them from 0"),
    ("HIP_VISIBLE_DEVICES=0,2", "names GPU 2"), ("ROCR_VISIBLE_DEVICES= 1 , 3", "names GPU 3"),
    ("GPU_DEVICE_ORDINAL=2,3", "env GPU_DEVICE_ORDINAL=2,3 names GPU 2"),  # ROCm's HIP reads it as HIP_VISIBLE_DEVICES
    ("CUDA_VISIBLE_DEVICES=", "env CUDA_VISIBLE_DEVICES='' hides GPUs from the engine; profile 'tp2' needs 2"),
    ("CUDA_VISIBLE_DEVICES=-1", "hides GPUs from the engine"), ("HIP_VISIBLE_DEVICES=0,-1", "hides GPUs"),
    ("CUDA_VISIBLE_DEVICES=0,,1", "env CUDA_VISIBLE_DEVICES='0,,1' hides GPUs"),  # CUDA stops at the empty item
])
def test_a_visible_devices_variable_numbering_gpus_the_container_does_not_have_is_refused(busybox_product, cli,
                                                                                          line, message):
    # a host's numbering copied from a docker run that gave every GPU: the container has only the profile's GPUs,
    # numbered from 0, so CUDA_VISIBLE_DEVICES=4,5 on a profile of 2 hid every GPU from the engine
    root = busybox_product.parent
    (root / "images/gpus.env").write_text(f"# from the old docker run\n{line}\n")
    append(busybox_product / "tp2.yaml", "env_file: images/gpus.env\n")
    result = cli("lock", "--config", str(busybox_product))  # the lock plans: refused there already
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith("error: images/gpus.env:2: env ") and message in result.error_lines[0]
    (root / "images/gpus.env").write_text("CUDA_VISIBLE_DEVICES=1,0,\nHIP_VISIBLE_DEVICES=GPU-5d2b,1\n")
    lock(cli, busybox_product)
    assert cli("--stage", "render", "--config", str(busybox_product)).code == 0  # the container's own GPUs


@pytest.mark.parametrize("line, message", [
    ("CUDA_VISIBLE_DEVICES=0", "env CUDA_VISIBLE_DEVICES=0 names 1 GPU, but profile 'tp2' needs 2: the engine would "
                               "see only that one; remove it (the container has the profile's GPUs alone), or name 2, "
                               "like 0,1"),
    ("HIP_VISIBLE_DEVICES=1,", "env HIP_VISIBLE_DEVICES=1, names 1 GPU, but profile 'tp2' needs 2"),
    ("ROCR_VISIBLE_DEVICES=GPU-5d2b", "names 1 GPU, but profile 'tp2' needs 2"),
    ("GPU_DEVICE_ORDINAL=0,00", "env GPU_DEVICE_ORDINAL=0,00 names 1 GPU"),  # GPU 0 twice
])
def test_a_visible_devices_variable_naming_fewer_gpus_than_the_profile_needs_is_refused(busybox_product, cli, line,
                                                                                         message):
    # CUDA_VISIBLE_DEVICES=0 on a profile of 2: the server started with one GPU for two tensor-parallel ranks
    root = busybox_product.parent
    (root / "images/gpus.env").write_text(f"# from a one-GPU test\n{line}\n")
    append(busybox_product / "tp2.yaml", "env_file: images/gpus.env\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith("error: images/gpus.env:2: env ") and message in result.error_lines[0]


def test_a_visible_devices_variable_naming_more_gpus_than_the_profile_has_is_warned(busybox_product, cli):
    # UUIDs (a number past the profile's count is refused): the container is given only the profile's GPUs
    root = busybox_product.parent
    (root / "images/gpus.env").write_text("CUDA_VISIBLE_DEVICES=GPU-5d2b,GPU-77a1,GPU-9c0e\n")
    append(busybox_product / "tp2.yaml", "env_file: images/gpus.env\n")
    lock(cli, busybox_product)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    warned = [line for line in result.err.splitlines() if "names 3 GPUs" in line]
    assert warned == [f"warning: {busybox_product / 'tp2.yaml'}: env CUDA_VISIBLE_DEVICES=GPU-5d2b,GPU-77a1,GPU-9c0e "
                      "names 3 GPUs, more than the 2 of profile tp2: its container is given only its 2 (run.sh's "
                      "GPUS), and CUDA and ROCm stop at the first named GPU the container lacks, hiding those after "
                      "it; name the profile's GPUs alone"], result.err


def test_an_env_files_quoted_value_is_kept_as_docker_keeps_it_with_one_warning_naming_file_line_and_key(
        busybox_product, cli):
    # KEY="x" from a file written for a shell or docker compose: docker run --env-file (and the image's ENV) keep
    # the quotes, so the engine got "/models/hf" with its quotes, without a word
    root = busybox_product.parent
    (root / "images/stack.env").write_text("A=1\nHF_HOME=\"/models/hf\"\nB='x'\nC=\"a\" \"b\"\nD=\"\n")
    append(busybox_product / "tp2.yaml", "env_file: images/stack.env\n")
    lock(cli, busybox_product)
    assert make_plan(busybox_product).profile("tp2").env["HF_HOME"] == '"/models/hf"'  # kept, as docker keeps it
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    warnings = [line for line in result.err.splitlines() if "keeps its quotes" in line]
    assert warnings == [
        "warning: images/stack.env:2: HF_HOME=\"/models/hf\" keeps its quotes (and 2 more keys of this file), as "
        "docker run --env-file does (a shell or docker compose would strip it): the engine gets it as part of the "
        "value; remove it unless the engine needs it"], result.err
    # a comment after the value, and a trailing space, are the value's too
    for text, kept in (("NCCL_ALGO=Ring # faster here\nB=2\n", "NCCL_ALGO=Ring # faster here keeps the comment "
                                                                   "'# faster here', as docker"),
                       ("B=2\nNCCL_ALGO=Ring \n", "images/stack.env:2: NCCL_ALGO=Ring  keeps its trailing space, as")):
        (root / "images/stack.env").write_text(text)
        lock(cli, busybox_product)
        warned = [line for line in cli("--stage", "render", "--config", str(busybox_product)).err.splitlines()
                  if "as docker run --env-file does" in line]
        assert len(warned) == 1 and kept in warned[0], warned
    (root / "images/stack.env").write_text("A=1\nD=\"\nE=say \"hi\"\nF=a#b\n")  # nothing a shell would strip
    lock(cli, busybox_product)
    assert "as docker run --env-file does" not in cli("--stage", "render", "--config", str(busybox_product)).err


def test_a_tune_cache_past_64_mib_is_checked_too_and_one_past_the_limit_is_refused(busybox_product):
    # a tune cache over 64 MiB was baked without being parsed: a NaN (or a cut-short end) in it passed
    from unibake.plan import MAX_TUNE_JSON

    big = busybox_product.parent / "images/tune/tp1/cache-2.json"
    entry = '"{}": {{"BLOCK_SIZE_M": 64, "num_warps": 4, "score": 0.5}},\n'
    with open(big, "w") as fh:
        fh.write("{" + "".join(entry.format(i) for i in range((65 << 20) // len(entry))) + '"last": NaN}\n')
    assert big.stat().st_size > 65 << 20
    with pytest.raises(InputError, match=r"cache-2\.json:\d+: tune cache of profile 'tp1' holds NaN, which is not "):
        make_plan(busybox_product, verify_lock=False)
    with open(big, "w") as fh:  # past the limit (sparse: nothing written): refused, not baked unread
        fh.truncate(MAX_TUNE_JSON + 1)
    with pytest.raises(InputError) as refused:
        make_plan(busybox_product, verify_lock=False)
    assert str(refused.value) == (
        f"images/tune/tp1/cache-2.json: tune cache of profile 'tp1' is {MAX_TUNE_JSON + 1} bytes, more than the "
        "256 MiB unibake reads to check a tune cache's JSON; split it, or keep it out of tune_caches.source")


@pytest.mark.parametrize("bom", [b"\xff\xfe", b"\xfe\xff"])
def test_an_env_file_or_profile_saved_as_utf16_says_so(busybox_product, cli, bom):
    # Windows editors save "Unicode" as UTF-16: the error said only "invalid start byte at byte 0"
    root = busybox_product.parent
    codec = "utf-16-le" if bom == b"\xff\xfe" else "utf-16-be"
    (root / "images/win.env").write_bytes(bom + "NCCL_DEBUG=INFO\r\n".encode(codec))
    append(busybox_product / "tp2.yaml", "env_file: images/win.env\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: {root / 'images/win.env'}: not UTF-8 text (invalid start byte at byte 0); it is UTF-16 (its first "
        "bytes are a UTF-16 byte-order mark): save it as UTF-8"], result.err
    (busybox_product / "tp3.yaml").write_bytes(bom + "profile: tp3\ngpus: 1\n".encode(codec))
    (root / "images/win.env").write_text("NCCL_DEBUG=INFO\r\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and len(result.error_lines) == 1 and "tp3.yaml:1: not UTF-8 text" in result.err
    assert result.error_lines[0].endswith("; it is UTF-16 (its first bytes are a UTF-16 byte-order mark): save it as "
                                          "UTF-8"), result.err


def test_a_multi_node_profile_whose_master_port_is_the_engines_port_is_refused(busybox_product, cli, tmp_path):
    # on the host's network the rank-0 engine and the rendezvous both listened on it: one failed to bind at start
    from .test_publish import METADATA, make_release

    append(busybox_product / "tp2.yaml", "topology: {nodes: 2, master_port: 30000}\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: {busybox_product / 'tp2.yaml'}:7: topology.master_port 30000 is launch.port too: on 2 nodes the "
        "container shares the host's network, where the engine and the ranks' rendezvous cannot both listen on one "
        "port; choose another master_port"], result.err
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp2"]["topology"] = {"nodes": 2, "network": "host", "master_port": 29500}
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    for env in ({"PORT": "29500"}, {"MASTER_PORT": "30000"}):
        run = subprocess.run(["sh", str(folder / "run.sh"), "--dry-run", "tp2"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "n0", **env})
        assert run.returncode == 2 and run.stderr == (
            f"error: MASTER_PORT and PORT are both {env.get('PORT', '30000')}: on the host's network the engine and "
            "the rendezvous need a port each\n"), run.stderr


def test_run_sh_gives_groups_by_this_hosts_number_the_image_need_not_know_their_names(tmp_path):
    # --group-add render: the engine looks the name up in the image's /etc/group, which a Debian or Ubuntu
    # image lacks ("Unable to find group render"), and the device nodes belong to the host's render GID anyway
    from .test_publish import METADATA, make_release

    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"].update(vendor="hygon", devices={"extra": ["/dev/mkfd"], "groups": ["render", "39",
                                                                                                   "hpc"]})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "getent").write_text('#!/bin/sh\ncase "$2" in video) echo video:x:44: ;; render) echo render:x:993:u ;;'
                                    ' 39) echo dip:x:39: ;; *) exit 2 ;; esac\n')
    (bin_dir / "getent").chmod(0o755)
    run = subprocess.run(["/bin/sh", str(folder / "run.sh"), "--dry-run", "tp4"], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    words = run.stdout.split()
    assert [words[i + 1] for i, w in enumerate(words) if w == "--group-add"] == ["44", "993", "39", "hpc"], run.stdout
    bare = tmp_path / "bare"  # a host without getent at all (a minimal or non-glibc one): its /etc/group, else names
    bare.mkdir()
    for tool in ("sed", "sort", "uniq", "head", "tr", "grep", "cut", "cat", "printf"):
        found = next((d / tool for d in (Path("/usr/bin"), Path("/bin")) if (d / tool).exists()), None)
        if found:
            (bare / tool).symlink_to(found)
    run = subprocess.run(["/bin/sh", str(folder / "run.sh"), "--dry-run", "tp4"], capture_output=True, text=True,
                         env={"PATH": str(bare)})
    assert run.returncode == 0 and run.stderr == "", run.stderr
    words = run.stdout.split()
    host = {line.split(":")[0]: line.split(":")[2] for line in Path("/etc/group").read_text().splitlines()
            if line.count(":") >= 3}
    assert [words[i + 1] for i, w in enumerate(words) if w == "--group-add"] == [
        host.get("video", "video"), host.get("render", "render"), "39", "hpc"]


@pytest.mark.parametrize("key", ["PWD", "IFS", "PPID", "OPTIND"])
@pytest.mark.parametrize("where", ["product.yaml", "tp2.yaml"])
def test_an_env_key_the_shell_sets_itself_is_refused_it_never_reached_the_engine(busybox_product, cli, tmp_path,
                                                                                 key, where):
    # an env file written by `env` in a working container: PWD=/workspace passed the plan and never reached the
    # engine (the image's ENV is replaced as /bin/sh starts; a profile's value is given only where none is set)
    (busybox_product.parent / "images/dump.env").write_text(f"NCCL_DEBUG=INFO\n{key}=/workspace\n")
    append(busybox_product / where, "env_file: images/dump.env\n")
    result = cli("lock", "--config", str(busybox_product))
    assert result.code == 2 and result.error_lines == [
        f"error: images/dump.env:2: env key '{key}' is the shell's own: the entrypoint's /bin/sh sets it, so this "
        "value would not reach the engine (an env file written by `env`?); remove it"], result.err
    if where == "tp2.yaml" and key == "PWD":  # what the entrypoint did with it: nothing
        (busybox_product.parent / "images/dump.env").write_text("NCCL_DEBUG=INFO\n")
        tp2 = busybox_product / where
        tp2.write_text(tp2.read_text().replace("env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring, PWD_X: /workspace}"))
        lock(cli, busybox_product)
        text = render(make_plan(busybox_product)).entrypoint.replace("PWD_X", "PWD")
        script = tmp_path / "entrypoint.sh"
        script.write_text(text)
        for shell in ("sh", "busybox"):
            run = subprocess.run([shell, *(["sh"] if shell == "busybox" else []), str(script), "sh", "-c",
                                  'printf %s "$PWD"'], capture_output=True, text=True, cwd=tmp_path,
                                 env={"PROFILE": "tp2", "PATH": "/usr/bin:/bin"})
            assert run.returncode == 0 and run.stdout == str(tmp_path), (shell, run)


@pytest.mark.parametrize("kind", ["env file", "patch"])
def test_an_env_file_or_patch_edited_between_its_hash_and_its_read_is_refused(busybox_product, monkeypatch, kind):
    # each is hashed (for the lock and the provenance), then read again by its path to be parsed: an edit in
    # between was baked (an env value, a patched engine file) while the lock passed on the hash of the old file
    import unibake.envfile
    import unibake.patches

    root = busybox_product.parent
    if kind == "env file":
        rel, module, edited = "images/tp1.env", unibake.envfile, "NCCL_ALGO=Tree\nNCCL_DEBUG=TRACE\n"
        (root / rel).write_text("NCCL_ALGO=Tree\n")
        append(busybox_product / "tp1.yaml", f"env_file: {rel}\n")
    else:
        rel, module, edited = "images/patches/fix.patch", unibake.patches, PATCH.replace("A patched", "An edited")
        (root / "images/patches").mkdir()
        (root / rel).write_text(PATCH)
        append(busybox_product / "product.yaml", f"patches:\n  - {{file: {rel}}}\n")
    make_plan(busybox_product, verify_lock=False)
    hash_it = module.read_source

    def an_editor_meanwhile(*args, **kwargs):  # the real hashing; then someone saves the file
        source = hash_it(*args, **kwargs)
        if source.path == rel:
            (root / rel).write_text(edited)
        return source

    monkeypatch.setattr(module, "read_source", an_editor_meanwhile)
    with pytest.raises(InputError, match=rf"^input '{rel}' changed while it was read \(after it was hashed\); run again"):
        make_plan(busybox_product, verify_lock=False)


def test_an_env_value_a_shell_would_expand_is_warned_once_naming_where_it_is_written(busybox_product, cli):
    # found by probing: env {HF_HOME: "${UNIBAKE_MOUNT_TARGET}/hf"} reached the engine as these characters, without a
    # word, where args expand ${NAME} and a compose or shell env file would expand it too
    root = busybox_product.parent
    (root / "images/stack.env").write_text("A=1\nLD_PRELOAD=$UNIBAKE_ROOT/x.so\n")
    append(busybox_product / "tp2.yaml", "env_file: images/stack.env\n")
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("env: {NCCL_ALGO: Tree}",
                                           'env: {NCCL_ALGO: Tree, HF_HOME: "${UNIBAKE_MOUNT_TARGET}/hf", B: "a $ b"}'))
    lock(cli, busybox_product)
    assert make_plan(busybox_product).profile("tp1").env["HF_HOME"] == "${UNIBAKE_MOUNT_TARGET}/hf"  # as written
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    assert [line for line in result.err.splitlines() if "env values are never expanded" in line] == [
        f"warning: {busybox_product}/tp1.yaml:4: env HF_HOME=${{UNIBAKE_MOUNT_TARGET}}/hf is passed as it is written: "
        "env values are never expanded ($NAME, ${NAME} and $(...) reach the engine as these characters); write the value itself",
        "warning: images/stack.env:2: env LD_PRELOAD=$UNIBAKE_ROOT/x.so is passed as it is written: "
        "env values are never expanded ($NAME, ${NAME} and $(...) reach the engine as these characters); write the value itself"], result.err
