"""The scratch engine of the round trip, let go early: stopped in a thread while the release's last
stages run, and gone, daemon and data, by the time the run's exit returns."""

from __future__ import annotations

import os

from unibake.scratch import ScratchEngine, runtime_of


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_scratch_engine_let_go_early_is_gone_by_the_exit(tmp_path):
    with ScratchEngine(tmp_path / "scratch") as scratch:
        pid, folder = scratch.pid, scratch.folder
        assert scratch.engine.version()
        assert (folder / "root").is_dir() and _alive(pid)
        scratch.stop_in_background()
        scratch.stop_in_background()  # a second call is the same one
    assert not _alive(pid)
    assert not folder.exists() and not runtime_of(folder).exists()
    assert os.listdir(tmp_path / "scratch") == []
