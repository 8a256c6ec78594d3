"""GRPO for multi-turn tool use: roll out groups, score, normalise within groups, PPO-clip update.

The whole step is visible in `GRPOTrainer.step`: rollout -> rewards -> advantages -> loss -> optimizer.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from toolrl.algos import group_advantages, kl_k3, ppo_clip_loss
from toolrl.chat import ChatFormat
from toolrl.config import RunConfig
from toolrl.config.schema import SamplingConfig
from toolrl.envs import Environment, Task, make_env
from toolrl.errors import ConfigError
from toolrl.models import load_model, load_tokenizer, pick_device
from toolrl.parsers import get_parser
from toolrl.rollout import Engine, Rollout, RolloutLimits, SamplingParams, Trajectory, get_engine_factory
from toolrl.rollout.engine import common_prefix_length
from toolrl.tools import ToolExecutor
from toolrl.tools.toolset import Toolset, run_executor
from toolrl.train.evaluate import evaluate, summarize
from toolrl.train.logprobs import micro_batches, trained_token_logprobs
from toolrl.train.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass
class Workbench:
    """What a run works with: model, tokenizer, chat format, environment and tools."""

    config: RunConfig
    device: torch.device
    tokenizer: Any
    model: Any
    chat: ChatFormat
    env: Environment
    executor: ToolExecutor
    toolset: Toolset | None = None
    engines: dict[str, Engine] = field(default_factory=dict)

    @classmethod
    def load(cls, config: RunConfig, model_name: str | None = None) -> Workbench:
        device = pick_device(config.device)
        name = model_name or config.model.name
        tokenizer = load_tokenizer(name)
        model = load_model(name, device, config.model.dtype)
        env = make_env(config.env)
        executor, toolset = run_executor(env.tools(), config.tools)
        return cls(config, device, tokenizer, model, ChatFormat(tokenizer), env, executor, toolset)

    def close(self) -> None:
        """End the engines, the tools' sessions and worker threads."""
        for engine in self.engines.values():
            engine.close()
        self.executor.close()
        if self.toolset is not None:
            self.toolset.close()

    def engine(self, purpose: str, seed: int) -> Engine:
        """One engine per purpose (train, eval), made on first use and kept: its cache is reused every step."""
        if purpose not in self.engines:
            factory = get_engine_factory(self.config.rollout.engine)
            self.engines[purpose] = factory(
                model=self.model, chat=self.chat, device=self.device, seed=seed, config=self.config
            )
        return self.engines[purpose]

    def rollout(self, sampling: SamplingConfig, seed: int, purpose: str = "train") -> Rollout:
        r = self.config.rollout
        params = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k)
        limits = RolloutLimits(
            r.max_turns,
            r.max_new_tokens,
            r.max_response_tokens,
            r.max_observation_tokens,
            params,
            r.stop_on_tool_error,
            r.last_turn_tools,
        )
        engine = self.engine(purpose, seed)
        return Rollout(self.env, engine, self.chat, get_parser(r.parser), self.executor, limits, r.schedule)

    def evaluate(self, num_tasks: int | None = None, temperature: float | None = None) -> dict[str, float]:
        e = self.config.eval
        tasks = self.env.tasks("test")[: num_tasks or e.num_tasks]
        sampling = e.sampling if temperature is None else e.sampling.model_copy(update={"temperature": temperature})
        return evaluate(self.rollout(sampling, seed=self.config.seed + 1, purpose="eval"), tasks, e.batch_size)


