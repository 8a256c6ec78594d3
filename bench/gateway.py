"""Benchmark: the gateway's cost against calling the engine directly, and token-exactness, for each wire protocol
(OpenAI chat completions and Responses, Anthropic Messages), whole and streamed.

1. overhead_ms: the median latency of one request through HTTP (the protocol's wire format, keep-alive, the key
   check, request validation, capture; a stream read to its last event) minus the same work done in-process
   (render the prompt, the engine's generate, decode, parse), both over an engine that answers at once (a fixed
   reply), so that the difference is the gateway alone. Goal <= 5 ms.
2. throughput_vs_rollout: 64 agents at once (on the gateway's event loop: a thread of their own would fight the
   server and the engine for the interpreter, which agents in processes of their own do not), each sending the
   calculator environment's prompt (its messages and tool schema) as one request, against the native rollout of
   the same 64 prompts for one turn, on the default model and one HFEngine (no stop token: exactly --tokens tokens
   each, the same work); generated tokens per second, gateway / rollout within each round (every protocol and
   the rollout alternated), the median of the rounds' ratios. Goal >= 0.9.
3. drift_tokens: --conversations three-turn tool conversations through the gateway on the default model, sampled
   at temperature 1, each sent back in the protocol's own shapes (Responses items, Anthropic content blocks):
   positions where the captured ids differ from what the engine sampled and was fed (ours, goal 0), and, for chat
   completions, where rendering each whole conversation again and tokenizing it would (the naive way).

Prints a table and writes bench/results/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import torch
from common import machine, write_results

from toolrl.chat import ChatFormat
from toolrl.chat.format import TOOL_RESPONSE_FALLBACK
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
VARIANTS = [(protocol, stream) for protocol in ("chat", "responses", "messages") for stream in (False, True)]


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


class Wire:
    """How an agent speaks one protocol: its request, and what it reads back from a reply or a stream (the turn
    to send back in its own shape, the calls in it, the tokens it cost). The history is kept in the protocol's
    own shapes; `results` appends what the agent's tools returned."""

    def __init__(self, protocol: str):
        self.protocol = protocol
        self.path = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}[protocol]

    def start(self, messages: list[dict]) -> tuple[list[dict], str | None]:
        """(history, system) from chat messages."""
        if self.protocol == "chat":
            return list(messages), None
        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        # the environment's in-context examples hold tool messages without calls: as the user's, wrapped
        history = [{"role": "user", "content": TOOL_RESPONSE_FALLBACK.format(content=m["content"])}
                   if m["role"] == "tool" else {"role": m["role"], "content": m["content"]}
                   for m in messages if m["role"] != "system"]  # fmt: skip
        return history, system

    def body(self, history, system, tools, tokens: int, seed: int | None, stream: bool) -> dict:
        if self.protocol == "chat":
            return {"messages": history, "tools": tools, "max_tokens": tokens, "temperature": 1.0, "seed": seed,
                    "stream": stream}  # fmt: skip
        if self.protocol == "responses":
            flat = [{"type": "function", **t["function"]} for t in tools]
            return {"input": history, "instructions": system, "tools": flat, "max_output_tokens": tokens,
                    "temperature": 1.0, "store": False, "stream": stream}  # fmt: skip
        anthropic = [{"name": t["function"]["name"], "description": t["function"]["description"],
                      "input_schema": t["function"]["parameters"]} for t in tools]  # fmt: skip
        return {"messages": history, "system": system, "tools": anthropic, "max_tokens": tokens, "temperature": 1.0,
                "stream": stream}  # fmt: skip

    def read(self, reply: dict) -> tuple[list[dict], list[tuple[str, str]], int]:
        """(the turn's items to send back, its calls as (id, name), completion tokens) from a whole reply."""
        if self.protocol == "chat":
            message = reply["choices"][0]["message"]
            calls = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls") or []]
            return [message], calls, reply["usage"]["completion_tokens"]
        if self.protocol == "responses":
            calls = [(i["call_id"], i["name"]) for i in reply["output"] if i["type"] == "function_call"]
            return reply["output"], calls, reply["usage"]["output_tokens"]
        calls = [(b["id"], b["name"]) for b in reply["content"] if b["type"] == "tool_use"]
        return [{"role": "assistant", "content": reply["content"]}], calls, reply["usage"]["output_tokens"]

    def read_stream(self, events: list[dict]) -> tuple[list[dict], list[tuple[str, str]], int]:
        """The same from a stream's events, assembled as the protocol's SDKs assemble them."""
        if self.protocol == "chat":
            text, calls, tokens = "", {}, 0
            for chunk in events:
                if not chunk["choices"]:
                    tokens = chunk["usage"]["completion_tokens"]
                    continue
                delta = chunk["choices"][0]["delta"]
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    entry = calls.setdefault(call["index"], {"id": call.get("id"), "name": "", "arguments": ""})
                    entry["name"] += call.get("function", {}).get("name") or ""
                    entry["arguments"] += call.get("function", {}).get("arguments") or ""
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [{"id": c["id"], "type": "function",
                                          "function": {"name": c["name"], "arguments": c["arguments"]}}
                                         for c in calls.values()]  # fmt: skip
            return [message], [(c["id"], c["name"]) for c in calls.values()], tokens
        if self.protocol == "responses":
            done = ("response.completed", "response.incomplete")
            return self.read(next(e["response"] for e in events if e["type"] in done))
        blocks, tokens, partial = [], 0, ""
        for event in events:
            if event["type"] == "content_block_start":
                blocks.append(dict(event["content_block"]))
                partial = ""
            elif event["type"] == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    blocks[-1]["text"] += delta["text"]
                else:
                    partial += delta["partial_json"]
            elif event["type"] == "content_block_stop" and blocks[-1]["type"] == "tool_use":
                try:  # a call cut by the token budget: what its arguments were, as far as they parse
                    blocks[-1]["input"] = json.loads(partial or "{}")
                except ValueError:
                    blocks[-1]["input"] = {}
            elif event["type"] == "message_delta":
                tokens = event["usage"]["output_tokens"]
        return self.read({"content": blocks, "usage": {"output_tokens": tokens}})

    def stream_tokens(self, lines: list[str]) -> int:
        """The completion tokens a stream reports (its last usage), reading only the event that holds them."""
        data = [line[6:] for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
        if self.protocol == "chat":
            return json.loads(data[-1])["usage"]["completion_tokens"]
        if self.protocol == "responses":
            return json.loads(data[-1])["response"]["usage"]["output_tokens"]
        return next(json.loads(d)["usage"]["output_tokens"] for d in reversed(data) if '"message_delta"' in d)

    def results(self, history: list[dict], turn: list[dict], calls: list[tuple[str, str]], outputs: list[str]):
        if self.protocol == "chat":
            return [*history, *turn, *({"role": "tool", "tool_call_id": i, "content": o} for (i, _), o in
                                       zip(calls, outputs, strict=True))]  # fmt: skip
        if self.protocol == "responses":
            return [*history, *turn, *({"type": "function_call_output", "call_id": i, "output": o} for (i, _), o in
                                       zip(calls, outputs, strict=True))]  # fmt: skip
        results = [
            {"type": "tool_result", "tool_use_id": i, "content": o} for (i, _), o in zip(calls, outputs, strict=True)
        ]
        return [*history, *turn, {"role": "user", "content": results or "Go on."}]


def headers(gateway, protocol: str) -> dict[str, str]:
    return {"x-api-key": gateway.key} if protocol == "messages" else {"Authorization": f"Bearer {gateway.key}"}


def post_sync(client: httpx.Client, url: str, body: dict, stream: bool) -> list[dict] | dict:
    """The reply, or a stream's events (data lines, [DONE] left out)."""
    if not stream:
        reply = client.post(url, json=body)
        reply.raise_for_status()
        return reply.json()
    with client.stream("POST", url, json=body) as reply:
        reply.raise_for_status()
        return [
            json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"
        ]


def overhead(chat: ChatFormat, messages, tools, repeats: int) -> dict:
    syntax = get_parser("hermes")
    ids = chat.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>')
    engine = Instant([*ids, chat.end_of_turn_id])
    gateway = Gateway(engine, chat, syntax, "bench").start()
    known = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in tools}

    async def direct() -> None:
        prompt = chat.prompt_ids(template_messages(messages, syntax), tools, syntax.instructions)
        sampled = await engine.generate(object(), prompt, SamplingParams(max_new_tokens=32))
        syntax(chat.tokenizer.decode(sampled.ids, skip_special_tokens=True), known)

    rows = {}
    try:
        for protocol, stream in VARIANTS:
            wire = Wire(protocol)
            history, system = wire.start(messages)
            body = wire.body(history, system, tools, 32, None, stream)
            url = f"{gateway.base_url()}{wire.path}"
            with httpx.Client(headers=headers(gateway, protocol)) as client:
                through, alone = [], []
                for _ in range(repeats):  # alternated, so that a busy moment costs both alike
                    started = time.perf_counter()
                    post_sync(client, url, body, stream)
                    through.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    asyncio.run(direct())
                    alone.append(time.perf_counter() - started)
            gateway_ms, direct_ms = statistics.median(through) * 1000, statistics.median(alone) * 1000
            rows[name(protocol, stream)] = {"gateway_ms": round(gateway_ms, 3), "direct_ms": round(direct_ms, 3),
                                            "overhead_ms": round(gateway_ms - direct_ms, 3),
                                            "repeats": repeats}  # fmt: skip
            print(f"overhead {name(protocol, stream)}: {rows[name(protocol, stream)]}", flush=True)
    finally:
        gateway.stop()
    return rows


