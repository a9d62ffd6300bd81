"""The scratch engine of the round trip, let go early: stopped in a thread while the release's last
stages run, and gone, daemon and data, by the time the run's exit returns."""

from __future__ import annotations

import os

from unibake.scratch import ScratchEngine, runtime_of

from .test_faults import running_from


def test_a_scratch_engine_let_go_early_is_gone_by_the_exit(tmp_path):
    with ScratchEngine(tmp_path / "scratch") as scratch:
        folder = scratch.folder
        assert scratch.engine.version()
        assert (folder / "root").is_dir() and running_from(folder)
        scratch.stop_in_background()
        scratch.stop_in_background()  # a second call is the same one
    assert running_from(folder) == []
    assert not folder.exists() and not runtime_of(folder).exists()
    assert os.listdir(tmp_path / "scratch") == []
