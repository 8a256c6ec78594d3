"""Stage d, complexity scaling: programmatic transformations of the merged tools and the tasks, each with its
knob in `scale` (0 turns it off), all seeded by the spec's seed:

- functional generalization: tools that take the same entity merge into one `ENTITY_info` tool with a
  `field` enum, so one tool serves several sub-problem kinds;
- parameter expansion: optional parameters that change nothing (the model must not be thrown by them);
- type generalization: a tool's entity parameter becomes an enum (small domains), a nested object
  (`{"city": {"name": ...}}`) or a list of names (one call answers several, a JSON object back), or a numeric
  tool gets a required `unit`;
- toolset expansion: each task offers distractor tools besides the ones it needs;
- multi-turn (beyond the paper): a task's sub-problems arrive as successive user requests.

The expected call of every sub-problem follows its tool through the transformations.
Writes `4_tools.jsonl` (ScaledTool rows) and `4_tasks.jsonl` (BuiltTask rows with calls, tools, requests).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from itertools import combinations
from typing import Any

from toolrl.build.artifacts import BuiltTask, FactRow, Impl, MergedTool, ScaledTool, ToolDoc, Workspace
from toolrl.build.decompose import SCENARIOS_FILE, read_facts
from toolrl.build.integrate import MAPPING_FILE, TOOLS_FILE

SCALED_TOOLS_FILE = "4_tools.jsonl"
TASKS_FILE = "4_tasks.jsonl"
UNITS = {"units": 1.0, "thousands": 1000.0}
ENUM_MAX = 12
OPTIONAL_POOL = (
    ("language", {"type": "string", "enum": ["en"], "description": "Language of the answer (only en)."}),
    ("verbose", {"type": "boolean", "description": "Ask for a longer answer (the service answers the same)."}),
    ("request_id", {"type": "string", "description": "Any id of your own, for your records; changes nothing."}),
)


def _column(kind: str) -> str:
    return kind.partition(".")[2] or kind


def _rows(impl_kinds: list[str], facts: dict[str, list[FactRow]]) -> list[FactRow]:
    return [row for kind in impl_kinds for row in facts.get(kind, [])]


def _initial(tool: MergedTool) -> ScaledTool:
    properties = tool.doc.parameters.get("properties", {})
    key = next(iter(properties)) if len(properties) == 1 else ""
    return ScaledTool(doc=tool.doc, impl=Impl(kinds=tool.kinds, key=key))


def _subjects(tool: ScaledTool, facts: dict[str, list[FactRow]]) -> set[str]:
    return {str(row.arguments.get(tool.impl.key, "")).strip().lower() for row in _rows(tool.impl.kinds, facts)}


def subject_kind(tool: ScaledTool) -> str | None:
    """The kind of subject a tool's kinds name (`person` for `person.birthplace`), or None when they name none."""
    types = {kind.partition(".")[0] for kind in tool.impl.kinds if "." in kind}
    return next(iter(types)) if len(types) == 1 and all("." in k for k in tool.impl.kinds) else None


SAME_SUBJECTS = 0.5
"""Two tools whose kinds name no subject kind are over the same kind of subject when at least this share of the
smaller one's subjects are the other's too (the capital and the population of the same countries)."""


def subject_groups(tools: dict[str, ScaledTool], facts: dict[str, list[FactRow]]) -> list[tuple[str, list[str]]]:
    """Tools over the same kind of subject, by meaning, never by a shared parameter name alone: the subject kind
    their kinds name, or, where they name none, subjects they share (SAME_SUBJECTS). (label, tool names) each."""
    eligible = {}
    for name, tool in tools.items():
        prop = tool.doc.parameters["properties"].get(tool.impl.key, {}) if tool.impl.key else {}
        if tool.impl.key and prop.get("type") == "string":
            eligible[name] = tool
    typed: dict[tuple[str, str], list[str]] = {}
    untyped: list[str] = []
    for name, tool in sorted(eligible.items()):
        kind = subject_kind(tool)
        if kind is None:
            untyped.append(name)
        else:
            typed.setdefault((tool.impl.key, kind), []).append(name)
    groups = [(kind, names) for (_, kind), names in sorted(typed.items())]
    subjects = {name: _subjects(eligible[name], facts) for name in untyped}
    parent = {name: name for name in untyped}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    holders: dict[tuple[str, str], list[str]] = {}
    for name in untyped:
        for subject in subjects[name]:
            holders.setdefault((eligible[name].impl.key, subject), []).append(name)
    for names in holders.values():
        for a, b in combinations(names, 2):
            smaller = min(len(subjects[a]), len(subjects[b]))
            if root(a) != root(b) and len(subjects[a] & subjects[b]) >= SAME_SUBJECTS * smaller:
                parent[root(b)] = root(a)
    components: dict[str, list[str]] = {}
    for name in untyped:
        components.setdefault(root(name), []).append(name)
    groups += [(eligible[names[0]].impl.key, names) for names in components.values()]
    return [(label, names) for label, names in groups if len(names) >= 2]


