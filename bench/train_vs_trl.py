"""Benchmark: the same single-turn GRPO work with TRL's GRPOTrainer and with toolrl, one after the other.

Work (identical for both): the default model (fp32, CPU), the calculator prompts (system prompt, tool schema,
two worked examples, a question: ~360 tokens, the same ids for both), `--prompts` prompts x `--group`
samples per step, at most `--tokens` new tokens at temperature 1, a dense reward computed from the completion
text (the share of its characters that are digits, so that no group is all-equal), beta = 0 (no reference
model), no gradient checkpointing, one optimizer step per generation batch, token-mean loss (TRL's loss_type
"dapo"), the same learning rate. The first step of each is a warm-up and is not timed.

Reported per framework: seconds per step, generated tokens per second of step, and the breakdown
(generation, log-probs before the update, forward + backward, optimizer). `toolrl_vs_trl_speedup` is the
ratio of seconds per generated token (TRL / toolrl), since the sampled lengths differ between the two;
the ratio of seconds per step is reported beside it, and each update's GFLOP/s (6 x parameters x the tokens it
put through the model, the output layer at the generated tokens; attention left out) against the machine's
fp32 matmul peak, measured in the same run. Each side runs as its users get it: TRL's model as
`from_pretrained` gives it (torch's linear kernels, MKL), toolrl's as `toolrl train` loads it (oneDNN on CPU,
`model.cpu_linear`; bench/kernels/linear_kernels.py measures that part alone). Needs `pip install trl`. Prints a table
and writes bench/results/train_vs_trl.json.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from common import machine, matmul_peak_gflops, model_sizes, write_results

from toolrl.chat import ChatFormat
from toolrl.config import load_config
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env, register_env
from toolrl.envs.calculator.env import CalculatorEnv
from toolrl.models import load_model, load_tokenizer
from toolrl.rewards import Criterion, Rubric
from toolrl.rollout.engine import common_prefix_length

MODEL = "smollm2-135m-instruct"


def digit_share(text: str) -> float:
    return sum(c.isdigit() for c in text) / max(len(text), 1)


@register_env("bench-digits")
class DigitsEnv(CalculatorEnv):
    """The calculator prompts, one turn, rewarded by `digit_share` of the reply."""

    def __init__(self, config, options):
        super().__init__(config, options)
        self.rubric = Rubric([Criterion("digits", lambda traj, task: digit_share(traj.final_text))])


def prompts(tokenizer, count: int) -> list[list[int]]:
    env = make_env(EnvConfig(options={"num_train": count, "num_test": 1}))
    chat = ChatFormat(tokenizer)
    tools = [t.to_openai() for t in env.tools()]
    return [chat.prompt_ids(env.messages(task), tools) for task in env.tasks("train")[:count]]


def run_toolrl(args) -> dict:
    from toolrl.train import Trainer, Workbench

    config = load_config(
        overrides=[
            "env.name=bench-digits",
            f"env.options.num_train={args.prompts * (args.steps + 1)}",
            "device=cpu",
            "rollout.max_turns=1",
            f"rollout.max_new_tokens={args.tokens}",
            f"train.steps={args.steps + 1}",
            f"train.prompts_per_step={args.prompts}",
            f"train.group_size={args.group}",
            f"train.lr={args.lr}",
            *([f"train.micro_batch_tokens={args.micro_batch_tokens}"] if args.micro_batch_tokens else []),
            "eval.at_start=false",
            "eval.at_end=false",
        ]
    )
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    steps = [trainer.step(step) for step in range(1, args.steps + 2)][1:]  # the first is a warm-up
    bench.close()

    def mean(key):
        return sum(m[key] for m in steps) / len(steps)

    return {
        "step_s": mean("step_s"),
        "generated_tokens_per_step": mean("generated_tokens"),
        "generation_s": mean("rollout_s"),
        "logprobs_s": mean("time/reference_and_values_s"),
        "forward_backward_s": mean("time/forward_backward_s"),
        "optimizer_s": mean("time/optimizer_s"),
        "reward": mean("reward"),
    }


def run_trl(args, tokenizer, prompt_ids) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    texts = [tokenizer.decode(ids) for ids in prompt_ids]
    for text, ids in zip(texts, prompt_ids, strict=True):  # TRL re-tokenizes the text: the same ids
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    dataset = Dataset.from_dict({"prompt": texts})

    def reward(completions, **_):
        return [digit_share(c) for c in completions]

    # as a TRL user has it (from_pretrained: torch's kernels); toolrl's own runs its linear layers on oneDNN
    model = load_model(MODEL, torch.device("cpu"), cpu_linear="torch")
    config = GRPOConfig(
        output_dir="/tmp/toolrl-bench-trl",
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        gradient_accumulation_steps=1,
        max_completion_length=args.tokens,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",
        learning_rate=args.lr,
        max_steps=args.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; toolrl does not recompute activations
        seed=0,
    )
    timings: dict[str, list[float]] = {"step": [], "generation": [], "generate_and_score": [], "optimizer": []}
    marks: dict[str, float] = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            marks["step"] = time.perf_counter()

        def on_pre_optimizer_step(self, *a, **k):
            marks["optimizer"] = time.perf_counter()

        def on_optimizer_step(self, *a, **k):
            timings["optimizer"].append(time.perf_counter() - marks["optimizer"])

        def on_step_end(self, *a, **k):
            timings["step"].append(time.perf_counter() - marks["step"])

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    completion_tokens: list[int] = []

    def timed(name, fn):
        def wrapper(*a, **k):
            started = time.perf_counter()
            out = fn(*a, **k)
            timings[name].append(time.perf_counter() - started)
            if name == "generate_and_score":
                completion_tokens.append(int(out["completion_mask"].sum()))
            return out

        return wrapper

    trainer._generate = timed("generation", trainer._generate)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    trainer.train()

    def mean(key):
        values = timings[key][1:]  # the first step is a warm-up
        return sum(values) / len(values)

    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h][1:]
    step_s, gen_score = mean("step"), mean("generate_and_score")
    return {
        "step_s": step_s,
        "generated_tokens_per_step": sum(completion_tokens[1:]) / len(completion_tokens[1:]),
        "generation_s": mean("generation"),
        "logprobs_s": gen_score - mean("generation"),
        "forward_backward_s": step_s - gen_score - mean("optimizer"),
        "optimizer_s": mean("optimizer"),
        "reward": sum(rewards) / max(len(rewards), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--out", default="bench/results/train_vs_trl.json")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="toolrl's train.micro_batch_tokens "
        "(default: the config's; the step's shared prompt is computed once whatever the split)",
    )
    parser.add_argument("--only-toolrl", action="store_true", help="toolrl's half alone (no TRL needed)")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.only_toolrl:  # bench/before_after.py compares toolrl with an earlier toolrl this way
        result = run_toolrl(args)
        result["tokens_per_s"] = result["generated_tokens_per_step"] / result["step_s"]
        print("\n".join(f"{key:>28} {value:>10.3f}" for key, value in result.items()))
        write_results(args.out, {"machine": machine(), "toolrl": {k: round(v, 3) for k, v in result.items()}})
        return
    import trl

    load_before = os.getloadavg()
    tokenizer = load_tokenizer(MODEL)
    prompt_ids = prompts(tokenizer, args.prompts * (args.steps + 1))
    results = {"trl": run_trl(args, tokenizer, prompt_ids)}
    # the halves run one after the other: the load between them shows whether they saw the same machine (beside a
    # make test, TRL's half ran at a load of 3.3-5.3 and toolrl's as it fell to 1.5: 5.43x, against 4.21x quiet)
    load_between = os.getloadavg()
    results["toolrl"] = run_toolrl(args)
    for r in results.values():
        r["tokens_per_s"] = r["generated_tokens_per_step"] / r["step_s"]
    speedup = results["toolrl"]["tokens_per_s"] / results["trl"]["tokens_per_s"]
    peak = matmul_peak_gflops()
    body, head = model_sizes(load_model(MODEL, torch.device("cpu")))
    rows, prompt = args.prompts * args.group, len(prompt_ids[0])
    steps = range(0, len(prompt_ids), args.prompts)
    shared = min(common_prefix_length(prompt_ids[i : i + args.prompts]) for i in steps)
    for name, r in results.items():
        completion = r["generated_tokens_per_step"] / rows
        # TRL: every sample's prompt and completion; toolrl: the shared prefix once per step (StepPrefix), each group's
        # task once (scoring/packed.py lend_alike), each completion
        own = args.prompts * (prompt - shared) + rows * completion
        processed = rows * (prompt + completion) if name == "trl" else shared + own
        flops = 6 * body * processed + 6 * head * r["generated_tokens_per_step"]
        r["update_gflops"] = flops / r["forward_backward_s"] / 1e9
        r["update_share_of_peak"] = r["update_gflops"] / peak
    out = {
        "machine": machine(),
        "versions": {"trl": trl.__version__},
        "workload": {
            "model": MODEL,
            "prompt_tokens": len(prompt_ids[0]),
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_new_tokens": args.tokens,
            "timed_steps": args.steps,
            "beta": 0.0,
            "linear_kernels": {"trl": "torch", "toolrl": load_config().model.cpu_linear},
        },
        **{name: {k: round(v, 3) for k, v in r.items()} for name, r in results.items()},
        "toolrl_vs_trl_speedup": round(speedup, 2),
        "toolrl_vs_trl_step_time_ratio": round(results["trl"]["step_s"] / results["toolrl"]["step_s"], 2),
        "matmul_peak_gflops": round(peak, 1),
        "load_average": {"before": load_before, "between": load_between, "after": os.getloadavg()},
    }
    keys = ["step_s", "generated_tokens_per_step", "tokens_per_s", "generation_s", "logprobs_s"]
    keys += ["forward_backward_s", "optimizer_s", "reward"]
    print(f"{'':>28} {'TRL':>10} {'toolrl':>10}")
    for key in keys:
        print(f"{key:>28} {results['trl'][key]:>10.3f} {results['toolrl'][key]:>10.3f}")
    print(f"toolrl_vs_trl_speedup (tokens/s): {out['toolrl_vs_trl_speedup']}x")
    print(f"step time ratio: {out['toolrl_vs_trl_step_time_ratio']}x")
    for name in ("trl", "toolrl"):
        r = results[name]
        print(f"{name} update: {r['update_gflops']:.1f} GFLOP/s, {r['update_share_of_peak']:.0%} of the matmul peak "
              f"({peak:.0f} GFLOP/s; 6 x parameters x tokens through the body, attention left out)")  # fmt: skip
    write_results(args.out, out)


if __name__ == "__main__":
    main()
