"""The command line contract: exit codes and one `error:` line that names the problem."""

from __future__ import annotations

import pytest

from unibake.cli import source_date_epoch
from unibake.errors import InputError


@pytest.mark.parametrize("args,message", [
    (["--profile", "tp8"], "error: unknown profile 'tp8' (--profile); known: tp1, tp2"),
    (["--profile", "all", "--profile", "tp1"], "error: --profile all cannot be combined"),
    (["--stage", "deploy"], "error: argument --stage: invalid choice: 'deploy'"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
    (["--version", "1.0 beta"], "error: --version '1.0 beta' is not a valid version"),
])
def test_bad_command_lines_exit_2_with_one_error_line(cli, busybox_product, args, message):
    result = cli("--stage", "render", "--config", str(busybox_product), *args)
    assert result.code == 2
    assert len(result.error_lines) == 1
    assert result.error_lines[0].startswith(message)


def test_bad_yaml_exits_2_and_renders_nothing(cli, busybox_product):
    (busybox_product / "tp2.yaml").write_text("profile: tp2\ngpus: two\n")
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 2
    assert result.error_lines == [f"error: {busybox_product}/tp2.yaml:2: key 'gpus' must be an integer, not str"]
    assert not (busybox_product.parent / "dockerfiles").exists()


def test_a_missing_profiles_folder_is_named(cli, tmp_path):
    result = cli("--stage", "render", "--config", str(tmp_path / "nowhere"))
    assert result.code == 2
    assert result.error_lines == [f"error: {tmp_path / 'nowhere'}: the profiles folder does not exist"]


def test_render_stage_writes_the_reviewable_files(cli, busybox_product):
    result = cli("--stage", "render", "--config", str(busybox_product), "--profile", "tp2")
    assert result.code == 0, result.err
    folder = busybox_product.parent / "dockerfiles/rendered/tp2"
    assert sorted(p.name for p in folder.iterdir()) == ["Dockerfile", "entrypoint.sh", "self-check.sh"]
    assert "unibake-test:0.1.0-tp2" in (folder / "Dockerfile").read_text()


def test_source_date_epoch_must_be_a_number(cli, busybox_product):
    with pytest.raises(InputError, match="SOURCE_DATE_EPOCH='yesterday' is not a whole number"):
        source_date_epoch(busybox_product.parent, {"SOURCE_DATE_EPOCH": "yesterday"})
    assert source_date_epoch(busybox_product.parent, {"SOURCE_DATE_EPOCH": "1700000000"}) == 1700000000