def name(protocol: str, stream: bool) -> str:
    return protocol + (" streamed" if stream else "")


def throughput(model, chat, env, agents: int, tokens: int, rounds: int) -> dict:
    tasks = env.tasks("test")[:agents]
    engine = HFEngine(model, stop_ids=[], pad_id=chat.tokenizer.pad_token_id, device=torch.device("cpu"),
                      tokenizer=chat.tokenizer)  # fmt: skip
    tools = [t.to_openai() for t in env.tools()]
    params = SamplingParams(1.0, 1.0, 0, tokens, None)
    gateway = Gateway(engine, chat, env.syntax, "bench", max_new_tokens=tokens, sampling=params).start()
    limits = RolloutLimits(1, tokens, 10_000, 256, params)
    rollout = Rollout(env, engine, chat, env.syntax, ToolExecutor(env.tools()), limits)

    async def through_gateway(protocol: str, stream: bool) -> int:
        wire = Wire(protocol)
        async with httpx.AsyncClient(headers=headers(gateway, protocol), timeout=900) as client:

            async def agent(task) -> int:
                history, system = wire.start(env.messages(task))
                body = wire.body(history, system, tools, tokens, None, stream)
                url = f"{gateway.base_url()}{wire.path}"
                if not stream:
                    return wire.read((await client.post(url, json=body)).json())[2]
                async with client.stream("POST", url, json=body) as reply:
                    lines = [line async for line in reply.aiter_lines()]
                return wire.stream_tokens(lines)

            return sum(await asyncio.gather(*(agent(task) for task in tasks)))

    def native() -> int:
        trajs = rollout.run(tasks)
        return sum(sum(t.loss_mask) for t in trajs)

    rates: dict[str, list[float]] = {"rollout": [], **{name(p, s): [] for p, s in VARIANTS}}
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            made = native()
            rates["rollout"].append(made / (time.perf_counter() - started))
            for protocol, stream in VARIANTS:
                started = time.perf_counter()
                made = gateway.run_coroutine(through_gateway(protocol, stream), 1800)
                rates[name(protocol, stream)].append(made / (time.perf_counter() - started))
                gateway.run_coroutine(_free(engine))
            print(f"throughput round: { {k: round(v[-1], 1) for k, v in rates.items()} }", flush=True)
    finally:
        gateway.stop()
    rollout_rate = statistics.median(rates["rollout"])
    ratios = {key: [r / n for r, n in zip(rates[key], rates["rollout"], strict=True)] for key in rates}
    rows = {key: {"tok_s": round(statistics.median(rates[key]), 1),
                  "throughput_vs_rollout": round(statistics.median(ratios[key]), 3)}
            for key in rates if key != "rollout"}  # fmt: skip
    return {"agents": agents, "tokens_each": tokens, "rounds": rounds, "rollout_tok_s": round(rollout_rate, 1),
            "protocols": rows, "per_round": rates}  # fmt: skip


