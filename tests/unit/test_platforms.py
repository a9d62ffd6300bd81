"""Platforms without an engine: what the YAML and --platform accept, the names an arm64 release gets,
the config normalise writes, and an arm64 image released through every stage on fake engines."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from unibake.builder import build_image
from unibake.errors import BuildFailed, InputError
from unibake.manifest import load_manifest, parse_manifest
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL
from unibake.pipeline import ARCHIVE, Request, run_stages, selection
from unibake.plan import make_plan
from unibake.platforms import KNOWN, parse, parse_options
from unibake.render import render
from unibake.targets import check_base
from unibake.verify import verify_folder

from unibake.engine import RunOutcome

from ..fake_engine import FakeEngine
from ..savefixtures import DEFAULT_LAYERS
from .test_normalise import EPOCH, built, engine, normalise  # noqa: F401 - the fixture is used by name
from .test_pipeline import Quiet
from .test_smoke import metadata, server  # noqa: F401 - the fixture is used by name
from .test_verify import rewrite_sums

AMD64, ARM64 = KNOWN["linux/amd64"], KNOWN["linux/arm64"]
BUSYBOX_BASE = 'base: {image: "localhost/unibake-busybox:1"}'
WITH_ARM64_BASE = ('base: {image: "localhost/unibake-busybox:1", '
                   'platforms: {linux/arm64: "localhost/unibake-busybox:1-arm64"}}')


def with_arm64(profiles: Path, extra: str = "") -> Path:
    product = profiles / "product.yaml"
    product.write_text(product.read_text().replace(BUSYBOX_BASE, WITH_ARM64_BASE + extra))
    return profiles


# --- what is accepted --------------------------------------------------------------------------


def test_platforms_are_written_as_docker_writes_them_one_or_several():
    assert parse("linux/arm64", "x") == (ARM64,)
    assert parse("linux/arm64/v8", "x") == (ARM64,)
    assert parse("linux/amd64,linux/arm64", "x") == (AMD64, ARM64)
    assert parse_options(["linux/arm64", "linux/amd64"]) == (ARM64, AMD64)
    assert parse_options([]) == ()
    # a list written by hand, a space after the comma (docker buildx trims it): refused as no platform before
    assert parse("linux/amd64, linux/arm64", "x") == (AMD64, ARM64)
    assert parse_options(["linux/arm64 ,\tlinux/amd64"]) == (ARM64, AMD64)


@pytest.mark.parametrize("text,message", [
    ("linux/riscv64", "platform 'linux/riscv64' is not one of linux/amd64, linux/arm64"),
    ("arm64", "platform 'arm64' is not one of"),
    ("linux/arm64,linux/arm64/v8", "platform linux/arm64 is named twice"),
    ("linux/amd64,,linux/arm64", "is not one of"),
    ("linux/amd64, linux/amd64", "platform linux/amd64 is named twice"),
])
def test_an_unknown_or_repeated_platform_is_refused(text, message):
    with pytest.raises(InputError, match=message):
        parse(text, "--platform")


def test_the_default_is_the_hosts_and_an_unknown_host_must_name_one(monkeypatch, busybox_product):
    import unibake.platforms as platforms

    monkeypatch.setattr(platforms.os, "uname", lambda: type("U", (), {"machine": "aarch64"})())
    assert make_plan(with_arm64(busybox_product)).platform == ARM64
    monkeypatch.setattr(platforms.os, "uname", lambda: type("U", (), {"machine": "s390x"})())
    with pytest.raises(InputError, match="this machine is s390x, for which unibake has no default platform"):
        make_plan(busybox_product)
    assert make_plan(busybox_product, platform=AMD64).platform == AMD64  # --platform needs no host default


def test_the_yaml_names_the_platform_and_the_command_line_overrides_it(busybox_product):
    with_arm64(busybox_product, "\nplatform: linux/arm64")
    plan = make_plan(busybox_product)
    assert (plan.platform, plan.tag, plan.base_image) == (ARM64, "unibake-test:0.1.0-arm64",
                                                          "localhost/unibake-busybox:1-arm64")
    plan = make_plan(busybox_product, platform=AMD64)
    assert (plan.platform, plan.tag, plan.base_image) == (AMD64, "unibake-test:0.1.0", "localhost/unibake-busybox:1")


def test_a_bad_platform_in_the_yaml_names_the_file_and_line(cli, busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "platform: linux/sparc\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2
    line = len(product.read_text().splitlines())
    assert len(result.error_lines) == 1 and result.error_lines[0].endswith(
        f"product.yaml:{line}: key 'platform' has an invalid value 'linux/sparc': expected linux/amd64, linux/arm64, "
        "or both comma-separated")


def test_a_platform_list_with_spaces_in_the_yaml_is_each_platform(busybox_product):
    with_arm64(busybox_product, '\nplatform: "linux/amd64, linux/arm64"')
    from unibake.plan import product_platforms
    assert product_platforms(busybox_product) == (AMD64, ARM64)


def test_a_platforms_key_written_with_arm64s_variant_names_that_platform_everywhere(busybox_product):
    # base.platforms, builder.platforms and a kernel's platforms took linux/arm64 only: linux/arm64/v8, as docker
    # writes arm64 with its variant (and as platform: takes it), was refused as no platform
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        BUSYBOX_BASE, 'base: {image: "localhost/unibake-busybox:1", '
                      'platforms: {linux/arm64/v8: "localhost/unibake-busybox:1-arm64"}}'))
    assert make_plan(busybox_product, platform=ARM64, verify_lock=False).base_image == \
        "localhost/unibake-busybox:1-arm64"
    assert make_plan(busybox_product, platform=AMD64, verify_lock=False).base_image == "localhost/unibake-busybox:1"
    product.write_text(product.read_text().replace(
        "platforms: {linux/arm64/v8: ", 'platforms: {linux/arm64: "localhost/other:1", linux/arm64/v8: '))
    for platform in (ARM64, AMD64):  # (the amd64 plan too: the lock plans both)
        with pytest.raises(InputError, match=r"product\.yaml:\d+: linux/arm64 and linux/arm64/v8 are the same "
                                             r"platform; keep one"):
            make_plan(busybox_product, platform=platform, verify_lock=False)


def test_a_kernels_platforms_key_written_with_arm64s_variant_takes_its_file(demo_product, cli):
    product = demo_product / "product.yaml"
    assert "linux/arm64: " in product.read_text()
    product.write_text(product.read_text().replace("linux/arm64: ", "linux/arm64/v8: "))
    plan = make_plan(demo_product, platform=ARM64, verify_lock=False)  # base, builder and kernel: all three
    assert plan.base_image == "localhost/unibake-demo-base:bookworm-arm64"
    assert {k.builder for k in plan.kernels if not k.prebuilt} == {"localhost/unibake-demo-builder:bookworm-arm64"}
    wheel = next(k for k in plan.kernels if k.name == "demo_quant").prebuilt.file.path
    assert wheel == "images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_aarch64.whl"
    (demo_product / "inputs.lock").unlink()
    assert cli("lock", "--config", str(demo_product)).code == 0
    assert wheel in (demo_product / "inputs.lock").read_text()
    make_plan(demo_product, platform=ARM64)


def test_a_profile_cannot_have_its_own_platform(busybox_product):
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text() + "platform: linux/arm64\n")
    with pytest.raises(InputError, match="key 'platform' can only be set in product.yaml"):
        make_plan(busybox_product)


def test_a_required_digest_applies_to_the_base_of_each_platform(busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        BUSYBOX_BASE, 'base: {image: "x@sha256:' + "a" * 64 + '", require_digest: true, '
                      'platforms: {linux/arm64: "localhost/unibake-busybox:1-arm64"}}'))
    assert make_plan(busybox_product, platform=AMD64, verify_lock=False).base_image.startswith("x@sha256:")
    with pytest.raises(InputError, match=r"base\.platforms\.linux/arm64 'localhost/unibake-busybox:1-arm64' is given "
                                         r"by tag, but base\.require_digest is set"):
        make_plan(busybox_product, platform=ARM64)



def test_a_required_digest_takes_a_platforms_local_base_pinned_by_its_image_id(busybox_product):
    # the error told to pin a local arm64 base "with base.id", which pins base.image only: the same error again,
    # and an image ID in base.platforms, which FROM takes as base.id's, was refused as "given by tag"
    product = busybox_product / "product.yaml"
    image_id = "sha256:" + "b" * 64
    product.write_text(product.read_text().replace(
        BUSYBOX_BASE, 'base: {image: "localhost/unibake-busybox:1", id: "sha256:' + "a" * 64 + '", '
                      'require_digest: true, platforms: {linux/arm64: "localhost/unibake-busybox:1-arm64"}}'))
    with pytest.raises(InputError) as refused:
        make_plan(busybox_product, platform=ARM64)
    assert str(refused.value).endswith(
        "base.platforms.linux/arm64 'localhost/unibake-busybox:1-arm64' is given by tag, but base.require_digest is "
        "set: pin it as name@sha256:<digest> (a registry image) or as base.platforms.linux/arm64: sha256:<image ID> "
        "(a local image; base.id pins base.image only)")
    product.write_text(product.read_text().replace('"localhost/unibake-busybox:1-arm64"', f'"{image_id}"'))
    plan = make_plan(busybox_product, platform=ARM64, verify_lock=False)
    assert plan.base_image == image_id
    assert f"FROM {image_id}\n" in render(plan).dockerfile

def test_an_arm64_render_has_its_own_name_base_and_machine_check(busybox_product):
    amd64 = render(make_plan(with_arm64(busybox_product), platform=AMD64))
    arm64 = render(make_plan(busybox_product, platform=ARM64))
    assert (amd64.selection, arm64.selection) == ("all", "all-arm64")  # rendered copies and build cache apart
    assert "FROM localhost/unibake-busybox:1-arm64\n" in arm64.dockerfile
    assert 'if [ "$machine" = aarch64 ]; then' in arm64.self_check
    assert 'if [ "$machine" = x86_64 ]; then' in amd64.self_check
    assert json.loads(next(f.data for f in arm64.files if f.name == "ctx/upper/meta/release.json"))["platform"] == \
        "linux/arm64"


def test_one_command_renders_both_platforms(cli, busybox_product):
    with_arm64(busybox_product, "\nplatform: linux/amd64,linux/arm64")
    result = cli("--json", "--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    rendered = json.loads(result.out)["rendered"]
    assert [r["image"] for r in rendered] == ["unibake-test:0.1.0", "unibake-test:0.1.0-arm64"]
    folder = busybox_product.parent / "dockerfiles/rendered"
    assert sorted(p.name for p in folder.iterdir()) == ["all", "all-arm64"]
    assert "==> platform linux/arm64 (2 of 2)" in result.err


def test_commands_that_build_one_image_take_one_platform(cli, busybox_product):
    result = cli("repro", "--config", str(busybox_product), "--platform", "linux/amd64,linux/arm64")
    assert result.code == 2
    assert result.error_lines == ["error: --platform: repro builds for one platform, not 2"]


# --- the engine's side, faked ----------------------------------------------------------------


def test_normalise_records_the_platform_and_leaves_an_amd64_config_as_it_was(engine):
    def build(tag):  # the same build under three tags: each normalise rewrites what its tag names
        return built(engine, tag, 1700000100, "2024-01-01T00:00:00Z")

    plain = normalise(engine, build("demo:plain"))
    assert normalise(engine, build("demo:amd64"), platform=AMD64).image_id == plain.image_id  # unchanged
    arm64 = normalise(engine, build("demo:arm64"), platform=ARM64)
    config = engine.images[arm64.image_id].parsed
    assert (config["architecture"], config["os"], config["variant"]) == ("arm64", "linux", "v8")
    assert arm64.platform == "linux/arm64" and plain.platform == "linux/amd64"
    assert arm64.image_id != plain.image_id and arm64.diff_ids == plain.diff_ids


def test_a_base_image_of_another_platform_is_refused_before_building(busybox_product):
    fake = FakeEngine()
    fake.add({"architecture": "amd64", "os": "linux"}, [b"x" * 1024], tag="localhost/unibake-busybox:1-arm64")
    plan = make_plan(with_arm64(busybox_product), platform=ARM64)
    with pytest.raises(InputError, match=r"the base image localhost/unibake-busybox:1-arm64 is linux/amd64, not "
                                         r"linux/arm64: set base\.platforms\.linux/arm64 in product\.yaml"):
        check_base(fake, plan)
    fake.add({"architecture": "amd64", "os": "linux"}, [b"x" * 1024], tag="localhost/unibake-busybox:1")
    check_base(fake, make_plan(busybox_product, platform=AMD64))


def test_an_image_the_dockerfile_builds_from_that_the_engine_lacks_is_refused_before_building(busybox_product, tmp_path,
                                                                                              cli):
    # the build tried to pull it and failed at its FROM with the registry's error, not saying it is not local
    from unibake.pipeline import BUILD
    from unibake.targets import run_platforms

    fake = FakeEngine()
    with pytest.raises(InputError, match=r"^base image localhost/unibake-busybox:1 is not in the engine "
                                         r"\(fake://engine\): unibake builds on local images and pulls none"):
        check_base(fake, make_plan(busybox_product, platform=AMD64))
    fake.add({"architecture": "amd64", "os": "linux"}, [b"x" * 1024], tag="localhost/unibake-busybox:1")
    (busybox_product / "product.yaml").write_text((busybox_product / "product.yaml").read_text().replace(
        BUSYBOX_BASE, BUSYBOX_BASE + '\nbuilder: {image: "localhost/unibake-demo-builder:bookworm"}'))
    (busybox_product.parent / "kernels" / "k").mkdir(parents=True)
    (busybox_product.parent / "kernels" / "k" / "k.c").write_text("int k(void) { return 1; }\n")
    append = "kernels:\n  - {name: k, version: '1.0', source: kernels/k}\n"
    (busybox_product / "product.yaml").write_text((busybox_product / "product.yaml").read_text() + append)
    with_arm64(busybox_product)
    assert cli("lock", "--config", str(busybox_product)).code == 0
    plan = make_plan(busybox_product, platform=AMD64)
    assert plan.from_images == (("builder image", "localhost/unibake-demo-builder:bookworm"),
                                ("base image", "localhost/unibake-busybox:1"))
    with pytest.raises(InputError, match=r"^builder image localhost/unibake-demo-builder:bookworm is not in the "
                                         r"engine"):
        check_base(fake, plan)
    fake.add({"architecture": "amd64", "os": "linux"}, [b"y" * 1024], tag="localhost/unibake-demo-builder:bookworm")
    check_base(fake, plan)

    # several platforms: the arm64 base is found missing before the amd64 image is built (the fake
    # engine builds nothing: a build would fail with its EngineError)
    request = Request(env={}, cwd=tmp_path, config=busybox_product, out=tmp_path / "release", version="0.2.0")
    with pytest.raises(InputError, match=r"^base image localhost/unibake-busybox:1-arm64 is not in the engine"):
        run_platforms(selection(BUILD), request, (AMD64, ARM64), Quiet(), connect=lambda address: fake)


class NoEmulation(FakeEngine):
    """An engine whose host has no emulator: the first RUN of a foreign image cannot start."""

    def build(self, context, *, tag, buildargs, nocache, on_line, platform=None):
        raise BuildFailed("the build failed at Step 9: RUN self-check: The command returned a non-zero code: 1",
                          output=("standard_init_linux.go:228: exec user process caused: exec format error",))


def test_a_build_without_emulation_says_how_to_get_it(busybox_product):
    context = render(make_plan(with_arm64(busybox_product), platform=ARM64))
    with pytest.raises(BuildFailed, match="the engine's host cannot run linux/arm64 programs: register "
                                          "qemu-user-static with binfmt_misc"):
        build_image(context, NoEmulation(), product="unibake-test", revision="r", epoch=EPOCH,
                    platform="linux/arm64")


@pytest.fixture
def arm64_engines(server):  # noqa: F811
    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: metadata(server.server_port).model_copy(update={"platform": "linux/arm64"}).to_json(),
              PROFILES_LABEL: "tp1", "org.opencontainers.image.version": "1.0",
              "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "arm64", "variant": "v8", "os": "linux",
                "config": {"Env": ["PATH=/bin"], "Labels": labels}, "history": [{"created_by": "x"}] * 3},
               DEFAULT_LAYERS, tag="demo:1.0-arm64")
    return {None: source, "fake://verify": FakeEngine(address="fake://verify")}


def test_an_arm64_image_carries_its_platform_into_the_index_manifest_and_notes(arm64_engines, tmp_path):
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", image="demo:1.0-arm64",
                      verify_engine="fake://verify")
    results = run_stages(selection(ARCHIVE), request, Quiet(), connect=arm64_engines.__getitem__)
    assert results["image"].platform == "linux/arm64"
    folder = results["release"].folder
    assert folder.name == "1.0-arm64" and results["release"].manifest.platform == "linux/arm64"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["platform"] == "linux/arm64"
    assert "| Platform | `linux/arm64` |" in (folder / "RELEASE_NOTES.md").read_text()
    assert "should print `aarch64`" in (folder / "README-DIST.md").read_text()
    with open(folder / "demo-1.0-arm64.tar.zst", "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        index = json.loads(tar.extractfile("index.json").read())
    assert index["manifests"][0]["platform"] == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    assert not verify_folder(folder).failures

    # a manifest edited to claim another platform (its sum rewritten to match) fails the structure check
    (folder / "manifest.json").write_text(json.dumps({**manifest, "platform": "linux/amd64"}, indent=2) + "\n")
    rewrite_sums(folder, "manifest.json")
    failed = [c for c in verify_folder(folder).failures]
    assert [(c.name, c.detail) for c in failed] == [
        ("structure", "the image config is for linux/arm64, but manifest.json says linux/amd64")]


def test_a_manifest_from_before_platforms_reads_as_amd64(arm64_engines, tmp_path):
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", image="demo:1.0-arm64", roundtrip=False)
    folder = run_stages(selection(ARCHIVE), request, Quiet(), connect=arm64_engines.__getitem__)["release"].folder
    document = json.loads((folder / "manifest.json").read_text())
    del document["platform"]
    old = parse_manifest(json.dumps(document, indent=2) + "\n", "old manifest.json")
    assert old.platform == "linux/amd64" and old.metadata.platform == "linux/amd64"
    assert load_manifest(folder).platform == "linux/arm64"


def hotfix_plan(busybox_product, base_platform: str, **request):
    """The plan stage of a hotfix on a release of ``base_platform`` (the base stage's result, faked)."""
    from types import SimpleNamespace

    from unibake.pipeline import BY_NAME, Results

    base = SimpleNamespace(manifest=SimpleNamespace(platform=base_platform, profiles={"tp1": None, "tp2": None},
                                                    tag="unibake-test:0.1.0", release="0.1.0",
                                                    product="unibake-test"))
    request = Request(env={}, cwd=busybox_product.parent, config=busybox_product, version="0.1.1", **request)
    return run_stages([BY_NAME["plan"]], request, Quiet(), given=Results(values={"base": base}))["plan"]


def test_a_hotfix_is_built_for_its_base_releases_platform(busybox_product):
    plan = hotfix_plan(with_arm64(busybox_product), "linux/arm64")
    assert (plan.platform, plan.tag) == (ARM64, "unibake-test:0.1.1-arm64")
    with pytest.raises(InputError, match="release 0.1.0 is linux/arm64; a hotfix on it is built for the same "
                                         "platform, not linux/amd64"):
        hotfix_plan(busybox_product, "linux/arm64", platform="linux/amd64")


def test_a_base_image_carrying_unibakes_own_labels_is_refused_before_building(busybox_product):
    fake = FakeEngine()
    fake.add({"architecture": "amd64", "os": "linux",
              "config": {"Labels": {"io.unibake.kernel.evil": "1.0 sha256:" + "0" * 64, "maintainer": "x"}}},
             [b"x" * 1024], tag="localhost/unibake-busybox:1")
    with pytest.raises(InputError, match=r"carries unibake's own labels \(io\.unibake\.kernel\.evil\)"):
        check_base(fake, make_plan(busybox_product, platform=AMD64))


def test_a_base_image_whose_env_would_win_over_a_profiles_is_refused_before_building(busybox_product):
    # the entrypoint sets PROFILE and a profile's own env only where none is set: a base's ENV counted
    # as set, so the container ran tp2 (or the base's NCCL_ALGO) while the notes recorded tp1's Tree
    fake = FakeEngine()
    plan = make_plan(busybox_product, platform=AMD64)
    for env, says in ((["PROFILE=tp2"], r"sets PROFILE \(the default profile\)"),
                      (["NCCL_ALGO=FromBase"], r"sets NCCL_ALGO \(profile tp1's env\)")):
        fake.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin", *env]}}, [b"x" * 1024],
                 tag="localhost/unibake-busybox:1")
        with pytest.raises(InputError, match=rf"the base image localhost/unibake-busybox:1 {says} in its environment "
                                             r"\(ENV\): the release's entrypoint gives a profile's value only where "
                                             "none is set"):
            check_base(fake, plan)
    # what every profile sets alike is the image's own ENV, over the base's: no clash
    fake.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin", "SHARED_SETTING=off"]}},
             [b"x" * 1024], tag="localhost/unibake-busybox:1")
    check_base(fake, plan)


