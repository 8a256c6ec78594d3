"""The `built` environment: what `toolrl env build` deployed (`env.options.path: DIR`), as an ordinary
environment.

Its tools are the deployed functions, each call run in the code sandbox (their code is generated, so it never
runs in this process). Each task offers the tools it needs and the distractors scaling gave it. The reward is
FTRL's 2q/(p+1) (plus 1/(t+1) for a correct final answer) with sub-problem accounting: a call solves a
sub-problem when it went through and its arguments match the sub-problem's expected ones (a list argument
containing the expected name counts); Solve-P/R/F1 are logged and `toolrl eval` reports them per scenario.

Multi-turn tasks (scaling's `multi_turn`) ask their sub-problems one request at a time. Noise (`scale.noise`,
or `env.options.noise`) makes a call fail, time out or return another entity's record at that rate, decided
before the call; the model sees it, and it is counted in `injected_faults`, not as the model's mistake (an
injected result never counts as a call p nor solves anything).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from toolrl.build.artifacts import BuiltTask, Deployed, Workspace, rounds
from toolrl.build.needs import task_needs
from toolrl.envs.base import Environment, EnvOptions, Episode, StepResult, Task, register_env
from toolrl.envs.built.notes import NOTE_STYLES, chain_plan, fact, note_tokens, notes, plan_of
from toolrl.envs.built.scoring import (
    _norm,
    answer_correct,
    arguments_match,
    contains_all,
    correct,
    counts,
    evidence,
    injected_faults,
    reference_requests,
)
from toolrl.envs.code.sandbox import SandboxLimits
from toolrl.envs.reference import ReferenceRequest
from toolrl.envs.tasks import interleaved
from toolrl.errors import ConfigError, DataError
from toolrl.rewards.ftrl import ftrl_criteria
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import Tool, json_schema_checker

SYSTEM = (
    "You answer questions about a world you do not know, with the tools. Look every fact up with a tool call; "
    "when a question needs an earlier answer, call the next tool with it. When you have the answer, reply with "
    "<answer>ANSWER</answer> (several answers separated by semicolons)."
)
EXAMPLES = (
    (
        "What is the height of the mountain Orvel Peak?",
        [("get_mountain_height", {"mountain": "Orvel Peak"}, "2310")],
        "2310",
        ["height"],
    ),
    (
        "What is the colour of the favourite fruit of the person Ama Lee?",
        [("get_person_fruit", {"person": "Ama Lee"}, "mango"), ("fruit_colour", {"fruit": "mango"}, "orange")],
        "orange",
        ["favourite fruit", "colour"],
    ),
)
"""In-context exchanges with tools of no task: one call, then a chain of two (with the facts each call looks up,
for the notes). Measured on the default model: with the chain alone, greedy decoding never calls a tool."""


class BuiltOptions(EnvOptions):
    path: str
    """The folder `toolrl env build --out DIR` wrote (its deploy/ stage must have run)."""
    isolation: str | None = None
    """The sandbox for the tools; default: the one the build validated them in."""
    noise: float | None = Field(None, ge=0, le=1)
    """Injected faults per call; default: the build's scale.noise."""
    timeout_s: float = Field(10.0, gt=0)
    budget: Literal["task", "run"] = "task"
    """task: each trajectory's turns and tokens are its task's reference needs times `budget_slack` (a one-call
    task does not get the tokens of the widest fan-out), never past the run's limits; run: the run's limits."""
    budget_slack: float = Field(1.5, ge=1.0)
    """How much more than its reference a trajectory may spend (tokens; one more turn than the reference's)."""
    examples: Literal["task_tools", "generic"] = "task_tools"
    """In-context exchanges: task_tools: one call of the task's first tool on a train task's entity, then a
    generic chain of two calls; generic: tools of no task only (one call, then the chain)."""
    countdown: Literal["steps", "facts"] | None = None
    """Every turn opens with a note of what the question still needs (envs/built/notes.py): `steps` (or true):
    `Steps left: N`, the rounds of calls still needed (0: the answer); `facts`: `Left: population of the
    headquarters of the employer`, the facts still to look up in the question's words (`nothing`: the answer).
    In the instructions, the in-context exchanges and the reference (what a warm start imitates). It makes the
    choice after a tool result (call again or answer) a note the model carries from turn to turn, rather than a
    reading of the question's structure at every turn."""

    @field_validator("countdown", mode="before")
    @classmethod
    def _style(cls, value: Any) -> Any:
        if value is True or value is False:  # true: the first style, `steps`; false: no notes
            return "steps" if value else None
        if value is not None and value not in NOTE_STYLES:
            raise ValueError(f"must be true, false or one of {', '.join(NOTE_STYLES)}, got {value!r}")
        return value


