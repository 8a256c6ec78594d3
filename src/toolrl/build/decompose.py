"""Stage a, scenario decomposition: each task becomes sub-problems with a dependency graph and one of the four
scenarios. Programmatic sources (synthetic, table) draw tasks already decomposed, with exact answers; a `tasks`
source asks the LLM to decompose each task text, and the scenario is read off the graph it returns.

Writes `1_scenarios.jsonl` (BuiltTask rows) and `facts.json` (kind -> the rows of the function answering it).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from toolrl.build.artifacts import BuiltTask, FactRow, SubProblem, Workspace
from toolrl.build.spec import BuildSpec
from toolrl.build.world import facts, load_tables, sample_tasks, synthetic_world
from toolrl.errors import DataError
from toolrl.text import clip, first_line

log = logging.getLogger(__name__)

SCENARIOS_FILE = "1_scenarios.jsonl"
FACTS_FILE = "facts.json"

DECOMPOSE_SCHEMA = {
    "type": "object",
    "required": ["subproblems"],
    "properties": {
        "subproblems": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "question", "kind", "arguments", "answer"],
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "question": {"type": "string", "minLength": 1},
                    "kind": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_. ]*$"},
                    "arguments": {"type": "object", "minProperties": 1},
                    "answer": {"type": ["string", "number", "array"], "items": {"type": ["string", "number"]}},
                    "depends_on": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    },
}

DECOMPOSE_PROMPT = """Decompose the task below into sub-problems, each answered by one call of a tool.
A sub-problem that needs the answer of an earlier one lists that one's id in depends_on and uses that answer
as an argument. Give each sub-problem: id, question, kind (the function it needs, such as country.capital),
arguments (the call's arguments, a JSON object), answer (the call's result; a list when it is several values),
depends_on. Use at most {limit} sub-problems.
Reply with only a JSON object: {{"subproblems": [...]}}.

Task: {question}
{answer}"""


def scenario_of(subproblems: Sequence[SubProblem]) -> str:
    """The FTRL scenario of a dependency graph, as the paper defines the four: one sub-problem (single_hop);
    several with no dependency (parallel_single_hop); one chain, each sub-problem needing the one before it and
    feeding only the next (multi_hop); anything else with a dependency (parallel_multi_hop): several groups with
    a chain among them, a fan-out (one answer, a list, feeding several sub-problems that run side by side) or a
    fan-in (several answers combined by one sub-problem)."""
    if len(subproblems) == 1:
        return "single_hop"
    if not any(s.depends_on for s in subproblems):
        return "parallel_single_hop"
    dependents: dict[str, int] = {s.id: 0 for s in subproblems}
    for s in subproblems:
        for d in s.depends_on:
            dependents[d] = dependents.get(d, 0) + 1
    chain = all(len(s.depends_on) == 1 for s in subproblems[1:]) and not subproblems[0].depends_on
    chain = chain and all(count <= 1 for count in dependents.values())
    return "multi_hop" if chain else "parallel_multi_hop"


def check_graph(subproblems: Sequence[SubProblem]) -> None:
    """Ids unique; a dependency names an earlier sub-problem (so the graph has no cycle)."""
    seen: set[str] = set()
    for s in subproblems:
        if s.id in seen:
            raise ValueError(f"sub-problem id {s.id!r} appears twice")
        for d in s.depends_on:
            if d not in seen:
                raise ValueError(f"sub-problem {s.id!r} depends on {d!r}, which is not an earlier sub-problem")
        seen.add(s.id)


def _split(question: str, spec: BuildSpec) -> str:
    share = spec.test_per_scenario / (spec.test_per_scenario + spec.train_per_scenario)
    digest = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 16**8
    return "test" if digest < share else "train"


def _records(spec: BuildSpec):
    """(row number, record, question) of the tasks file (tasks.path), with one-line errors."""
    from toolrl.build.formats import FORMATS, resolve

    assert spec.tasks is not None
    path = resolve(spec.tasks.path)
    if not path.is_file():
        raise DataError(f"{path}: tasks file not found (tasks.path)")
    for number, record in FORMATS.lookup(spec.tasks.format)(path):
        question = record.get("question") if isinstance(record, dict) else None
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{path}: row {number}, field question: a non-empty string is required")
        yield path, number, record, question


def _text(answer: Any) -> str:
    """A sub-problem's answer as its tool returns it: a list of values is one text, comma-separated."""
    return ", ".join(str(a) for a in answer) if isinstance(answer, list) else str(answer)


def _subproblems(items: list[dict[str, Any]]) -> list[SubProblem]:
    subs = [SubProblem.model_validate({**s, "answer": _text(s["answer"])}) for s in items]
    check_graph(subs)
    return subs


def final_answers(record: dict[str, Any], subs: list[SubProblem]) -> list[str]:
    """What the reply must contain: the task's own `answer` when given (a list: every value of it; the answer of a
    comparison is none of its sub-problems' answers), else the answer of each sub-problem nothing depends on."""
    given = record.get("answer")
    if isinstance(given, list) and given:
        return [str(a) for a in given]
    if given is not None and str(given).strip():
        return [str(given)]
    needed = {d for s in subs for d in s.depends_on}
    return [s.answer for s in subs if s.id not in needed]


