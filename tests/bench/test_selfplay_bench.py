"""A small sample of bench/selfplay.py: the tiny model, one seed, two steps of self-play on Nim and the test games
against its frozen step-0 copy before and after; the results hold both win rates, by seat, with the machine."""

import re

from tests.harness.bench_quick import run_quick


def test_a_seed_trains_by_self_play_and_plays_its_frozen_copy(tmp_path):
    result, steps, log = run_quick("selfplay", tmp_path)
    seed = result["seeds"]["0"]
    for when in ("before", "after"):
        assert seed[when]["games"] == 8 and set(seed[when]["by_seat"]) == {"first", "second"}
        assert 0 <= seed[f"win_rate_{when}"] <= 1
    assert result["win_rate_after"] == seed["win_rate_after"] and result["machine"]["cores"] > 0
    assert [s["step"] for s in steps] == [1, 2]
    assert all("role/first/share" in s and "role/second/share" in s for s in steps)  # both seats trained as roles
    assert re.findall(r"seed 0: step (\d+) reward", log) == ["1", "2"]  # progress