async def _free(engine) -> None:
    engine.free_memory()


def drift(model, chat, env, conversations: int) -> dict:
    engine = Recording(HFEngine(model, stop_ids=[chat.end_of_turn_id], pad_id=chat.tokenizer.pad_token_id,
                                device=torch.device("cpu"), tokenizer=chat.tokenizer))  # fmt: skip
    tools = [t.to_openai() for t in env.tools()]
    gateway = Gateway(engine, chat, env.syntax, "bench", max_new_tokens=48).start()
    rows = {}
    try:
        for protocol, stream in VARIANTS:
            totals = {"conversations": conversations, "segments": 0, "turns": 0, "tokens": 0, "drift_tokens": 0,
                      "naive_drift_tokens": 0}  # fmt: skip
            for task in env.tasks("test")[:conversations]:
                engine.calls.clear()
                one = conversation(gateway, engine, chat, env, task, tools, Wire(protocol), stream)
                for key, value in one.items():
                    totals[key] += value
            rows[name(protocol, stream)] = totals
            print(f"drift {name(protocol, stream)}: {totals}", flush=True)
    finally:
        gateway.stop()
    return rows


def conversation(gateway, engine, chat, env, task, tools, wire: Wire, stream: bool) -> dict:
    sample = gateway.open_sample(task)
    history, system = wire.start(list(env.messages(task)))
    try:
        with httpx.Client(headers=headers(gateway, wire.protocol), timeout=600) as client:
            for turn in range(3):
                body = wire.body(history, system, tools, 48, turn, stream)
                reply = post_sync(client, f"{gateway.base_url(sample)}{wire.path}", body, stream)
                items, calls, _ = wire.read_stream(reply) if stream else wire.read(reply)
                outputs = [f"{k + 41}" for k in range(len(calls) or 1)]
                history = wire.results(history, items, calls or [("none", "")], outputs)
    finally:
        record = gateway.close_sample(sample.id)
    traj = max((s.traj for s in record.segments), key=lambda t: len(t.token_ids))
    ours = 0
    for (fed, sampled), (start, end) in zip(engine.calls, traj.model_spans(), strict=False):
        ours += sum(a != b for a, b in zip(fed, traj.token_ids[: len(fed)], strict=False))
        ours += sum(a != b for a, b in zip(sampled, traj.token_ids[start:end], strict=True))
    naive_drift = 0
    if wire.protocol == "chat" and not stream:  # the whole conversation rendered again and tokenized
        history_msgs = template_messages(history[: -1 if history[-1]["role"] == "tool" else None], env.syntax)
        naive = chat.prompt_ids(history_msgs, tools, env.syntax.instructions)
        end = traj.model_spans()[-1][1] if traj.model_spans() else 0
        naive_drift = sum(a != b for a, b in zip(naive[:end], traj.token_ids[:end], strict=False))
        naive_drift += end - min(len(naive), end)
    return {"segments": len(record.segments), "turns": traj.num_turns, "tokens": len(traj.token_ids),
            "drift_tokens": ours, "naive_drift_tokens": naive_drift}  # fmt: skip


