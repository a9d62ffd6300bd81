"""The sanitisation gate on real images: build arguments in history, addresses in the notes."""

from __future__ import annotations

from .conftest import build_dockerfile


def test_a_secret_passed_as_a_build_argument_fails_the_release(cli, engine, tmp_path):
    tag = build_dockerfile(engine, "unibake-test-leaky:1",
                           b"FROM localhost/unibake-busybox:1\nARG DB_PASSWORD\nRUN echo fetched > /weights.txt\n",
                           buildargs={"DB_PASSWORD": "correct-horse-battery"}, nocache=True)
    try:
        out = tmp_path / "release"
        result = cli("archive", tag, "--out", str(out), "--no-roundtrip")
        assert result.code == 3
        line = result.error_lines[-1]
        assert "history[" in line and "build argument DB_PASSWORD" in line and "correct-horse-battery" not in line
        assert not out.exists()  # refused before the release folder was made
    finally:
        engine.remove_image(tag)


def test_a_private_address_in_a_value_that_reaches_the_notes_is_refused_before_the_build(cli, engine, busybox_product,
                                                                                        version, images, tmp_path):
    """It used to be caught in the release's texts, after the build and the round trip: now at plan time."""
    images(f"unibake-test:{version}")
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("model_name: tiny", "model_name: tiny-on-10.20.30.40"))
    out = tmp_path / "release"
    result = cli("--config", str(busybox_product), "--version", version, "--out", str(out), "--no-roundtrip")
    assert result.code == 3
    line = result.error_lines[-1]
    assert line.startswith("error: sanitisation: ") and "private network address (10.2…40" in line
    assert "product.yaml:12: launch.model_name" in line and "in the profiles" in line
    assert engine.inspect_image(f"unibake-test:{version}") is None  # nothing was built
    assert not (out / version).exists()
