"""The supervised warm start: fine-tune on trajectories in the RL format (token ids as the rollout made them, the
model's turns in the loss, tool results and user turns out of it), so that a policy that never succeeds gets
successes to learn from before GRPO's signal can start.

Sources (`sft.source`, a registry: `register_sft_source` adds one): the environment's reference policy playing
the train split; a teacher behind an OpenAI-compatible endpoint playing it; a JSONL of conversations in the
OpenAI messages format; the policy itself (rejection sampling: keep its successful samples, fine-tune, sample
again, `sft.rounds` times). What a source plays is scored by the environment's rubric and, with `keep:
success`, only the successful trajectories are learned from; what is left out is counted in sft.jsonl.
The loss is the mean negative log-likelihood of the trained tokens of every segment (toolrl/scoring: shared prefixes
computed once), LoRA or full, whatever the run trains.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from toolrl import distributed
from toolrl.config.preflight import NO_SFT_FILE
from toolrl.config.schema import SamplingConfig, SFTConfig
from toolrl.envs.base import Task
from toolrl.errors import ConfigError, DataError
from toolrl.files import read_text
from toolrl.memory import meter, trim
from toolrl.models.policy import adamw
from toolrl.registry import Registry
from toolrl.rollout.limits import limits_hit
from toolrl.rollout.trajectory import Trajectory
from toolrl.scoring import DEFAULT_BLOCKS, Scorer, VocabBlocks
from toolrl.text import clip, first_line
from toolrl.tools.observation import results_cut
from toolrl.train.embedding_grad import sparse_tied_embedding

log = logging.getLogger(__name__)


@dataclass
class Played:
    """What a source gave for one round: trajectories to learn from, and what it could not play."""

    trajs: list[Trajectory]
    left_out: int = 0
    """Tasks it could not play (no reference for them)."""
    unreadable: list[str] = field(default_factory=list)
    """Why records of a file were skipped (one line each)."""


Source = Callable[[Any, SFTConfig, Sequence[Task], int], Played]
"""(workbench, sft config, train tasks, seed) -> Played."""

SFT_SOURCES: Registry[Source] = Registry("sft source", "sft.source")
register_sft_source = SFT_SOURCES.register


def _play(bench, purpose: str, cfg: SFTConfig, tasks: Sequence[Task], seed: int, samples: int) -> list[Trajectory]:
    rollout = bench.rollout(SamplingConfig(temperature=cfg.temperature), seed, purpose=purpose)
    return rollout.run([task for task in tasks for _ in range(samples)], seed=seed)


@register_sft_source("reference")
def reference_source(bench, cfg: SFTConfig, tasks: Sequence[Task], seed: int) -> Played:
    """The environment's reference policy (its known-good calls) plays each task once."""
    from toolrl.rollout.scripted import playable

    played, left = playable(bench.env, tasks, "reference")
    if not played:
        raise ConfigError(f"sft.source: reference, but environment {bench.env.name} has no reference for any of "
                          f"its {len(tasks)} train tasks; use teacher, file or self")  # fmt: skip
    if "sft-reference" not in bench.engines:
        bench.engines["sft-reference"] = bench.scripted("reference")
    return Played(_play(bench, "sft-reference", cfg, played, seed, 1), left_out=len(left))


@register_sft_source("teacher")
def teacher_source(bench, cfg: SFTConfig, tasks: Sequence[Task], seed: int) -> Played:
    """A model behind an OpenAI-compatible endpoint plays each task samples_per_task times."""
    from toolrl.rollout.openai import served_engine

    if cfg.teacher is None:
        raise ConfigError("sft.teacher: sft.source is teacher; give sft.teacher.base_url (and model)")
    if "sft-teacher" not in bench.engines:
        bench.engines["sft-teacher"] = served_engine(bench.chat, cfg.teacher, bench.config.model.name, "sft.teacher")
    return Played(_play(bench, "sft-teacher", cfg, tasks, seed, cfg.samples_per_task))


@register_sft_source("self")
def self_source(bench, cfg: SFTConfig, tasks: Sequence[Task], seed: int) -> Played:
    """The policy samples each task samples_per_task times (rejection sampling keeps its successes)."""
    return Played(_play(bench, "train", cfg, tasks, seed, cfg.samples_per_task))


