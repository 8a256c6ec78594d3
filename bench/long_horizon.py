"""Benchmark: long-horizon training (issue 71). Episodes longer than the context are compacted into linked segments
(rollout.context) and trained token-exactly; this measures what a user relies on, part by part:

- identity: `rollout.context: none` trains bit-identically to the commit before linked segments (the weights after an
  update of hand-made multi-turn trajectories and after a rolled-out step, under every estimator: the digests of
  tests/harness/update_digest.py at both revisions, on the tiny test model);
- estimators: an update of the key-chain reference's segmented trajectories (rewards that differ) under grpo,
  dr_grpo, rloo, gae (vanilla policy gradient), ppo (gae with PPO's clipped loss), reinforce_pp and gigpo: every
  segment with trained tokens enters the loss (`segments_left_out` 0) and takes advantages (tiny test model);
- tree: a step's segments scored as a prefix tree against the naive way (every segment alone, all its tokens),
  forward and backward on the default model: the FLOPs each computes (each token through the layers, each query's
  attention over its context; forward, backward: 3x) and the time, side by side, repeated; the workload is four
  key-chain tasks (a trajectory each: they share the harness prompt, not the task) behind a harness-sized prompt
  (~3.2k tokens: `env.options.preamble_tokens`) in a 4,096-token window, 6 calls a chain, compacted by a sliding
  window;
- check: `toolrl env check` of the key-chain environment's reference with sliding_window, summarize, fold and none, and
  what each strategy costs on the reference's episodes (segments, tokens fed, trained, carried and written);
- learning: recipes/long-horizon.yaml over seeds: greedy success before and after training, the share of greedy
  test trajectories stopped by the length limit after training, the run's peak memory.

    python bench/long_horizon.py                       # every part
    python bench/long_horizon.py --part tree --part check

    python bench/long_horizon.py --part tree --beside 'make test'   # the time ratio, measured on a busy machine

Prints each part's figures and writes bench/results/long_horizon.json (the parts it ran; the others are kept from the
file), with the machine and, under `runs`, each part's commit, seconds, load average before and after, and what ran
beside it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import ROOT, git_head, machine, side_by_side, write_results

OUT = ROOT / "bench" / "results" / "long_horizon.json"
BEFORE = "594976a"
"""The commit before linked segments."""
ESTIMATORS = {"grpo": [], "dr_grpo": [], "rloo": [], "gae": ["train.loss=vanilla_pg"], "ppo": ["train.advantage=gae"],
              "reinforce_pp": [], "gigpo": []}  # fmt: skip


def say(line: str) -> None:
    print(line, flush=True)


def tiny_model(folder: Path) -> Path:
    from tests.harness.tiny import make_tiny_model

    return make_tiny_model(folder / "tiny")


def identity(tmp: Path) -> dict:
    """Digests of one update and one step under every estimator, at BEFORE and here."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src/toolrl"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp / "before", filter="data")
    model, digests = tiny_model(tmp), {}
    for name, src in (("before", tmp / "before" / "src"), ("now", ROOT / "src")):
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
        out = tmp / f"{name}.json"
        subprocess.run([sys.executable, str(ROOT / "tests/harness/update_digest.py"), str(model), str(out)],
                       env=env, check=True, capture_output=True)  # fmt: skip
        digests[name] = json.loads(out.read_text())
    same = digests["before"] == digests["now"]
    say(f"identity: none trains bit-identically to {BEFORE}: {same} ({len(digests['now'])} digests)")
    return {"none_grad_identical": same, "none_digests": len(digests["now"]), "none_before_commit": BEFORE}


def chain_trajectories(model: Path | str, tasks: int, sets: list[str], samples: int = 4, rewards: bool = True):
    """The key-chain reference's trajectories of `tasks` tasks, `samples` each (a group); with `rewards`, rewards
    that differ (alternately 0 and 1) in place of the environment's."""
    from toolrl.config import load_config
    from toolrl.train import Workbench

    config = load_config(overrides=[f"model.name={model}", "env.name=chain", "device=cpu", *sets])
    bench = Workbench.load(config, policy="reference")
    try:
        chosen = bench.env.tasks("train")[:tasks]
        trajs = bench.evaluation(tasks=[task for task in chosen for _ in range(samples)])
    finally:
        bench.close()
    for i, traj in enumerate(trajs if rewards else []):
        traj.reward = float(i % 2)
    return trajs


