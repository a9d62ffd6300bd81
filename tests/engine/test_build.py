"""Building the busybox-sized product on the real engine: the image contract and the cache."""

from __future__ import annotations

from pathlib import Path

from unibake.builder import build_image
from unibake.plan import make_plan
from unibake.render import render


def build(cli, profiles: Path, version: str, *extra: str):
    return cli("--stage", "build", "--config", str(profiles), "--version", version, *extra)


def test_the_unified_image_honours_profile_port_and_model_name(cli, engine, busybox_product, version, images):
    tag = f"unibake-test:{version}"
    images(tag)
    result = build(cli, busybox_product, version)
    assert result.code == 0, result.err
    info = engine.inspect_image(tag)
    assert info.labels["org.opencontainers.image.version"] == version
    assert info.labels["io.unibake.profiles"] == "tp1,tp2"
    assert info.labels["io.unibake.default-profile"] == "tp1"
    assert info.labels["org.opencontainers.image.created"].endswith("Z")
    assert info.labels["io.unibake.tune-caches.tp2"].startswith("3 sha256:")

    for profile in ("tp1", "tp2"):
        run = engine.run(tag, ["self-check"], env={"PROFILE": profile})
        assert run.exit_code == 0, run.output
        assert f"self-check[{profile}]: ok: all checks passed" in run.output

    unknown = engine.run(tag, ["self-check"], env={"PROFILE": "tp4"})
    assert unknown.exit_code == 2
    assert "error: unknown PROFILE 'tp4'; known profiles: tp1, tp2" in unknown.output

    show = 'echo "$PROFILE" "$NCCL_ALGO" "$PORT" "$MODEL_NAME" "$UNIBAKE_TUNE_DIR"'
    default = engine.run(tag, ["sh", "-c", show])
    assert default.output.split() == ["tp1", "Tree", "30000", "tiny", "/opt/unibake/profiles/tp1/tune"]
    custom = engine.run(tag, ["sh", "-c", show], env={"PROFILE": "tp2", "PORT": "8123", "MODEL_NAME": "other"})
    assert custom.output.split() == ["tp2", "Ring", "8123", "other", "/opt/unibake/profiles/tp2/tune"]


def test_a_tampered_file_fails_the_self_check_at_run_time(engine, busybox_product, version, images):
    tag = f"unibake-test:{version}"
    images(tag)
    first = build_image(render(make_plan(busybox_product, version=version)), engine, product="unibake-test",
                        revision="r", epoch=0)
    images(first.image_id)  # the second build below moves the tag away from it
    run = engine.run(tag, ["sh", "-c", "echo '{}' > /opt/unibake/profiles/tp2/tune/cache-1.json && "
                                       "/opt/unibake/meta/entrypoint.sh self-check"], env={"PROFILE": "tp2"})
    assert run.exit_code == 1
    assert "error: self-check[tp2]: files differ from meta/files.sha256: " \
           "profiles/tp2/tune/cache-1.json: FAILED" in run.output

    # The build checks the ledgers with its first profile only (one hash of a big engine folder, not one
    # per profile); that option is refused unless spelled exactly, and the default checks them.
    lines = []
    build_image(render(make_plan(busybox_product, version=version)), engine, product="unibake-test", revision="r",
                epoch=0, nocache=True, on_line=lines.append)
    assert sum("files match meta/files.sha256" in line for line in lines) == 1
    assert any("self-check[tp2]: ok: file ledgers not checked again (--skip-ledgers)" in line for line in lines)
    bogus = engine.run(tag, ["self-check", "--skip"], env={"PROFILE": "tp1"})
    assert bogus.exit_code == 1 and "error: self-check[tp1]: unknown option --skip" in bogus.output


def test_changing_one_tune_json_rebuilds_only_from_the_tune_caches_on(cli, engine, busybox_product, version,
                                                                      images):
    tag = f"unibake-test:{version}"
    images(tag)
    first = build_image(render(make_plan(busybox_product, version=version)), engine, product="unibake-test",
                        revision="r", epoch=0)
    images(first.image_id)  # the second build moves the tag away from it
    (busybox_product.parent / "images/tune/tp2/cache-2.json").write_text('{"tp2_cache": "retuned"}\n')
    assert cli("lock", "--config", str(busybox_product)).code == 0
    second = build_image(render(make_plan(busybox_product, version=version)), engine, product="unibake-test",
                         revision="r", epoch=0)

    tune_step = next(s.number for s in second.steps if s.instruction.startswith("COPY ctx/upper/"))
    before = [s for s in second.steps if s.number < tune_step and not s.instruction.startswith("FROM")]
    after = [s for s in second.steps if s.number >= tune_step and s.instruction.startswith(("COPY", "RUN"))]
    assert before and all(s.cached for s in before), second.steps
    assert after and not any(s.cached for s in after), second.steps
    # below the marker, what a tune-cache change leaves as it was (the ENV) comes from the cache too: the engine
    # makes containers only for the one COPY of the tune caches and the metadata, the checks, the ARG and the LABEL
    made = [" ".join(s.instruction.split()[:2 if s.instruction.startswith("COPY") else 1]) for s in second.steps
            if not s.cached and not s.instruction.startswith("FROM")]
    assert made == ["COPY ctx/upper/", "RUN", "ARG", "LABEL"], second.steps
    # The layers below the tune caches are the very same ones; the tune layer and those after it are new.
    base_layers = len(engine.inspect_image("localhost/unibake-busybox:1").diff_ids)
    copies_below = sum(1 for s in before if s.instruction.startswith("COPY"))
    same = next(i for i, (a, b) in enumerate(zip(first.diff_ids + ("",), second.diff_ids + ("-",))) if a != b)
    assert same == base_layers + copies_below
    assert len(second.diff_ids) == len(first.diff_ids)
    assert second.image_id != first.image_id
    print(f"\none tune-cache JSON changed: {second.cached_steps} of {len(second.cacheable_steps)} build steps reused, "
          f"{same} of {len(second.diff_ids)} layers unchanged")