@register_sft_source("file")
def file_source(bench, cfg: SFTConfig, tasks: Sequence[Task], seed: int) -> Played:
    """Conversations of a JSONL file, rendered as the rollout renders them (every one kept)."""
    if not cfg.file:
        raise ConfigError(NO_SFT_FILE)
    schemas = [tool.to_openai() for tool in bench.env.tools()] if bench.env.show_tool_schemas else []
    trajs, unreadable = [], []
    for k, line in enumerate(read_text(Path(cfg.file), "sft.file", DataError, max_bytes=None).splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            trajs.append(conversation_trajectory(bench.chat, bench.env.syntax, record, schemas, f"file-{k + 1}"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            unreadable.append(f"{cfg.file}:{k + 1}: {clip(first_line(exc), 160)}")
    if not trajs:
        raise DataError(f"sft.file: {cfg.file} has no usable conversation"
                        + (f" ({unreadable[0]})" if unreadable else ""))  # fmt: skip
    return Played(trajs, unreadable=unreadable)


def conversation_trajectory(chat, syntax, record: dict[str, Any], schemas: list[dict], task_id: str) -> Trajectory:
    """One conversation ({"messages": [...], "tools": [...]}) as a trajectory: the messages before the first
    assistant turn are the prompt, each assistant turn a trained model turn (its tool_calls written in the run's
    call syntax), tool and user messages between them observations, out of the loss, framed as the rollout
    frames them."""
    from toolrl.gateway.capture import continuation_ids, template_messages

    messages = record["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of objects")
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a conversation needs a prompt (system or user messages) and then an assistant turn")
    tools = record.get("tools", schemas)
    prompt = chat.prompt_ids(template_messages(messages[:first], syntax), tools, syntax.instructions)
    question = next((str(m.get("content")) for m in messages[:first] if m.get("role") == "user"), "")
    traj = Trajectory.start(Task(task_id, question, "", {}), prompt)
    pending: list[dict[str, Any]] = []
    for message in messages[first:]:
        role = message.get("role")
        if role == "assistant":
            if pending:
                ids = continuation_ids(chat, pending, True)
                if any(m.get("role") == "user" for m in pending):
                    traj.add_user_message(ids, "\n".join(str(m.get("content") or "") for m in pending))
                else:
                    traj.add_observation(ids)
                pending = []
            (text,) = [m["content"] for m in template_messages([message], syntax)]
            ids = chat.encode(text) + [chat.end_of_turn_id]
            traj.add_model_turn(ids, [0.0] * len(ids), text)
        elif role in ("tool", "user"):
            pending.append(message)
        else:
            raise ValueError(f"a message after the first assistant turn has role {clip(str(role), 20)!r}")
    return traj


def succeeded(traj: Trajectory, success: str | None) -> bool:
    """Whether a played trajectory counts as a success: the rubric's success criterion, else a positive reward;
    never one that an infrastructure fault ended."""
    if traj.env_fault is not None or traj.trained_count == 0:
        return False
    if success is not None:
        return traj.rewards.get(success, 0.0) >= 1.0
    return traj.reward > 0


def fine_tune(
    model, trajs: Sequence[Trajectory], cfg: SFTConfig, micro_batch_tokens: int, seed: int,
    on_step: Callable[[dict[str, Any]], None], vocab: VocabBlocks = DEFAULT_BLOCKS,
) -> None:  # fmt: skip
    """`cfg.epochs` passes over `trajs` in a seeded order, `cfg.batch_size` trajectories per optimizer step: the
    mean negative log-likelihood of their trained tokens, micro-batched."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, cfg.lr)
    rng = random.Random(seed)
    scorer = Scorer(None, 1.0, micro_batch_tokens, distributed.from_env(), vocab)  # one process (the warm start)
    model.train()
    steps = cfg.epochs * -(-len(trajs) // cfg.batch_size)
    done = 0
    for epoch in range(1, cfg.epochs + 1):
        order = list(range(len(trajs)))
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            started = time.perf_counter()
            batch = [trajs[i] for i in order[start : start + cfg.batch_size]]
            rows = [segment for t in batch for segment in t.sequences() if sum(segment.loss_mask)]
            tokens = sum(sum(row.loss_mask) for row in rows)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            with sparse_tied_embedding(model):  # the embedding's gradient: the rows the batch touched
                longest = max(sum(len(s.token_ids) for s in t.sequences()) for t in batch)  # an episode's segments
                plan = scorer.plan(model, rows, "tree" if len(rows) > len(batch) else "group", longest)
                for micro in plan.batches:
                    scores = scorer.scores(model, [rows[i] for i in micro], prefix=plan.prefix, sharing=plan.sharing)
                    loss = -scores.logprobs.sum() / tokens
                    loss.backward()
                    total += float(loss.detach())
                plan.finish()
            norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            optimizer.step()
            trim()  # the step's activations go back to the system: the heap had grown step after step
            done += 1
            seconds = round(time.perf_counter() - started, 3)
            on_step({"sft_step": done, "sft_steps": steps, "epoch": epoch, "loss": round(total, 5),
                     "tokens": tokens, "grad_norm": round(norm, 4), "step_s": seconds})  # fmt: skip
    optimizer.zero_grad(set_to_none=True)
    model.eval()


class WarmStart:
    """The warm start of a run: `rounds` times, a source plays the train split, its successes (or everything)
    are kept, the policy is fine-tuned on them and `sync` hands the new weights to the engines."""

    def __init__(self, bench, cfg: SFTConfig, micro_batch_tokens: int, seed: int, vocab: VocabBlocks = DEFAULT_BLOCKS):
        SFT_SOURCES.lookup(cfg.source)  # an unknown source is a one-line error naming the registered ones
        self.bench, self.cfg, self.micro_batch_tokens, self.seed = bench, cfg, micro_batch_tokens, seed
        self.vocab = vocab

    def run(self, model, sync: Callable[[], None], record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        cfg, bench = self.cfg, self.bench
        tasks = bench.sample("train", cfg.num_tasks, "warm start")
        success = bench.env.rubric.success
        summary: dict[str, Any] = {"sft_rounds": cfg.rounds, "sft_kept": 0, "sft_played": 0}
        cuts: Counter[str] = Counter()  # the rollout limits that cut what a round kept nothing of
        for round_ in range(1, cfg.rounds + 1):
            seed = self.seed + round_
            started = time.perf_counter()
            with meter.phase("sft_play"):
                played = SFT_SOURCES[cfg.source](bench, cfg, tasks, seed)
            for reason in played.unreadable[:20]:
                log.warning("sft: skipped %s", reason)
            keep_all = cfg.keep == "all" or cfg.source == "file"
            kept = [t for t in played.trajs if t.trained_count and (keep_all or succeeded(t, success))]
            line = {"sft_round": round_, "source": cfg.source, "played": len(played.trajs), "kept": len(kept),
                    "left_out_tasks": played.left_out, "unreadable": len(played.unreadable),
                    "play_s": round(time.perf_counter() - started, 2)}  # fmt: skip
            categories = Counter(str(t.task.meta["category"]) for t in kept if "category" in t.task.meta)
            if categories:  # what the warm start teaches, by kind of task (a split's first N may be one kind)
                line["kept_by_category"] = dict(categories)
            record(line)
            summary["sft_played"] += len(played.trajs)
            summary["sft_kept"] += len(kept)
            if not kept:
                log.warning("sft: round %d kept no trajectory (%d played, none successful): nothing to learn from",
                            round_, len(played.trajs))  # fmt: skip
                cuts.update(hit for t in played.trajs for hit in self._limits_hit(t))
                continue
            with meter.phase("sft_train"):
                fine_tune(model, kept, cfg, self.micro_batch_tokens, seed, partial(_tagged, record, round_),
                          self.vocab)  # fmt: skip
            sync()
        if not summary["sft_kept"]:
            raise DataError(nothing_kept(cfg, summary["sft_played"], cuts))
        return summary

    def _limits_hit(self, traj: Trajectory) -> list[str]:
        rollout, tokenizer = self.bench.config.rollout, self.bench.chat.tokenizer
        return limits_hit(traj, rollout, results_cut(traj.results, tokenizer, rollout.max_observation_tokens))


def nothing_kept(cfg: SFTConfig, played: int, cuts: Counter[str]) -> str:
    """The one line of a warm start that kept nothing: what cut the trajectories (each limit, how many), or that
    none was cut, and what to change. No model is written as if trained."""
    what = f"sft: kept none of the {played} trajectories sft.source {cfg.source} played ({cfg.rounds} round(s))"
    successes = cfg.keep == "success" and cfg.source != "file"  # else every trajectory with a model turn is kept
    if cuts:
        limits = ", ".join(f"{limit} cut {n} of them" for limit, n in cuts.most_common())
        instead = " or set sft.keep: all" if successes else ""
        why = f"{limits}; raise the limit (toolrl env check names the value that fits){instead}"
    elif successes:
        why = "none succeeded and no rollout limit cut them; set sft.keep: all, or another sft.source"
    else:
        why = "none had a model turn to learn from; check what the source gives (sft.file: assistant messages)"
    return f"{what}: {why}; no model was written"


def _tagged(record: Callable[[dict[str, Any]], None], round_: int, line: dict[str, Any]) -> None:
    record({"sft_round": round_, **line})


def progress_line(line: dict[str, Any]) -> str:
    """A warm-start record as one progress line."""
    if "sft_step" in line:
        return (f"sft round {line['sft_round']} step {line['sft_step']}/{line['sft_steps']} epoch {line['epoch']}  "
                f"loss {line['loss']:.4f}  tokens {line['tokens']}  {line['step_s']:.1f} s")  # fmt: skip
    left = f", {line['left_out_tasks']} tasks it cannot play" if line.get("left_out_tasks") else ""
    bad = f", {line['unreadable']} records unreadable" if line.get("unreadable") else ""
    kinds = ", ".join(f"{k} {n}" for k, n in line.get("kept_by_category", {}).items())
    return (f"sft round {line['sft_round']}: {line['source']} played {line['played']}, kept {line['kept']}"
            f"{f' ({kinds})' if kinds else ''}{left}{bad} ({line['play_s']:.1f} s)")  # fmt: skip
