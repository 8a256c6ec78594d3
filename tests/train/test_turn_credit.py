"""Dense turn credit (train.turn_credit): a frozen model's log-probability of the gold answer before each turn and
after the last; each turn credited with the change over it. Read from one cache per segment, it equals reading
each context whole; the credits telescope; they are turn rewards at each turn's last token."""

import math
from types import SimpleNamespace

import pytest
import torch

from toolrl.config import load_config
from toolrl.envs.base import Task
from toolrl.errors import ConfigError
from toolrl.rollout import Trajectory
from toolrl.rollout.trajectory import Carry
from toolrl.train import Trainer, Workbench
from toolrl.train.turn_credit import (
    PrefixReader,
    TurnCredit,
    answer_logprobs,
    boundary_contexts,
    group_normalized,
    naive_answer_logprobs,
    telescoped,
)
from toolrl.train.update import step_batch


def three_turns(chat, answer: str = "1458", compact: bool = False) -> Trajectory:
    """A call, its result, a second call, its result, the answer; `compact` closes a segment after the first round
    (its prompt and last round carried), so the last two contexts are another segment's."""
    prompt = chat.encode("<|im_start|>user\nWhat is 964 + 494?<|im_end|>\n<|im_start|>assistant\n")
    traj = Trajectory.start(Task("t", "What is 964 + 494?", answer), prompt)
    for k, (call, result) in enumerate([("add(964, 494)", "1458"), ("check(1458)", "ok")]):
        ids = chat.encode(f"<tool_call>{call}</tool_call>") + [chat.end_of_turn_id]
        traj.add_model_turn(ids, [-0.1] * len(ids), call)
        traj.record_step(0.0, {})
        traj.add_observation(chat.observation_ids([result], True))
        if compact and k == 0:
            n = len(traj.token_ids)
            traj.compact([Carry(0, len(prompt)), Carry(len(prompt), n)], "sliding_window")
    ids = chat.encode("<answer>1458</answer>") + [chat.end_of_turn_id]
    traj.add_model_turn(ids, [-0.1] * len(ids), "<answer>1458</answer>")
    return traj


@pytest.mark.parametrize("compact", [False, True])
def test_the_cache_read_equals_each_context_read_whole_and_the_credits_telescope(tiny_model, chat, compact):
    traj = three_turns(chat, compact=compact)
    closing = chat.continuation_ids([], True)
    contexts = boundary_contexts(traj, closing)
    assert len(contexts) == 4 and contexts[-1][-len(closing) :] == closing  # 3 turns, then after the last
    probe, target = chat.encode("<answer>"), chat.encode("1458</answer>")
    cached = answer_logprobs(tiny_model, contexts, probe, target)
    naive = naive_answer_logprobs(tiny_model, contexts, probe, target)
    assert cached == pytest.approx(naive, abs=1e-4) and all(s < 0 for s in cached)
    credit = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0)
    metrics = credit.assign([traj])
    assert len(traj.turn_credit) == 3
    assert sum(traj.turn_credit) == pytest.approx(naive[-1] - naive[0], abs=1e-4)  # lp(end) - lp(prompt)
    assert traj.turn_credit[1] == pytest.approx(naive[2] - naive[1], abs=1e-4)
    assert metrics["credit/scored"] == 1 and metrics["credit/gold_logprob_start"] == pytest.approx(naive[0], abs=1e-4)


def test_a_groups_prompt_is_read_once_and_every_score_equals_reading_its_context_whole(tiny_model, chat):
    group = [three_turns(chat), three_turns(chat, compact=True), three_turns(chat)]
    closing = chat.continuation_ids([], True)
    probe, target = chat.encode("<answer>"), chat.encode("1458</answer>")
    alone = []
    for traj in group:
        reader = PrefixReader(tiny_model)
        contexts = boundary_contexts(traj, closing)
        scores = [reader.score(c, probe, target) for c in contexts]
        assert scores == pytest.approx(naive_answer_logprobs(tiny_model, contexts, probe, target), abs=1e-4)
        alone.append(reader.tokens_read)
    metrics = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0).assign(group)
    prompt = group[0].prompt_length
    # each trajectory after the first starts from the prompt the one before it read (one id fed again for its logit)
    assert metrics["credit/tokens_read"] == sum(alone) - (len(group) - 1) * (prompt - 1)
    for traj in group:
        contexts = boundary_contexts(traj, closing)
        naive = naive_answer_logprobs(tiny_model, contexts, probe, target)
        assert traj.turn_credit == pytest.approx(telescoped(naive), abs=1e-4)


def test_the_prob_measure_credits_changes_of_the_answers_per_token_probability_and_they_telescope(tiny_model, chat):
    """measure: prob (IGPO): p = exp(mean log p over the answer's tokens); each credit is a change of p, in [-1, 1],
    and a trajectory's credits sum to p(gold | end) - p(gold | prompt)."""
    traj = three_turns(chat)
    contexts = boundary_contexts(traj, chat.continuation_ids([], True))
    probe, target = chat.encode("<answer>"), chat.encode("1458</answer>")
    probs = [math.exp(lp / len(target)) for lp in naive_answer_logprobs(tiny_model, contexts, probe, target)]
    metrics = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0, measure="prob").assign([traj])
    assert traj.turn_credit == pytest.approx([probs[k + 1] - probs[k] for k in range(3)], abs=1e-5)
    assert sum(traj.turn_credit) == pytest.approx(probs[-1] - probs[0], abs=1e-5)
    assert all(-1 <= c <= 1 for c in traj.turn_credit) and all(0 < p < 1 for p in probs)
    assert metrics["credit/turn_mean"] == pytest.approx(sum(traj.turn_credit) / 3)
    with pytest.raises(ConfigError, match=r"train\.turn_credit\.measure: 'odds' is not one of logprob, prob"):
        TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0, measure="odds")


