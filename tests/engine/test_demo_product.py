"""The example product, built for real on its Debian base: every profile checks out and answers."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from unibake.docker_engine import DockerEngine

pytestmark = pytest.mark.slow


def chat(engine: DockerEngine, tag: str, profile: str, env: dict | None = None) -> tuple[dict, dict]:
    """Start the engine with PROFILE=profile on the default bridge; return /health and a chat reply."""
    api = engine.api
    container = api.create_container(tag, environment={"PROFILE": profile, **(env or {})})
    try:
        api.start(container)
        ip = api.inspect_container(container)["NetworkSettings"]["IPAddress"]
        port = (env or {}).get("PORT", "30000")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{ip}:{port}/health", timeout=2) as r:
                    health = json.load(r)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(api.logs(container).decode()) from None
                time.sleep(0.2)
        body = json.dumps({"messages": [{"role": "user", "content": "hello"}]}).encode()
        request = urllib.request.Request(f"http://{ip}:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as r:
            return health, json.load(r)
    finally:
        api.remove_container(container, force=True)


def test_the_unified_demo_image_serves_every_profile(cli, engine, demo_product, version, images):
    tag = f"demo-llm:{version}"
    images(tag)
    started = time.monotonic()
    result = cli("--profile", "all", "--stage", "build", "--config", str(demo_product), "--version", version)
    assert result.code == 0, result.err
    print(f"\ndemo image built in {time.monotonic() - started:.1f} s")

    for profile in ("tp1", "tp2", "tp4"):
        run = engine.run(tag, ["self-check"], env={"PROFILE": profile})
        assert run.exit_code == 0, run.output
        assert "kernels load" in run.output and "Python files of the engine compile" in run.output
    refused = engine.run(tag, ["self-check"], env={"PROFILE": "tp8"})
    assert refused.exit_code == 2
    assert "error: unknown PROFILE 'tp8'; known profiles: tp1, tp2, tp4" in refused.output

    health, reply = chat(engine, tag, "tp2", {"PORT": "8080", "MODEL_NAME": "served-name"})
    assert health == {"status": "ok", "profile": "tp2", "tp": 2}
    content = reply["choices"][0]["message"]["content"]
    assert content.startswith("UNIFIED_TP2_OK model=served-name tp=2")  # the overlay is what answered
    assert "flash_attn@260602" in content  # TP2's sidecar, not the shared 260728 build
    assert "rope@3.0.1" in content  # built by g++, the builder image's second toolchain
    assert "demo_quant@1.0.0+cpu" in content  # the prebuilt wheel's library, unpacked as it is
    wheel = engine.run(tag, ["python3", "-c", "import demo_quant, os; print(os.path.isfile(demo_quant.LIBRARY))"],
                       env={"PROFILE": "tp2"})
    assert wheel.output.strip() == "True", wheel.output  # the wheel's folder is importable
    _, reply = chat(engine, tag, "tp4")
    assert "UNIFIED_TP4_OK" in reply["choices"][0]["message"]["content"]
    assert "flash_attn@260728" in reply["choices"][0]["message"]["content"]


def test_a_single_profile_image_holds_only_that_profile(cli, engine, demo_product, version, images):
    tag = f"demo-llm:{version}-tp4"
    images(tag)
    result = cli("--profile", "tp4", "--stage", "build", "--config", str(demo_product), "--version", version)
    assert result.code == 0, result.err
    assert engine.inspect_image(tag).labels["io.unibake.profiles"] == "tp4"
    assert engine.run(tag, ["self-check"]).exit_code == 0
    assert engine.run(tag, ["self-check"], env={"PROFILE": "tp2"}).exit_code == 2
    listing = engine.run(tag, ["ls", "/opt/unibake/profiles"]).output.split()
    assert listing == ["tp4"]


def test_the_engine_refuses_to_start_without_its_tune_caches(cli, engine, demo_product, version, images):
    tag = f"demo-llm:{version}-tp1"
    images(tag)
    assert cli("--profile", "tp1", "--stage", "build", "--config", str(demo_product), "--version", version).code == 0
    run = engine.run(tag, ["sh", "-c", "rm -r /opt/unibake/profiles/tp1/tune && exec "
                                       "/opt/unibake/meta/entrypoint.sh serve"])
    assert run.exit_code == 1
    assert "error: demo-engine refuses to start: tune-cache folder /opt/unibake/profiles/tp1/tune is missing" \
        in run.output


def test_a_kernel_that_does_not_load_fails_the_build_with_no_tag(cli, engine, demo_product, version):
    source = demo_product.parent / "images/kernels/rmsnorm/rmsnorm.c"
    source.write_text(source.read_text() + "\nextern double vendor_only_symbol(double);\n"
                      "double rmsnorm_probe(double x) { return vendor_only_symbol(x); }\n")
    assert cli("lock", "--config", str(demo_product)).code == 0
    result = cli("--profile", "tp1", "--stage", "build", "--config", str(demo_product), "--version", version)
    assert result.code == 3
    assert result.error_lines[-1].startswith(
        f"error: in-image check failed during the build, so demo-llm:{version}-tp1 was not tagged: "
        "self-check[tp1]: kernel /opt/unibake/kernels/rmsnorm/librmsnorm.so does not load: ")
    assert "undefined symbol: vendor_only_symbol" in result.error_lines[-1]
    assert engine.inspect_image(f"demo-llm:{version}-tp1") is None


def test_a_kernel_that_does_not_compile_is_named_with_the_compilers_first_error(cli, engine, demo_product, version):
    source = demo_product.parent / "images/kernels/rope/rope.cpp"
    source.write_text(source.read_text() + "\nextern \"C\" double rope_broken() { return undeclared_value; }\n")
    assert cli("lock", "--config", str(demo_product)).code == 0
    result = cli("--profile", "tp1", "--stage", "build", "--config", str(demo_product), "--version", version)
    assert result.code == 1
    line = result.error_lines[-1]
    assert line.startswith(f"error: kernel rope failed to build, so demo-llm:{version}-tp1 was not tagged: ")
    assert "rope.cpp" in line and "error: 'undeclared_value' was not declared" in line
    assert len(line) < 600  # one line naming the kernel, not the whole RUN
    assert engine.inspect_image(f"demo-llm:{version}-tp1") is None
