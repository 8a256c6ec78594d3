"""RL for multi-turn tool use: roll out groups, score, estimate advantages, update the policy.

One step, top to bottom, in four files: `Trainer.step` (trainer.py) -> `Collector.for_step` (collect.py: the prompts,
the rollout, the rubric's scores) -> `Trainer.update` (here, calling update.py's pieces: per-token inputs,
advantages, the trajectories that enter the loss, the loss over micro-batches; then the optimizer) -> the
journal (runs/journal.py: metrics, trajectory records, status). The only mutable training state is the
PolicyState (models/policy.py: model, value head, optimizer, scheduler, step, best) and the task order
(collect.py); checkpoints write and read exactly those (runs/checkpoints.py). Which estimator, loss,
aggregation and KL estimator run is configuration (registries in toolrl.algos, asked for their capabilities).
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolrl import distributed, seeds
from toolrl.algos import ADVANTAGES
from toolrl.algos.corrections import CorrectionStats
from toolrl.algos.mismatch import Mismatch
from toolrl.config.resolve import plugin_options
from toolrl.errors import ConfigError, ToolRLError
from toolrl.memory import MEASURE, meter, trim
from toolrl.models.policy import (
    PolicyState,
    ValueHead,
    adamw,
    check_teacher_tokenizer,
    lr_factor,
    make_reference,
    prepare_policy,
)
from toolrl.rollout import Trajectory
from toolrl.rollout.engine import ENGINES
from toolrl.rollout.trajectory import UpdateValues
from toolrl.runs import checkpoints
from toolrl.runs.journal import Journal
from toolrl.runs.live import LiveStep
from toolrl.runs.rundir import RunDir
from toolrl.scoring import Scorer, VocabBlocks
from toolrl.scoring.rollout_prefix import attach
from toolrl.train import reference
from toolrl.train.collect import Collector, TaskOrder, curriculum_metrics
from toolrl.train.embedding_grad import sparse_tied_embedding
from toolrl.train.evaluate import summarize
from toolrl.train.generation import Generation
from toolrl.train.staleness import offpolicy_metrics, staleness
from toolrl.train.teacher import endpoint_teacher
from toolrl.train.turn_credit import make_turn_credit
from toolrl.train.update import LossFunctions, StepRows, advantage_inputs, backward, select, step_batch
from toolrl.train.workbench import Workbench

log = logging.getLogger(__name__)


@dataclass
class StepUpdate:
    """An update's metrics and, per trajectory, its per-token values (advantages, log-probs; None: not trained)."""

    metrics: dict[str, float]
    values: list[UpdateValues | None]


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
        self.loss_fns = LossFunctions.of(self.config)
        self.kl = self.loss_fns.kl
        torch.manual_seed(seeds.init(self.config.seed))
        if t.lora.r or not t.train_vision:
            bench.model = prepare_policy(bench.model, t)  # LoRA; a vision tower frozen
            bench.engines.clear()  # engines made before hold the unwrapped model
        model = bench.model
        self.dist = distributed.from_env()
        if self.dist.on and t.prompts_per_step % self.dist.world:
            raise ConfigError(
                f"train.prompts_per_step: {t.prompts_per_step} prompts do not split over {self.dist.world} "
                "ranks; give a multiple of the number of processes"
            )
        Generation.check(t, bench.engine_name)
        self.generation = Generation(bench, model, t, self.dist, lambda: self.state.step)
        if t.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        value_head = None
        if ADVANTAGES.capability(t.advantage, "needs_values"):
            value_head = ValueHead(model.get_output_embeddings().in_features).to(bench.device)
        if t.kl.teacher and t.kl.coef > 0:
            check_teacher_tokenizer(bench.tokenizer, t.kl.teacher)
        # in every process (no collectives): a teacher behind an endpoint, a local teacher or the initial model
        m = self.config.model
        self.reference = endpoint_teacher(bench, self.config) or make_reference(model, t, m.dtype, m.cpu_linear)
        self.credit = make_turn_credit(t.turn_credit, model, None if t.kl.teacher else self.reference, bench.chat,
                                       bench.device, m.dtype, m.cpu_linear)  # fmt: skip
        if self.dist.on:
            distributed.shard(model, self.dist)
            if value_head is not None:
                distributed.shard_module(value_head, self.dist)
        params = [p for p in model.parameters() if p.requires_grad]
        params += list(value_head.parameters()) if value_head is not None else []
        optimizer = adamw(params, t.lr, t.betas, t.weight_decay, sharded=self.dist.on)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, t))
        self.state = PolicyState(model, optimizer, scheduler, value_head)
        self.rollout = bench.rollout(self.config.rollout.sampling, seed=seeds.engine(self.config.seed, "train"))
        train_tasks = list(bench.env.tasks("train"))
        self.rollout.refuse_long_prompts(train_tasks, bench.context_length)
        order = TaskOrder(
            train_tasks, self.config.seed, curriculum=t.curriculum, mix=getattr(bench.env, "draw_weights", None)
        )
        kept = attach(bench.engines.get("train"), model, t.share_prompt_pass and not self.dist.on)
        self.generation.attach(self.rollout.engine)
        self.collector = Collector(self.rollout, order, t, self.config.seed, self.dist,
                                   self.generation.before_rollout, lambda: self.generation.version, kept)  # fmt: skip
        self.scorer = Scorer(
            self.reference, self.config.rollout.sampling.temperature, t.micro_batch_tokens, self.dist,
            VocabBlocks.of(t), kept)  # fmt: skip
        self.journal = Journal(run, self.dist, self.config, bench.tokenizer, bench.env.rubric.success)
        self.on_note: Callable[[str], None] = lambda text: log.info("%s", text)  # the warm start's lines: the CLI's
        bench.note = lambda text: self.on_note(text)  # which tasks were taken, as on_note is when they are
        self.live = LiveStep(run and run.write_json, t.steps, t.prompts_per_step * t.group_size // self.dist.world)
        self.rollout.on_finished = self.live.finished_one  # RUN/live.json: where the running step is (the UI's)
        self.warm_start = None
        if t.warm_start:
            from toolrl.train.sft import WarmStart

            seed = seeds.derive(self.config.seed, "sft")
            self.warm_start = WarmStart(bench, self.config.sft, t.micro_batch_tokens, seed, VocabBlocks.of(t))

    @property
    def model(self):
        return self.state.model

    @property
    def value_head(self):
        return self.state.value_head

    # ---- weights the rollouts sample from ---------------------------------------------------------------

    @property
    def generator(self):
        """What the rollout engines sample from: the policy itself, or its copy (train/generation.py)."""
        return self.generation.copy

    def refresh_generator(self, version: int | None = None) -> None:
        """The generation copy and the engines get the policy's weights of `version` optimizer steps (default:
        done). No rollout may run on the copy; under torchrun every rank calls it (weights gathered)."""
        self.generation.refresh(version)

    # ---- one step -----------------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, Any]:
        """One step: rollout (scored by the rubric) -> advantages, loss, optimizer -> journal."""
        started = time.perf_counter()
        self.live.begin(step)
        with meter.phase("rollout"):
            part = self.collector.for_step(step, self.config.train.steps)
        trajs = part.trajs
        waited = time.perf_counter() - started
        bound, now = self.config.train.async_steps, self.state.step  # now: the optimizer steps the update starts from
        too_stale = [s > bound for s in staleness(trajs, now, part.version)]  # none, by the collector's order
        with meter.phase("update"):
            update = self.update(trajs, too_stale)
            self.state.optimizer.zero_grad(set_to_none=True)  # the rollout and evaluation to come hold no gradient
        generated = sum(traj.trained_count for traj in trajs)
        metrics = {
            "step": step,
            **summarize(trajs, self.bench.env.rubric.success),
            **update.metrics,
            **{f"tools/{k}": v for k, v in part.tool_counts.items()},
            **part.reward_counts,
            "generated_tokens": generated,
            "trajectories": len(trajs),
            "gen_tokens_per_s": generated / part.rollout_s,
            "rollout_s": part.rollout_s,
            "train_s": time.perf_counter() - started - waited,
            "step_s": time.perf_counter() - started,
            **meter.metrics(("rollout", "update")),
        }
        if self.collector.asynchronous:  # optimizer steps since the weights that sampled the tokens
            metrics |= offpolicy_metrics(trajs, now, part.version, bound)
            metrics["offpolicy/rollout_wait_s"] = waited
        order = self.collector.order
        if order.by_pass_rate:
            rates = order.pass_rates()
            metrics |= curriculum_metrics(rates)
            if self.run is not None:
                self.run.write_json("pass_rates.json", {"step": step, "tasks": rates})
        metrics = distributed.reduce_metrics(self.dist, metrics)
        self.journal.step(step, metrics, trajs, update.values)
        return metrics

    def update(self, trajs: list[Trajectory], leave_out: Sequence[bool] = ()) -> StepUpdate:
        """One optimizer step over the step's trajectories: per-token inputs, advantages, the trajectories that
        enter the loss, the loss over micro-batches, the optimizer and the schedule. `leave_out`: trajectories out
        of the loss and of their group's statistics (staler than train.async_steps)."""
        t, device, state = self.config.train, self.bench.device, self.state
        leave_out = list(leave_out) or [False] * len(trajs)
        started = time.perf_counter()
        credited = self.credit.assign(trajs, t.group_size) if self.credit is not None else {}  # dense: turn rewards
        rows = StepRows.of(trajs)  # every segment of every trajectory, scored as a prefix tree where they link
        sharing = "tree" if rows.linked else "group"
        ref_parts, value_parts = self.scorer.before_update(state.model, state.value_head, rows.rows, t.kl.coef > 0,
                                                           sharing)  # fmt: skip
        scored = time.perf_counter()
        refs, values = rows.per_trajectory(ref_parts, len(trajs)), rows.per_trajectory(value_parts, len(trajs))
        batch = step_batch(trajs, refs, values, t, self.kl, device, leave_out)
        inputs = advantage_inputs(batch, t, device, state.value_head is not None, self.estimator_options)
        est = distributed.step_advantages(self.dist, self.estimate, inputs) if self.dist.on else self.estimate(inputs)
        only_policy = (t.kl.coef == 0 or t.kl.mode == "reward") and not t.entropy_coef and state.value_head is None
        chosen = select(batch, rows, est, t, only_policy)
        chosen.totals = distributed.global_totals(self.dist, chosen.totals)
        state.model.train()
        state.optimizer.zero_grad(set_to_none=True)
        with sparse_tied_embedding(state.model, not self.dist.on):  # the embedding's gradient: its touched rows
            longest = rows.longest_episode  # a long horizon's heap is bounded as a long sequence's (memory.py)
            plan = self.scorer.plan(state.model, [w.row for w in chosen.work], sharing, longest)  # prompt once a step
            scores = self.live.counted(
                self.scorer.policy(state.model, state.value_head, t.entropy_coef > 0 or "measure", plan),
                len(plan.batches),
            )
            pad_to = distributed.max_over_ranks(self.dist, len(plan.batches))
            sums, clipped = backward(chosen, plan, scores, self.loss_fns, t, pad_to, rows.rows[0],
                                     mismatch := Mismatch(), corrections := CorrectionStats())  # fmt: skip
        backward_done = time.perf_counter()
        params = [p for group in state.optimizer.param_groups for p in group["params"]]
        any_work = distributed.max_over_ranks(self.dist, len(chosen.work)) > 0  # every rank steps its shards
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm) if any_work else torch.tensor(0.0)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = state.optimizer.param_groups[0]["lr"]
        if any_work:
            with self.generation.inbox.writing():  # a rollout taking weights meanwhile waits for the whole step
                state.optimizer.step()
        self.generation.updated(state.step + 1, any_work)  # to the copy and engines now, or for the next to take
        with warnings.catch_warnings():  # a step with nothing to train skips optimizer.step(); the schedule goes on
            warnings.simplefilter("ignore", UserWarning)
            state.scheduler.step()
        metrics = {
            "time/reference_and_values_s": scored - started,
            "time/forward_backward_s": backward_done - scored,
            "time/optimizer_s": time.perf_counter() - backward_done,
            "loss": sums["loss"],
            "pg_loss": sums["pg_loss"],
            "grad_norm": float(grad_norm),
            "clip_frac": clipped / chosen.totals.tokens,
            "lr": lr,
            "trained_trajectories": len(chosen.work),
            "segments": len(rows.rows) - len(trajs),
            "segments_left_out": chosen.left_out,
            "kept_fraction": sum(chosen.keep[: len(trajs)]) / max(len(trajs), 1),
            "fault_masked": sum(not v and not out for v, out in zip(batch.valid, leave_out, strict=False)),
            "advantage_abs": float(est.advantages.abs().mean()) if len(est.advantages) else 0.0,
            **mismatch.metrics(),
            **(corrections.metrics() if self.loss_fns.corrects else {}),
            **self.scorer.prompt_pass_metrics(),
            **credited,
        }
        optional = {
            "kl": t.kl.coef > 0,
            "entropy": sums["entropy"] is not None,
            "value_loss": state.value_head is not None,
        }
        metrics.update({k: sums[k] for k, on in optional.items() if on})
        trim()  # the step's activations go back to the system, not into a fragmented heap
        return StepUpdate(metrics, chosen.values(len(trajs)))

    # ---- the run ------------------------------------------------------------------------------------------

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The run: evaluations, steps, checkpoints, the final model. status.json follows it; a STOP file in
        the run directory ends it after the current step, with a checkpoint (summary["stopped"])."""
        config, t, state = self.config, self.config.train, self.state
        summary: dict[str, Any] = {}
        self.journal.status(state="running", step=state.step, steps=t.steps)
        try:
            if config.eval.at_start and state.step == 0:
                summary["eval_start"] = self.evaluate("start", 0)
            if self.warm_start is not None and state.step == 0:
                summary |= self.run_warm_start()
            for step in range(state.step + 1, t.steps + 1):
                metrics = self.step(step)
                state.step = step
                if on_step:
                    on_step(metrics)
                if step < t.steps and self.journal.stop_requested():
                    self.settle()
                    summary |= {"stopped": step, "checkpoint": str(self.save_checkpoint())}
                    break
                if t.eval_every and step % t.eval_every == 0 and step < t.steps:
                    self.evaluate_and_keep_best(step)
                if t.save_every and step % t.save_every == 0 and step < t.steps:
                    self.save_checkpoint()
            else:
                if why := self.rollout.nothing_trained():
                    raise ToolRLError(why)
                self._finish(summary)
        except BaseException as exc:
            stopped = isinstance(exc, KeyboardInterrupt)
            self.journal.status(state="stopped" if stopped else "failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.collector.close()
            self.journal.close()
        late = "stopped" not in summary and self.journal.stop_requested()  # asked during the last step
        note = {"note": "the stop came during the last step: the run finished first"} if late else {}
        self.journal.status(state="stopped" if "stopped" in summary else "finished", step=state.step, **note)
        return summary

    def run_warm_start(self) -> dict[str, Any]:
        """The supervised warm start (train/sft.py) on the policy, before the first RL step; its lines go to
        RUN/sft.jsonl and, as progress, to on_note."""
        assert self.warm_start is not None
        from toolrl.train.sft import progress_line

        if self.dist.on:
            raise ConfigError("train.warm_start: the warm start runs in one process; run toolrl sft first, then "
                              "torchrun the RL run from its model (model.name: RUN/final)")  # fmt: skip

        def record(line: dict[str, Any]) -> None:
            if self.run is not None:
                self.run.append("sft.jsonl", [line])
            self.on_note(progress_line(line))

        def sync() -> None:  # the engines sample from the tuned weights (a copy or vLLM gets them)
            self.generation.refresh(0, force=True)

        self.journal.status(state="running", step=0, phase="sft")
        with meter.phase("warm_start"):
            summary = self.warm_start.run(self.model, sync, record)
            gc.collect()  # its optimizer's states and gradients go back to the system before the first rollout
            trim()
            if reference.rebase(self):  # the KL term's model and the credit's scorer: the warm-started policy
                checkpoints.save_warm_start(self.run, self.model)
        self.journal.status(phase="rl")
        return summary

    def _finish(self, summary: dict[str, Any]) -> None:
        if self.config.eval.at_end and (self.config.train.steps or self.warm_start is not None):
            summary["eval_end"] = self.evaluate_and_keep_best(self.config.train.steps)
        with meter.phase("checkpoint"):
            self.save_checkpoint()  # under torchrun a collective: every rank writes its shards
            if self.run:
                summary["checkpoint"] = str(self.run.save("final", self.write_model))
        summary["memory"] = {"peak_gb": meter.current_overall(), "phases_peak_gb": dict(meter.peaks),
                             "children_peak_gb": round(meter.children_peak, 3), "measure": MEASURE}  # fmt: skip
        if self.run:
            self.run.write_json("memory.json", summary["memory"])
            from toolrl.runs.report import write_plot

            write_plot(self.run.path)

    def settle(self) -> None:
        """Wait for a rollout running in the background (before evaluating on the generator's engine)."""
        self.collector.settle()

    def evaluate(self, when: str, step: int) -> dict[str, float]:
        """Evaluate the current weights on the test split (rank 0; the others wait) and journal it."""
        self.settle()
        self.refresh_generator()  # on every rank: a collective under torchrun
        if not self.dist.main:
            distributed.barrier(self.dist)
            return {}
        started = time.perf_counter()
        with meter.phase("eval"):
            trajs = self.bench.evaluation(progress=self.on_note, what=f"eval {when}")
        stats = summarize(trajs, self.bench.env.rubric.success)
        distributed.barrier(self.dist)
        stats["eval_s"] = time.perf_counter() - started
        stats |= meter.metrics(("eval",))
        self.journal.evaluation(when, step, stats, trajs)
        return stats

    def evaluate_and_keep_best(self, step: int) -> dict[str, float]:
        stats = self.evaluate("end" if step == self.config.train.steps else f"step {step}", step)
        metric = "success" if "success" in stats else "reward"  # an environment without a success criterion
        score = stats.get(metric)
        if self.run and score is not None and (self.state.best is None or score > self.state.best):
            self.state.best = score
            checkpoints.save_best(self.run, self.generator, self.bench.tokenizer, step, metric, score)
        return stats

    # ---- checkpoints (runs/checkpoints.py) ---------------------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        return checkpoints.save_checkpoint(self.run, self.dist, self.state, self.collector.order_state())

    def resume(self, folder: Path | None = None) -> int:
        """Continue from the run's last checkpoint (`folder`: the run directory, for ranks without one)."""
        self.collector.order.load(checkpoints.resume(self.run, self.dist, self.state, folder))
        self.generation.refresh(force=True)  # the generation copy and engines start from the loaded weights
        if self.warm_start is not None and self.state.step > 0:  # the reference the run had: the warm start's
            run = self.run or (RunDir.existing(folder) if folder else None)
            if (weights := reference.kept_weights(self.config, self.credit, run, self.dist.on)) is not None:
                reference.rebase(self, weights)
        return self.state.step

    def write_model(self, folder: Path) -> None:
        """The policy as a Hugging Face folder (under torchrun: the full, synced generation copy)."""
        checkpoints.write_model(self.generator, self.bench.tokenizer, folder)


GRPOTrainer = Trainer
"""The name of earlier versions: the trainer runs GRPO by default."""
