"""The `files` environment: a multi-turn benchmark on a stateful backend, written for toolrl.

Each task starts from a small file tree and asks for 2-4 things in turn; after the model answers a request (a
turn without tool calls), the user asks for the next one: the task's scripted request, or a simulated user's
(`env.options.user: simulated`, a model with the task's goals). The model works with file tools on its own
FileSystem instance, built from the task (the way to do stateful backends: one object per trajectory, its
bound methods as the episode's tools); the calls of a turn run in order, since they depend on each other.
Each task offers its own tools (per-task tools): the core six, the ones its requests need, three others.

Rewards compare states, never texts: after each request the tree is compared with the one the reference calls
leave (`requests`, the share solved, and a per-turn reward of 1 for each), and at the end with the final one
(`correct`, the success criterion); `used_tools` (0.1) is shaping for exploration. A turn's anchor state
(for gigpo) is the request it works on and the tree.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from toolrl.envs.base import Environment, Episode, StepResult, Task, register_env, tool_call_example
from toolrl.envs.files.backend import TOOL_NAMES, FileSystem
from toolrl.envs.files.tasks import canonical, generate
from toolrl.envs.tasks import GeneratedTasks, TaskSplits
from toolrl.envs.users import Transcript, User, UserModel, UserPrompt, hear, make_user, requests_scenario
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rewards.rules import common_criteria
from toolrl.tools.function import Tool, tool_from_function

SYSTEM = (
    "You are an assistant that manages the user's files with the file tools. Do what the user asks with tool "
    "calls, then reply in one short sentence without a tool call; the user may ask for more.\n\n"
    "The files now:\n{listing}"
)


EXAMPLES = (
    ("Create a folder called tmp.", "mkdir", {"name": "tmp"}, "created folder tmp"),
    ("Move a.txt into the tmp folder.", "mv", {"source": "a.txt", "destination": "tmp"}, "moved a.txt to tmp"),
)
"""In-context exchanges (as for the other environments, the default model needs some), on files of no task."""


class FilesOptions(GeneratedTasks):
    num_train: int = Field(400, ge=1)
    num_test: int = Field(50, ge=1)
    min_requests: int = Field(2, ge=1)
    max_requests: int = Field(4, ge=1)
    user: Literal["scripted", "simulated"] = "scripted"
    """scripted: the task's requests in order; simulated: a model asks for them in its own words."""
    user_model: UserModel | None = None
    """The simulated user's model (needed with user: simulated)."""
    user_prompt: UserPrompt = Field(default_factory=UserPrompt)
    """How the simulated user plays (users.UserPrompt: its system prompt, guidelines, stop markers)."""
    persona: str = "You write short, friendly messages."


def listing(tree: dict, indent: str = "") -> str:
    """A tree as an indented listing (folders end with /)."""
    lines = []
    for name, value in sorted(tree.items()):
        if isinstance(value, dict):
            lines.append(f"{indent}{name}/")
            lines.append(listing(value, indent + "  "))
        else:
            lines.append(f"{indent}{name}")
    return "\n".join(line for line in lines if line)


def file_tools(fs: FileSystem, names=TOOL_NAMES) -> list[Tool]:
    return [tool_from_function(getattr(fs, name), isolation="thread") for name in names]


class FilesEpisode(Episode):
    """One trajectory: its own FileSystem, the request being worked on, and the user."""

    def __init__(self, task: Task, messages, user, persona: str, seed: int | None = None):
        self.fs = FileSystem(task.meta["tree"])
        offered = task.meta.get("tools", TOOL_NAMES)  # this task's tools: the prompt shows these, no others
        super().__init__(task, messages, file_tools(self.fs, offered), offered=offered, ordered=True)
        self.user, self.persona, self.seed = user, persona, seed
        self.request = 0
        self.solved: list[bool] = []
        self.transcript = Transcript([("user", task.question)])

    def state(self) -> tuple[int, str]:
        """Where the trajectory stands: the request it is on, and the tree."""
        return self.request, canonical(self.fs.root)

    async def step(self, calls, executor) -> StepResult:
        result = await super().step(calls, executor)
        result.info["state"] = self.state()
        return result

    async def reply(self, text: str) -> StepResult:
        """The model answered request k: score it against the reference tree, then the user's next request."""
        meta = self.task.meta
        solved = canonical(self.fs.root) == meta["states"][self.request]
        self.solved.append(solved)
        info = {"request": self.request, "kind": meta["kinds"][self.request], "solved": solved}
        self.request += 1
        if self.request >= len(meta["requests"]):
            return StepResult(reward=float(solved), done=True, info=info)
        self.transcript.assistant(text)  # the user's message k is request k: the transcript holds k so far
        scenario = requests_scenario(meta["requests"], self.request, self.persona)
        step = await hear(self.user, scenario, self.transcript, self.seed, reward=float(solved), info=info)
        if step.user_message is not None:
            step.info = {**info, "state": self.state()}
        return step


