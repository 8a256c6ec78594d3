"""The builder's artifacts: typed rows written as JSON Lines in the output folder, one file per stage.

Every stage reads the artifact of the stage before and writes its own, so any stage can be re-run alone and
each step can be inspected. A row that does not parse is one line naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from toolrl.errors import DataError
from toolrl.files import read_jsonl
from toolrl.text import clip


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubProblem(Row):
    """One step of a task: a question a single tool call answers."""

    id: str
    question: str
    kind: str
    """What is asked (a relation such as `person.birthplace`); sub-problems of one kind share a function."""
    arguments: dict[str, Any]
    """The arguments that answer it (the entity named in full; for a dependent one, the earlier answer)."""
    answer: str
    depends_on: list[str] = []
    """Sub-problems whose answer this one needs as an argument."""


class BuiltTask(Row):
    id: str
    split: str
    scenario: str
    question: str
    answers: list[str]
    """The final answers the reply must contain (one per chain)."""
    subproblems: list[SubProblem]
    requests: list[str] = []
    """Multi-turn tasks: the user's successive messages (the first is `question`), one per sub-problem group."""
    request_answers: list[list[str]] = []
    """What the reply to each request must contain."""
    tools: list[str] = []
    """The tools this task offers (set by scaling: the ones it needs and distractors)."""
    calls: list[dict[str, Any]] = []
    """Per sub-problem (same order), the call that solves it: tool name and the arguments that must match."""
    overrides: list[dict[str, Any]] = []
    """Calls this task answers with its own fact where the tool's table holds another task's (a true conflict
    of the data: `{"name", "arguments", "answer"}`)."""


class ToolDoc(Row):
    """An OpenAI function schema (name, description, parameters), plus what it returns."""

    name: str
    description: str
    parameters: dict[str, Any]
    returns: str = "string"


class DocRow(Row):
    """Stage b: the document of one sub-problem (one-to-one)."""

    task: str
    subproblem: str
    kind: str
    doc: ToolDoc


class FactRow(Row):
    """A row of a function's table: the arguments and the answer."""

    arguments: dict[str, Any]
    answer: str


class MergedTool(Row):
    """Stage c: a tool that serves the documents it merged; `kinds` are the sub-problem kinds it answers."""

    doc: ToolDoc
    members: list[str]
    """`task/subproblem` ids of the documents merged into it."""
    kinds: list[str]


class Impl(Row):
    """How a deployed function computes: a table per kind, and what the scaling transformations changed."""

    kinds: list[str]
    key: str
    """The argument that names the entity (the key of the tables)."""
    field: str | None = None
    """Functional generalization: the argument choosing the kind (an enum of `fields`)."""
    fields: dict[str, list[str]] = {}
    """field value -> the kinds whose tables answer it."""
    key_shape: str = "string"
    """string, enum, nested ({key: {"name": X}}) or list (several names at once; a JSON object back)."""
    unit: dict[str, float] = {}
    """A unit argument `unit` for numeric answers: unit name -> divisor."""
    optional: list[str] = []
    """Parameters that change nothing (parameter expansion)."""


class ScaledTool(Row):
    doc: ToolDoc
    impl: Impl


class Deployed(Row):
    name: str
    file: str
    doc: ToolDoc


def levels(subproblems: list[SubProblem]) -> dict[str, int]:
    """Each sub-problem's round (by id): one past the latest of those it depends on (they come first)."""
    level: dict[str, int] = {}
    for sub in subproblems:
        level[sub.id] = 1 + max((level.get(d, 0) for d in sub.depends_on), default=-1)
    return level


def rounds(task: BuiltTask) -> list[list[int]]:
    """The task's sub-problems (indices) by round: each after every sub-problem it depends on, as a model calls
    them (a list first, then one call per item side by side)."""
    level = levels(task.subproblems)
    out: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for i, sub in enumerate(task.subproblems):
        out[level[sub.id]].append(i)
    return out


Model = TypeVar("Model", bound=Row)


def content_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Workspace:
    """The output folder: one artifact per stage, the LLM exchanges (`llm/`), and `build.json` (per stage:
    when it ran, its input's hash, its counts)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def write_rows(self, name: str, rows: Iterable[BaseModel | dict[str, Any]]) -> Path:
        """Atomically (a temporary file renamed), so a kill never leaves half an artifact."""
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                data = row.model_dump(exclude_defaults=False) if isinstance(row, BaseModel) else row
                f.write(json.dumps(data, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        return path

    def read_rows(self, name: str, model: type[Model], stage: str) -> list[Model]:
        path, rows = self.path(name), []
        for number, record in enumerate(self.read_records(name, stage), 1):
            try:
                rows.append(model.model_validate(record))
            except ValidationError as exc:
                error = exc.errors()[0]
                field = ".".join(str(p) for p in error["loc"]) or "(row)"
                raise DataError(clip(f"{path}: row {number}, field {field}: {error['msg']}", 300)) from None
        return rows

    def read_records(self, name: str, stage: str) -> list[dict[str, Any]]:
        path = self.path(name)
        if not path.is_file():
            raise DataError(f"{path}: not found; run the stage before it first (toolrl env build --stage {stage})")
        return read_jsonl(path, DataError)

    def write_json(self, name: str, value: Any) -> Path:
        path = self.path(name)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.path(name)
        if not path.is_file():
            return default
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None

    def record(self, stage: str, report: dict[str, Any]) -> None:
        manifest = self.read_json("build.json", {})
        manifest[stage] = report
        self.write_json("build.json", manifest)


def check_field(where: str, row: int, field: str, ok: bool, what: str) -> None:
    if not ok:
        raise DataError(f"{where}: row {row}, field {field}: {what}")


__all__ = [
    "BuiltTask",
    "Deployed",
    "DocRow",
    "FactRow",
    "Impl",
    "MergedTool",
    "ScaledTool",
    "SubProblem",
    "ToolDoc",
    "Workspace",
    "check_field",
    "content_hash",
    "rounds",
]
