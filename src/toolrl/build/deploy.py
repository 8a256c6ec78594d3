"""Stage e, local deployment: every tool document becomes a Python function that runs locally and
deterministically, validated by calling it with its sub-problems' arguments (each must give the sub-problem's
answer) and with wrong ones (each must raise a clear error). A tool that fails is dropped, counted and reported
with the reason, and so are the tasks that need it.

`deploy.method: template` writes each function over its table with runtime.py; `llm` has the model write it.
Either way the code runs only in the code sandbox (bubblewrap or unshare), never in the builder's process.

Writes `deploy/`: runtime.py, tools/NAME.py, tools.jsonl (Deployed rows), tasks.jsonl, and deploy.json.
"""

from __future__ import annotations

import json
import keyword
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from toolrl.build.answers import same_answer
from toolrl.build.artifacts import BuiltTask, Deployed, FactRow, ScaledTool, Workspace
from toolrl.build.decompose import read_facts
from toolrl.build.needs import rollout_needs
from toolrl.build.runtime import _norm, _row_key  # the runtime's own keys: tables and lookups must agree
from toolrl.build.scale import SCALED_TOOLS_FILE, TASKS_FILE
from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, how_it_ended
from toolrl.text import clip

log = logging.getLogger(__name__)

DEPLOY_DIR = "deploy"
MANIFEST = f"{DEPLOY_DIR}/deploy.json"
RUNTIME = Path(__file__).with_name("runtime.py")
PROBE_NAME = "Nobody Ofthisworld"
"""A name no table has: a deployed tool must reject it with an error."""

CODE_PROMPT = """Write a Python function `{name}(**arguments)` for this tool document:
{doc}
It must return, as a string, exactly the answers below for these arguments, and raise ValueError with a clear
message for arguments it does not know. Use the standard library only; no input, files or network.
{examples}
Reply with only the code in one ```python block."""


def tool_spec(tool: ScaledTool, facts: dict[str, list[FactRow]]) -> dict[str, Any]:
    """What the runtime needs: the tables of the tool's kinds and the scaling's changes."""
    impl = tool.impl
    tables = {}
    for kind in impl.kinds:
        rows = facts.get(kind, [])
        if impl.key:
            tables[kind] = {_norm(r.arguments.get(impl.key, "")): r.answer for r in rows}
        else:
            tables[kind] = {_row_key(r.arguments): r.answer for r in rows}
    return {
        "name": tool.doc.name,
        "parameters": tool.doc.parameters,
        "kinds": impl.kinds,
        "key": impl.key,
        "key_shape": impl.key_shape,
        "field": impl.field,
        "fields": impl.fields,
        "unit": impl.unit,
        "optional": list(impl.optional),
        "tables": tables,
    }


def template_source(tool: ScaledTool, facts: dict[str, list[FactRow]]) -> str:
    name, description = tool.doc.name, tool.doc.description
    return (
        f'"""Tool {name}, deployed by `toolrl env build` from its document; runs with runtime.py."""\n\n'
        f"SPEC = {tool_spec(tool, facts)!r}\n\n\n"
        f"def {name}(**arguments):\n"
        f"    {json.dumps(description)}\n"
        f"    return call(SPEC, arguments)\n"
    )


def harness(runtime: str, source: str, name: str, calls: list[dict[str, Any]]) -> str:
    """One script for the sandbox: the runtime, the tool, then each call's result (or error) as JSON."""
    return (
        f"{runtime}\n\n{source}\n\n"
        "import json as _json\n"
        "_results = []\n"
        f"for _arguments in _json.loads({json.dumps(calls)!r}):\n"
        "    try:\n"
        f"        _results.append({{'ok': str({name}(**_arguments))}})\n"
        "    except Exception as _exc:\n"
        "        _results.append({'error': str(_exc) or type(_exc).__name__})\n"
        "print('\\n' + _json.dumps(_results))\n"
    )


BATCH_TOOLS = 32
"""Template tools validated per sandbox: each runs in a namespace of its own, one process starts per batch (a
sandbox's start, not the tools, was most of deploy's time: 41 s for 274 tools one by one)."""


