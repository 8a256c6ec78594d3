"""RL for multi-turn tool use: roll out groups, score, estimate advantages, update the policy.

The whole step is visible in `Trainer.step`: rollout -> rewards -> advantages -> loss -> optimizer. Which
advantage estimator, policy loss, aggregation and KL estimator run is configuration (registries in
toolrl.algos). Checkpoints hold everything a resumed run needs to continue exactly.
"""

from __future__ import annotations

import json
import logging
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolrl.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    PolicyInputs,
    StepTotals,
    TurnInput,
    informative_groups,
    value_loss,
)
from toolrl.chat import ChatFormat
from toolrl.config import RunConfig
from toolrl.config.schema import SamplingConfig
from toolrl.envs import Environment, Task, make_env
from toolrl.errors import ConfigError
from toolrl.models import load_model, load_tokenizer, pick_device
from toolrl.rollout import Engine, Rollout, RolloutLimits, SamplingParams, Trajectory, get_engine_factory
from toolrl.rollout.engine import common_prefix_length
from toolrl.text import first_line
from toolrl.tools import ToolExecutor
from toolrl.tools.toolset import Toolset, run_executor
from toolrl.train.checkpoint import load_state, save_state
from toolrl.train.evaluate import run_tasks, summarize
from toolrl.train.loggers import open_loggers
from toolrl.train.logprobs import TokenScores, micro_batches, score_tokens
from toolrl.train.policy import (
    ValueHead,
    apply_lora,
    load_trainable,
    lr_factor,
    make_reference,
    reference_context,
    save_model,
    save_trainable,
)
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
    def load(cls, config: RunConfig, model_name: str | None = None, log_dir: Path | None = None) -> Workbench:
        """`log_dir`: where tool servers and workers write their stderr (a run's tools/ folder; by default
        $TOOLRL_HOME/logs/tools)."""
        device = pick_device(config.device)
        name = model_name or config.model.name
        tokenizer = load_tokenizer(name)
        model = load_model(name, device, config.model.dtype)
        env = make_env(config.env, name, config.rollout.parser)
        executor, toolset = run_executor(env.tools(), config.tools, log_dir)
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
        parser = self.env.syntax  # rollout.parser, else the environment's own, else hermes (make_env)
        return Rollout(self.env, engine, self.chat, parser, self.executor, limits, r.schedule)

    def evaluate(self, num_tasks: int | None = None, temperature: float | None = None) -> dict[str, float]:
        """Means over the test split (see evaluation for the trajectories themselves)."""
        return summarize(self.evaluation(num_tasks, temperature), self.env.rubric.success)

    def evaluation(self, num_tasks: int | None = None, temperature: float | None = None) -> list[Trajectory]:
        """The test split's trajectories (the first `num_tasks`, at `temperature`; eval.* by default)."""
        e = self.config.eval
        tasks = self.env.tasks("test")[: num_tasks or e.num_tasks]
        sampling = e.sampling if temperature is None else e.sampling.model_copy(update={"temperature": temperature})
        rollout = self.rollout(sampling, seed=self.config.seed + 1, purpose="eval")
        return run_tasks(rollout, tasks, e.batch_size, seed=self.config.seed + 7)


STATE = "trainer_state.json"
TRAINABLE = "trainable.safetensors"
OPTIMIZER = "optimizer"
"""optimizer.safetensors + optimizer.json: optimizer, scheduler and torch RNG state (train/checkpoint.py)."""
LEGACY_OPTIMIZER = "optimizer.pt"
"""What checkpoints of earlier versions hold instead; loaded with weights_only=True."""
BEST = "best.json"


@dataclass
class _Work:
    """One trajectory in the loss, with its per-token tensors."""

    traj: Trajectory
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def turn_inputs(traj: Trajectory) -> list[TurnInput]:
    """A trajectory's model turns for turn-level estimators: trained tokens, reward (0 where the environment
    gave none), and the state the turn started from: the environment's `info["state"]` of the step before it
    when it gives one, else the exact context (prompt, calls, results) the turn was generated from."""
    turns = []
    for k, (start, end) in enumerate(traj.model_spans()):
        reward = traj.turn_rewards[k] if k < len(traj.turn_rewards) else 0.0
        given = traj.infos[k - 1].get("state") if 0 < k <= len(traj.infos) else None
        state = ("env", given) if given is not None else ("context", hash(tuple(traj.token_ids[:start])))
        turns.append(TurnInput(sum(traj.loss_mask[start:end]), reward, state))
    return turns


