"""Benchmark: the gateway's cost against calling the engine directly, and token-exactness.

1. overhead_ms: the median latency of a chat completion through HTTP (the `openai` wire format, keep-alive, the
   gateway's key check, request validation, capture) minus the same work done in-process (render the prompt,
   the engine's generate, decode, parse), both over an engine that answers at once (a fixed reply), so that the
   difference is the gateway alone. Goal <= 5 ms.
2. throughput_vs_rollout: 64 agents at once, each sending the calculator environment's prompt (its messages and
   tool schema) as one chat completion, against the native rollout of the same 64 prompts for one turn, on the
   default model and one HFEngine (no stop token: exactly --tokens tokens each, the same work); generated tokens
   per second, gateway / rollout, alternated and repeated (median). Goal >= 0.9.
3. drift_tokens: --conversations three-turn tool conversations through the gateway on the default model, sampled
   at temperature 1: positions where the captured ids differ from what the engine sampled and was fed (ours),
   and where rendering each whole conversation again and tokenizing it would (the naive way).

Prints a table and writes bench/results/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
import torch
from common import machine, write_results

from toolrl.chat import ChatFormat
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.gateway import Gateway
from toolrl.gateway.capture import template_messages
from toolrl.models import load_model, load_tokenizer
from toolrl.parsers import get_parser
from toolrl.rollout import HFEngine, Rollout, RolloutLimits, SamplingParams
from toolrl.rollout.engine import Engine, Sampled
from toolrl.tools import ToolExecutor

MODEL = "smollm2-135m-instruct"


class Instant(Engine):
    """Answers every request at once with the same ids: what is left is the gateway's own time."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    async def generate(self, seq, tokens, params):
        return Sampled(list(self.ids), [-0.1] * len(self.ids), True)


class Recording(Engine):
    """The real engine, keeping what it was fed and what it sampled."""

    def __init__(self, inner: Engine):
        self.inner, self.calls = inner, []

    async def generate(self, seq, tokens, params):
        sampled = await self.inner.generate(seq, tokens, params)
        self.calls.append((list(tokens), list(sampled.ids)))
        return sampled

    def release(self, seq):
        self.inner.release(seq)


def overhead(chat: ChatFormat, messages, tools, repeats: int) -> dict:
    syntax = get_parser("hermes")
    ids = chat.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>')
    engine = Instant([*ids, chat.end_of_turn_id])
    gateway = Gateway(engine, chat, syntax, "bench").start()
    body = {"model": "bench", "messages": messages, "tools": tools, "max_tokens": 32}
    known = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in tools}

    async def direct() -> None:
        prompt = chat.prompt_ids(template_messages(messages, syntax), tools, syntax.instructions)
        sampled = await engine.generate(object(), prompt, SamplingParams(max_new_tokens=32))
        syntax(chat.tokenizer.decode(sampled.ids, skip_special_tokens=True), known)

    try:
        with httpx.Client(headers={"Authorization": f"Bearer {gateway.key}"}) as client:
            through, alone = [], []
            for _ in range(repeats):  # alternated, so that a busy moment costs both alike
                started = time.perf_counter()
                client.post(f"{gateway.base_url()}/chat/completions", json=body).raise_for_status()
                through.append(time.perf_counter() - started)
                started = time.perf_counter()
                asyncio.run(direct())
                alone.append(time.perf_counter() - started)
    finally:
        gateway.stop()
    gateway_ms, direct_ms = statistics.median(through) * 1000, statistics.median(alone) * 1000
    return {"gateway_ms": round(gateway_ms, 3), "direct_ms": round(direct_ms, 3),
            "overhead_ms": round(gateway_ms - direct_ms, 3), "repeats": repeats}  # fmt: skip


def throughput(model, chat, env, agents: int, tokens: int, rounds: int) -> dict:
    tasks = env.tasks("test")[:agents]
    engine = HFEngine(model, stop_ids=[], pad_id=chat.tokenizer.pad_token_id, device=torch.device("cpu"))
    tools = [t.to_openai() for t in env.tools()]
    params = SamplingParams(1.0, 1.0, 0, tokens, None)
    gateway = Gateway(engine, chat, env.syntax, "bench", max_new_tokens=tokens, sampling=params).start()
    limits = RolloutLimits(1, tokens, 10_000, 256, params)
    rollout = Rollout(env, engine, chat, env.syntax, ToolExecutor(env.tools()), limits)

    async def through_gateway() -> int:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {gateway.key}"}, timeout=600) as client:

            async def agent(task) -> int:
                body = {"messages": env.messages(task), "tools": tools, "max_tokens": tokens, "temperature": 1.0}
                reply = await client.post(f"{gateway.base_url()}/chat/completions", json=body)
                return reply.json()["usage"]["completion_tokens"]

            return sum(await asyncio.gather(*(agent(task) for task in tasks)))

    def native() -> int:
        trajs = rollout.run(tasks)
        return sum(sum(t.loss_mask) for t in trajs)

    rates: dict[str, list[float]] = {"gateway": [], "rollout": []}
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            made = native()
            rates["rollout"].append(made / (time.perf_counter() - started))
            started = time.perf_counter()
            made = gateway.run_coroutine(through_gateway(), 900)
            rates["gateway"].append(made / (time.perf_counter() - started))
            gateway.run_coroutine(_free(engine))
    finally:
        gateway.stop()
    gateway_rate, rollout_rate = statistics.median(rates["gateway"]), statistics.median(rates["rollout"])
    return {"agents": agents, "tokens_each": tokens, "rounds": rounds,
            "gateway_tok_s": round(gateway_rate, 1), "rollout_tok_s": round(rollout_rate, 1),
            "throughput_vs_rollout": round(gateway_rate / rollout_rate, 3), "per_round": rates}  # fmt: skip