def batch_harness(runtime: str, items: list[tuple[str, str, list[dict[str, Any]]]]) -> str:
    """One script for several tools: each tool's source in a fresh copy of the runtime's namespace, then its
    calls; per tool, its results or why its code did not load, as one JSON list."""
    return (
        f"{runtime}\n\n"
        "import json as _json\n"
        "_base = dict(globals())\n"
        "_out = []\n"
        f"for _source, _name, _calls in _json.loads({json.dumps(items)!r}):\n"
        "    _ns = dict(_base)\n"
        "    try:\n"
        "        exec(compile(_source, _name + '.py', 'exec'), _ns)\n"
        "        _fn = _ns[_name]\n"
        "    except Exception as _exc:\n"
        "        _out.append('the code does not load: ' + (str(_exc) or type(_exc).__name__))\n"
        "        continue\n"
        "    _results = []\n"
        "    for _arguments in _calls:\n"
        "        try:\n"
        "            _results.append({'ok': str(_fn(**_arguments))})\n"
        "        except Exception as _exc:\n"
        "            _results.append({'error': str(_exc) or type(_exc).__name__})\n"
        "    _out.append(_results)\n"
        "print('\\n' + _json.dumps(_out))\n"
    )


def _sandboxed(script: str, limits: SandboxLimits) -> Any:
    """Run a harness script in a fresh sandbox; its last line, parsed (ValueError saying why it failed)."""
    sandbox = Sandbox(limits)
    try:
        status, output = sandbox.run(script)
    finally:
        sandbox.close()
    if status is None:
        raise ValueError(f"the tool ran longer than {limits.timeout_s:g} s")
    lines = output.strip().splitlines()
    if status != 0 or not lines:
        raise ValueError(clip(f"the tool's code {how_it_ended(status)}: {' | '.join(lines[-3:])}", 300))
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise ValueError(clip(f"the tool printed something else than its results: {lines[-1]}", 300)) from None


def run_batch(items: list[tuple[str, str, list[dict[str, Any]]]], limits: SandboxLimits) -> list[list | str]:
    """Per (source, name, calls): its results, or why its code did not load; a batch failing as a whole (a
    timeout, a crash) raises ValueError, and its tools are then run one by one."""
    results = _sandboxed(batch_harness(RUNTIME.read_text(encoding="utf-8"), items), limits)
    if not isinstance(results, list) or len(results) != len(items):
        raise ValueError("the batch did not answer every tool")
    return results


def run_calls(
    source: str, name: str, calls: list[dict[str, Any]], limits: SandboxLimits, runtime: str | None = None
) -> list[dict[str, str]]:
    """Run `calls` of the tool `name` defined by `source` in a fresh sandbox; per call {"ok": text} or
    {"error": message}. The whole run failing (a syntax error, a timeout) raises ValueError."""
    runtime = RUNTIME.read_text(encoding="utf-8") if runtime is None else runtime
    results = _sandboxed(harness(runtime, source, name, calls), limits)
    if not isinstance(results, list) or len(results) != len(calls):
        raise ValueError("the tool's code did not answer every call")
    return results


def expected_answer(tool: ScaledTool, call: dict[str, Any], answer: str) -> str:
    if tool.impl.key_shape == "list":
        names = call["arguments"][tool.impl.key]
        return json.dumps({names[0]: answer}, ensure_ascii=False)
    return answer


def _probes(tool: ScaledTool) -> list[dict[str, Any]]:
    """Arguments the tool must reject: an unknown name, and nothing at all (when something is required)."""
    impl, probes = tool.impl, []
    if impl.key and impl.key_shape != "enum":
        shaped = {"nested": {"name": PROBE_NAME}, "list": [PROBE_NAME]}.get(impl.key_shape, PROBE_NAME)
        args = {impl.key: shaped}
        if impl.field:
            args[impl.field] = next(iter(impl.fields))
        if impl.unit:
            args["unit"] = "units"
        probes.append(args)
    if tool.doc.parameters.get("required"):
        probes.append({})
    return probes


def validate(
    tool: ScaledTool, source: str, cases: list[tuple[dict, str]], limits: SandboxLimits, results: list | None = None
) -> tuple[str | None, dict[int, tuple[str, str | None]]]:
    """(Why the tool fails as a whole, or None; per case it answers wrong, its index, why and what it gave). A
    tool fails as a whole when its code does not run, it accepts a probe, or it answers no case right; one fact
    wrong (a functional tool with hundreds of fields, two rows whose names differ only in case) costs only the
    tasks that need it. `results`: its calls' results from a batch (else it runs alone)."""
    probes = _probes(tool)
    if results is None:
        try:
            results = run_calls(source, tool.doc.name, validation_calls(tool, cases), limits)
        except ValueError as exc:
            return str(exc), {}
    for probe, result in zip(probes, results[len(cases) :], strict=True):
        if "error" not in result:
            return clip(f"{probe} should be an error but gave {result.get('ok')!r}", 300), {}
    wrong: dict[int, tuple[str, str | None]] = {}
    for i, ((call, answer), result) in enumerate(zip(cases, results, strict=False)):
        want = expected_answer(tool, call, answer)
        if "ok" not in result:
            wrong[i] = (clip(f"{call['arguments']} raised {result.get('error')!r}; expected {want!r}", 300), None)
        elif not same_answer(result["ok"], want):
            wrong[i] = (clip(f"{call['arguments']} gave {result['ok']!r}; expected {want!r}", 300), result["ok"])
    if cases and len(wrong) == len(cases):
        return f"no call answered right, such as: {wrong[0][0]}", {}
    return None, wrong