class BuiltEpisode(Episode):
    def __init__(self, task: Task, messages, env: BuiltEnv, rng: random.Random):
        super().__init__(task, messages, offered=task.meta["tools"])
        self.env, self.rng, self.noise = env, rng, env.noise
        self.injected: set[int] = set()
        self.request = 0
        self.solved: list[bool] = []

    def _fault(self, call: ToolCall) -> ToolResult | None:
        if not self.noise or self.rng.random() >= self.noise:
            return None
        kind = self.rng.choice(["error", "timeout", "distractor"])
        others = [n for n in self.env.names.get(call.name, []) if _norm(n) not in _norm(call.arguments)]
        if kind == "distractor" and others:
            other = self.rng.choice(others)
            content = self.env.call_quietly(call.name, call.arguments, other)
            if content is not None:
                return ToolResult(call, f"(a record for {other}, not the one asked for) {content}", "ok")
        message = {
            "timeout": f"error: {call.name} timed out (the service is slow); try the call again",
            "error": f"error: {call.name} failed (service unavailable, 503); try the call again",
        }.get(kind, f"error: {call.name} failed (service unavailable, 503); try the call again")
        return ToolResult(call, message, "tool_error")

    def _own_fact(self, call: ToolCall) -> ToolResult | None:
        """This task's own answer to a call where the data disagree (the build's per-task overrides)."""
        for override in self.task.meta.get("overrides") or ():
            if override["name"] == call.name and arguments_match(call.arguments, override["arguments"]):
                return ToolResult(call, override["answer"], "ok")
        return None

    async def step(self, calls, executor) -> StepResult:
        """Faults are decided before the calls; a call this task answers with its own fact does not run; the
        other calls run as usual, results kept in call order."""
        faults = [self._fault(call) for call in calls]
        for fault in faults:
            if fault is not None:
                self.injected.add(id(fault))
        ready = [fault or self._own_fact(call) for call, fault in zip(calls, faults, strict=True)]
        real = [call for call, done in zip(calls, ready, strict=True) if done is None]
        answered = iter((await super().step(real, executor)).observations if real else [])
        results = [next(answered) if done is None else done for done in ready]
        return StepResult(results, info={"injected": sum(f is not None for f in faults)})

    async def reply(self, text: str) -> StepResult:
        requests = self.task.meta.get("requests")
        if not requests:
            return StepResult(done=True)
        solved = contains_all(text, self.task.meta["request_answers"][self.request])
        self.solved.append(solved)
        info = {"request": self.request, "solved": solved}
        self.request += 1
        if self.request >= len(requests):
            return StepResult(reward=float(solved), done=True, info=info)
        return StepResult(reward=float(solved), user_message=requests[self.request], info=info)


