"""The benchmark's targets are issue 11's, and its verdicts compare with them (no timing here: the
harness itself runs in tests/engine/test_bench.py, the figures in docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from benchmarks import bench


def test_the_targets_are_the_issue_s():
    # goal 1: a cold release <= 1.0 x by hand; goal 2: a release after one change <= 15 % of the cold one; goal 3:
    # the archive stage <= 0.9 x the peer, peak RSS <= 256 MiB and flat in the image's size (within 10 %)
    assert (bench.COLD_MAX, bench.CHANGE_MAX, bench.ARCHIVE_MAX, bench.RSS_MAX_MIB, bench.RSS_FLAT) == \
        (1.0, 0.15, 0.9, 256, 0.10)


@pytest.mark.parametrize("value, peer, most, met", [(9.0, 10.0, 0.9, True), (9.01, 10.0, 0.9, False),
                                                    (1.5, 10.0, 0.15, True), (1.51, 10.0, 0.15, False),
                                                    (10.0, 10.0, 1.0, True), (10.01, 10.0, 1.0, False)])
def test_a_ratio_target_is_met_at_its_bound_and_missed_past_it(value, peer, most, met):
    assert bench.within(value, peer, most) is met


@pytest.mark.parametrize("bigger, smaller, met", [(109, 100, True), (91, 100, True), (111, 100, False),
                                                  (89, 100, False)])
def test_peak_rss_is_flat_within_ten_percent_either_way(bigger, smaller, met):
    assert bench.flat(bigger, smaller) is met