def estimators(tmp: Path) -> dict:
    from toolrl.config import load_config
    from toolrl.train import Trainer, Workbench

    model = tiny_model(tmp)
    trajs = chain_trajectories(model, 2, [])
    out = {}
    for name, more in ESTIMATORS.items():
        sets = [f"model.name={model}", "env.name=chain", "device=cpu", f"train.advantage={name}", *more,
                "train.prompts_per_step=2", "train.group_size=4", f"output_dir={tmp}", "run_name=x"]  # fmt: skip
        trainer = Trainer(Workbench.load(load_config(overrides=sets)))
        update = trainer.update(trajs)
        values = update.values
        trained = [v is not None and v.advantages is not None and len(v.advantages) == t.trained_count
                   for v, t in zip(values, trajs, strict=True)]  # fmt: skip
        out[name] = {"segments_left_out": int(update.metrics["segments_left_out"]),
                     "segments": int(update.metrics["segments"]) + len(trajs),
                     "trajectories_trained_whole": sum(trained), "trajectories": len(trajs)}  # fmt: skip
        trainer.bench.close()
        say(
            f"estimators: {name:12s} segments {out[name]['segments']}, left out {out[name]['segments_left_out']}, "
            f"trajectories trained whole {sum(trained)}/{len(trajs)}"
        )
    return {"segments_left_out": {name: row["segments_left_out"] for name, row in out.items()}, "estimators": out}