def validation_calls(tool: ScaledTool, cases: list[tuple[dict, str]]) -> list[dict[str, Any]]:
    return [c["arguments"] for c, _ in cases] + _probes(tool)


def llm_source(tool: ScaledTool, cases: list[tuple[dict, str]], llm) -> str | None:
    examples = "\n".join(f"{json.dumps(c['arguments'])} -> {expected_answer(tool, c, a)!r}" for c, a in cases[:12])
    prompt = CODE_PROMPT.format(name=tool.doc.name, doc=tool.doc.model_dump_json(), examples=examples)

    def defines(code: str) -> None:
        if f"def {tool.doc.name}(" not in code:
            raise ValueError(f"the code does not define {tool.doc.name}(...)")

    return llm.ask_json(tool.doc.name, prompt, {}, defines, raw=True)


Outcome = tuple[ScaledTool, str | None, str | None, dict[int, tuple[str, str | None]]]


def _known_answers(tools: list[ScaledTool], facts: dict[str, list[FactRow]]) -> dict[tuple[str, str], list[str]]:
    """(tool, a fact's arguments) -> every answer the facts of the tool's kinds give them: a tool that answers a
    call with one of these gives a fact of the data, another task's where two disagree."""
    known: dict[tuple[str, str], list[str]] = {}
    for tool in tools:
        for kind in tool.impl.kinds:
            for row in facts.get(kind, []):
                known.setdefault((tool.doc.name, _row_key(row.arguments)), []).append(row.answer)
    return known


def _unshaped(tool: ScaledTool, gave: str | None) -> str | None:
    """A tool's answer less its shape (a list-taking tool answers {name: answer})."""
    if gave is None or tool.impl.key_shape != "list":
        return gave
    try:
        values = list(json.loads(gave).values())
    except (json.JSONDecodeError, AttributeError):
        return gave
    return str(values[0]) if len(values) == 1 else gave


def _case_key(call: dict[str, Any], answer: str) -> str:
    return json.dumps([call, _norm(answer)], sort_keys=True, ensure_ascii=False)


