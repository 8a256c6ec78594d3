"""A trajectory of three segments is one sample to every estimator: its six trained tokens (two in each segment, one of
them a summary) take the advantages a one-segment trajectory with those tokens would, split over its segments.
Hand-computed for a group of three samples with rewards [1, 1, 0]: A (three segments), B and C (one each)."""

import math
from types import SimpleNamespace

import pytest
import torch

from toolrl.algos import ADVANTAGES, StepTotals
from toolrl.envs.base import Task
from toolrl.rollout import Trajectory
from toolrl.rollout.trajectory import Carry, Written
from toolrl.train.update import StepRows, advantage_inputs, select, step_batch, token_weights

PROMPT = [1, 2, 3, 4]
EPS = 1e-4


def three_segments() -> Trajectory:
    traj = Trajectory.start(Task("t", "q", "a"), PROMPT)
    traj.add_model_turn([10, 11], [-0.1, -0.2], "first")
    traj.record_step(0.0, {})
    traj.add_observation([20, 21])
    traj.compact([Carry(0, 4), Carry(4, 8)], "sliding_window")  # the prompt and the last round, as they were
    traj.add_model_turn([12], [-0.3], "second")
    traj.record_step(0.0, {})
    traj.add_observation([22])
    traj.add_context([30])  # a request for a summary
    traj.add_summary([13], [-0.4], "summary")
    traj.compact([Carry(0, 4), Written((31, 32))], "summarize")
    traj.add_model_turn([14, 15], [-0.5, -0.6], "third")
    traj.reward = 1.0
    return traj


def one_segment(reward: float) -> Trajectory:
    traj = Trajectory.start(Task("t", "q", "a"), PROMPT)
    traj.add_model_turn([10, 16], [-0.7, -0.8], "only")
    traj.reward = reward
    return traj


def settings(**more):
    kl = SimpleNamespace(coef=0.0, mode="loss", task_reward=1.0)
    base = dict(kl=kl, turn_rewards="rubric", turn_credit=SimpleNamespace(model=None), infra_faults="mask",
                group_size=3, advantage_eps=EPS, gamma=1.0, lam=1.0, step_weight=1.0, dynamic_sampling=False,
                mask_truncated=False, summary_weight=1.0)  # fmt: skip
    return SimpleNamespace(**(base | more))


def advantages(name, values=None, **more):
    """(per-row advantages of A's three segments, B's, C's) and the selection."""
    trajs = [three_segments(), one_segment(1.0), one_segment(0.0)]
    rows = StepRows.of(trajs)
    t = settings(**more)
    value_rows = [torch.tensor(v) for v in values] if values is not None else [None] * len(rows.rows)
    batch = step_batch(trajs, [None] * 3, rows.per_trajectory(value_rows, 3), t, None, "cpu")
    inputs = advantage_inputs(batch, t, "cpu", values is not None)
    chosen = select(batch, rows, ADVANTAGES[name](inputs), t, only_policy=False)
    return [w.advantages.tolist() for w in chosen.work], chosen


def test_the_trajectory_is_its_segments_in_order():
    traj = three_segments()
    segments = traj.sequences()
    assert len(segments) == 3 and segments[0].token_ids == [1, 2, 3, 4, 10, 11, 20, 21]
    assert segments[1].token_ids == [1, 2, 3, 4, 10, 11, 20, 21, 12, 22, 30, 13]
    assert segments[2].token_ids == [1, 2, 3, 4, 31, 32, 14, 15]
    assert [sum(s.loss_mask) for s in segments] == [2, 2, 2] and traj.trained_count == 6
    assert traj.trained_logprobs == [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]


def check(rows, a_values, b_value, c_value):
    a = [x for row in rows[:3] for x in row]
    assert [len(r) for r in rows] == [2, 2, 2, 2, 2]  # A's three segments, then B and C
    assert a == pytest.approx(a_values, abs=1e-5)
    assert rows[3] == pytest.approx([b_value] * 2, abs=1e-5) and rows[4] == pytest.approx([c_value] * 2, abs=1e-5)