def work(rows: list[list[int]], plan, sharing: str) -> tuple[int, int]:
    """(tokens through the layers, query-key pairs of attention) a plan computes: naive, every row's every token
    over its own context; tree, the step's shared prompt once, then each row's own tokens (those it does not borrow)
    over their whole context."""
    from toolrl.scoring.plan import lend_longest

    if sharing == "naive":
        return sum(len(r) for r in rows), sum(len(r) * (len(r) + 1) // 2 for r in rows)
    shared = plan.prefix.length if plan.prefix is not None else 0
    tokens, pairs = shared, shared * (shared + 1) // 2
    for batch in plan.batches:
        suffixes = [rows[i][shared:] for i in batch]
        for suffix, (_, n) in zip(suffixes, lend_longest(suffixes), strict=True):
            tokens += len(suffix) - n
            pairs += sum(shared + q + 1 for q in range(n, len(suffix)))
    return tokens, pairs


def tree(tmp: Path, repeats: int, preamble: int) -> dict:
    import torch

    from toolrl import distributed
    from toolrl.models import load_model
    from toolrl.models.resolve import DEFAULT_MODEL
    from toolrl.scoring import Scorer, VocabBlocks

    sets = [f"env.options.preamble_tokens={preamble}", "env.options.steps=6", "rollout.max_context_tokens=4096"]
    # four tasks, one trajectory each: they share the harness prompt, not the task (a GRPO group's samples would share
    # their task too, and the reference plays a task's samples alike: identical rows that the tree would all but skip)
    trajs = chain_trajectories(DEFAULT_MODEL, 4, sets, samples=1)
    rows = [segment for traj in trajs for segment in traj.sequences()]
    model = load_model(DEFAULT_MODEL, torch.device("cpu"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    scorer = Scorer(None, 1.0, 4096, distributed.from_env(), VocabBlocks(rows=512))
    config = model.config
    hidden, layers = config.hidden_size, config.num_hidden_layers
    body = sum(p.numel() for n, p in model.named_parameters() if "layers." in n)  # the layers' weights
    flops, plans = {}, {}

    def scored(sharing: str):
        model.zero_grad(set_to_none=True)
        plan = scorer.plan(model, rows, sharing)
        for batch in plan.batches:
            scorer.scores(
                model, [rows[i] for i in batch], prefix=plan.prefix, sharing=sharing
            ).logprobs.sum().backward()
        plan.finish()
        plans[sharing] = plan

    times = side_by_side({sharing: (lambda s=sharing: scored(s)) for sharing in ("tree", "naive")}, repeats)
    for sharing in ("tree", "naive"):
        tokens, pairs = work([r.token_ids for r in rows], plans[sharing], sharing)
        flops[sharing] = {"tokens": tokens, "attention_pairs": pairs,
                          "flops": 3 * (2 * body * tokens + 4 * layers * hidden * pairs)}  # fmt: skip
    result = {
        "workload": {"segments": len(rows), "trajectories": len(trajs), "preamble_tokens": preamble,
                     "prompt_tokens": trajs[0].sequences()[0].prompt_length,
                     "segment_tokens": [len(r.token_ids) for r in rows], "gradient_checkpointing": True},
        "flops": flops, "time_s": {k: round(v, 2) for k, v in times.items()}, "repeats": repeats,
        "prefix_tree_vs_naive_flops": round(flops["naive"]["flops"] / flops["tree"]["flops"], 2),
        "prefix_tree_vs_naive_time": round(times["naive"] / times["tree"], 2),
    }  # fmt: skip
    say(
        f"tree: {len(rows)} segments, prompt {result['workload']['prompt_tokens']} tokens: FLOPs naive/tree "
        f"{result['prefix_tree_vs_naive_flops']}x, time {times['naive']:.1f} / {times['tree']:.1f} s = "
        f"{result['prefix_tree_vs_naive_time']}x"
    )
    return result


FOLD = [
    "rollout.context.name=fold",
    "rollout.max_turns=24",
    "rollout.max_new_tokens=64",
    "rollout.max_context_tokens=2048",
]
"""fold's branch and return are turns of their own (two more a branch of three calls), a return must fit a turn, and the
main context keeps every return: it needs these limits on the key chain (still short of the whole episode's ~2,750)."""


def check(tmp: Path, tasks: int) -> dict:
    out = {}
    for name in ("sliding_window", "summarize", "fold", "none"):
        sets = FOLD if name == "fold" else [f"rollout.context.name={name}"]
        done = subprocess.run([sys.executable, "-m", "toolrl", "env", "check", "--set", "env.name=chain",
                               *(f"--set={s}" for s in sets), "--num-tasks", str(tasks), "--json"],
                              capture_output=True, text=True, cwd=tmp)  # fmt: skip
        report = json.loads(done.stdout.strip().splitlines()[-1])
        reference = next(p for p in report["policies"] if p["policy"] == "reference")
        out[name] = {"reference_success": reference["success"], "limits_cut": report.get("limits_cut", [])}
        say(f"check: {name:14s} reference {reference['success']:.0%}")
    return {"reference_success_with_context": min(out["sliding_window"]["reference_success"],
                                                  out["summarize"]["reference_success"]),
            "reference_success_without_context": out["none"]["reference_success"], "env_check": out,
            "strategy_costs": costs(tasks)}  # fmt: skip


COSTED = {"uncapped": ["rollout.context.name=none", "rollout.max_context_tokens=8192"],
          "none": ["rollout.context.name=none"], "sliding_window": [],
          "sliding_window_notes": ["rollout.context.options.notes=true"],
          "summarize": ["rollout.context.name=summarize"], "fold": FOLD}  # fmt: skip
"""What each strategy costs on the key-chain reference (and the whole episode in one context, uncapped, for scale)."""


def mean(values) -> float:
    return round(statistics.fmean(values), 2)


def costs(tasks: int) -> dict:
    """Per strategy, means per trajectory of the reference's episodes: its success, segments, the longest segment,
    the tokens the model is fed in training (every segment's, carried context included: what the update and the
    rollout's prefill compute), the trained tokens, the tokens carried from one segment to the next and written for
    it, and the attention's query-key pairs (the part of the cost that grows with a segment's square)."""
    from toolrl.models.resolve import DEFAULT_MODEL

    out = {}
    for name, sets in COSTED.items():
        trajs = chain_trajectories(DEFAULT_MODEL, tasks, sets, samples=1, rewards=False)
        rows = [[len(s.token_ids) for s in t.sequences()] for t in trajs]
        out[name] = {
            "success": mean(t.rewards.get("correct", 0.0) for t in trajs),
            "segments": mean(len(r) for r in rows),
            "longest_segment": max(max(r) for r in rows),
            "tokens_fed": mean(sum(r) for r in rows),
            "tokens_trained": mean(t.trained_count for t in trajs),
            "tokens_carried": mean(sum(s.carried for s in t.sequences()) for t in trajs),
            "tokens_written": mean(sum(s.written for s in t.sequences()) for t in trajs),
            "attention_pairs": mean(sum(n * (n + 1) // 2 for n in r) for r in rows),
            "tool_calls": mean(t.num_tool_calls for t in trajs),
        }
        row = out[name]
        say(
            f"costs: {name:20s} segments {row['segments']:5.2f}, longest {row['longest_segment']:5d}, fed "
            f"{row['tokens_fed']:7.1f}, trained {row['tokens_trained']:6.1f}, carried {row['tokens_carried']:7.1f}, "
            f"written {row['tokens_written']:5.1f}, calls {row['tool_calls']:4.1f}"
        )
    return out


def learning(seeds: list[int], num_tasks: int, sets: list[str]) -> dict:
    """recipes/long-horizon.yaml through bench/learning.py (which writes its row of the README's table into
    bench/results/learning.json), read back with the greedy test trajectories' length stops and the peak memory."""
    command = [sys.executable, str(ROOT / "bench" / "learning.py"), "--recipes", "long-horizon", "--seeds",
               *map(str, seeds), "--num-tasks", str(num_tasks), *(f"--set={s}" for s in sets)]  # fmt: skip
    subprocess.run(command, check=True)
    entry = json.loads((ROOT / "bench" / "results" / "learning.json").read_text())["long-horizon"]
    rows = [{"seed": seed, **{k: row.get(k) for k in ("greedy_before", "greedy_after", "peak_gb", "train_s")},
             "length_stops_after": row.get("greedy_stops_after", {}).get("length", 0.0)}
            for seed, row in zip(entry["args"]["seeds"], entry["seeds"], strict=True)]  # fmt: skip
    for row in rows:
        say(
            f"learning: seed {row['seed']}: greedy {row['greedy_before']:.2f} -> {row['greedy_after']:.2f}, length "
            f"stops {row['length_stops_after']:.2f}, peak {row['peak_gb']:.2f} GB"
        )
    return {"greedy_before": entry["greedy_before"], "greedy_after": entry["greedy_after"],
            "length_stops_after": round(statistics.fmean(r["length_stops_after"] for r in rows), 4),
            "peak_gb": max(r["peak_gb"] for r in rows), "learning_seeds": rows, "test_tasks": num_tasks}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=list(PARTS), help="parts to run (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="tree: timed passes of each way")
    parser.add_argument("--preamble", type=int, default=2500, help="tree: the harness prompt's tokens")
    parser.add_argument("--check-tasks", type=int, default=16)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--num-tasks", type=int, default=32, help="learning: test tasks per evaluation")
    parser.add_argument("--set", action="append", default=[], help="learning: a config override for every run")
    parser.add_argument("--beside", default="", help="what else ran on the machine meanwhile (e.g. 'make test')")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    results = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            started, load_before = time.perf_counter(), os.getloadavg()
            folder = Path(tmp) / part
            folder.mkdir()
            results.update(PARTS[part](folder, args))
            results.setdefault("runs", {})[part] = {  # each part's own provenance: parts run at different times
                "commit": git_head(), "seconds": round(time.perf_counter() - started, 1), "beside": args.beside,
                "load_avg_before": [round(x, 2) for x in load_before],
                "load_avg_after": [round(x, 2) for x in os.getloadavg()],
            }  # fmt: skip
            say(f"{part}: load average before {results['runs'][part]['load_avg_before']}, after "
                f"{results['runs'][part]['load_avg_after']}")  # fmt: skip
    results["machine"] = machine()
    write_results(args.out, results)
    say(f"wrote {args.out}")


PARTS = {
    "identity": lambda folder, args: identity(folder),
    "estimators": lambda folder, args: estimators(folder),
    "tree": lambda folder, args: tree(folder, args.repeats, args.preamble),
    "check": lambda folder, args: check(folder, args.check_tasks),
    "learning": lambda folder, args: learning(args.seeds, args.num_tasks, args.set),
}
"""Each part: (a scratch folder, the arguments) -> its results."""


if __name__ == "__main__":
    main()
