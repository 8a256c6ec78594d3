"""A small sample of bench/trained_user.py: the tiny model trains one seed with its customers played by the policy
(agent and user seats), then the trained agent talks with the test customers played by the fixed prompt user (the
base model) and by the trained weights, through one simulated-user harness; the results hold each user's agreement
with its scenarios, beside how the training went, with the machine."""

import re

from tests.harness.bench_quick import run_quick


def test_a_seed_trains_both_seats_and_compares_the_trained_user_with_the_fixed_one(tmp_path):
    result, steps, log = run_quick("trained_user", tmp_path)
    seed = result["seeds"]["0"]
    for user in ("fixed_user", "trained_user"):
        row = seed[user]
        assert row["conversations"] == 4 and sum(row["outcomes"].values()) == 4
        assert 0 <= row["agreement"] <= min(row["agent_correct"], row["db"], row["faithful"]) <= 1
        assert 0 <= row["told"] <= 1
        assert result["agreement"][user] == row["agreement"]
    assert seed["training"]["steps"] == 2 and result["machine"]["cores"] > 0
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["role/agent/share"] == s["role/user/share"] == 0.5 for s in steps)  # both seats trained as roles
    assert re.findall(r"seed 0: step (\d+) agent", log) == ["1", "2"]  # progress
    assert "seed 0: fixed_user: agreement" in log and "seed 0: trained_user: agreement" in log