def run(spec, ws: Workspace, llm_for) -> dict[str, Any]:
    tools = ws.read_rows(SCALED_TOOLS_FILE, ScaledTool, "scale")
    tasks = ws.read_rows(TASKS_FILE, BuiltTask, "scale")
    facts = read_facts(ws)
    limits = SandboxLimits(timeout_s=20.0, max_output_chars=10_000_000, isolation=spec.deploy.isolation)
    Sandbox(limits).close()  # the sandbox is usable here, or one line saying why not, before any work
    cases: dict[str, list[tuple[dict, str]]] = {t.doc.name: [] for t in tools}
    case_of: dict[str, int] = {}  # a call and its answer -> its index in its tool's cases
    for task in tasks:
        for sub, call in zip(task.subproblems, task.calls, strict=True):
            key = _case_key(call, sub.answer)
            if key not in case_of:
                case_of[key] = len(cases[call["name"]])
                cases[call["name"]].append((call, sub.answer))
    llm = llm_for("deploy") if spec.deploy.method == "llm" else None
    out = ws.path(DEPLOY_DIR)
    (out / "tools").mkdir(parents=True, exist_ok=True)
    ws.path(MANIFEST).unlink(missing_ok=True)  # first: a deploy killed past here is not taken as up to date
    for old in (out / "tools").glob("*.py"):
        if ".by-hand." not in old.name:  # a tool file edited by hand, set aside by `--stage deploy`: the user's
            old.unlink()
    (out / "runtime.py").write_text(RUNTIME.read_text(encoding="utf-8"), encoding="utf-8")

    def source_of(tool: ScaledTool) -> tuple[str | None, str | None]:
        name = tool.doc.name
        if not name.isidentifier() or keyword.iskeyword(name):
            return None, f"{name!r} is not a Python function name"
        source = template_source(tool, facts) if llm is None else llm_source(tool, cases[name], llm)
        return source, None if source is not None else "the model wrote no acceptable code (see llm/deploy.jsonl)"

    def deploy_batch(batch: list[ScaledTool]) -> list[Outcome]:
        sources = [source_of(tool) for tool in batch]
        ready = [(tool, source) for tool, (source, _) in zip(batch, sources, strict=True) if source is not None]
        results: dict[str, list | str] = {}
        if llm is None and len(ready) > 1:  # the builder's own code: one sandbox for the batch
            items = [(source, t.doc.name, validation_calls(t, cases[t.doc.name])) for t, source in ready]
            try:
                results = dict(zip((t.doc.name for t, _ in ready), run_batch(items, limits), strict=True))
            except ValueError as exc:
                log.info("deploy: a batch of %d tools failed as a whole (%s); one by one", len(ready), exc)
        outcomes: list[Outcome] = []
        for tool, (source, reason) in zip(batch, sources, strict=True):
            got = results.get(tool.doc.name)
            if source is None:
                outcomes.append((tool, None, reason, {}))
            elif isinstance(got, str):
                outcomes.append((tool, source, got, {}))
            else:
                outcomes.append((tool, source, *validate(tool, source, cases[tool.doc.name], limits, got)))
        return outcomes

    size = BATCH_TOOLS if llm is None else 1
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            batches = pool.map(deploy_batch, [tools[i : i + size] for i in range(0, len(tools), size)])
            outcomes = [outcome for batch in batches for outcome in batch]
    finally:
        if llm is not None:
            llm.close()
    deployed, dropped = [], []
    wrong: dict[str, tuple[str, str | None]] = {}  # case key -> why the deployed tool does not answer it
    for tool, source, reason, failed in outcomes:
        for i, why in failed.items():
            call, answer = cases[tool.doc.name][i]
            wrong[_case_key(call, answer)] = why
        if reason is not None:
            dropped.append({"tool": tool.doc.name, "reason": reason})
            log.warning("deploy: dropped %s: %s", tool.doc.name, reason)
            continue
        file = f"tools/{tool.doc.name}.py"
        (out / file).write_text(source or "", encoding="utf-8")
        deployed.append(Deployed(name=tool.doc.name, file=file, doc=tool.doc))
    names = {d.name for d in deployed}
    why = {d["tool"]: d["reason"] for d in dropped}
    by_name = {t.doc.name: t for t in tools}
    known = _known_answers(tools, facts)
    kept, overridden = [], 0
    for task in tasks:  # every task lost is named with the tool or the call it needed and why that failed
        pairs = list(zip(task.subproblems, task.calls, strict=True))
        lost = next((c["name"] for c in task.calls if c["name"] not in names), None)
        overrides, bad = [], None
        for sub, call in pairs:
            if (k := _case_key(call, sub.answer)) not in wrong:
                continue
            reason, gave = wrong[k]
            facts_given = known.get((call["name"], _row_key(sub.arguments)), ())
            gave = _unshaped(by_name[call["name"]], gave)
            if gave is not None and any(same_answer(gave, a) for a in facts_given):
                answer = expected_answer(by_name[call["name"]], call, sub.answer)  # another task's fact: keep ours
                overrides.append({"name": call["name"], "arguments": call["arguments"], "answer": answer})
            else:
                bad = bad or reason
        if lost is not None:
            dropped.append({"task": task.id, "reason": f"needs tool {lost}, dropped: {clip(why.get(lost, '?'), 160)}"})
        elif bad is not None:
            dropped.append({"task": task.id, "reason": f"a call it needs is answered wrong: {clip(bad, 200)}"})
        else:
            kept.append(task.model_copy(update={"overrides": overrides}) if overrides else task)
            overridden += bool(overrides)
    kept = [t.model_copy(update={"tools": [n for n in t.tools if n in names]}) for t in kept]
    ws.write_rows(f"{DEPLOY_DIR}/tools.jsonl", deployed)
    ws.write_rows(f"{DEPLOY_DIR}/tasks.jsonl", kept)
    report = {
        "needs": rollout_needs(kept),
        "tools_validated": len(deployed),
        "tools_dropped": sum("tool" in d for d in dropped),
        "calls_answered_wrong": len(wrong),
        "tasks_with_own_facts": overridden,
        "dropped": dropped,
        "tasks": len(kept),
        "tasks_dropped": len(tasks) - len(kept),
        "noise": spec.scale.noise,
        "isolation": spec.deploy.isolation,
        "method": spec.deploy.method,
    }
    if llm is not None:
        report["llm"] = llm.stats.report()
    ws.write_json(MANIFEST, report)
    return {k: v for k, v in report.items() if k != "dropped"} | {"dropped": dropped[:20]}
