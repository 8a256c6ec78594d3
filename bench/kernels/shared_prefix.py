"""Benchmark: one training forward/backward of a GRPO step, shared-prefix vs padded full sequences.

Workload: the default model, the calculator prompt (system prompt, tool schema, two examples, question) as
prompt, `--rows` trajectories with `--response` generated tokens each, groups of `--group` samples per
question. (a) padded: every row runs its whole sequence and full-vocabulary logits, as a plain HF loss does;
(b) the same with logits only at trained positions;
(c) toolrl: `trained_token_logprobs`, the shared prefix once and logits only at trained positions.
Both give the same log-probs and gradients (checked here). Prints a table, writes bench/results/shared_prefix.json.
"""

from __future__ import annotations

import argparse

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import machine, padded_rows, timed_backward, write_results

from toolrl.chat import ChatFormat
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.models import load_model, load_tokenizer
from toolrl.rollout import Trajectory
from toolrl.scoring import trained_token_logprobs


def workload(tokenizer, rows: int, group: int, response: int, seed: int = 0) -> list[Trajectory]:
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": rows}))
    chat = ChatFormat(tokenizer)
    tools = [t.to_openai() for t in env.tools()]
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(rows):
        task = env.tasks("test")[i // group]
        traj = Trajectory.start(task, chat.prompt_ids(env.messages(task), tools))
        ids = torch.randint(100, 40000, (response,), generator=gen).tolist()
        traj.add_model_turn(ids, [0.0] * response, "")
        trajs.append(traj)
    return trajs


def padded_logprobs(model, trajs):
    """Every row's whole sequence, full-vocabulary logits at every position (a plain HF forward)."""
    ids, mask, rows, cols, targets = padded_rows(trajs)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    return logp[rows, cols].gather(1, targets[:, None]).squeeze(1)


def padded_selected_logprobs(model, trajs):
    """Every row's whole sequence, logits only at trained positions."""
    ids, mask, rows, cols, targets = padded_rows(trajs)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state[rows, cols]
    logp = torch.log_softmax(model.get_output_embeddings()(hidden).float(), -1)
    return logp.gather(1, targets[:, None]).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="bench/results/shared_prefix.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct", torch.device("cpu")).train()
    trajs = workload(tokenizer, args.rows, args.group, args.response)

    def ours(m, t):
        return trained_token_logprobs(m, t)[0]

    padded_s, padded_lp, padded_grad = timed_backward(model, padded_logprobs, trajs, args.repeats)
    selected_s, _, _ = timed_backward(model, padded_selected_logprobs, trajs, args.repeats)
    ours_s, ours_lp, ours_grad = timed_backward(model, ours, trajs, args.repeats)
    grad_rel = float((ours_grad - padded_grad).norm() / padded_grad.norm())
    result = {
        "machine": machine(),
        "workload": {
            "rows": args.rows,
            "group": args.group,
            "prompt_tokens": trajs[0].prompt_length,
            "response_tokens": args.response,
        },
        "padded_s": round(padded_s, 2),
        "padded_selected_logits_s": round(selected_s, 2),
        "toolrl_s": round(ours_s, 2),
        "padded_vs_toolrl": round(padded_s / ours_s, 2),
        "padded_selected_logits_vs_toolrl": round(selected_s / ours_s, 2),
        "max_logprob_diff": float((ours_lp - padded_lp).abs().max()),
        "grad_relative_diff": grad_rel,
    }
    print(f"{'forward+backward':<36}{'seconds':>10}{'ratio':>9}")
    print(f"{'padded, full logits':<36}{padded_s:>10.2f}{padded_s / ours_s:>8.2f}x")
    print(f"{'padded, logits at trained tokens':<36}{selected_s:>10.2f}{selected_s / ours_s:>8.2f}x")
    print(f"{'toolrl: shared prefix, trained logits':<36}{ours_s:>10.2f}{1:>8.2f}x")
    print(f"gradient relative difference toolrl vs padded: {grad_rel:.1e}")
    write_results(args.out, result)


if __name__ == "__main__":
    main()
