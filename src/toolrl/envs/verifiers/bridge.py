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

The first line may name a verifiers 0.4 (v1) taskset in place of the environment ({"taskset": ID, "harness": {...},
"runtime": {...}, "args": {...}}): its tasks are the rows and each rollout is one episode of it (`V1`).

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
    if spec.get("taskset"):
        return load_v1(spec)
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
            "vf.Environment API; a verifiers 0.4 taskset goes in env.options.taskset)"
        )
    return vf, env


def load_v1(spec: dict):
    """A verifiers 0.4 (v1) environment: the taskset `spec["taskset"]` (an id verifiers resolves: a built-in one or
    a module on the path exporting its Taskset) played by a harness (its default, or `spec["harness"]`) in a
    runtime (`spec["runtime"]`; the local subprocess one unless named)."""
    try:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config
    except ImportError as exc:
        raise NoVerifiers(f"{one_line(exc)} (verifiers 0.4 or later has verifiers.v1)") from exc
    sys.path.insert(0, os.getcwd())
    agent = {"runtime": spec.get("runtime") or {"type": "subprocess"}}
    if spec.get("harness"):
        agent["harness"] = spec["harness"]
    config = resolve_env_config({"taskset": {"id": spec["taskset"], **(spec.get("args") or {})}, "agent": agent})
    return vf, V1(vf, load_environment(config))


class V1:
    """A verifiers 0.4 Env behind the classic surface the bridge speaks: its taskset's tasks as rows (one split:
    toolrl holds out its test tasks), `run_rollout` as one episode of the task against the sample's base URL, the
    reward the sum of its traces' rewards, their reward components and metrics the metrics."""

    KEY_VARIABLE = "TOOLRL_GATEWAY_KEY"
    MOST_TASKS = 10_000
    """Tasks taken from a taskset without end (verifiers' INFINITE tasksets)."""

    def __init__(self, vf, env):
        self.vf, self.env = vf, env
        taskset, self.notes = env.taskset, []
        if not getattr(taskset, "bounded", True):  # a generator of tasks without end: a bounded view of it
            taskset = taskset.take(self.MOST_TASKS)
            self.notes.append(f"the taskset has no end: its first {self.MOST_TASKS} tasks are taken")
        self.tasks = {str(task.data.idx): task for task in taskset}
        self.rubric = "the tasks' own rewards"
        self.serving = None

    def rows(self) -> list[dict]:
        return [plain({"example_id": idx, "prompt": task.data.prompt, "answer": getattr(task.data, "answer", ""),
                       "info": task.data.model_dump(mode="json", exclude_none=True)})
                for idx, task in self.tasks.items()]  # fmt: skip

    async def start(self) -> None:
        self.serving = self.env.serving()
        await self.serving.__aenter__()

    async def stop(self) -> None:
        if self.serving is not None:
            await self.serving.__aexit__(None, None, None)

    async def run_rollout(self, row: dict, base_url: str, api_key: str, model: str, sampling_args: dict) -> dict:
        os.environ[self.KEY_VARIABLE] = api_key  # read by the client verifiers builds (one gateway key per run)
        client = self.vf.EvalClientConfig(base_url=base_url, api_key_var=self.KEY_VARIABLE)
        sampling = self.vf.SamplingConfig(**{k: v for k, v in sampling_args.items() if k in ("temperature", "top_p",
                                                                                            "max_tokens")})  # fmt: skip
        ctx = self.vf.ModelContext(model=model, client=client, sampling=sampling)
        episode = await self.env.run_episode(self.tasks[str(row["example_id"])], ctx)
        errors = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
        metrics: dict = {}
        for trace in episode.traces:
            metrics |= {name: reward.value for name, reward in trace.rewards.items() if reward is not None}
            metrics |= {name: value for name, value in trace.metrics.items() if value is not None}
        stops = [trace.stop_condition for trace in episode.traces if trace.stop_condition]
        return {"reward": sum(trace.reward for trace in episode.traces) if episode.ok else None, "metrics": metrics,
                "error": None if episode.ok else (f"{errors[0].type}: {errors[0].message}" if errors else
                                                  "the episode did not complete"),
                "stop_condition": stops[-1] if stops else None,
                "completion": [_wire(m) for t in episode.traces for m in t.messages]}  # fmt: skip


def _wire(message):
    """A v1 message (a pydantic model) as JSON takes it."""
    return message.model_dump(mode="json") if hasattr(message, "model_dump") else message


def rows(dataset) -> list[dict]:
    if dataset is None:
        return []
    return [plain({"example_id": k, **dict(row)}) for k, row in enumerate(dataset)]


def datasets(env) -> tuple[list[dict], list[dict]]:
    if isinstance(env, V1):
        return env.rows(), []
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
            if isinstance(self.env, V1):
                output = await self.env.run_rollout(request["input"], request["base_url"], request["api_key"],
                                                    request["model"], request.get("sampling_args") or {})  # fmt: skip
            else:
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
    if isinstance(env, V1):
        await env.start()  # the interception server and shared tool servers, for every episode
    bridge = Bridge(vf, env, out)
    notes = getattr(env, "notes", [])
    bridge.send({"ready": {"version": getattr(vf, "__version__", "?"), "train": train, "test": test, "notes": notes}})
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=read_lines, args=(loop, queue, sys.stdin), daemon=True).start()
    try:
        await bridge.serve(queue)
    finally:
        if isinstance(env, V1):
            await env.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