async def _free(engine) -> None:
    engine.free_memory()


def drift(model, chat, env, conversations: int) -> dict:
    engine = Recording(HFEngine(model, stop_ids=[chat.end_of_turn_id], pad_id=chat.tokenizer.pad_token_id,
                                device=torch.device("cpu")))  # fmt: skip
    tools = [t.to_openai() for t in env.tools()]
    gateway = Gateway(engine, chat, env.syntax, "bench", max_new_tokens=48).start()
    totals = {"conversations": conversations, "segments": 0, "turns": 0, "tokens": 0, "drift_tokens": 0,
              "naive_drift_tokens": 0}  # fmt: skip
    try:
        for task in env.tasks("test")[:conversations]:
            engine.calls.clear()
            one = conversation(gateway, engine, chat, env, task, tools)
            for key, value in one.items():
                totals[key] += value
    finally:
        gateway.stop()
    return totals


def conversation(gateway, engine, chat, env, task, tools) -> dict:
    sample = gateway.open_sample(task)
    messages = list(env.messages(task))
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {gateway.key}"}, timeout=600) as client:
            for turn in range(3):
                body = {"messages": messages, "tools": tools, "max_tokens": 48, "temperature": 1.0, "seed": turn}
                reply = client.post(f"{gateway.base_url(sample)}/chat/completions", json=body).json()
                message = reply["choices"][0]["message"]
                messages.append(message)
                for k, call in enumerate(message.get("tool_calls") or [{"id": "none"}]):
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{k + 41}"})
    finally:
        record = gateway.close_sample(sample.id)
    traj = max((s.traj for s in record.segments), key=lambda t: len(t.token_ids))
    ours = 0
    for (fed, sampled), (start, end) in zip(engine.calls, traj.model_spans(), strict=False):
        ours += sum(a != b for a, b in zip(fed, traj.token_ids[: len(fed)], strict=False))
        ours += sum(a != b for a, b in zip(sampled, traj.token_ids[start:end], strict=True))
    history = template_messages(messages[: -1 if messages[-1]["role"] == "tool" else None], env.syntax)
    naive = chat.prompt_ids(history, tools, env.syntax.instructions)
    end = traj.model_spans()[-1][1] if traj.model_spans() else 0
    naive_drift = sum(a != b for a, b in zip(naive[:end], traj.token_ids[:end], strict=False))
    naive_drift += end - min(len(naive), end)
    return {"segments": len(record.segments), "turns": traj.num_turns, "tokens": len(traj.token_ids),
            "drift_tokens": ours, "naive_drift_tokens": naive_drift}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--out", default="bench/results/gateway.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = load_tokenizer(MODEL)
    chat = ChatFormat(tokenizer)
    env = make_env(EnvConfig(name="calculator"))
    tools = [t.to_openai() for t in env.tools()]
    first = env.tasks("test")[0]
    over = overhead(chat, env.messages(first), tools, args.repeats)
    print(f"overhead: {over}", flush=True)
    model = load_model(MODEL, torch.device("cpu"), "float32")
    rate = throughput(model, chat, env, args.agents, args.tokens, args.rounds)
    print(f"throughput: gateway {rate['gateway_tok_s']} tok/s, rollout {rate['rollout_tok_s']} tok/s", flush=True)
    exact = drift(model, chat, env, args.conversations)
    print(f"{'measure':<28}{'value':>12}{'goal':>10}")
    print(f"{'overhead_ms':<28}{over['overhead_ms']:>12.3f}{'<= 5':>10}")
    print(f"{'throughput_vs_rollout':<28}{rate['throughput_vs_rollout']:>12.3f}{'>= 0.9':>10}")
    print(f"{'drift_tokens (ours)':<28}{exact['drift_tokens']:>12}{'0':>10}")
    print(f"{'drift_tokens (naive)':<28}{exact['naive_drift_tokens']:>12}{'':>10}")
    write_results(args.out, {
        "machine": machine(), "model": MODEL,
        "overhead_ms": over["overhead_ms"], "throughput_vs_rollout": rate["throughput_vs_rollout"],
        "drift_tokens": exact["drift_tokens"], "naive_drift_tokens": exact["naive_drift_tokens"],
        "overhead": over, "throughput": rate, "drift": exact,
    })  # fmt: skip


if __name__ == "__main__":
    main()