class GRPOTrainer:
    def __init__(self, bench: Workbench, run: RunDir | None = None):
        self.bench, self.run = bench, run
        self.config = bench.config
        t = self.config.train
        if t.steps and self.config.rollout.engine != "hf":
            raise ConfigError(
                f"rollout.engine: {self.config.rollout.engine} serves evaluation only; training samples from the "
                "model being trained, so use hf (weights are not synced to a server yet)"
            )
        torch.manual_seed(self.config.seed)
        self.model = bench.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        self.reference = None
        if t.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.rollout = bench.rollout(self.config.rollout.sampling, seed=self.config.seed)
        self.train_tasks = list(bench.env.tasks("train"))
        self.rng = random.Random(self.config.seed)
        self.order: list[int] = []

    def next_tasks(self) -> list[Task]:
        """The next prompts, from a seeded shuffle of the train split, reshuffled each epoch."""
        tasks = []
        for _ in range(self.config.train.prompts_per_step):
            if not self.order:
                self.order = list(range(len(self.train_tasks)))
                self.rng.shuffle(self.order)
            tasks.append(self.train_tasks[self.order.pop()])
        return tasks

    def step(self, step: int) -> dict[str, Any]:
        t = self.config.train
        started = time.perf_counter()
        tasks = [task for task in self.next_tasks() for _ in range(t.group_size)]
        tool_counts = self.bench.executor.metrics.copy()
        trajs = self.rollout.run(tasks)
        tool_counts = self.bench.executor.metrics - tool_counts
        rollout_s = time.perf_counter() - started

        rewards = torch.tensor([traj.reward for traj in trajs])
        advantages = group_advantages(rewards, t.group_size, eps=t.advantage_eps)
        stats = self.update(trajs, advantages)

        metrics = {"step": step, **summarize(trajs), **stats, **{f"tools/{k}": v for k, v in tool_counts.items()}}
        generated = sum(sum(traj.loss_mask) for traj in trajs)
        metrics.update(
            generated_tokens=generated,
            gen_tokens_per_s=generated / rollout_s,
            rollout_s=rollout_s,
            train_s=time.perf_counter() - started - rollout_s,
            step_s=time.perf_counter() - started,
        )
        if self.run:
            self.run.log_metrics(metrics)
            samples = [traj.to_record(self.bench.tokenizer) for traj in trajs[: t.samples_per_step]]
            self.run.log_samples(step, samples)
        return metrics

    def update(self, trajs: list[Trajectory], advantages: torch.Tensor) -> dict[str, float]:
        """One optimizer step: token-mean PPO-clip loss (+ k3 KL) over all trained tokens of the step."""
        t = self.config.train
        temperature = self.config.rollout.sampling.temperature
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if t.mask_truncated:  # cut by a token limit: its last turn is unfinished, leave it out of the loss
            trajs, advantages = [tr for tr in trajs if not tr.truncated], advantages[[not tr.truncated for tr in trajs]]
        total_tokens = sum(sum(traj.loss_mask) for traj in trajs)
        # With no KL term a zero-advantage trajectory adds nothing to the gradient: skip its forward/backward.
        # It still counts in the token-mean denominator, so the loss equals the full-batch loss.
        work = [(traj, float(a)) for traj, a in zip(trajs, advantages, strict=True) if sum(traj.loss_mask)]
        if self.reference is None:
            work = [(traj, a) for traj, a in work if a != 0.0]
        loss_sum, clipped, kl_sum = 0.0, 0, 0.0
        shared = common_prefix_length([traj.token_ids for traj, _ in work]) if work else 0
        lengths = [len(traj.token_ids) - shared for traj, _ in work]
        for indices in micro_batches(lengths, t.micro_batch_tokens):
            batch = [work[i] for i in indices]
            batch_trajs = [traj for traj, _ in batch]
            logp, counts = trained_token_logprobs(self.model, batch_trajs, temperature)
            device = logp.device
            old = torch.tensor([lp for traj in batch_trajs for lp in traj.trained_logprobs], device=device)
            adv = torch.cat([torch.full((n,), a, device=device) for (_, a), n in zip(batch, counts, strict=True)])
            per_token, was_clipped = ppo_clip_loss(logp, old, adv, t.clip_eps)
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = trained_token_logprobs(self.reference, batch_trajs, temperature)
                kl = kl_k3(logp, ref)
                per_token = per_token + t.kl_coef * kl
                kl_sum += float(kl.detach().sum())
            loss = per_token.sum() / total_tokens
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += int(was_clipped.sum())
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm) if work else torch.tensor(0.0)
        )
        if work:
            self.optimizer.step()
        stats = {
            "loss": loss_sum,
            "grad_norm": float(grad_norm),
            "clip_frac": clipped / max(total_tokens, 1),
            "trained_trajectories": len(work),
        }
        if self.reference is not None:
            stats["kl"] = kl_sum / max(total_tokens, 1)
        return stats

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        config = self.config
        summary: dict[str, Any] = {}
        if config.eval.at_start:
            summary["eval_start"] = self._eval("start")
        for step in range(1, config.train.steps + 1):
            metrics = self.step(step)
            if on_step:
                on_step(metrics)
        if config.eval.at_end:
            summary["eval_end"] = self._eval("end")
        if self.run:
            summary["checkpoint"] = str(self.run.save_checkpoint(self.model, self.bench.tokenizer, "final"))
        return summary

    def _eval(self, when: str) -> dict[str, float]:
        started = time.perf_counter()
        stats = self.bench.evaluate()
        stats["eval_s"] = time.perf_counter() - started
        log.info("eval at %s: %s", when, stats)
        if self.run:
            self.run.log_metrics({"eval": when, **stats})
        return stats