def turn_reward_tokens(turns: list[TurnInput]) -> torch.Tensor:
    """[trained tokens] each turn's reward at its last trained token, 0 elsewhere."""
    parts = []
    for turn in turns:
        part = torch.zeros(turn.tokens)
        if turn.tokens:
            part[-1] = turn.reward
        parts.append(part)
    return torch.cat(parts) if parts else torch.zeros(0)


def _cat(work: list[_Work], name: str) -> torch.Tensor:
    return torch.cat([getattr(w, name) for w in work])


class Trainer:
    def __init__(self, bench: Workbench, run: RunDir | None = None):
        self.bench, self.run = bench, run
        self.config = bench.config
        t = self.config.train
        if t.steps and self.config.rollout.engine != "hf":
            raise ConfigError(
                f"rollout.engine: {self.config.rollout.engine} serves evaluation only; training samples from the "
                "model being trained, so use hf (weights are not synced to a server yet)"
            )
        self.estimate = ADVANTAGES.lookup(t.advantage)
        self.policy_loss = POLICY_LOSSES.lookup(t.loss)
        self.aggregate = AGGREGATIONS.lookup(t.aggregation)
        self.kl = KL_ESTIMATORS.lookup(t.kl.estimator)
        torch.manual_seed(self.config.seed)
        if t.lora.r:
            bench.model = apply_lora(bench.model, t.lora)
            bench.engines.clear()  # engines made before hold the unwrapped model
        self.model = bench.model
        if t.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.value_head = None
        if t.advantage == "gae":
            hidden = self.model.get_output_embeddings().in_features
            self.value_head = ValueHead(hidden).to(bench.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(step, t))
        self.reference = make_reference(self.model, t)
        self.rollout = bench.rollout(self.config.rollout.sampling, seed=self.config.seed)
        self.train_tasks = list(bench.env.tasks("train"))
        self.rng = random.Random(self.config.seed)
        self.order: list[int] = []
        self.step_done = 0
        self.best: float | None = None
        self.loggers = open_loggers(t.report_to, run.path if run else None, self.config) if run else []

    # ---- data ---------------------------------------------------------------------------------------------

    def next_tasks(self) -> list[Task]:
        """The next prompts, from a seeded shuffle of the train split, reshuffled each epoch."""
        tasks = []
        for _ in range(self.config.train.prompts_per_step):
            if not self.order:
                self.order = list(range(len(self.train_tasks)))
                self.rng.shuffle(self.order)
            tasks.append(self.train_tasks[self.order.pop()])
        return tasks

    # ---- one step -----------------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, Any]:
        t = self.config.train
        started = time.perf_counter()
        tasks = [task for task in self.next_tasks() for _ in range(t.group_size)]
        tool_counts, reward_counts = self.bench.executor.metrics.copy(), self.bench.env.rubric.stats()
        trajs = self.rollout.run(tasks, seed=self.config.seed * 1_000_003 + step)
        tool_counts = self.bench.executor.metrics - tool_counts
        reward_counts = self.bench.env.rubric.stats() - reward_counts
        rollout_s = time.perf_counter() - started

        stats = self.update(trajs)
        metrics = {
            "step": step,
            **summarize(trajs, self.bench.env.rubric.success),
            **stats,
            **{f"tools/{k}": v for k, v in tool_counts.items()},
            **reward_counts,
        }
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
            for logger in self.loggers:
                logger.log(metrics, step)
        return metrics

    def _scores(self, model, trajs: list[Trajectory], entropy: bool = False, values: bool = False) -> TokenScores:
        return score_tokens(
            model, trajs, self.config.rollout.sampling.temperature, entropy, self.value_head if values else None
        )

    def _before_update(self, trajs: list[Trajectory]) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Per trajectory, without gradient: reference log-probs (KL) and the value head's estimates (GAE)."""
        t = self.config.train
        refs: list[torch.Tensor | None] = [None] * len(trajs)
        values: list[torch.Tensor | None] = [None] * len(trajs)
        need_ref, need_values = t.kl.coef > 0, self.value_head is not None
        if not (need_ref or need_values):
            return refs, values
        scored = [i for i, traj in enumerate(trajs) if sum(traj.loss_mask)]
        self.model.eval()
        with torch.no_grad():
            for batch in self._micro_batches([trajs[i] for i in scored]):
                chosen = [trajs[scored[i]] for i in batch]
                if need_ref:
                    model, context = reference_context(self.model, self.reference)
                    with context:
                        ref = self._scores(model, chosen)
                    for i, part in zip(batch, ref.logprobs.split(ref.counts), strict=True):
                        refs[scored[i]] = part
                if need_values:
                    out = self._scores(self.model, chosen, values=True)
                    for i, part in zip(batch, out.values.split(out.counts), strict=True):
                        values[scored[i]] = part
        return refs, values

    def _micro_batches(self, trajs: list[Trajectory]) -> list[list[int]]:
        shared = common_prefix_length([traj.token_ids for traj in trajs]) if trajs else 0
        return micro_batches([len(traj.token_ids) - shared for traj in trajs], self.config.train.micro_batch_tokens)

    def update(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One optimizer step over the step's trajectories."""
        t = self.config.train
        device = self.bench.device
        started = time.perf_counter()
        refs, values = self._before_update(trajs)
        scored = time.perf_counter()
        counts = [sum(traj.loss_mask) for traj in trajs]
        old = [torch.tensor(traj.trained_logprobs, device=device) for traj in trajs]
        token_rewards = None
        if t.kl.coef > 0 and t.kl.mode == "reward":  # KL to the reference, per token, at sampling time
            token_rewards = torch.cat(
                [-t.kl.coef * self.kl(o, r) if r is not None else o for o, r in zip(old, refs, strict=True)]
            )
        turns = [turn_inputs(traj) for traj in trajs]
        if t.turn_rewards == "tokens":
            placed = torch.cat([turn_reward_tokens(traj_turns) for traj_turns in turns]).to(device)
            token_rewards = placed if token_rewards is None else token_rewards + placed
        flat_values = None
        if self.value_head is not None:
            flat_values = torch.cat([v if v is not None else o for v, o in zip(values, old, strict=True)])
        # A trajectory a tool's crash or timeout cut short says nothing about the model: out of the statistics.
        valid = [not (t.infra_faults == "mask" and traj.num_tool_faults) for traj in trajs]
        est = self.estimate(
            AdvantageInputs(
                torch.tensor([traj.reward for traj in trajs], device=device),
                t.group_size,
                counts,
                token_rewards,
                flat_values,
                t.advantage_eps,
                t.gamma,
                t.lam,
                None if all(valid) else torch.tensor(valid, device=device),
                turns,
                t.step_weight,
            )
        )
        adv_parts = est.advantages.split(counts)
        ret_parts = est.returns.split(counts) if est.returns is not None else [None] * len(trajs)
        keep = [n > 0 and v for n, v in zip(counts, valid, strict=True)]
        if t.dynamic_sampling:
            rewards = torch.tensor([traj.reward for traj in trajs])
            informative = informative_groups(rewards, t.group_size, torch.tensor(valid)).tolist()
            keep = [k and i for k, i in zip(keep, informative, strict=True)]
        if t.mask_truncated:  # cut by a token limit: its last turn is unfinished, leave it out of the loss
            keep = [k and not traj.truncated for k, traj in zip(keep, trajs, strict=True)]
        work = [
            _Work(traj, a, o, r, v, ret)
            for traj, a, o, r, v, ret, k in zip(trajs, adv_parts, old, refs, values, ret_parts, keep, strict=True)
            if k
        ]
        totals = StepTotals(tokens=max(sum(len(w.advantages) for w in work), 1), sequences=max(len(work), 1))
        # A trajectory whose advantages are all 0 adds nothing to the gradient when the loss has no other term:
        # skip its forward/backward (it still counts in the denominators, so the loss is the full-batch loss).
        only_policy = (t.kl.coef == 0 or t.kl.mode == "reward") and not t.entropy_coef and self.value_head is None
        if only_policy:
            work = [w for w in work if bool(w.advantages.any())]

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg_loss", "kl", "entropy", "value_loss"), 0.0)
        clipped = 0
        for batch in self._micro_batches([w.traj for w in work]):
            chosen = [work[i] for i in batch]
            scores = self._scores(
                self.model, [w.traj for w in chosen], entropy=t.entropy_coef > 0, values=self.value_head is not None
            )
            per_token, was_clipped = self.policy_loss(
                PolicyInputs(
                    scores.logprobs,
                    _cat(chosen, "old_logprobs"),
                    _cat(chosen, "advantages"),
                    scores.counts,
                    t.clip_low,
                    t.clip_high,
                )
            )
            pg = self.aggregate(per_token, scores.counts, totals)
            loss = pg
            sums["pg_loss"] += float(pg.detach())
            if t.kl.coef > 0:
                kl = self.aggregate(self.kl(scores.logprobs, _cat(chosen, "ref_logprobs")), scores.counts, totals)
                sums["kl"] += float(kl.detach())
                if t.kl.mode == "loss":
                    loss = loss + t.kl.coef * kl
            if scores.entropy is not None:
                entropy = self.aggregate(scores.entropy, scores.counts, totals)
                sums["entropy"] += float(entropy.detach())
                loss = loss - t.entropy_coef * entropy
            if scores.values is not None:
                v_loss = value_loss(scores.values, _cat(chosen, "old_values"), _cat(chosen, "returns"), t.value_clip)
                v_loss = self.aggregate(v_loss, scores.counts, totals)
                sums["value_loss"] += float(v_loss.detach())
                loss = loss + t.vf_coef * v_loss
            loss.backward()
            sums["loss"] += float(loss.detach())
            clipped += int(was_clipped.sum())
        backward_done = time.perf_counter()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm) if work else torch.tensor(0.0)
        lr = self.optimizer.param_groups[0]["lr"]
        if work:
            self.optimizer.step()
        with warnings.catch_warnings():  # a step with nothing to train skips optimizer.step(); the schedule goes on
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        stats = {
            "time/reference_and_values_s": scored - started,
            "time/forward_backward_s": backward_done - scored,
            "time/optimizer_s": time.perf_counter() - backward_done,
            "loss": sums["loss"],
            "pg_loss": sums["pg_loss"],
            "grad_norm": float(grad_norm),
            "clip_frac": clipped / totals.tokens,
            "lr": lr,
            "trained_trajectories": len(work),
            "kept_fraction": sum(keep) / max(len(trajs), 1),
            "fault_masked": sum(not v for v in valid),
            "advantage_abs": float(est.advantages.abs().mean()) if len(est.advantages) else 0.0,
        }
        if t.kl.coef > 0:
            stats["kl"] = sums["kl"]
        if t.entropy_coef > 0:
            stats["entropy"] = sums["entropy"]
        if self.value_head is not None:
            stats["value_loss"] = sums["value_loss"]
        return stats

    # ---- the run ------------------------------------------------------------------------------------------

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        config, t = self.config, self.config.train
        summary: dict[str, Any] = {}
        try:
            if config.eval.at_start and self.step_done == 0:
                summary["eval_start"] = self._eval("start", 0)
            for step in range(self.step_done + 1, t.steps + 1):
                metrics = self.step(step)
                self.step_done = step
                if on_step:
                    on_step(metrics)
                if t.eval_every and step % t.eval_every == 0 and step < t.steps:
                    self._eval_and_keep_best(step)
                if t.save_every and step % t.save_every == 0 and step < t.steps:
                    self.save_checkpoint()
            if config.eval.at_end and t.steps:
                summary["eval_end"] = self._eval_and_keep_best(t.steps)
            if self.run:
                self.save_checkpoint()
                summary["checkpoint"] = str(self.run.save("final", self._write_model))
                from toolrl.train.report import write_plot

                write_plot(self.run.path)
        finally:
            for logger in self.loggers:
                logger.close()
        return summary

    def _eval(self, when: str, step: int) -> dict[str, float]:
        started = time.perf_counter()
        stats = self.bench.evaluate()
        stats["eval_s"] = time.perf_counter() - started
        log.info("eval at %s: %s", when, stats)
        if self.run:
            self.run.log_metrics({"eval": when, "step": step, **stats})
            for logger in self.loggers:
                logger.log({f"eval/{k}": v for k, v in stats.items()}, step)
        return stats

    def _eval_and_keep_best(self, step: int) -> dict[str, float]:
        stats = self._eval("end" if step == self.config.train.steps else f"step {step}", step)
        metric = "success" if "success" in stats else "reward"  # an environment without a success criterion
        score = stats[metric]
        if self.run and (self.best is None or score > self.best):
            self.best = score

            def write(folder: Path) -> None:
                self._write_model(folder)
                (folder / BEST).write_text(json.dumps({"step": step, "metric": metric, "score": self.best}))

            self.run.point("best", self.run.save(f"checkpoints/best-step-{step:06d}", write))
            self._prune()
        return stats

    # ---- checkpoints --------------------------------------------------------------------------------------

    def _write_model(self, folder: Path) -> None:
        save_model(self.model, self.bench.tokenizer, folder)

    def _write_state(self, folder: Path) -> None:
        save_trainable(folder / TRAINABLE, self.model, self.value_head)
        save_state(
            folder / OPTIMIZER,
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
        )
        state = {"step": self.step_done, "order": self.order, "rng": self.rng.getstate(), "best": self.best}
        (folder / STATE).write_text(json.dumps(state))

    def save_checkpoint(self) -> Path | None:
        """Everything a resumed run needs (trainable weights, optimizer, scheduler, RNGs, data position, step),
        written atomically under checkpoints/, then run/last points at it."""
        if not self.run:
            return None
        path = self.run.save(f"checkpoints/step-{self.step_done:06d}", self._write_state)
        self.run.point("last", path)
        self._prune()
        return path

    def _prune(self) -> None:
        keep = {p for p in (self.run.pointed("last"), self.run.pointed("best")) if p is not None}
        self.run.prune("checkpoints", keep)

    def resume(self) -> int:
        """Continue from run/last: load the state and drop log records of later steps. Returns the step."""
        last = self.run.pointed("last") if self.run else None
        if last is None or not (last / STATE).is_file():
            raise ConfigError(f"{self.run.path if self.run else '?'}: no checkpoint to resume from (no last/)")
        self.run.remove_leftovers()
        load_trainable(last / TRAINABLE, self.model, self.value_head)
        if (last / LEGACY_OPTIMIZER).is_file():
            try:  # tensors and containers only: a pickle that would run code is refused
                saved = torch.load(last / LEGACY_OPTIMIZER, weights_only=True)
            except Exception as exc:
                raise ConfigError(
                    f"{last / LEGACY_OPTIMIZER}: refused, it is not plain training state ({first_line(exc)})"
                ) from None
        else:
            saved = load_state(last / OPTIMIZER)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"])
        state = json.loads((last / STATE).read_text())
        self.step_done, self.order, self.best = state["step"], state["order"], state["best"]
        best = self.run.pointed("best")
        if best is not None and (best / BEST).is_file():  # an evaluation after the last checkpoint may have won
            kept = json.loads((best / BEST).read_text())
            self.best = max(self.best or 0.0, kept.get("score", kept.get("success", 0.0)))  # "success": older runs
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.run.truncate_logs(self.step_done)
        log.info("resumed %s at step %d", self.run.path, self.step_done)
        return self.step_done


GRPOTrainer = Trainer
"""The name of earlier versions: the trainer runs GRPO by default."""