def test_group_normalization_standardizes_the_turns_of_each_group_and_role():
    """By hand: a group's turns [0.2, -0.1] and [0.5] have mean 0.2 and std sqrt(0.06); another key's turns are
    standardized on their own; equal credits become 0; no credit stays None."""
    credits = [[0.2, -0.1], [0.5], [1.0, 3.0], None, [4.0, 4.0]]
    keys = [(0, None), (0, None), (1, None), (1, None), (1, "user")]
    out = group_normalized(credits, keys)
    s = math.sqrt(0.06)
    assert out[0] == pytest.approx([0.0, -0.3 / s]) and out[1] == pytest.approx([0.3 / s])
    assert out[2] == pytest.approx([-1.0, 1.0]) and out[3] is None and out[4] == [0.0, 0.0]


def test_normalized_credits_have_mean_0_and_std_1_within_each_group(tiny_model, chat):
    group = [three_turns(chat), three_turns(chat, compact=True), three_turns(chat), three_turns(chat, compact=True)]
    raw = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0, measure="prob")
    raw.assign(group, group_size=2)
    expected = group_normalized([t.turn_credit for t in group], [0, 0, 1, 1])
    normalizing = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0, measure="prob", normalize=True)
    metrics = normalizing.assign(group, group_size=2)
    assert [t.turn_credit for t in group] == [pytest.approx(e, abs=1e-4) for e in expected]
    for first in (0, 2):
        pooled = torch.tensor(group[first].turn_credit + group[first + 1].turn_credit)
        assert float(pooled.mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(pooled.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    assert metrics["credit/turn_mean_abs"] < 1  # the metrics report the credits as measured


def test_a_task_without_a_gold_answer_gets_no_credit_and_is_counted(tiny_model, chat):
    trajs = [three_turns(chat), three_turns(chat, answer="")]
    metrics = TurnCredit(tiny_model, chat, "<answer>{answer}</answer>", 1.0).assign(trajs)
    assert trajs[1].turn_credit is None and metrics["credit/no_answer"] == 1 and metrics["credit/scored"] == 1
    with pytest.raises(ConfigError, match=r"train\.turn_credit\.template: write \{answer\} once"):
        TurnCredit(tiny_model, chat, "the answer", 1.0)


def test_credits_are_turn_rewards_at_each_turns_last_token(chat):
    """With turn_rewards: rubric (the default) the environment's turn rewards stay out of the tokens; the credit
    (times coef) goes in, at each model turn's last generated token; gigpo's turns carry it too."""
    traj = three_turns(chat)
    traj.turn_rewards = [0.5, 0.5]
    traj.turn_credit = [0.25, -1.0, 2.0]
    kl = SimpleNamespace(coef=0.0, mode="loss", task_reward=1.0)
    credit = SimpleNamespace(model="reference", coef=2.0)
    t = SimpleNamespace(kl=kl, turn_rewards="rubric", infra_faults="mask", turn_credit=credit)
    batch = step_batch([traj], [None], [None], t, None, "cpu")
    lengths = [b - a for _, a, b in traj.sequences()[0].trained_spans()]
    ends = [sum(lengths[: k + 1]) - 1 for k in range(3)]
    placed = batch.token_rewards
    assert [float(placed[e]) for e in ends] == [0.5, -2.0, 4.0] and float(placed.sum()) == pytest.approx(2.5)
    assert [turn.reward for turn in batch.turns[0]] == [0.5 + 0.5, 0.5 - 2.0, 4.0]
    assert [turn.credit for turn in batch.turns[0]] == [0.5, -2.0, 4.0]  # what igpo sets apart at the last turn
    off = SimpleNamespace(**{**vars(t), "turn_credit": SimpleNamespace(model=None, coef=2.0)})
    assert step_batch([traj], [None], [None], off, None, "cpu").token_rewards is None


@pytest.mark.parametrize("options", [[], ["train.turn_credit.measure=prob", "train.turn_credit.normalize=true"],
                                     ["train.turn_credit.measure=prob", "train.advantage=igpo"]])  # fmt: skip
def test_the_trainer_credits_turns_with_the_reference_when_configured(tiny_model_dir, tmp_path, options):
    config = load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", "env.name=calculator",
                                    "rollout.max_new_tokens=8", "train.group_size=2", "train.prompts_per_step=1",
                                    "train.turn_credit.model=reference", "train.turn_credit.coef=0.5",
                                    f"output_dir={tmp_path}", *options])  # fmt: skip
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    assert trainer.credit is not None and trainer.credit.model is not bench.model  # a frozen copy
    trajs = trainer.rollout.run([bench.env.tasks("train")[0]] * 2, seed=3)
    metrics = trainer.update(trajs).metrics
    assert metrics["credit/scored"] == 2 and math.isfinite(metrics["credit/gold_logprob_end"])
    assert all(len(t.turn_credit) == t.num_turns for t in trajs)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    credits = [c for t in trajs for c in t.turn_credit]
    if "train.turn_credit.normalize=true" in options:  # over the group: mean 0 (or all 0 where all changed alike)
        assert abs(sum(credits)) < 1e-4 and trainer.credit.measure == "prob"
    with pytest.raises(Exception, match=r"train\.turn_credit\.measure"):
        load_config(overrides=[f"model.name={tiny_model_dir}", "train.turn_credit.measure=odds"])
