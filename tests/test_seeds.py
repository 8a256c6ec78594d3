"""Named random streams (toolrl.seeds): evaluation draws the same numbers whatever eval.batch_size and never
those of a training step; streams are stable across versions (a resumed run draws what it would have)."""

import pytest

from toolrl import seeds
from toolrl.train import Workbench


def test_a_stream_is_its_name_and_stable_across_versions():
    assert seeds.derive(0, "eval") == seeds.derive(0, "eval") == seeds.evaluation(0)
    # blake2b(b"0/eval") >> 1: changing how streams are derived changes what every resumed run draws
    assert seeds.derive(0, "eval") == 7911480023664182016
    assert 0 <= seeds.derive(2**70, "x", 3) < 2**63
    assert len({seeds.derive(0, "sampling", step) for step in range(10_000)}) == 10_000


@pytest.mark.parametrize("run_seed", [0, 1, 7, 1234])
def test_evaluation_never_shares_a_seed_with_a_training_step(run_seed):
    """Before, evaluation task i drew with seed (run seed + 7 + i) * stride, which is training step 7's."""
    evaluation = {seeds.derive(seeds.evaluation(run_seed), i) for i in range(500)}
    training = {seeds.derive(seeds.sampling(run_seed, step), i) for step in range(1, 201) for i in range(64)}
    assert len(evaluation) == 500 and len(training) == 200 * 64
    assert not evaluation & training
    assert seeds.evaluation(run_seed) not in {seeds.sampling(run_seed, step) for step in range(10_000)}


def test_evaluation_draws_do_not_depend_on_eval_batch_size(tiny_model_dir, tmp_path):
    from tests.train.test_features import tiny_config

    tokens = {}
    for batch_size in (1, 3, 5):
        config = tiny_config(tiny_model_dir, tmp_path, "eval.num_tasks=5", f"eval.batch_size={batch_size}")
        bench = Workbench.load(config)
        try:
            trajs = bench.evaluation()
        finally:
            bench.close()
        tokens[batch_size] = [t.token_ids for t in trajs]
        assert len({tuple(t) for t in tokens[batch_size]}) > 1  # sampled, not one greedy answer
    assert tokens[1] == tokens[3] == tokens[5]
