"""Benchmark: the hf-vision engine on this CPU: toolrl's batched decoding (the batch's shared prefix, a group's
task image included, computed once; each row's own tokens after it) against the same turns one at a time and
against the engine before (one left-padded `model.generate` over every row's whole sequence, toolrl's sampler
as a logits processor), on a random Qwen2.5-VL and a random LLaVA built from real configs (no small
vision-language model ships for offline use; `--hidden` and `--layers` set the language model), the images
environment's tasks (one 224x224 image each: 64 image tokens for Qwen2.5-VL; the tiny LLaVA's CLIP tower
sees it at 56x56, 16 tokens), `--tasks` groups of `--group` samples (one-turn trajectories), 48 new tokens a
turn, seeded (the share of trajectories all three sampled alike is recorded).
Prints a table and writes bench/results/vision_engine.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
from common import machine, write_results

from toolrl.models.vision import model_inputs
from toolrl.rollout.sampling import sample_tokens
from toolrl.rollout.vision import VisionEngine

NEW_TOKENS = 48


class _Draw:
    """A logits processor that samples every row with toolrl's sampler at its own context length."""

    def __init__(self, params, pads, generator) -> None:
        self.params, self.pads, self.generator = params, pads, generator
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        positions = [input_ids.shape[1] - pad for pad in self.pads]
        tokens, logprobs = sample_tokens(scores, self.params, self.generator, positions=positions)
        self.logprobs.append(logprobs)
        chosen = torch.full_like(scores, float("-inf"))
        chosen[torch.arange(len(tokens)), tokens] = 0.0
        return chosen


class GenerateEngine(VisionEngine):
    """The engine before: one left-padded `model.generate` over each row's whole sequence and all images."""

    def _generate(self, batch):
        from transformers import LogitsProcessorList

        from toolrl.rollout.engine import Sampled

        width = max(len(r.tokens) for r in batch)
        pads = [width - len(r.tokens) for r in batch]
        ids = torch.tensor([[self.pad_id] * p + r.tokens for p, r in zip(pads, batch, strict=True)])
        mask = torch.tensor([[0] * p + [1] * len(r.tokens) for p, r in zip(pads, batch, strict=True)])
        extra = {}
        if self.model.config.model_type == "qwen2_5_vl":  # M-RoPE positions for the image tokens
            extra["mm_token_type_ids"] = (ids == self.model.config.image_token_id).int()
        draw = _Draw([r.params for r in batch], pads, self.generator)
        with torch.no_grad():
            self.model.eval()
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, **model_inputs([im for r in batch for im in r.images], ids.device),
                **extra, max_new_tokens=max(r.params.max_new_tokens for r in batch), do_sample=False,
                temperature=None, top_p=None, top_k=None, logits_processor=LogitsProcessorList([draw]),
                eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
            )  # fmt: skip
        logprobs = torch.stack(draw.logprobs, dim=1)
        results = []
        for row, request in enumerate(batch):
            new = out[row, width:].tolist()[: request.params.max_new_tokens]
            end = next((i + 1 for i, t in enumerate(new) if t in self.stop_ids), len(new))
            ids_row = new[:end]
            ended = bool(ids_row) and ids_row[-1] in self.stop_ids
            results.append(Sampled(ids_row, logprobs[row, : len(ids_row)].tolist(), ended))
        return results


def measure(model_dir: Path, tasks: int, group: int, how: str) -> tuple[dict, list]:
    from toolrl.config import load_config
    from toolrl.rollout import vision
    from toolrl.train import Workbench

    sets = [
        f"model.name={model_dir}", "env.name=images", "device=cpu", "rollout.max_turns=1",
        f"rollout.max_new_tokens={NEW_TOKENS}", "env.options.num_train=64", "env.options.num_test=2",
    ]  # fmt: skip
    bench = Workbench.load(load_config(overrides=sets))
    try:
        rollout = bench.rollout(bench.config.rollout.sampling, seed=0)
        if how == "generate":
            rollout.engine = GenerateEngine(bench.model, bench.chat.stop_ids, bench.chat.tokenizer.pad_token_id,
                                            torch.device("cpu"))  # fmt: skip
        chosen = [task for task in bench.env.tasks("train")[:tasks] for _ in range(group)]
        vision.MAX_BATCH = 1 if how == "one" else 16
        asyncio.run(rollout.arun(chosen[:1], seed=1))  # warm up
        started = time.perf_counter()
        trajs = asyncio.run(rollout.arun(chosen, seed=2))
        seconds = time.perf_counter() - started
    finally:
        vision.MAX_BATCH = 16
        bench.close()
    generated = sum(sum(t.loss_mask) for t in trajs)
    result = {"seconds": round(seconds, 2), "generated_tokens": generated, "tok_per_s": round(generated / seconds, 1)}
    return result, [t.token_ids for t in trajs]


def same_share(*runs: list) -> float:
    """The share of trajectories whose tokens every run sampled alike (seeded draws; a random model's nearly
    flat distributions can still flip a draw on the last bits of other batch shapes)."""
    return sum(all(run[i] == runs[0][i] for run in runs) for i in range(len(runs[0]))) / len(runs[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", default="bench/results/vision_engine.json")
    args = parser.parse_args()
    from tests.harness.tiny_vlm import make_tiny_vlm

    result = {}
    print(f"{'tok/s':<12}{'one at a time':>15}{'generate':>10}{'toolrl':>8}{'vs one':>8}{'vs generate':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("qwen2_5_vl", "llava"):
            model = make_tiny_vlm(Path(tmp) / family, family, hidden=args.hidden, layers=args.layers)
            one, one_ids = measure(model, args.tasks, args.group, "one")
            before, before_ids = measure(model, args.tasks, args.group, "generate")
            ours, ours_ids = measure(model, args.tasks, args.group, "toolrl")
            r = result[family] = {
                "one_at_a_time": one, "generate_before": before, "together": ours,
                "together_vs_one": round(ours["tok_per_s"] / one["tok_per_s"], 2),
                "together_vs_generate": round(ours["tok_per_s"] / before["tok_per_s"], 2),
                "same_tokens": same_share(one_ids, before_ids, ours_ids),
            }  # fmt: skip
            rates = f"{one['tok_per_s']:>15}{before['tok_per_s']:>10}{ours['tok_per_s']:>8}"
            ratios = f"{r['together_vs_one']:>7}x{r['together_vs_generate']:>12}x"
            print(f"{family:<12}{rates}{ratios}  same tokens: {r['same_tokens']:.0%} of trajectories")
    workload = {k: v for k, v in vars(args).items() if k != "out"} | {"new_tokens_per_turn": NEW_TOKENS}
    write_results(args.out, {"machine": machine(), "workload": workload, **result})


if __name__ == "__main__":
    main()