class EmulatingNothing(FakeEngine):
    """An engine whose host has no emulator for arm64: an arm64 program cannot start; builds are counted."""

    def __init__(self):
        super().__init__()
        self.built = []
        self.runner = lambda image, args, env: RunOutcome(
            exit_code=1, output="standard_init_linux.go:228: exec user process caused: exec format error"
            if image.endswith("-arm64") else "")

    def build(self, context, *, tag, buildargs, nocache, on_line, platform=None):
        self.built.append(tag)
        raise BuildFailed("the build failed at Step 9: RUN self-check: The command returned a non-zero code: 1",
                          output=("standard_init_linux.go:228: exec user process caused: exec format error",)
                          if platform == "linux/arm64" else ("built nothing: a fake engine",))


def test_several_platforms_without_emulation_are_refused_before_any_is_built(busybox_product, tmp_path):
    """``--platform linux/amd64,linux/arm64`` on an engine whose host has no arm64 emulator: amd64 was
    built (and archived, round-tripped, gated: minutes) before arm64's first RUN step failed with the
    hint. Now each platform's base is checked, and a foreign one's program run once, before any build;
    so is a base of the wrong platform."""
    from unibake.errors import UnibakeError
    from unibake.pipeline import BUILD
    from unibake.targets import run_platforms

    fake = EmulatingNothing()
    fake.add({"architecture": "amd64", "os": "linux"}, [b"x" * 1024], tag="localhost/unibake-busybox:1")
    fake.add({"architecture": "arm64", "variant": "v8", "os": "linux"}, [b"y" * 1024],
             tag="localhost/unibake-busybox:1-arm64")
    request = Request(env={}, cwd=tmp_path, config=with_arm64(busybox_product), out=tmp_path / "release",
                      require_lock=False, write_rendered=False)
    with pytest.raises(UnibakeError, match=r"^the engine at fake://engine cannot run the linux/arm64 base image "
                                           r"localhost/unibake-busybox:1-arm64 \(exec format error\); the engine's "
                                           r"host cannot run linux/arm64 programs: register qemu-user-static"):
        run_platforms(selection(BUILD), request, [AMD64, ARM64], Quiet(), connect=lambda address: fake)
    assert fake.built == []
    assert [p for p in (tmp_path / "release").iterdir() if not p.name.endswith(".lock")] == []

    fake.tags["localhost/unibake-busybox:1-arm64"] = fake.tags["localhost/unibake-busybox:1"]  # an amd64 image
    with pytest.raises(InputError, match="the base image localhost/unibake-busybox:1-arm64 is linux/amd64, not "
                                         "linux/arm64"):
        run_platforms(selection(BUILD), request, [AMD64, ARM64], Quiet(), connect=lambda address: fake)
    assert fake.built == []