DOCS = "docs/agents.md"
MARKS = ("<!-- gateway table: python bench/gateway.py -->", "<!-- /gateway table -->")


def docs_table(results: dict) -> str:
    """The table docs/agents.md shows, from a results file."""
    rate, over = results["throughput"], results["overhead"]
    lines = ["| protocol | overhead per request (through HTTP / in-process) | 64 agents / native rollout (tok/s) | "
             "drift (ours) |", "|---|---:|---:|---:|"]  # fmt: skip
    for key, row in results["protocols"].items():
        o, t = over[key], rate["protocols"][key]
        lines.append(f"| {key} | {row['overhead_ms']:.1f} ms ({o['gateway_ms']:.1f} / {o['direct_ms']:.1f}) | "
                     f"{row['throughput_vs_rollout']:.2f} ({t['tok_s']:.0f} / {rate['rollout_tok_s']:.0f}) | "
                     f"{row['drift_tokens']} |")  # fmt: skip
    lines.append("| goal | <= 5 ms | >= 0.9 | 0 |")
    load = results.get("load_average")
    lines.append("")
    lines.append(f"Medians of {over['chat']['repeats']} requests and of {rate['rounds']} rounds; "
                 f"{results['drift']['chat']['conversations']} conversations a protocol. Rendering each chat "
                 f"conversation again and tokenizing it (the naive way) drifts by {results['naive_drift_tokens']} "
                 f"tokens. Measured on {results['machine']['cpu']}, {results['machine']['cores']} cores"
                 + (f", load average {load[0]} at the start and {load[1]} at the end." if load else "."))  # fmt: skip
    return "\n".join(lines)