def test_grpo():
    rows, chosen = advantages("grpo")
    std = math.sqrt(1 / 3)  # [1, 1, 0]: mean 2/3, unbiased std sqrt(1/3)
    check(rows, [(1 / 3) / (std + EPS)] * 6, (1 / 3) / (std + EPS), (-2 / 3) / (std + EPS))
    assert chosen.left_out == 0 and chosen.totals == StepTotals(tokens=10, sequences=5)


def test_dr_grpo():
    check(advantages("dr_grpo")[0], [1 / 3] * 6, 1 / 3, -2 / 3)


def test_rloo():
    check(advantages("rloo")[0], [0.5] * 6, 0.5, -1.0)  # 3/2 x (reward - mean)


def test_reinforce_pp():
    # the group-centred reward on every token (1/3 on A's 6 and B's 2, -2/3 on C's 2), whitened over the 10 tokens:
    # mean 2/15, deviations 1/5 and -4/5, unbiased std sqrt(1.6 / 9)
    std = math.sqrt(1.6 / 9)
    check(advantages("reinforce_pp")[0], [0.2 / (std + EPS)] * 6, 0.2 / (std + EPS), -0.8 / (std + EPS))


def test_gae_bootstraps_across_segments():
    # values per row; gamma = lam = 1: A_t = reward - V_t, the value of the next segment's first token carrying over
    values = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.5, 0.5], [0.2, 0.2]]
    raw = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.5, 0.5, -0.2, -0.2]
    mean = sum(raw) / 10
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 9)
    want = [(x - mean) / (std + EPS) for x in raw]
    rows, chosen = advantages("gae", values=values)
    check(rows, want[:6], want[6], want[8])
    returns = [w.returns.tolist() for w in chosen.work]
    assert returns[:3] == [pytest.approx([1.0, 1.0])] * 3  # A + V: the reward at every token of every segment


def test_gigpo_compares_turns_that_start_from_the_same_context():
    # episode level: GRPO's; turn level: the first turns of A, B and C start from the same prompt, with returns
    # [1, 1, 0] (the reward at each trajectory's end): (r - 2/3) / std; A's later turns start from contexts no
    # other turn shares: 0
    std = math.sqrt(1 / 3)
    up, down = (1 / 3) / (std + EPS), (-2 / 3) / (std + EPS)
    rows = advantages("gigpo")[0]
    check(rows, [2 * up, 2 * up, up, up, up, up], 2 * up, 2 * down)


def test_igpo_sums_a_groups_standardized_turn_rewards_to_go_across_segments():
    # turn rewards (no credit here): A's four trained spans (first, second, summary, third) [0, 0, 0, 1 (its
    # outcome at the last)], B [1], C [0]; the group's six: mean 1/3, unbiased std sqrt(4/15). Standardized: 0 ->
    # lo, 1 -> hi; A's spans take the sums to go: 3 lo + hi, 2 lo + hi, lo + hi, hi
    std = math.sqrt(4 / 15)
    lo, hi = (-1 / 3) / (std + EPS), (2 / 3) / (std + EPS)
    rows = advantages("igpo")[0]
    check(rows, [3 * lo + hi] * 2 + [2 * lo + hi, lo + hi] + [hi] * 2, hi, lo)


def ends_on_a_summary() -> Trajectory:
    """An episode whose last trained span is a summary (its turn budget ran out right after it was compacted)."""
    traj = Trajectory.start(Task("t", "q", "a"), PROMPT)
    traj.add_model_turn([10, 11], [-0.1, -0.2], "search")
    traj.record_step(0.0, {})
    traj.add_observation([20])
    traj.add_context([30])
    traj.add_summary([13, 14], [-0.3, -0.4], "summary")
    traj.turn_credit = [0.5]  # the search turn's dense credit
    traj.reward = 1.0
    return traj