@register_env("built")
class BuiltEnv(Environment):
    name = "built"
    rollout_defaults: ClassVar[dict[str, Any]] = {
        "max_turns": 6,
        "max_new_tokens": 96,
        "max_response_tokens": 512,
        "max_observation_tokens": 96,
    }
    """At least these; each larger where the build's references need more (`rollout_needs`)."""
    Options = BuiltOptions

    @staticmethod
    def rollout_needs(options: BuiltOptions) -> dict[str, int]:
        """What the build recorded its references need (deploy.json `needs`): turns, calls per turn, tokens."""
        from toolrl.build.deploy import MANIFEST

        manifest = Path(options.path).expanduser() / MANIFEST
        try:
            needs = json.loads(manifest.read_text(encoding="utf-8")).get("needs", {})
        except (OSError, ValueError, AttributeError):
            return {}  # a missing or broken build is named when the environment starts
        return {k: v for k, v in needs.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}

    def __init__(self, config, options: BuiltOptions):
        super().__init__(config, options)
        from toolrl.build.deploy import DEPLOY_DIR, MANIFEST, RUNTIME  # the builder imports the environments

        root = Path(options.path).expanduser()
        manifest = root / MANIFEST
        if not manifest.is_file():
            raise ConfigError(
                f"env.options.path: {root} has no {MANIFEST}; build it first: toolrl env build SPEC --all --out {root}"
            )
        report = json.loads(manifest.read_text(encoding="utf-8"))
        deploy = manifest.parent
        workspace = Workspace(root)
        self.deployed: list[Deployed] = workspace.read_rows(f"{DEPLOY_DIR}/tools.jsonl", Deployed, "deploy")
        self.built: list[BuiltTask] = workspace.read_rows(f"{DEPLOY_DIR}/tasks.jsonl", BuiltTask, "deploy")
        self.sources = {d.name: (deploy / d.file).read_text(encoding="utf-8") for d in self.deployed}
        runtime = deploy / "runtime.py"
        self.runtime = (runtime if runtime.is_file() else RUNTIME).read_text(encoding="utf-8")
        isolation = options.isolation or report.get("isolation", "auto")
        self.limits = SandboxLimits(timeout_s=options.timeout_s, isolation=isolation)
        self.noise = report.get("noise", 0.0) if options.noise is None else options.noise
        self.names: dict[str, list[str]] = {}
        for task in self.built:  # the entities each tool knows, for distractor records
            for call in task.calls:
                for key, value in call["arguments"].items():
                    value = value.get("name") if isinstance(value, dict) else value
                    for name in value if isinstance(value, list) else [value]:
                        if isinstance(name, str) and key not in ("field", "unit"):
                            self.names.setdefault(call["name"], []).append(name)
        self.episodes = itertools.count()
        self.rubric = Rubric(
            [
                *ftrl_criteria(correct, counts=counts),
                Criterion("correct", correct, 0.0),
                Criterion("answer", answer_correct, 0.0),
                Criterion("evidence", evidence, 0.0),
                Criterion("injected_faults", injected_faults, 0.0),
            ],
            success="correct",
        )

    def _call(self, name: str, **arguments: Any) -> str:
        from toolrl.build.deploy import run_calls

        [result] = run_calls(self.sources[name], name, [arguments], self.limits, self.runtime)
        if "error" in result:
            raise ValueError(result["error"])
        return result["ok"]

    def call_quietly(self, name: str, arguments: dict[str, Any], other: str) -> str | None:
        """The tool's answer for another entity (a distractor record): the entity argument swapped in its
        shape (a name, {"name": ...}, [names]); None when there is none to swap or the call fails."""
        swapped, changed = {}, False
        for key, value in arguments.items():
            if key in ("field", "unit") or changed:
                swapped[key] = value
            elif isinstance(value, str):
                swapped[key], changed = other, True
            elif isinstance(value, dict) and isinstance(value.get("name"), str):
                swapped[key], changed = {**value, "name": other}, True
            elif isinstance(value, list) and value:
                swapped[key], changed = [other], True
            else:
                swapped[key] = value
        if not changed:
            return None
        try:
            return self._call(name, **swapped)
        except ValueError:
            return None

    def tools(self) -> list[Tool]:
        return [
            Tool(
                d.name,
                d.doc.description,
                d.doc.parameters,
                partial(self._call, d.name),
                check=json_schema_checker(d.doc.parameters, d.name),
                idempotent=True,
                isolation="thread",
            )
            for d in self.deployed
        ]

    def reference(self, task: Task) -> list[ReferenceRequest]:
        return reference_requests(task, self.options.countdown)

    def offered(self, task: Task) -> list[str]:
        return list(task.meta["tools"])

    def limits_for(self, task: Task, limits):
        """With `budget: task`, the task's own needs (build.needs.task_needs) times budget_slack, within the
        run's limits: the widest fan-out keeps its 3,000 tokens, a one-call task gets a few hundred."""
        need = task.meta.get("needs")
        if self.options.budget != "task" or not need:
            return limits
        slack = self.options.budget_slack

        def scaled(key: str) -> int:
            return min(getattr(limits, key), int(need[key] * slack) + 1)

        turns = min(limits.max_turns, need["max_turns"] + 1)
        style = self.options.countdown  # each turn's note, on top of its reference
        notes = note_tokens(style, task.meta["plan"]) if style else 0
        return replace(limits, max_turns=turns,
                       max_new_tokens=min(limits.max_new_tokens, scaled("max_new_tokens") + notes),
                       max_response_tokens=min(limits.max_response_tokens,
                                               scaled("max_response_tokens") + notes * turns))  # fmt: skip

    def tasks(self, split: str) -> list[Task]:
        """The split's tasks, its scenarios taken in turn (the builder writes them scenario by scenario): the first
        N of a split (sft.num_tasks, eval.num_tasks) cover every scenario."""
        tasks = [
            Task(
                t.id,
                t.question,
                "; ".join(t.answers),
                {
                    "category": t.scenario,
                    "answers": t.answers,
                    "subproblems": t.calls,
                    "rounds": rounds(t),
                    "plan": plan_of(t.subproblems),
                    "facts": [fact(s.kind) for s in t.subproblems],
                    "needs": task_needs(t),
                    "overrides": t.overrides,
                    "tools": t.tools,
                    **({"requests": t.requests, "request_answers": t.request_answers} if t.requests else {}),
                },
            )
            for t in self.built
            if t.split == split
        ]
        if not tasks:
            raise DataError(f"env.options.path: {self.options.path} has no {split} tasks")
        return interleaved(tasks, lambda task: task.meta["category"])

    def _own_example(self, task: Task) -> tuple[str, list, str, list[str]] | None:
        """A single-hop exchange with the task's first tool on a train task's entity (never this task's)."""
        tool = task.meta["subproblems"][0]["name"]
        asked = _norm(task.meta["subproblems"])
        pool = [
            (sub.question, call["arguments"], sub.answer, fact(sub.kind))
            for t in self.built
            if t.split == "train" and t.id != task.id
            for sub, call in zip(t.subproblems, t.calls, strict=True)
            if call["name"] == tool and not sub.depends_on and _norm(call["arguments"]) not in asked
        ]
        if not pool:
            return None
        question, arguments, answer, looked_up = pool[int(hashlib.sha256(task.id.encode()).hexdigest(), 16) % len(pool)]
        return question, [(tool, arguments, answer)], answer, [looked_up]

    def messages(self, task: Task) -> list[dict[str, str]]:
        examples = list(EXAMPLES)
        if self.options.examples == "task_tools" and (own := self._own_example(task)) is not None:
            examples = [EXAMPLES[1], own]  # the chain, then the task's tool last (closest to the question)
        example, style = [], self.options.countdown
        for question, chain, answer, facts in examples:
            opened = notes(style, chain_plan(facts)) if style else ("",) * (len(chain) + 1)
            example.append({"role": "user", "content": question})
            for note, (tool, arguments, result) in zip(opened, chain, strict=False):
                example += [
                    {"role": "assistant", "content": note + self.syntax.render([ToolCall(tool, arguments)])},
                    {"role": "tool", "content": result},
                ]
            example.append({"role": "assistant", "content": f"{opened[-1]}<answer>{answer}</answer>"})
        system = SYSTEM + (NOTE_STYLES[style].instruction if style else "")
        return [{"role": "system", "content": system}, *example, {"role": "user", "content": task.question}]

    def reset(self, task: Task, seed: int | None = None) -> BuiltEpisode:
        """The injected tool faults draw from the trajectory's own stream (seeds.episode), so a trajectory meets
        the same faults whatever else runs and after a resume; without one, from a count of episodes."""
        own = seed if seed is not None else f"{self.config.seed}:{task.id}:{next(self.episodes)}"
        return BuiltEpisode(task, self.messages(task), self, random.Random(own))


__all__ = ["BuiltEnv", "arguments_match", "counts"]
