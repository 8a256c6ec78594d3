"""RL for multi-turn tool use: roll out groups, score, estimate advantages, update the policy.

The whole step reads top to bottom in `Trainer.step`: rollout (the rubric scores each trajectory) ->
advantages -> loss -> optimizer -> log. Which advantage estimator, policy loss, aggregation and KL estimator run
is configuration (registries in toolrl.algos, asked for their capabilities, never tested by name); the pieces
of the update live in update.py, checkpoints in checkpointing.py, the workbench in workbench.py.
"""

from __future__ import annotations

import copy
import logging
import random
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from toolrl import seeds
from toolrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from toolrl.algos.mismatch import Mismatch
from toolrl.config.resolve import plugin_options
from toolrl.envs import Task
from toolrl.errors import ConfigError
from toolrl.memory import trim
from toolrl.rollout import Trajectory
from toolrl.rollout.engine import ENGINES
from toolrl.train import checkpointing, distributed, journal
from toolrl.train.evaluate import summarize
from toolrl.train.loggers import open_loggers
from toolrl.train.logprobs import TokenScores, micro_batches, score_tokens, shared_prefix_length
from toolrl.train.policy import ValueHead, exported, lr_factor, make_reference, prepare_policy, reference_context
from toolrl.train.rundir import RunDir
from toolrl.train.update import (  # noqa: F401  (their home before update.py)
    LossFunctions,
    advantage_inputs,
    backward,
    select,
    step_batch,
    turn_inputs,
    turn_reward_tokens,
)
from toolrl.train.workbench import Workbench

log = logging.getLogger(__name__)


@dataclass
class RolloutPart:
    """A step's rollout: its trajectories, what its tools and rubric counted, and the policy version (optimizer
    steps taken) of the weights that sampled it."""

    trajs: list[Trajectory]
    tool_counts: Any
    reward_counts: Any
    rollout_s: float
    version: int