def test_igpo_gives_the_outcome_to_a_last_summary_and_keeps_the_last_model_turns_credit():
    # X: its search turn's credit 0.5 (not its last span: it keeps it), its summary the outcome 1; Y [1], Z [0]. The
    # group's turn rewards [0.5, 1, 1, 0]: mean 0.625, unbiased std sqrt(0.6875 / 3); X's search turn takes the sum
    # of its own and its summary's standardized rewards
    trajs = [ends_on_a_summary(), one_segment(1.0), one_segment(0.0)]
    rows = StepRows.of(trajs)
    t = settings(turn_credit=SimpleNamespace(model="ref", coef=1.0))
    batch = step_batch(trajs, [None] * 3, rows.per_trajectory([None] * len(rows.rows), 3), t, None, "cpu")
    out = ADVANTAGES["igpo"](advantage_inputs(batch, t, "cpu", False)).advantages.tolist()
    std = math.sqrt(0.6875 / 3)
    z = [(r - 0.625) / (std + EPS) for r in (0.5, 1.0, 1.0, 0.0)]
    assert out == pytest.approx([z[0] + z[1]] * 2 + [z[1]] * 2 + [z[2]] * 2 + [z[3]] * 2, abs=1e-5)


def test_summary_tokens_take_their_own_loss_weight():
    traj = three_segments()
    middle = traj.sequences()[1]
    assert token_weights(middle, 1.0) is None
    assert token_weights(middle, 0.25).tolist() == [1.0, 0.25]  # the model turn, then the summary
    assert token_weights(traj.sequences()[0], 0.25) is None  # no summary in it
    _, chosen = advantages("grpo", summary_weight=0.5)
    assert [None if w.weights is None else w.weights.tolist() for w in chosen.work] == [None, [1.0, 0.5], None,
                                                                                         None, None]  # fmt: skip


def test_a_long_horizon_bounds_the_heap_as_a_long_sequence_does(monkeypatch):
    """A trajectory's segments together are its episode's length (A: 8 + 12 + 8 tokens; B: 6): the plan bounds the
    heap (memory.for_sequences) from that length, though every segment is shorter, since a step over many linked
    segments fragments the heap as one long sequence does (the long-horizon recipe's update peaked 0.4 GB higher
    in the same update without it)."""
    from toolrl.scoring import DEFAULT_BLOCKS
    from toolrl.scoring import scorer as scoring

    rows = StepRows.of([three_segments(), one_segment(1.0)])
    assert [len(r.token_ids) for r in rows.rows] == [8, 12, 8, 6]
    assert rows.longest_episode == 28
    assert StepRows.of([]).longest_episode == 0
    asked = []
    monkeypatch.setattr(scoring, "for_sequences", asked.append)
    scorer = scoring.Scorer(None, 1.0, 1024, SimpleNamespace(on=True), DEFAULT_BLOCKS)
    assert scorer.plan(None, rows.rows, "naive", 28).batches
    assert asked == [28]
    scorer.plan(None, rows.rows, "naive")
    assert asked == [28, 12]  # without the episode: the longest row, as before


def test_gdpo():
    """Two components, `answer` (weight 1) and `format` (weight 0.5): A (1, 1), B (1, 0), C (0, 1); totals 1.5, 1,
    0.5. Per component over the group: answer [1, 1, 0] -> 1/3 / s, 1/3 / s, -2/3 / s with s = sqrt(1/3); format
    [1, 0, 1] -> 1/3 / s, -2/3 / s, 1/3 / s. Summed with the weights, then whitened over the three trajectories."""
    trajs = [three_segments(), one_segment(1.0), one_segment(0.0)]
    for traj, (answer, fmt) in zip(trajs, [(1, 1), (1, 0), (0, 1)], strict=True):
        traj.rewards, traj.reward_weights = {"answer": answer, "format": fmt, "chars": 9}, {"answer": 1, "format": 0.5}
        traj.reward = answer + 0.5 * fmt
    rows = StepRows.of(trajs)
    t = settings()
    batch = step_batch(trajs, [None] * 3, [None] * 3, t, None, "cpu")
    inputs = advantage_inputs(batch, t, "cpu", False, ADVANTAGES.options["gdpo"](batch_norm=False))
    assert inputs.component_names == ["answer", "format"] and inputs.components.tolist() == [[1, 1], [1, 0], [0, 1]]
    chosen = select(batch, rows, ADVANTAGES["gdpo"](inputs), t, only_policy=False)
    s = math.sqrt(1 / 3) + EPS
    a, b, c = (1 / 3 + 0.5 / 3) / s, (1 / 3 - 1 / 3) / s, (-2 / 3 + 0.5 / 3) / s
    check([w.advantages.tolist() for w in chosen.work], [a] * 6, b, c)
    assert chosen.left_out == 0