def test_a_wheel_of_another_platform_is_refused_at_the_plan_as_a_library_of_one_is(demo_product):
    # the x86_64 wheel, given without platforms: for arm64, was baked into the arm64 image: its library failed
    # the self-check once built (under emulation), where a prebuilt .so of another platform is refused at the plan
    product = demo_product / "product.yaml"
    product.write_text(product.read_text().replace(
        "    platforms: {linux/arm64: images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_aarch64.whl}\n", ""))
    assert make_plan(demo_product, platform=AMD64, verify_lock=False).kernels[3].name == "demo_quant"
    with pytest.raises(InputError) as refused:
        make_plan(demo_product, platform=ARM64, verify_lock=False)
    assert str(refused.value).endswith(
        "product.yaml:30: prebuilt images/prebuilt/demo_quant-1.0.0+cpu-py3-none-linux_x86_64.whl's "
        "demo_quant/libdemo_quant.so is built for x86_64, not for aarch64, the platform's architecture; give that "
        "platform's build (a kernel's platforms: names one per platform)")
    product.write_text(product.read_text().replace("linux_x86_64.whl", "linux_aarch64.whl"))  # the arm64 one for all
    assert make_plan(demo_product, platform=ARM64, verify_lock=False).kernels[3].name == "demo_quant"
    with pytest.raises(InputError, match=r"libdemo_quant\.so is built for aarch64, not for x86_64"):
        make_plan(demo_product, platform=AMD64, verify_lock=False)
