"""Benchmark: a served request's memory (issue 72, item 1). `toolrl serve`'s gateway and hf engine on the default
model, in this process, over real sockets; for each request the resident memory before it, its peak (sampled every
20 ms) and after it (once the gateway has given back what it gives back), in order:

- `plain`: a short chat turn (the engine's packed weights are made here: the baseline after it);
- `name10k_auto`: one tool named with 10,000 characters (~5k tokens), `tool_choice: auto`, `max_tokens: 8`;
- `user5k`: a 5k-token user message, `max_tokens: 8`;
- `over_budget`: the 10 KB tool name with `max_tokens: 4000` and `n: 4`: past the 1,024 MB a request, refused (400);
- `plain_again`: a short turn after them.

Prints a table and writes bench/results/gateway_memory.json. Before the budget (fad8e5b, the same requests by the
same script): plain 0.42 -> 1.54 GB; name10k_auto peak 3.85 GB and 3.82 GB after (8 slots x 6,400 positions of
keys and values kept); user5k peak 3.71 GB.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import psutil
from common import machine, write_results

OUT = Path(__file__).parent / "results" / "gateway_memory.json"


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


CASES = {
    "plain": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "name10k_auto": {"messages": [{"role": "user", "content": "hi"}], "tools": [tool("n" * 10_000)],
                     "tool_choice": "auto", "max_tokens": 8},
    "user5k": {"messages": [{"role": "user", "content": "hello world " * 2500}], "max_tokens": 8},
    "over_budget": {"messages": [{"role": "user", "content": "hi"}], "tools": [tool("n" * 10_000)], "n": 4,
                    "max_tokens": 4000},
    "plain_again": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beside", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    import httpx

    from toolrl.chat import ChatFormat
    from toolrl.config import resolve_config
    from toolrl.gateway import Gateway
    from toolrl.gateway.budget import KVBudget
    from toolrl.memory import rss_gb
    from toolrl.models import load_model, load_tokenizer, pick_device
    from toolrl.parsers import get_parser
    from toolrl.rollout import get_engine_factory

    cfg = resolve_config(None, ["device=cpu"])
    device = pick_device("cpu")
    model = load_model(cfg.model.name, device, "float32", cfg.model.cpu_linear).eval()
    chat = ChatFormat(load_tokenizer(cfg.model.name))
    engine = get_engine_factory("hf")(model=model, chat=chat, device=device, seed=0, config=cfg)
    gateway = Gateway(engine, chat, get_parser("hermes"), "m", max_new_tokens=8192, context_length=8192,
                      budget=KVBudget(engine.kv_bytes_per_token)).start()  # fmt: skip
    headers = {"Authorization": f"Bearer {gateway.key}"}
    process, peak, stop = psutil.Process(), [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss / 2**30)
            stop.wait(0.02)

    threading.Thread(target=sample, daemon=True).start()
    loads, rows = [os.getloadavg()], {}
    try:
        for name, body in CASES.items():
            peak[0], before, started = 0.0, rss_gb(), time.perf_counter()
            reply = httpx.post(f"{gateway.base_url()}/chat/completions", json={"model": "m", **body}, headers=headers,
                               timeout=900)  # fmt: skip
            seconds = time.perf_counter() - started
            time.sleep(1.5)  # the cache is given back within a second of the reply
            rows[name] = {"status": reply.status_code, "before_gb": round(before, 3), "peak_gb": round(peak[0], 3),
                          "after_gb": round(rss_gb(), 3), "s": round(seconds, 1)}  # fmt: skip
            if reply.status_code != 200:
                rows[name]["error"] = reply.json()["error"]["message"][:200]
            r = rows[name]
            print(f"{name:14s} {r['status']}  before {r['before_gb']:5.2f}  peak {r['peak_gb']:5.2f}  after "
                  f"{r['after_gb']:5.2f} GB  {r['s']:6.1f} s", flush=True)  # fmt: skip
    finally:
        stop.set()
        gateway.stop()
        engine.close()
    loads.append(os.getloadavg())
    result = {"cases": rows, "cache_given_back": gateway.stats["cache_given_back"], "beside": args.beside,
              "load_avg_before": [round(x, 2) for x in loads[0]], "load_avg_after": [round(x, 2) for x in loads[1]],
              "machine": machine()}  # fmt: skip
    write_results(Path(args.out), result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