def complete_task(task: Task, split: str) -> Task:
    """A task as the environment needs it. Its own tasks have everything; a task from env.train_file /
    env.test_file needs `tree`, `requests` (the user's messages, the first being the question) and `reference`
    (for each request, the calls that fulfil it); the states they leave, the kinds and tools are derived."""
    meta = task.meta
    if "states" in meta:
        return task
    missing = [key for key in ("tree", "requests", "reference") if key not in meta]
    if missing or len(meta["requests"]) != len(meta["reference"]):
        from toolrl.errors import DataError

        what = f"lacks {missing[0]!r}" if missing else "has not one reference list of calls per request"
        raise DataError(
            f"env.{split}_file: files task {task.id} {what}; a task needs tree, requests and reference "
            "(per request, its calls)"
        )
    fs, states = FileSystem(meta["tree"]), []
    for calls in meta["reference"]:
        for call in calls:
            getattr(fs, call["name"])(**call["arguments"])
        states.append(canonical(fs.root))
    extra = {"states": states, "kinds": meta.get("kinds") or ["custom"] * len(states), "tools": TOOL_NAMES}
    return Task(
        task.id, meta["requests"][0], states[-1], {**meta, **extra, **{k: meta[k] for k in ("tools",) if k in meta}}
    )


def used_tools(trajectory, task: Task) -> float:
    """Shaping: 1 when some call of the task's tools went through (as the code environment's ran_code): the
    default model mostly invents tool names, and without it a group of failures has nothing to learn from."""
    return float(any(r.call is not None and not r.error for r in trajectory.results))


def final_state(trajectory, task: Task) -> float:
    """The tree at the end equals the one the reference calls leave."""
    return float(canonical(trajectory.episode.fs.root) == task.answer)


def requests_solved(trajectory, task: Task) -> float:
    """The share of the task's requests whose tree was right when the model answered them."""
    return sum(trajectory.episode.solved) / len(task.meta["requests"])


@register_env("files")
class FilesEnv(Environment):
    name = "files"
    rollout_defaults: ClassVar[dict[str, Any]] = {
        "max_turns": 10,
        "max_new_tokens": 64,
        "max_response_tokens": 768,
        "max_observation_tokens": 64,
    }
    """Its reference's turns and calls fit these (toolrl env check)."""
    Options = FilesOptions

    def __init__(self, config, options: FilesOptions):
        super().__init__(config, options)
        if options.min_requests > options.max_requests:
            from toolrl.errors import ConfigError

            raise ConfigError("env.options.min_requests is larger than env.options.max_requests")
        own = generate(config.seed, options.num_train, options.num_test, options.min_requests, options.max_requests)
        self.splits = TaskSplits(config, own)
        self.user = self._user(options)
        self.rubric = Rubric(
            [
                Criterion("correct", final_state, 1.0),
                Criterion("requests", requests_solved, 0.5),
                Criterion("used_tools", used_tools, 0.1),
                *common_criteria(format_weight=0.0),
            ],
            success="correct",
        )

    @staticmethod
    def _user(options: FilesOptions) -> User:
        return make_user(options.user, options.user_model, options.user_prompt)

    def tools(self) -> list[Tool]:
        return file_tools(FileSystem({}))

    def tasks(self, split: str) -> list[Task]:
        return [complete_task(task, split) for task in self.splits(split)]

    def messages(self, task: Task) -> list[dict[str, str]]:
        system = SYSTEM.format(listing=listing(task.meta["tree"]) or "(nothing)")
        examples = []
        for question, tool, arguments, result in EXAMPLES:  # in the run's call syntax
            examples += tool_call_example(question, tool, arguments, result, "Done.", self.syntax)
        return [{"role": "system", "content": system}, *examples, {"role": "user", "content": task.question}]

    def reset(self, task: Task, seed: int | None = None) -> FilesEpisode:
        persona = task.meta.get("persona", self.options.persona)  # a task may carry its own
        return FilesEpisode(task, self.messages(task), self.user, persona, seed)