def test_hostile_values_land_in_the_image_literally(cli, engine, busybox_product, version, images):
    hostile = 'a"b $HOME `id` \\c \'d\' ${X:-y} RUN rm -rf /'
    escaped = hostile.replace("\\", "\\\\").replace('"', '\\"')
    for file in ("product.yaml", "tp2.yaml"):
        path = busybox_product / file
        path.write_text(path.read_text().replace("env: {", f'env: {{HOSTILE_{file[:2].upper()}: "{escaped}", ', 1))
    tag = f"unibake-test:{version}"
    images(tag)
    assert build(cli, busybox_product, version).code == 0
    assert f"HOSTILE_PR={hostile}" in engine.inspect_image(tag).env
    run = engine.run(tag, ["sh", "-c", 'printf "%s\\n" "$HOSTILE_TP"'], env={"PROFILE": "tp2"})
    assert run.output == hostile + "\n"


def test_a_failing_in_image_check_means_no_tag(cli, engine, busybox_product, version):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "checks:\n  - {name: no-weights-baked, run: 'test ! -e /opt/unibake/engine/serve.sh'}\n")
    result = build(cli, busybox_product, version)
    assert result.code == 3
    assert result.error_lines[-1].startswith(
        f"error: in-image check failed during the build, so unibake-test:{version} was not tagged: "
        "self-check[tp1]: check no-weights-baked failed")
    assert engine.inspect_image(f"unibake-test:{version}") is None


def test_a_failing_build_step_shows_the_instruction_and_its_output(cli, engine, busybox_product, version):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "checks:\n  - {name: loud, run: 'echo the-check-said-this; exit 1'}\n")
    result = build(cli, busybox_product, version)
    assert result.code == 3
    assert "the-check-said-this" in result.err
    assert "RUN skip=; for p in tp1 tp2" in result.err
    assert engine.inspect_image(f"unibake-test:{version}") is None


def test_a_missing_base_image_is_refused_before_anything_is_built(cli, engine, busybox_product, version):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("localhost/unibake-busybox:1", "localhost/unibake-absent:1"))
    result = build(cli, busybox_product, version)
    assert result.code == 2
    assert result.error_lines == [
        f"error: base image localhost/unibake-absent:1 is not in the engine ({engine.address}): unibake builds on "
        "local images and pulls none; load it (docker load, or docker pull localhost/unibake-absent:1), then build "
        "again (scripts/setup.sh makes the example's); nothing was built"]
    assert "Step 1" not in result.err  # the engine was never asked to build
    assert engine.inspect_image(f"unibake-test:{version}") is None


def test_an_input_that_differs_from_the_lock_builds_nothing(cli, engine, busybox_product, version):
    (busybox_product.parent / "images/engine/serve.sh").write_text("#!/bin/sh\necho changed\n")
    result = build(cli, busybox_product, version)
    assert result.code == 2
    assert result.error_lines == [result.err.strip().splitlines()[-1]]
    assert "input 'images/engine/serve.sh' differs from" in result.error_lines[0]
    assert engine.inspect_image(f"unibake-test:{version}") is None


def test_an_unreachable_engine_is_a_clear_error(cli, busybox_product, tmp_path, version):
    result = build(cli, busybox_product, version, "--engine", f"unix://{tmp_path}/no-engine.sock")
    assert result.code == 1
    assert result.error_lines == [f"error: cannot reach the Docker engine at unix://{tmp_path}/no-engine.sock: "
                                  "no engine listens there; start the engine that serves that socket, or name "
                                  "another with --engine"]


def test_a_local_base_pinned_by_image_id_builds_where_a_digest_cannot(cli, engine, busybox_product, version, images):
    """A local image has no registry digest (FROM name@sha256:... would try a registry); its image ID pins it."""
    tag = f"unibake-test:{version}"
    images(tag)
    base_id = engine.inspect_image("localhost/unibake-busybox:1").id
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        'base: {image: "localhost/unibake-busybox:1"}',
        f'base: {{image: "localhost/unibake-busybox:1", id: "{base_id}", require_digest: true}}'))
    result = build(cli, busybox_product, version)
    assert result.code == 0, result.err
    assert engine.inspect_image(tag).diff_ids[0] == engine.inspect_image(base_id).diff_ids[0]
    assert engine.run(tag, ["self-check"]).exit_code == 0