class Trainer:
    def __init__(self, bench: Workbench, run: RunDir | None = None):
        self.bench, self.run = bench, run
        self.config = bench.config
        t = self.config.train
        if t.steps and not ENGINES.capability(bench.engine_name, "supports_training"):
            raise ConfigError(
                f"rollout.engine: {bench.engine_name} serves evaluation only; training samples from the "
                "model being trained, so use an engine that can train (hf, vllm, vllm-server)"
            )
        self.estimate = ADVANTAGES.lookup(t.advantage)
        self.estimator_options = plugin_options(self.config)["advantage"]
        self.kl = KL_ESTIMATORS.lookup(t.kl.estimator)
        self.loss_fns = LossFunctions(POLICY_LOSSES.lookup(t.loss), AGGREGATIONS.lookup(t.aggregation), self.kl)
        torch.manual_seed(seeds.init(self.config.seed))
        if t.lora.r or not t.train_vision:
            bench.model = prepare_policy(bench.model, t)  # LoRA; a vision tower frozen
            bench.engines.clear()  # engines made before hold the unwrapped model
        self.model = bench.model
        self.dist = distributed.from_env()
        self.generator = self.model  # what the rollout engine samples from: the policy itself in one process
        if self.dist.on and t.prompts_per_step % self.dist.world:
            raise ConfigError(
                f"train.prompts_per_step: {t.prompts_per_step} prompts do not split over {self.dist.world} "
                "ranks; give a multiple of the number of processes"
            )
        if self.dist.on or t.async_steps:
            self.generator = copy.deepcopy(self.model).eval()  # unsharded, refreshed after each update
            bench.model = self.generator
            bench.engines.clear()
        if t.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.value_head = None
        if ADVANTAGES.capability(t.advantage, "needs_values"):
            hidden = self.model.get_output_embeddings().in_features
            self.value_head = ValueHead(hidden).to(bench.device)
        self.reference = make_reference(self.model, t)  # a full copy in every process (no collectives)
        if self.dist.on:
            distributed.shard(self.model, self.dist)
            if self.value_head is not None:
                distributed.shard_module(self.value_head, self.dist)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(step, t))
        self.rollout = bench.rollout(self.config.rollout.sampling, seed=seeds.engine(self.config.seed, "train"))
        self.train_tasks = list(bench.env.tasks("train"))
        self.rollout.refuse_long_prompts(self.train_tasks, bench.context_length)
        self.rng = random.Random(seeds.task_order(self.config.seed))
        self.order: list[int] = []
        self.step_done = 0
        self.best: float | None = None
        self.generator_version = 0  # optimizer steps in the generator's weights
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if t.async_steps else None
        self.pending: tuple[int, Future[RolloutPart], dict[str, Any]] | None = None
        self.journal_full: set[str] = set()  # journal files that reached train.samples_max_mb
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

    def data_state(self) -> dict[str, Any]:
        """Where the task order stands for the next step to train (before a pending rollout drew its tasks)."""
        if self.pending is not None:
            return self.pending[2]
        return {"order": list(self.order), "rng": self.rng.getstate()}

    # ---- one step -----------------------------------------------------------------------------------------

    def roll_out(self, step: int) -> RolloutPart:
        """The step's groups (this rank's share), scored by the rubric, sampled by the generator's weights."""
        t, bench = self.config.train, self.bench
        started = time.perf_counter()
        version = self.generator_version
        tasks = [task for task in self.next_tasks() for _ in range(t.group_size)]
        share = len(tasks) // self.dist.world  # whole groups: prompts_per_step splits over the ranks
        first = self.dist.rank * share
        tool_counts, reward_counts = bench.executor.metrics.copy(), bench.env.rubric.stats()
        seed = seeds.sampling(self.config.seed, step)
        trajs = self.rollout.run(tasks[first : first + share], seed=seed, first=first)
        tool_counts, reward_counts = bench.executor.metrics - tool_counts, bench.env.rubric.stats() - reward_counts
        return RolloutPart(trajs, tool_counts, reward_counts, time.perf_counter() - started, version)

    def _rollout_for(self, step: int) -> RolloutPart:
        """This step's rollout: made now, or (train.async_steps) the one that ran during the last update; then
        the next step's rollout starts, on the weights as they are before this step's update."""
        part = None
        if self.pending is not None and self.pending[0] == step:
            part = self.pending[1].result()
        self.pending = None
        if part is None:
            self.refresh_generator()
            part = self.roll_out(step)
        if self.pool is not None and step < self.config.train.steps:
            self.refresh_generator()
            mark = self.data_state()
            self.pending = (step + 1, self.pool.submit(self.roll_out, step + 1), mark)
        return part

    def refresh_generator(self, version: int | None = None) -> None:
        """The generation copy and the engines that load weights get the policy's current weights, which have
        `version` optimizer steps (the steps done by default). No rollout may be running on the copy; under
        torchrun every rank calls it at the same point (the full weights are gathered)."""
        version = self.step_done if version is None else version
        if self.generator_version == version:
            return
        if self.generator is not self.model:
            state = distributed.full_state(self.model) if self.dist.on else self.model.state_dict()
            self.generator.load_state_dict(state)
        self.publish_weights()
        self.generator_version = version

    def publish_weights(self) -> None:
        """Engines that sample from weights of their own (vLLM) get the generation copy's, LoRA merged."""
        engines = self.bench.distinct_engines()
        if not engines or not ENGINES.capability(self.bench.engine_name, "loads_weights"):
            return
        with exported(self.generator) as plain:
            weights = {name: tensor.detach() for name, tensor in plain.state_dict().items()}
        for engine in engines:
            engine.load_weights(weights)

    def settle(self) -> None:
        """Wait for a rollout running in the background (before evaluating on the generator's engine)."""
        if self.pending is not None:
            self.pending[1].result()

    def step(self, step: int) -> dict[str, Any]:
        """One step: rollout -> advantages -> loss -> optimizer -> log."""
        bench = self.bench
        started = time.perf_counter()
        part = self._rollout_for(step)  # scored by the rubric
        trajs = part.trajs
        waited = time.perf_counter() - started
        stats = self.update(trajs)  # advantages, loss, optimizer
        generated = sum(sum(traj.loss_mask) for traj in trajs)
        metrics = {
            "step": step,
            **summarize(trajs, bench.env.rubric.success),
            **stats,
            **{f"tools/{k}": v for k, v in part.tool_counts.items()},
            **part.reward_counts,
            "generated_tokens": generated,
            "gen_tokens_per_s": generated / part.rollout_s,
            "rollout_s": part.rollout_s,
            "train_s": time.perf_counter() - started - waited,
            "step_s": time.perf_counter() - started,
        }
        if self.pool is not None:
            metrics["offpolicy/staleness"] = step - 1 - part.version  # optimizer steps since its weights
            metrics["offpolicy/rollout_wait_s"] = waited
        metrics = distributed.reduce_metrics(self.dist, metrics)
        self.log(step, metrics, trajs)
        return metrics

    def log(self, step: int, metrics: dict[str, Any], trajs: list[Trajectory]) -> None:
        journal.log_step(self, step, metrics, trajs)

    def _scores(self, model, trajs: list[Trajectory], entropy: bool | str = False, values: bool = False) -> TokenScores:
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
        batches = self._micro_batches([trajs[i] for i in scored])
        with torch.no_grad():
            sharded = need_values or (need_ref and self.reference is None)  # passes through the sharded model
            for _ in range(distributed.max_over_ranks(self.dist, len(batches)) - len(batches) if sharded else 0):
                self._dummy_scores(trajs[0], need_ref, need_values)
            for batch in batches:
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

    def _dummy_scores(self, traj: Trajectory, ref: bool, values: bool) -> None:
        """The sharded passes another rank makes and this one has no batch for (results unused)."""
        if ref and self.reference is None:
            model, context = reference_context(self.model, None)
            with context:
                self._scores(model, [traj])
        if values:
            self._scores(self.model, [traj], values=True)

    def _micro_batches(self, trajs: list[Trajectory]) -> list[list[int]]:
        # sharded, each row runs its whole sequence (logprobs.py): no shared prefix to leave out
        shared = shared_prefix_length(trajs) if trajs and not self.dist.on else 0
        return micro_batches([len(traj.token_ids) - shared for traj in trajs], self.config.train.micro_batch_tokens)

    def update(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One optimizer step over the step's trajectories: per-token inputs, advantages, the trajectories that
        enter the loss, the loss over micro-batches, the optimizer and the schedule."""
        t, device = self.config.train, self.bench.device
        started = time.perf_counter()
        refs, values = self._before_update(trajs)
        scored = time.perf_counter()
        batch = step_batch(trajs, refs, values, t, self.kl, device)
        inputs = advantage_inputs(batch, t, device, self.value_head is not None, self.estimator_options)
        est = (
            self.estimate(inputs) if not self.dist.on else distributed.step_advantages(self.dist, self.estimate, inputs)
        )
        only_policy = (t.kl.coef == 0 or t.kl.mode == "reward") and not t.entropy_coef and self.value_head is None
        chosen = select(batch, est, t, only_policy)
        chosen.totals = distributed.global_totals(self.dist, chosen.totals)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        batches = self._micro_batches([w.traj for w in chosen.work])
        scores = partial_scores(self, entropy=True if t.entropy_coef > 0 else "measure")
        pad_to = distributed.max_over_ranks(self.dist, len(batches))
        mismatch = Mismatch()
        sums, clipped = backward(chosen, batches, scores, self.loss_fns, t, pad_to, trajs[0], mismatch)
        backward_done = time.perf_counter()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        any_work = distributed.max_over_ranks(self.dist, len(chosen.work)) > 0  # every rank steps its shards
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm) if any_work else torch.tensor(0.0)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = self.optimizer.param_groups[0]["lr"]
        if any_work:
            self.optimizer.step()
        if not self.pool and any_work:  # the new weights reach the generation copy (and engines) before the next
            self.refresh_generator(self.step_done + 1)  # rollout; off-policy, they do when the next rollout starts
        elif not self.pool:
            self.generator_version = self.step_done + 1  # nothing stepped: the copy and engines are current
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
            "clip_frac": clipped / chosen.totals.tokens,
            "lr": lr,
            "trained_trajectories": len(chosen.work),
            "kept_fraction": sum(chosen.keep) / max(len(trajs), 1),
            "fault_masked": sum(not v for v in batch.valid),
            "advantage_abs": float(est.advantages.abs().mean()) if len(est.advantages) else 0.0,
            **mismatch.metrics(),
        }
        optional = {
            "kl": t.kl.coef > 0,
            "entropy": sums["entropy"] is not None,
            "value_loss": self.value_head is not None,
        }
        stats.update({k: sums[k] for k, on in optional.items() if on})
        trim()  # the step's activations go back to the system, not into a fragmented heap
        return stats

    # ---- the run ------------------------------------------------------------------------------------------

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The run: evaluations, steps, checkpoints, the final model. status.json follows it; a STOP file in
        the run directory ends it after the current step, with a checkpoint (summary["stopped"])."""
        config, t = self.config, self.config.train
        summary: dict[str, Any] = {}
        if self.run:
            self.run.write_status(state="running", step=self.step_done, steps=t.steps)
        try:
            if config.eval.at_start and self.step_done == 0:
                summary["eval_start"] = self._eval("start", 0)
            for step in range(self.step_done + 1, t.steps + 1):
                metrics = self.step(step)
                self.step_done = step
                if on_step:
                    on_step(metrics)
                if step < t.steps and journal.stop_requested(self):
                    self.settle()
                    summary |= {"stopped": step, "checkpoint": str(self.save_checkpoint())}
                    break
                if t.eval_every and step % t.eval_every == 0 and step < t.steps:
                    self._eval_and_keep_best(step)
                if t.save_every and step % t.save_every == 0 and step < t.steps:
                    self.save_checkpoint()
            else:
                self._finish(summary)
        except BaseException as exc:
            if self.run:
                stopped = isinstance(exc, KeyboardInterrupt)
                self.run.write_status(state="stopped" if stopped else "failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            for logger in self.loggers:
                logger.close()
        if self.run:
            self.run.write_status(state="stopped" if "stopped" in summary else "finished", step=self.step_done)
        return summary

    def _finish(self, summary: dict[str, Any]) -> None:
        if self.config.eval.at_end and self.config.train.steps:
            summary["eval_end"] = self._eval_and_keep_best(self.config.train.steps)
        self.save_checkpoint()  # under torchrun a collective: every rank writes its shards
        if self.run:
            summary["checkpoint"] = str(self.run.save("final", self._write_model))
            from toolrl.train.report import write_plot

            write_plot(self.run.path)

    def _eval(self, when: str, step: int) -> dict[str, float]:
        return journal.evaluate(self, when, step)

    def _eval_and_keep_best(self, step: int) -> dict[str, float]:
        return journal.evaluate_and_keep_best(self, step)

    # ---- checkpoints (checkpointing.py) ------------------------------------------------------------------

    def save_checkpoint(self):
        return checkpointing.save_checkpoint(self)

    def resume(self, folder=None) -> int:
        """Continue from the run's last checkpoint (`folder`: the run directory, for ranks without one)."""
        return checkpointing.resume(self, folder)

    def _write_model(self, folder) -> None:
        checkpointing.write_model(self, folder)


def partial_scores(trainer: Trainer, entropy: bool | str) -> Callable[[list[Trajectory]], TokenScores]:
    """The policy's log-probs (with entropy and values when the loss needs them) for a micro-batch."""
    return lambda trajs: trainer._scores(trainer.model, trajs, entropy=entropy, values=trainer.value_head is not None)


GRPOTrainer = Trainer
"""The name of earlier versions: the trainer runs GRPO by default."""
