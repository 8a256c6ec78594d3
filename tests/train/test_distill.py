"""On-policy distillation (`train.kl.teacher`): the policy's own samples are scored per token by a teacher that
shares its tokenizer, and the reverse KL to it is a per-token reward (kl.mode reward, estimator k1), alone
(kl.task_reward 0) or beside the task's reward. The estimators' maths is the KL's, unchanged."""

import shutil

import pytest
import torch

from tests.harness.tiny import make_tiny_model
from toolrl.config import load_config
from toolrl.errors import ConfigError
from toolrl.train import Trainer, Workbench
from toolrl.train.logprobs import score_tokens


def distill_config(tmp_path, student, teacher, *more):
    return load_config(overrides=[
        "env.name=calculator", f"model.name={student}", "device=cpu", "rollout.max_new_tokens=12",
        "rollout.max_turns=1", "train.steps=6", "train.prompts_per_step=2", "train.group_size=4", "train.lr=3e-3",
        "train.advantage=reinforce_pp", "train.kl.coef=1.0", "train.kl.estimator=k1", "train.kl.mode=reward",
        f"train.kl.teacher={teacher}", "train.kl.task_reward=0", "eval.at_start=false", "eval.at_end=false",
        f"output_dir={tmp_path}", "run_name=d", *more,
    ])  # fmt: skip


def test_the_teacher_scores_the_policys_own_tokens_and_its_reverse_kl_is_the_only_reward(tmp_path, tiny_model_dir):
    """A student of another random start samples; the teacher (loaded frozen) scores exactly those tokens, each
    token's reward is -(log p_sampled - log p_teacher), and with kl.task_reward 0 the task's reward is not in
    the advantages. A teacher equal to the student gives every token a reward of 0."""
    from toolrl.train.update import advantage_inputs, step_batch

    student = make_tiny_model(tmp_path / "student", seed=7)
    for teacher_dir, same in [(tiny_model_dir, False), (student, True)]:
        bench = Workbench.load(distill_config(tmp_path, student, teacher_dir))
        try:
            trainer = Trainer(bench)
            teacher, t = trainer.reference, bench.config.train
            assert teacher is not None and not any(p.requires_grad for p in teacher.parameters())
            trajs = bench.rollout(bench.config.rollout.sampling, seed=11).run(bench.env.tasks("train")[:4], seed=11)
            for traj in trajs:
                traj.reward = 1.0  # a task reward that distillation alone leaves out
            refs, values = trainer.scorer.before_update(trainer.model, None, trajs, True)
            with torch.no_grad():
                expected = score_tokens(teacher, trajs).logprobs.split([sum(x.loss_mask) for x in trajs])
            assert all(torch.allclose(r, e, atol=1e-5) for r, e in zip(refs, expected, strict=True))
            batch = step_batch(trajs, refs, values, t, trainer.kl, torch.device("cpu"))
            sampled = torch.cat([torch.tensor(x.trained_logprobs) for x in trajs])
            assert torch.allclose(batch.token_rewards, -(sampled - torch.cat(refs)), atol=1e-5)
            assert advantage_inputs(batch, t, torch.device("cpu"), False).rewards.abs().sum() == 0
            if same:  # the engine's sampling log-probs are the student's own: nothing to learn from
                assert batch.token_rewards.abs().max() < 1e-3
            else:
                assert batch.token_rewards.mean() < -1.0  # the teacher finds the student's tokens unlikely
        finally:
            bench.close()


def test_a_teacher_with_another_tokenizer_is_a_one_line_error(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<a-token-the-policy-lacks>"])
    tokenizer.save_pretrained(other)
    bench = Workbench.load(distill_config(tmp_path, tiny_model_dir, other))
    try:
        with pytest.raises(ConfigError, match=r"^train.kl.teacher: .*tokenizer differs from the policy's"):
            Trainer(bench)
    finally:
        bench.close()