def _task(spec: BuildSpec, number: int, record: dict[str, Any], question: str, subs: list[SubProblem]) -> BuiltTask:
    split = record.get("split") if record.get("split") in ("train", "test") else _split(question, spec)
    return BuiltTask(
        id=str(record.get("id") or f"task-{number}"),
        split=split,
        scenario=scenario_of(subs),
        question=question,
        answers=final_answers(record, subs),
        subproblems=subs,
    )


def _facts(tasks: list[BuiltTask]) -> dict[str, list[FactRow]]:
    table: dict[str, list[FactRow]] = {}
    for task in tasks:
        for s in task.subproblems:
            table.setdefault(s.kind, []).append(FactRow(arguments=s.arguments, answer=s.answer))
    return table


def _from_llm(spec: BuildSpec, ws: Workspace, llm) -> tuple[list[BuiltTask], dict[str, list[FactRow]], dict]:
    tasks, rejected = [], 0
    assert spec.tasks is not None
    limit = spec.tasks.max_subproblems

    def valid(value: dict[str, Any]) -> None:
        if len(value["subproblems"]) > limit:
            raise ValueError(
                f"{len(value['subproblems'])} sub-problems, more than tasks.max_subproblems ({limit}): "
                "decompose into fewer, or raise tasks.max_subproblems in the spec"
            )
        _subproblems(value["subproblems"])

    for _, number, record, question in _records(spec):
        hint = f"Its final answer: {_text(record['answer'])}" if record.get("answer") not in (None, "", []) else ""
        prompt = DECOMPOSE_PROMPT.format(question=question, answer=hint, limit=limit)
        value = llm.ask_json(f"row {number}", prompt, DECOMPOSE_SCHEMA, valid)
        if value is None:
            rejected += 1
            continue
        tasks.append(_task(spec, number, record, question, _subproblems(value["subproblems"])))
    return tasks, _facts(tasks), {"rejected": rejected}


def _from_decompositions(spec: BuildSpec) -> tuple[list[BuiltTask], dict[str, list[FactRow]], dict]:
    """Tasks whose sub-problems the file gives (a published decomposition): read and checked, no LLM."""
    import jsonschema

    tasks = []
    for path, number, record, question in _records(spec):
        where = f"{path}: row {number}"
        try:
            jsonschema.validate({"subproblems": record.get("subproblems")}, DECOMPOSE_SCHEMA)
            subs = _subproblems(record["subproblems"])
        except jsonschema.ValidationError as exc:
            at = "/".join(str(p) for p in exc.absolute_path) or "subproblems"
            raise DataError(f"{where}, field {at}: {first_line(exc.message)} (docs/environments.md)") from None
        except ValueError as exc:
            raise DataError(f"{where}, field subproblems: {first_line(exc)}") from None
        tasks.append(_task(spec, number, record, question, subs))
    return tasks, _facts(tasks), {"given": len(tasks)}


def run(spec: BuildSpec, ws: Workspace, llm_for) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if spec.source == "decompositions":
        tasks, table, extra = _from_decompositions(spec)
    elif spec.source == "tasks":
        llm = llm_for("decompose")
        try:
            tasks, table, extra = _from_llm(spec, ws, llm)
        finally:
            llm.close()
        extra["llm"] = llm.stats.report()
    else:
        tables = synthetic_world(spec.seed, spec.synthetic) if spec.source == "synthetic" else load_tables(spec.tables)
        ws.write_json("tables.json", tables)
        tasks, table = sample_tasks(tables, spec), facts(tables)
    if not tasks:
        raise DataError("decompose: no task was decomposed; see llm/decompose.jsonl for the model's replies")
    ws.write_rows(SCENARIOS_FILE, tasks)
    ws.write_json(FACTS_FILE, {kind: [row.model_dump() for row in rows] for kind, rows in table.items()})
    by_scenario: dict[str, int] = {}
    for task in tasks:
        by_scenario[task.scenario] = by_scenario.get(task.scenario, 0) + 1
    found = conflicts(tasks)
    for conflict in found:
        values = " vs ".join(f"{v['answer']!r} ({v['from']})" for v in conflict["values"])  # type: ignore[union-attr]
        log.warning("decompose: facts disagree on %s %s: %s; each task keeps its own", conflict["kind"],
                    conflict["key"], clip(values, 300))  # fmt: skip
    report = {"tasks": len(tasks), "by_scenario": by_scenario, "kinds": len(table), **extra}
    return report | {"fact_conflicts": len(found), "conflicts": found}


def conflicts(tasks: list[BuiltTask]) -> list[dict[str, Any]]:
    """Facts that truly disagree (answers.same_answer), each with both values and the sub-problems they came
    from: `8848.86` and `8,848.86 m` are one fact; `Anthony Russo and Joe Russo` and `The Russo brothers` two."""
    from toolrl.build.answers import fact_conflicts
    from toolrl.build.runtime import _row_key

    rows = ((s.kind, _row_key(s.arguments), s.answer, f"{t.id}/{s.id}") for t in tasks for s in t.subproblems)
    return fact_conflicts(rows)


def read_facts(ws: Workspace) -> dict[str, list[FactRow]]:
    data = ws.read_json(FACTS_FILE)
    if not isinstance(data, dict):
        raise DataError(f"{ws.path(FACTS_FILE)}: not found or not a mapping; run --stage decompose first")
    try:
        return {kind: [FactRow.model_validate(r) for r in rows] for kind, rows in data.items()}
    except Exception as exc:
        raise DataError(f"{ws.path(FACTS_FILE)}: a fact row does not parse ({exc})") from None