def write_docs(results: dict, page: str = DOCS) -> None:
    path = Path(__file__).parents[1] / page
    text = path.read_text()
    start, end = text.index(MARKS[0]) + len(MARKS[0]), text.index(MARKS[1])
    path.write_text(text[:start] + "\n" + docs_table(results) + "\n" + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", action="store_true", help="only write docs/agents.md's table from --out's results")
    parser.add_argument("--only", default="", help="measure these variants only (comma-separated: chat, responses "
                        "streamed, ...), for a look; the results file wants them all")  # fmt: skip
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--out", default="bench/results/gateway.json")
    args = parser.parse_args()
    if args.docs:
        write_docs(json.loads(Path(args.out).read_text()))
        return
    if args.only:
        VARIANTS[:] = [v for v in VARIANTS if name(*v) in args.only.split(",")]
    torch.manual_seed(0)
    started_load = _load_average()
    tokenizer = load_tokenizer(MODEL)
    chat = ChatFormat(tokenizer)
    env = make_env(EnvConfig(name="calculator"))
    tools = [t.to_openai() for t in env.tools()]
    over = overhead(chat, env.messages(env.tasks("test")[0]), tools, args.repeats)
    model = load_model(MODEL, torch.device("cpu"), "float32")
    rate = throughput(model, chat, env, args.agents, args.tokens, args.rounds)
    exact = drift(model, chat, env, args.conversations)
    rows = {key: {"overhead_ms": over[key]["overhead_ms"], "throughput_vs_rollout":
                  rate["protocols"][key]["throughput_vs_rollout"], "drift_tokens": exact[key]["drift_tokens"]}
            for key in over}  # fmt: skip
    print(f"{'protocol':<22}{'overhead_ms':>12}{'vs rollout':>12}{'drift':>8}")
    for key, row in rows.items():
        print(f"{key:<22}{row['overhead_ms']:>12.3f}{row['throughput_vs_rollout']:>12.3f}{row['drift_tokens']:>8}")
    print(f"{'goal':<22}{'<= 5':>12}{'>= 0.9':>12}{'0':>8}")
    print(f"naive re-render drift (chat): {exact['chat']['naive_drift_tokens']} tokens")
    chat_row = rows["chat"]
    results = {
        "machine": machine(), "model": MODEL, "load_average": [started_load, _load_average()],
        "overhead_ms": chat_row["overhead_ms"], "throughput_vs_rollout": chat_row["throughput_vs_rollout"],
        "drift_tokens": chat_row["drift_tokens"], "naive_drift_tokens": exact["chat"]["naive_drift_tokens"],
        "protocols": rows, "overhead": over, "throughput": rate, "drift": exact,
    }  # fmt: skip
    write_results(args.out, results)
    if not args.only:
        write_docs(results)


def _load_average() -> float:
    import os

    return round(os.getloadavg()[0], 2)


if __name__ == "__main__":
    main()
