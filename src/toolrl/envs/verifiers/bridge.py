"""The verifiers side of `env.name: verifiers`: a program run by the interpreter that has `verifiers` installed
(env.options.python), speaking JSON lines with toolrl on stdin and stdout. It imports nothing of toolrl, so it
runs in a virtual environment of its own (verifiers pins versions of openai and mcp that toolrl's do not meet).

    toolrl -> bridge, first line: {"environment": ID or "package.module:function", "args": {...}}
    bridge -> toolrl:             {"ready": {"version": ..., "train": [ROW...], "test": [ROW...]}}
                                  or {"fatal": "one line", "field": "environment" or "python"} (exits 2)
    toolrl -> bridge:             {"id": N, "input": ROW, "base_url": ..., "api_key": ..., "model": ...,
                                   "sampling_args": {...}}
    bridge -> toolrl:             {"id": N, "reward": R, "metrics": {...}, "error": null or "one line", ...}
    toolrl -> bridge:             {"cancel": N}     (a rollout past its deadline)

A ROW is one example of the environment's dataset as it gives it (example_id, prompt, answer, info, ...). Each
rollout runs `Environment.run_rollout` with an OpenAI client on the sample's own base URL (the gateway records
its turns), and its reward is the environment's rubric. Rollouts run concurrently; stdout carries nothing but
these lines (what the environment prints goes to stderr).
"""

import asyncio
import importlib
import json
import math
import os
import sys
import threading
import traceback

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this file's folder is toolrl's source, not a place to import from


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def plain(value):
    """`value` as JSON takes it (datasets give numpy scalars and nested features)."""
    return json.loads(json.dumps(value, default=str))


class NoVerifiers(Exception):
    """This interpreter cannot import verifiers."""


def load(spec: dict):
    try:
        import verifiers as vf
    except ImportError as exc:
        raise NoVerifiers(one_line(exc)) from exc

    target, args = spec["environment"], spec.get("args") or {}
    if ":" in target:
        module_name, _, name = target.partition(":")
        sys.path.insert(0, os.getcwd())
        loader = getattr(importlib.import_module(module_name), name)
        env = loader(**args)
    else:
        env = vf.load_environment(target, **args)
    if not hasattr(env, "run_rollout") or not hasattr(env, "rubric"):
        raise TypeError(
            f"{target} gave a {type(env).__name__}, not a verifiers Environment with a rubric (the classic "
            "vf.Environment API; verifiers v1 tasksets and harnesses are not supported)"
        )
    return vf, env


def rows(dataset) -> list[dict]:
    if dataset is None:
        return []
    return [plain({"example_id": k, **dict(row)}) for k, row in enumerate(dataset)]


def datasets(env) -> tuple[list[dict], list[dict]]:
    train = rows(env.get_dataset()) if getattr(env, "dataset", None) is not None else []
    test = rows(env.get_eval_dataset()) if getattr(env, "eval_dataset", None) is not None else []
    return train, test


class Bridge:
    def __init__(self, vf, env, out):
        self.vf, self.env, self.out = vf, env, out
        self.lock = threading.Lock()
        self.running: dict[int, asyncio.Task] = {}

    def send(self, message: dict) -> None:
        line = json.dumps(message, default=str)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    async def rollout(self, request: dict) -> None:
        rid = request["id"]
        try:
            from openai import AsyncOpenAI
            from verifiers.clients import OpenAIChatCompletionsClient

            client = OpenAIChatCompletionsClient(
                AsyncOpenAI(base_url=request["base_url"], api_key=request["api_key"], max_retries=0)
            )
            output = await self.env.run_rollout(
                request["input"], client, request["model"], request.get("sampling_args") or {}
            )
            reward = output.get("reward")
            reward = float(reward) if reward is not None else math.nan
            error = output.get("error")
            self.send(
                {
                    "id": rid,
                    "reward": reward if math.isfinite(reward) else None,
                    "metrics": plain(output.get("metrics") or {}),
                    "error": None
                    if not error
                    else str(error.get("error", error) if isinstance(error, dict) else error),
                    "stop_condition": output.get("stop_condition"),
                    "completion": plain(output.get("completion")),
                }
            )
        except asyncio.CancelledError:
            self.send({"id": rid, "reward": None, "error": "cancelled: past its deadline"})
        except Exception as exc:  # the rollout's failure is its sample's, not the bridge's
            print(traceback.format_exc(), file=sys.stderr)
            self.send({"id": rid, "reward": None, "error": one_line(exc)})
        finally:
            self.running.pop(rid, None)

    async def serve(self, lines: asyncio.Queue) -> None:
        while True:
            line = await lines.get()
            if line is None:
                break
            try:
                request = json.loads(line)
            except ValueError:
                print(f"toolrl bridge: not JSON, ignored: {line[:200]!r}", file=sys.stderr)
                continue
            if "cancel" in request:
                task = self.running.get(request["cancel"])
                if task is not None:
                    task.cancel()
                continue
            self.running[request["id"]] = asyncio.create_task(self.rollout(request))
        for task in list(self.running.values()):
            task.cancel()


def read_lines(loop, queue: asyncio.Queue, stream) -> None:
    for line in stream:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def main() -> int:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the environment prints goes to stderr: stdout is the protocol's
    spec = json.loads(sys.stdin.readline() or "{}")
    try:
        vf, env = load(spec)
        train, test = datasets(env)
    except Exception as exc:
        print(traceback.format_exc(), file=sys.stderr)
        field = "python" if isinstance(exc, NoVerifiers) else "environment"
        out.write(json.dumps({"fatal": str(exc) if field == "python" else one_line(exc), "field": field}) + "\n")
        out.flush()
        return 2
    bridge = Bridge(vf, env, out)
    bridge.send({"ready": {"version": getattr(vf, "__version__", "?"), "train": train, "test": test}})
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=read_lines, args=(loop, queue, sys.stdin), daemon=True).start()
    await bridge.serve(queue)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