def functional(
    tools: dict[str, ScaledTool], share: float, rng: random.Random, facts: dict[str, list[FactRow]], max_fields: int
) -> tuple[dict, dict[str, tuple]]:
    """Merge the tools of a share of the groups over one kind of subject (subject_groups) into `SUBJECT_info`
    with a `field` enum of at most `max_fields` values (a larger group makes several). Returns the tools and,
    per old tool name, (new name, field value)."""
    groups = subject_groups(tools, facts)
    chosen = sorted(rng.sample(range(len(groups)), int(share * len(groups) + 0.5)))
    moved: dict[str, tuple[str, str]] = {}
    for index in chosen:
        label, members = groups[index]
        for start in range(0, len(members), max_fields):
            _merge(tools, label, members[start : start + max_fields], moved)
    return tools, moved


def _merge(tools: dict[str, ScaledTool], label: str, names: list[str], moved: dict) -> None:
    key = tools[names[0]].impl.key
    fields: dict[str, list[str]] = {}
    for name in names:
        field = re.sub(r"[^a-z0-9]+", "_", _column(tools[name].impl.kinds[0]).lower()).strip("_")
        while field in fields and fields[field] != tools[name].impl.kinds:
            field += "_2"  # the same kinds (a function stage c left in two tools) share their field
        fields[field] = tools[name].impl.kinds
        moved[name] = field
    new = f"{re.sub(r'[^a-z0-9]+', '_', label.lower()).strip('_') or key}_info"
    base, n = new, 2
    while new in tools:
        new, n = f"{base}_{n}", n + 1
    words = ", ".join(f.replace("_", " ") for f in fields)
    doc = ToolDoc(
        name=new,
        description=f"Look up a fact about a {label.replace('_', ' ')}: its {words}.",
        parameters={
            "type": "object",
            "properties": {
                key: tools[names[0]].doc.parameters["properties"][key],
                "field": {"type": "string", "enum": list(fields), "description": "Which fact to return."},
            },
            "required": [key, "field"],
        },
    )
    kinds = [k for ks in fields.values() for k in ks]
    tools[new] = ScaledTool(doc=doc, impl=Impl(kinds=kinds, key=key, field="field", fields=fields))
    for name in names:
        moved[name] = (new, moved[name])
        del tools[name]


def expand_parameters(tool: ScaledTool, count: int, rng: random.Random) -> ScaledTool:
    properties = dict(tool.doc.parameters["properties"])
    added = []
    for name, schema in rng.sample(OPTIONAL_POOL, min(count, len(OPTIONAL_POOL))):
        if name not in properties:
            properties[name] = schema
            added.append(name)
    doc = tool.doc.model_copy(update={"parameters": {**tool.doc.parameters, "properties": properties}})
    return ScaledTool(doc=doc, impl=tool.impl.model_copy(update={"optional": tool.impl.optional + added}))


def _numeric_thousands(rows: list[FactRow]) -> bool:
    return bool(rows) and all(re.fullmatch(r"\d+", r.answer) and int(r.answer) % 1000 == 0 for r in rows)


def generalize_types(tool: ScaledTool, rows: list[FactRow], rng: random.Random) -> tuple[ScaledTool, str | None]:
    """One type change for a single-entity tool: a unit for numbers, an enum for small domains, else a nested
    object or a list. Returns the tool and the change made (None: none applies)."""
    key, impl = tool.impl.key, tool.impl
    if not key:
        return tool, None
    params = tool.doc.parameters
    properties, required = dict(params["properties"]), list(params.get("required", []))
    if not impl.field and _numeric_thousands(rows):
        properties["unit"] = {"type": "string", "enum": list(UNITS), "description": "Unit of the number returned."}
        change, update = "unit", {"unit": dict(UNITS)}
        required.append("unit")
    else:
        names = sorted({str(r.arguments.get(key)) for r in rows})
        if 0 < len(names) <= ENUM_MAX:
            properties[key] = {**properties[key], "enum": names}
            change = "enum"
        else:
            change = rng.choice(["nested", "list"])
            described = key.replace("_", " ")
            if change == "nested":
                properties[key] = {
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": f"The {described}'s name."}},
                    "required": ["name"],
                    "description": f"The {described}.",
                }
            else:
                properties[key] = {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": f"One or more {described} names; answers each.",
                }
        update = {"key_shape": change}
    doc = tool.doc.model_copy(update={"parameters": {**params, "properties": properties, "required": required}})
    return ScaledTool(doc=doc, impl=impl.model_copy(update=update)), change


