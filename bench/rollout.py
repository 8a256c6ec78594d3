"""Benchmark: per-trajectory scheduling against lock-step turns, and engine generation speed.

Workload (all on the default model and one HFEngine, one way after the other in this run): 64 trajectories on
the calculator prompts (a ~400-token shared prefix), 3 turns of exactly 32 sampled tokens (no stop token), and
every turn calls one tool whose result (a short text) is fed back: 192 calls. The bench parser counts every
turn as one call, so the work is the same for all ways. Tool latencies come from one seeded list, taken in
call order, so every way waits on the same latencies.

Ways: (a) ours: per-trajectory state machine, continuous batching; (b) lock-step turns, the calls of a turn
one after another; (c) lock-step turns, the calls of a turn gathered concurrently (RL-Factory's way);
(d) ours with zero-latency tools (the limit). Latency settings: fixed 1 s, and log-normal with median 0.5 s
and p99 5 s (sigma 0.99). Ours and (c), the comparison that decides, run `--repeats` times each per setting,
alternated, and their mean wall times give `lockstep_vs_ours`; (b) runs once (minutes).

Also: generated tokens/s of the engine against `model.generate` on the same prompts at batch 1, 8 and 32,
and transformers' own continuous batching (`generate_batch`) at batch 32. The limit run (twice, alternated) and
the batch speeds (median of three, alternated) are also measured with the engine's cascade attention off (the
shared prefix read per slot).

End to end (`--end-to-end`): whole training runs (`Trainer.train`, N steps of the calculator with its worked
examples, 4 prompts x 6 samples at temperature 0.6, where the default model calls the calculator on about three
tasks in four and solves about 70%, no evaluations) whose one tool, the calculator, answers after a latency from
the seeded list: zero, or the heavy tail above. Each setting runs twice, alternated (zero, heavy, heavy, zero),
lock-step steps (train.async_steps 0) and one step ahead (train.async_steps 1: the next step's rollout runs
during this step's update, its staleness bounded to one step and logged as offpolicy/staleness). Writes
`end_to_end` and `end_to_end_tail_vs_zero` (the one-step-ahead runs' summed wall time, heavy over zero) into
bench/results/rollout.json, keeping the file's other results.
Prints a table and writes bench/results/rollout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from pathlib import Path

import torch
from common import machine, write_results

from toolrl.chat import ChatFormat
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.models import load_model, load_tokenizer
from toolrl.parsers.base import ParseResult
from toolrl.rollout import HFEngine, Rollout, RolloutLimits, SamplingParams
from toolrl.tools import ToolCall, ToolExecutor, tool_from_function

MODEL = "smollm2-135m-instruct"


class Latencies:
    """A seeded list of latencies handed out in call order."""

    def __init__(self, kind: str, count: int, seed: int = 0):
        rng = random.Random(seed)
        if kind == "fixed":
            self.values = [1.0] * count
        elif kind == "heavy":
            self.values = [rng.lognormvariate(math.log(0.5), 0.99) for _ in range(count)]
        elif kind in ("tail20", "tail20slow"):  # p99 = exp(2.326 x 1.35) = 23x the median (bench/async.py)
            median = 0.5 if kind == "tail20" else 2.0
            self.values = [rng.lognormvariate(math.log(median), 1.35) for _ in range(count)]
        else:
            self.values = [0.0] * count
        self.next = 0

    def take(self) -> float:
        value = self.values[self.next % len(self.values)]
        self.next += 1
        return value


def every_turn_calls(text: str, names) -> ParseResult:
    return ParseResult(calls=[ToolCall("lookup", {"query": "x"})])


def make_rollout(env, engine, chat, latencies: Latencies, schedule: str, sequential: bool, turns: int, tokens: int):
    async def lookup(query: str) -> str:
        """A remote lookup."""
        await asyncio.sleep(latencies.take())
        return "result: 42"

    # the naive baseline: one call at a time, whatever the trajectory (an executor with one slot)
    executor = ToolExecutor([tool_from_function(lookup)], timeout_s=60, max_concurrency=1 if sequential else 64)
    limits = RolloutLimits(turns, tokens, 100_000, 64, SamplingParams(1.0), last_turn_tools=True)
    return Rollout(env, engine, chat, every_turn_calls, executor, limits, schedule)


def run_way(env, engine, chat, tasks, kind, schedule, sequential, turns, tokens) -> dict:
    latencies = Latencies(kind, len(tasks) * turns)
    rollout = make_rollout(env, engine, chat, latencies, schedule, sequential, turns, tokens)
    started = time.perf_counter()
    trajs = rollout.run(tasks)
    wall = time.perf_counter() - started
    generated = sum(sum(t.loss_mask) for t in trajs)
    calls = sum(t.num_tool_calls for t in trajs)
    assert calls == len(tasks) * turns, calls
    return {
        "wall_s": round(wall, 2),
        "generated_tokens": generated,
        "tokens_per_s": round(generated / wall, 1),
        "tool_calls": calls,
        "tool_latency_sum_s": round(sum(latencies.values[:calls]), 1),
    }


def engine_speed(engine, rows, tokens: int) -> float:
    """Generated tokens/s for `rows` prompts at once, `tokens` new tokens each."""

    async def generate():
        params = SamplingParams(1.0, max_new_tokens=tokens)
        outs = await asyncio.gather(*(engine.generate(("gen", i), p, params) for i, p in enumerate(rows)))
        for i in range(len(rows)):
            engine.release(("gen", i))
        return sum(len(o.ids) for o in outs)

    started = time.perf_counter()
    generated = asyncio.run(generate())
    return generated / (time.perf_counter() - started)


def generation_speed(model, tokenizer, engine, per_slot, prompts, batch: int, tokens: int) -> dict:
    rows = prompts[:batch]
    speeds = {"ours": [], "per_slot": []}
    for _ in range(3):  # alternated, the median of three: this machine is noisy
        speeds["ours"].append(engine_speed(engine, rows, tokens))
        speeds["per_slot"].append(engine_speed(per_slot, rows, tokens))
    ours, ours_per_slot = (sorted(v)[1] for v in speeds.values())

    width = max(len(p) for p in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    generate_s = time.perf_counter() - started
    generate_tokens = (out.shape[1] - width) * len(rows)
    return {
        "batch": batch,
        "ours_tokens_per_s": round(ours, 1),
        "ours_per_slot_attention_tokens_per_s": round(ours_per_slot, 1),
        "cascade_vs_per_slot": round(ours / ours_per_slot, 3),
        "generate_tokens_per_s": round(generate_tokens / generate_s, 1),
        "ours_vs_generate": round(ours / (generate_tokens / generate_s), 2),
    }


def transformers_cb_speed(model, prompts, tokens: int) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, eos_token_id=-1)
    started = time.perf_counter()
    out = model.generate_batch(
        prompts,
        generation_config=config,
        continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
        progress_bar=False,
    )
    wall = time.perf_counter() - started
    generated = sum(len(o.generated_tokens) for o in out.values())
    return {"batch": len(prompts), "tokens_per_s": round(generated / wall, 1), "wall_s": round(wall, 1)}


def slow_calculator_env():
    """A calculator environment, registered from outside the package, whose tool answers after the latency its
    options name (env.options.latency: zero, fixed, heavy, tail20 or tail20slow), taken in call order from the seeded
    list."""
    from typing import Literal

    from toolrl.envs.base import ENVIRONMENTS, register_env
    from toolrl.envs.calculator.env import CalculatorEnv, CalculatorOptions
    from toolrl.envs.calculator.tool import calculator

    if "bench_slow_calculator" in ENVIRONMENTS:
        return

    class SlowOptions(CalculatorOptions):
        latency: Literal["zero", "fixed", "heavy", "tail20", "tail20slow"] = "zero"

    @register_env("bench_slow_calculator")
    class SlowCalculator(CalculatorEnv):
        Options = SlowOptions

        def __init__(self, config, options):
            super().__init__(config, options)
            self.latencies = Latencies(options.latency, 10_000)

        def tools(self):
            latencies = self.latencies

            async def calculator_tool(expression: str) -> str:
                await asyncio.sleep(latencies.take())
                return calculator(expression)

            calculator_tool.__name__, calculator_tool.__doc__ = "calculator", calculator.__doc__  # the same schema
            return [tool_from_function(calculator_tool, idempotent=True)]


def train_run(
    latency: str, async_steps: int, steps: int, out: str, extra: tuple[str, ...] = (), repeat: int = 0
) -> dict:
    """One training run of `steps` steps; its wall time (the steps and the final checkpoint, not the load)."""
    from toolrl.config import load_config
    from toolrl.train import RunDir, Trainer, Workbench

    slow_calculator_env()
    config = load_config(overrides=[
        "env.name=bench_slow_calculator", f"env.options.latency={latency}", f"train.steps={steps}",
        f"train.async_steps={async_steps}", "eval.at_start=false", "eval.at_end=false", f"output_dir={out}",
        f"run_name=e2e-{latency}-{async_steps}-{repeat}", "device=cpu", "rollout.sampling.temperature=0.6", *extra,
    ])  # fmt: skip
    bench = Workbench.load(config)
    trainer = Trainer(bench, RunDir.create(config))
    rows = []
    started = time.perf_counter()
    trainer.train(on_step=rows.append)
    wall = time.perf_counter() - started
    bench.close()
    calls = sum(r.get("tool_calls", 0) * r["trajectories"] for r in rows)
    return {
        "wall_s": round(wall, 1),
        "generated_tokens": sum(r["generated_tokens"] for r in rows),
        "tool_calls": round(calls),
        "tool_latency_sum_s": round(sum(bench.env.latencies.values[: bench.env.latencies.next]), 1),
        "rollout_s": round(sum(r["rollout_s"] for r in rows), 1),
        "staleness_max": max((r.get("offpolicy/staleness", 0) for r in rows), default=0),
    }


def end_to_end(steps: int, out: str) -> None:
    import tempfile

    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for async_steps in (0, 1):
            for repeat, latency in enumerate(("zero", "heavy", "heavy", "zero")):
                key = f"{'ahead' if async_steps else 'lockstep'}_{latency}"
                run = train_run(latency, async_steps, steps, tmp, repeat=repeat)
                runs.setdefault(key, []).append(run)
                line = f"{key:>16}: {run['wall_s']:7.1f} s  {run['generated_tokens']:6d} tokens  "
                print(line + f"{run['tool_calls']:4d} calls  latency {run['tool_latency_sum_s']:6.1f} s", flush=True)

    def total(key, field="wall_s"):
        return sum(r[field] for r in runs[key])

    summary = {}
    for mode in ("lockstep", "ahead"):
        summary[f"{mode}_tail_vs_zero"] = round(total(f"{mode}_heavy") / total(f"{mode}_zero"), 3)
        per_token = [total(f"{mode}_{lat}") / total(f"{mode}_{lat}", "generated_tokens") for lat in ("heavy", "zero")]
        summary[f"{mode}_tail_vs_zero_per_token"] = round(per_token[0] / per_token[1], 3)
    summary["ahead_vs_lockstep_zero"] = round(total("ahead_zero") / total("lockstep_zero"), 3)
    print(f"\n{'mode':>10} {'heavy/zero wall':>16} {'per token':>10}")
    for mode in ("lockstep", "ahead"):
        print(f"{mode:>10} {summary[f'{mode}_tail_vs_zero']:>16} {summary[f'{mode}_tail_vs_zero_per_token']:>10}")
    result = json.loads(Path(out).read_text()) if Path(out).exists() else {}
    result["end_to_end"] = {"machine": machine(), "steps": steps, "runs": runs, **summary}
    result["end_to_end_tail_vs_zero"] = summary["ahead_tail_vs_zero"]
    write_results(out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--skip-transformers-cb", action="store_true")
    parser.add_argument("--out", default="bench/results/rollout.json")
    parser.add_argument("--end-to-end", action="store_true", help="only the training runs, zero against heavy")
    parser.add_argument("--steps", type=int, default=4, help="training steps per end-to-end run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of ours and of lock-step per latency (means)")
    args = parser.parse_args()
    if args.end_to_end:
        end_to_end(args.steps, args.out)
        return

    torch.manual_seed(0)
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    chat = ChatFormat(tokenizer)
    env = make_env(EnvConfig(options={"num_train": args.trajectories, "num_test": 1}))
    tasks = env.tasks("train")[: args.trajectories]
    engine = HFEngine(model, stop_ids=[], pad_id=tokenizer.pad_token_id, device=torch.device("cpu"))
    # The same engine reading the shared prefix per slot instead of once per step (cascade attention off).
    per_slot = HFEngine(model, [], tokenizer.pad_token_id, torch.device("cpu"), cascade=False)
    for e in (engine, per_slot):  # warm-up: allocate every slot of the cache
        run_way(env, e, chat, tasks, "zero", "async", False, 1, 2)

    ways = {
        "ours": ("async", False),
        "lockstep_sequential": ("lockstep", True),
        "lockstep_concurrent": ("lockstep", False),
    }
    workload = (args.turns, args.tokens)
    result: dict = {
        "machine": machine(),
        "workload": {
            "model": MODEL,
            "trajectories": args.trajectories,
            "turns": args.turns,
            "new_tokens_per_turn": args.tokens,
            "tool_calls_per_trajectory": args.turns,
            "prompt_tokens": len(
                make_rollout(env, engine, chat, Latencies("zero", 1), "async", False, 1, 1).prompt_ids(tasks[0])
            ),
        },
    }
    limit = run_way(env, engine, chat, tasks, "zero", "async", False, *workload)
    result["limit"] = limit
    print(f"limit (zero-latency tools): {limit['wall_s']:.1f} s, {limit['tokens_per_s']:.0f} tok/s", flush=True)
    result["limit_per_slot_attention"] = run_way(env, per_slot, chat, tasks, "zero", "async", False, *workload)
    result["limit_again"] = run_way(env, engine, chat, tasks, "zero", "async", False, *workload)
    result["limit_per_slot_attention_again"] = run_way(env, per_slot, chat, tasks, "zero", "async", False, *workload)
    cascade = limit["wall_s"] + result["limit_again"]["wall_s"]
    per_slot_s = result["limit_per_slot_attention"]["wall_s"] + result["limit_per_slot_attention_again"]["wall_s"]
    result["cascade_speedup_at_limit"] = round(per_slot_s / cascade, 3)
    print(
        f"limit, cascade: {limit['wall_s']:.1f}, {result['limit_again']['wall_s']:.1f} s; per-slot attention: "
        f"{result['limit_per_slot_attention']['wall_s']:.1f}, {result['limit_per_slot_attention_again']['wall_s']:.1f}"
        " s",
        flush=True,
    )
    for kind, label in (("fixed", "fixed_1s"), ("heavy", "lognormal_median_0.5s_p99_5s")):
        runs = {}
        for name, (schedule, sequential) in ways.items():
            runs[name] = run_way(env, engine, chat, tasks, kind, schedule, sequential, *workload)
            print(f"{label:>32} {name:>20}: {runs[name]['wall_s']:7.1f} s", flush=True)
        # ours against lock-step, the ratio the goal is about: each again `--repeats` times, alternated (lock-step
        # first, then ours: ABBA with the runs above), so that a machine growing busier or quieter weighs on both
        again = {"ours": [runs["ours"]["wall_s"]], "lockstep_concurrent": [runs["lockstep_concurrent"]["wall_s"]]}
        for _ in range(args.repeats - 1):
            for name in ("lockstep_concurrent", "ours"):
                schedule, sequential = ways[name]
                again[name].append(run_way(env, engine, chat, tasks, kind, schedule, sequential, *workload)["wall_s"])
                print(f"{label:>32} {name:>20}: {again[name][-1]:7.1f} s (again)", flush=True)
        runs["repeats_wall_s"] = again
        ours, lockstep = (statistics.fmean(again[name]) for name in ("ours", "lockstep_concurrent"))
        runs["sequential_vs_ours"] = round(runs["lockstep_sequential"]["wall_s"] / ours, 2)
        runs["lockstep_vs_ours"] = round(lockstep / ours, 3)
        runs["ours_vs_limit"] = round(ours / limit["wall_s"], 3)
        result[label] = runs

    prompts = [chat.prompt_ids(env.messages(t), [t.to_openai() for t in env.tools()]) for t in tasks]
    result["generation"] = [
        generation_speed(model, tokenizer, engine, per_slot, prompts, batch, args.tokens) for batch in (1, 8, 32)
    ]
    if not args.skip_transformers_cb:
        result["transformers_continuous_batching"] = transformers_cb_speed(model, prompts[:32], args.tokens)

    print()
    print(f"{'setting':>32} {'(b)/(a) seq':>12} {'(c)/(a) lockstep':>17} {'(a)/(d) limit':>14}")
    for label in ("fixed_1s", "lognormal_median_0.5s_p99_5s"):
        r = result[label]
        print(f"{label:>32} {r['sequential_vs_ours']:>12} {r['lockstep_vs_ours']:>17} {r['ours_vs_limit']:>14}")
    print(f"\n{'batch':>6} {'ours tok/s':>11} {'per-slot attn':>14} {'generate tok/s':>15} {'ratio':>6}")
    for g in result["generation"]:
        ours, plain = g["ours_tokens_per_s"], g["generate_tokens_per_s"]
        per = g["ours_per_slot_attention_tokens_per_s"]
        print(f"{g['batch']:>6} {ours:>11} {per:>14} {plain:>15} {g['ours_vs_generate']:>6}")
    if "transformers_continuous_batching" in result:
        cb = result["transformers_continuous_batching"]
        print(f"transformers generate_batch at batch {cb['batch']}: {cb['tokens_per_s']} tok/s")
    if Path(args.out).exists():  # the end-to-end runs (--end-to-end) are measured by their own invocation: kept
        kept = json.loads(Path(args.out).read_text())
        result |= {k: kept[k] for k in ("end_to_end", "end_to_end_tail_vs_zero") if k in kept}
    write_results(args.out, result)


if __name__ == "__main__":
    main()
