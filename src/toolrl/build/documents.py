"""Stage b, document generation: one tool document (an OpenAI function schema) per sub-problem, one-to-one.

Programmatic sources write each document from a kind's entity and column, in one of several wordings drawn per
sub-problem (as different writers would: the duplicates are what stage c merges). A `tasks` source asks the
LLM, whose document must name the sub-problem's arguments as its parameters.

Writes `2_documents.jsonl` (DocRow rows).
"""

from __future__ import annotations

import random
import re
from typing import Any

from toolrl.build.artifacts import BuiltTask, DocRow, SubProblem, ToolDoc, Workspace
from toolrl.build.decompose import SCENARIOS_FILE

DOCUMENTS_FILE = "2_documents.jsonl"

NAMES = ("get_{e}_{c}", "lookup_{c}_of_{e}", "find_{e}_{c}", "{e}_{c}_lookup")
DESCRIPTIONS = (
    "Returns the {c} of a {e}.",
    "Look up the {c} of the given {e}.",
    "Find a {e}'s {c}.",
    "Gives the {c} for a {e}, by name.",
)

DOC_SCHEMA = {
    "type": "object",
    "required": ["name", "description", "parameters"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
        "description": {"type": "string", "minLength": 3},
        "parameters": {
            "type": "object",
            "required": ["type", "properties"],
            "properties": {
                "type": {"const": "object"},
                "properties": {"type": "object", "minProperties": 1},
                "required": {"type": "array", "items": {"type": "string"}},
            },
        },
        "returns": {"type": "string"},
    },
}

DOC_PROMPT = """Write the document of a tool that answers this sub-problem, as an OpenAI function schema.
Sub-problem: {question}
Kind of function: {kind}
Its call's arguments: {arguments}
The parameters must be exactly these argument names, each with a type and a description.
Reply with only a JSON object: {{"name": ..., "description": ..., "parameters": {{"type": "object",
"properties": {{...}}, "required": [...]}}, "returns": "what it returns"}}."""


def _identifier(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "value"


def function_name(name: str, limit: int = 64) -> str:
    """A function name within OpenAI's 64 characters (and a file name's): a longer one keeps its start and a
    hash of the whole, so two long names stay apart."""
    if len(name) <= limit:
        return name
    import hashlib

    return f"{name[: limit - 9].rstrip('_')}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


def programmatic_doc(sub: SubProblem, rng: random.Random, answers_numeric: bool) -> ToolDoc:
    entity, dot, column = sub.kind.partition(".")
    if not dot:  # a kind named without its entity ("population"): the entity is what the call names
        entity, column = next(iter(sub.arguments), "item"), sub.kind
    words = {"e": _identifier(entity), "c": _identifier(column)}
    text = {"e": entity.replace("_", " "), "c": column.replace("_", " ")}
    single = len(sub.arguments) == 1  # the entity the kind is about, whatever the argument is called
    properties = {
        name: {"type": _json_type(value), "description": f"The name of the {text['e'] if single else name}."}
        for name, value in sub.arguments.items()
    }
    return ToolDoc(
        name=function_name(rng.choice(NAMES).format(**words)),
        description=rng.choice(DESCRIPTIONS).format(**text),
        parameters={"type": "object", "properties": properties, "required": list(sub.arguments)},
        returns="number" if answers_numeric else "string",
    )


def _check_doc(sub: SubProblem):
    def check(value: dict[str, Any]) -> None:
        names = set(value["parameters"]["properties"])
        if names != set(sub.arguments):
            raise ValueError(f"the parameters must be exactly {sorted(sub.arguments)}, got {sorted(names)}")

    return check


def run(spec, ws: Workspace, llm_for) -> dict[str, Any]:
    tasks = ws.read_rows(SCENARIOS_FILE, BuiltTask, "decompose")
    rows: list[DocRow] = []
    report: dict[str, Any] = {}
    if spec.source == "tasks":
        llm = llm_for("documents")
        try:
            for task in tasks:
                for sub in task.subproblems:
                    prompt = DOC_PROMPT.format(question=sub.question, kind=sub.kind, arguments=sub.arguments)
                    value = llm.ask_json(f"{task.id}/{sub.id}", prompt, DOC_SCHEMA, _check_doc(sub))
                    if value is not None:
                        value["parameters"].setdefault("required", list(sub.arguments))
                        rows.append(DocRow(task=task.id, subproblem=sub.id, kind=sub.kind, doc=ToolDoc(**value)))
        finally:
            llm.close()
        report["llm"] = llm.stats.report()
    else:
        from toolrl.build.decompose import read_facts

        numeric = {
            kind: all(re.fullmatch(r"-?\d+(\.\d+)?", r.answer) for r in rows_) for kind, rows_ in read_facts(ws).items()
        }
        for task in tasks:
            rng = random.Random(f"{spec.seed}:doc:{task.id}")
            for sub in task.subproblems:
                doc = programmatic_doc(sub, rng, numeric.get(sub.kind, False))
                rows.append(DocRow(task=task.id, subproblem=sub.id, kind=sub.kind, doc=doc))
    ws.write_rows(DOCUMENTS_FILE, rows)
    subproblems = sum(len(t.subproblems) for t in tasks)
    return {"documents": len(rows), "subproblems": subproblems, "dropped": subproblems - len(rows), **report}