def expected_call(tool: ScaledTool, arguments: dict[str, Any], field: str | None) -> dict[str, Any]:
    """The call that solves a sub-problem with these (original) arguments, in the tool's final shape."""
    impl = tool.impl
    if not impl.key:
        return {"name": tool.doc.name, "arguments": dict(arguments)}
    value = arguments.get(impl.key)
    shaped = {"nested": {"name": value}, "list": [value]}.get(impl.key_shape, value)
    args: dict[str, Any] = {impl.key: shaped}
    if impl.field and field:
        args[impl.field] = field
    if impl.unit:
        args["unit"] = "units"
    return {"name": tool.doc.name, "arguments": args}


def _requests(task: BuiltTask) -> tuple[list[str], list[list[str]]]:
    """One user request per sub-problem: a dependent one refers to the earlier answer as "that ENTITY"."""
    requests = []
    for sub in task.subproblems:
        entity, _, column = sub.kind.partition(".")
        if sub.depends_on and column:
            requests.append(f"And what is the {column} of that {entity}?")
        else:
            requests.append(sub.question)
    return requests, [[sub.answer] for sub in task.subproblems]


def run(spec, ws: Workspace, llm_for) -> dict[str, Any]:
    knobs = spec.scale
    tasks = ws.read_rows(SCENARIOS_FILE, BuiltTask, "decompose")
    merged = ws.read_rows(TOOLS_FILE, MergedTool, "integrate")
    facts = read_facts(ws)
    mapping = {(r["task"], r["subproblem"]): r["tool"] for r in ws.read_records(MAPPING_FILE, "integrate")}
    rng = random.Random(f"{spec.seed}:scale")
    tools = {t.doc.name: _initial(t) for t in merged}
    tools, moved = functional(tools, knobs.functional, rng, facts, knobs.max_fields)
    changes: Counter = Counter()
    for name in sorted(tools):
        tool = expand_parameters(tools[name], knobs.parameters, random.Random(f"{spec.seed}:params:{name}"))
        if rng.random() < knobs.types:
            tool, change = generalize_types(tool, _rows(tool.impl.kinds, facts), rng)
            changes[change] += change is not None
        tools[name] = tool
    out_tasks, dropped = [], []
    names = sorted(tools)
    for task in tasks:
        calls = []
        for sub in task.subproblems:
            old = mapping.get((task.id, sub.id))
            if old is None:
                reason = f"sub-problem {sub.id} has no tool: the documents stage made no document for it"
                dropped.append({"task": task.id, "reason": reason})
                break
            new, field = moved.get(old, (old, None))
            calls.append(expected_call(tools[new], sub.arguments, field))
        if len(calls) < len(task.subproblems):
            continue
        needed = list(dict.fromkeys(c["name"] for c in calls))
        task_rng = random.Random(f"{spec.seed}:task:{task.id}")
        others = [n for n in names if n not in needed]
        offered = needed + task_rng.sample(others, min(knobs.distractors, len(others)))
        task_rng.shuffle(offered)
        update: dict[str, Any] = {"calls": calls, "tools": offered}
        if len(task.subproblems) > 1 and task_rng.random() < knobs.multi_turn:
            requests, answers = _requests(task)
            update.update(requests=requests, request_answers=answers, question=requests[0])
        out_tasks.append(task.model_copy(update=update))
    ws.write_rows(SCALED_TOOLS_FILE, [tools[n] for n in names])
    ws.write_rows(TASKS_FILE, out_tasks)
    return {
        "tools": len(tools),
        "functional_tools": sum(1 for t in tools.values() if t.impl.field),
        "optional_parameters": sum(len(t.impl.optional) for t in tools.values()),
        "type_changes": dict(changes),
        "distractors_per_task": knobs.distractors,
        "multi_turn_tasks": sum(1 for t in out_tasks if t.requests),
        "tasks": len(out_tasks),
        "tasks_dropped": len(dropped),
        "dropped": dropped,
    }
