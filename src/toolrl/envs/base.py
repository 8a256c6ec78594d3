"""The environment interface, Gymnasium-like, and the registry that builds one by name.

An environment owns tasks (with a way to check success), the tools the model may call, the rubric that scores
a trajectory, and its own options (`env.options`, validated by its `Options` model). `reset(task)` starts an
episode, one per trajectory, used as a context manager (`with env.reset(task) as episode:`): its prompt
messages, the tools it offers (all of the run's by default; a subset, extra ones, or ones added at a later
turn), and whatever state is that trajectory's alone (a database, a sandbox, a backend object). Then:
- `await episode.step(calls, executor)` runs the calls of a model turn and returns a StepResult: one
  observation per call, the turn's reward, whether the episode is done, and info;
- `await episode.reply(text)` answers a model turn without tool calls: the next user message (a scripted
  request, a simulated user), or done. By default the episode is done: the model's answer ends it.
`episode.close()` frees its state.

Environments from outside the package register with `@register_env("name")` in a module that `env.module`
names (or that the `toolrl.environments` entry-point group lists); `toolrl env new NAME` writes one.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from toolrl.envs.reference import ReferenceRequest, answered, reference_from_meta
from toolrl.errors import ConfigError
from toolrl.parsers import CallSyntax, get_parser
from toolrl.plugins import import_modules
from toolrl.registry import Registry
from toolrl.rewards.rubric import Rubric
from toolrl.rewards.text import final_answer
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import Tool
from toolrl.validation import BoundedModel, format_validation_error

if TYPE_CHECKING:
    from toolrl.tools.executor import ToolExecutor

__all__ = ["EnvOptions", "Environment", "Episode", "StepResult", "Task", "final_answer", "make_env", "register_env"]


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else the task carries: all gold answers, gold SQL, sub-problems, the source record's fields."""
    images: list[Any] = field(default_factory=list)
    """Images shown with the task's question (PIL images or ToolImages); a vision-language policy sees them
    after the text of the last user message, and tools may receive them by reference (envs/images)."""


class EnvOptions(BoundedModel, BaseModel):
    """An environment's own settings, given as `env.options`; each environment subclasses this model (its
    `Options`), so a key it does not know is a one-line error, never ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def tool_call_example(
    question: str, tool: str, arguments: dict[str, Any], result: str, answer: str, syntax: CallSyntax | None = None
):
    """An in-context exchange: the question, a call of `tool` written in `syntax` (the run's parser; Hermes by
    default), its result, the <answer>."""
    syntax = syntax or get_parser("hermes")
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": syntax.render([ToolCall(tool, arguments)])},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": f"<answer>{answer}</answer>"},
    ]


@dataclass
class StepResult:
    observations: list[ToolResult] = field(default_factory=list)
    """One per call, in order (none for a reply to a turn without calls)."""
    reward: float = 0.0
    """This turn's reward (a process reward after tool calls; a request's reward when the user speaks next).
    Kept per turn on the trajectory (`turn_rewards`), with the turn's tokens."""
    done: bool = False
    """The environment ends the episode (stop reason env_done) after this step."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything for rewards and logs; kept on the trajectory (`infos`, one per step)."""
    user_message: str | None = None
    """After a turn without tool calls: the user's next message, rendered in the template's user role."""
    stop_reason: str | None = None
    """Why the episode ends, when it does and says why (`user_ended`: the user ended the conversation);
    None: the rollout names it (answer, no_tool_call, env_done)."""
    user_tokens: int = 0
    """Tokens a simulated user's model read and wrote for this step's message (metrics: user_tokens)."""
    user_seconds: float = 0.0
    """Seconds the user took to write it (metrics: user_s)."""


class Episode:
    """One trajectory in an environment.

    `tools` are this trajectory's own tools (bound to its state); they take the place of the run's tools of the
    same names. `offered` names every tool this episode shows and accepts (its own and the run's), in order;
    None offers all of the run's tools and its own. A call of a tool the episode does not offer is an error
    observation, never a call of another tool of that name. `ordered` runs a turn's calls one after another
    (stateful backends, where `cd` then `mv` is not `mv` then `cd`); a tool can also ask for it
    (`Tool.ordered`). Policies (timeouts, retries) apply by name as for the run's tools."""

    def __init__(
        self,
        task: Task,
        messages: list[dict[str, str]],
        tools: Sequence[Tool] | None = None,
        *,
        offered: Sequence[str] | None = None,
        ordered: bool = False,
    ):
        self.task = task
        self.messages = messages
        self.tools = {tool.name: tool for tool in tools or ()}
        self.offered = list(offered) if offered is not None else None
        self.ordered = ordered
        self.role: str | None = None
        """The role the policy plays in this episode (a game's first or second seat, a solver or a judge): its
        trajectory's role, whose advantages are taken within the group's trajectories of that role."""

    def offer(self, *tools: Tool) -> None:
        """Offer more tools from now on (a tool added at a later turn); say so in the next message."""
        for tool in tools:
            self.tools[tool.name] = tool
            if self.offered is not None and tool.name not in self.offered:
                self.offered.append(tool.name)

    def available(self, shared: Mapping[str, Tool]) -> dict[str, Tool]:
        """The tools this episode offers, by name: its own, else the run's (`shared`)."""
        names: Iterable[str] = self.offered if self.offered is not None else [*shared, *self.tools]
        available = {}
        for name in dict.fromkeys(names):
            tool = self.tools.get(name) or shared.get(name)
            if not isinstance(tool, Tool):
                raise ConfigError(
                    f"env: the episode of task {self.task.id!r} offers {name!r}, which is no tool "
                    "(episode tools are Tool objects: tool_from_function)"
                )
            available[name] = tool
        return available

    async def step(self, calls: Sequence[ToolCall], executor: ToolExecutor) -> StepResult:
        """Run one turn's calls (concurrently unless ordered) and return their observations and reward."""
        offered = self.available(executor.tools)
        if self.ordered or any(getattr(offered.get(c.name), "ordered", False) for c in calls):
            results = [await executor.invoke(call, offered) for call in calls]
        else:
            results = await executor.invoke_all(calls, offered)
        return StepResult(results, self.process_reward(results))

    async def open(self) -> StepResult | None:
        """Before the first model turn: None when `messages` is the whole prompt (the default), or a StepResult
        whose `user_message` the prompt ends with: a simulated user's opening message, written while other
        episodes start (and play: under rollout.schedule async an opening may wait for another episode's move).
        With `done` the trajectory ends there, before any model turn. A failure fails this trajectory alone (stop
        reason `user_failed`, an environment fault)."""
        return None

    async def reply(self, text: str) -> StepResult:
        """Answer a model turn without tool calls: a StepResult with `user_message` goes on, done ends."""
        return StepResult(done=True)

    def process_reward(self, results: Sequence[ToolResult]) -> float:
        """Reward of one tool step from its results; 0 unless an environment says otherwise."""
        return 0.0

    def finish(self, stop_reason: str) -> None:
        """The trajectory stopped (`stop_reason`: env_done, length, max_turns, ...), whatever stopped it, before its
        rubric scores it: an episode another one waits on (a game's other seat) lets it go on here."""

    def close(self) -> None:
        """Free per-trajectory state (databases, directories, backends)."""

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Environment(ABC):
    """Tasks with a checkable outcome, the tools the model may call, and the rubric that scores a trajectory."""

    name: str
    rubric: Rubric
    Options: ClassVar[type[EnvOptions]] = EnvOptions
    """Its own settings (`env.options`); a subclass of EnvOptions."""
    parser: ClassVar[str | None] = None
    """The tool-call parser its prompts are written for (Search-R1's tags); None: rollout.parser, else hermes."""
    show_tool_schemas: bool = True
    """Put the tools' JSON schemas into the prompt; False for prompt formats that describe their own tags
    (Search-R1's `<search>`)."""
    needs_vision: ClassVar[bool] = False
    """Its tasks show images (Task.images): a text-only model is refused at start-up."""
    rollout_defaults: ClassVar[dict[str, Any]] = {}
    """The rollout limits its tasks need (max_turns, max_new_tokens, max_response_tokens, ...): each takes the
    place of toolrl's default for a `rollout.*` key the config does not set (`toolrl config show` prints the
    result), so that the environment's reference fits a run's limits out of the box (toolrl env check)."""
    rollout_needs: ClassVar[Any] = None
    """Optional `rollout_needs(options) -> dict`: limits read off the environment's data (what a built
    environment's references need), each the larger of it and `rollout_defaults`'s."""

    def __init__(self, config, options: EnvOptions):
        self.config, self.options = config, options
        self.syntax: CallSyntax = get_parser("hermes")
        """How the run writes tool calls (set by make_env from rollout.parser): for in-context examples."""

    def tools(self) -> list[Tool]:
        """The run's tools, as the prompt shows them and shared by episodes that bind no state of their own.
        No tools by default: an environment whose tasks or episodes bring their own tools (`Episode(tools=...)`,
        `episode.offer`) need not define it."""
        return []

    max_idle_success: ClassVar[float | None] = None
    """The idle policy's success (no call, "Done." to everything) this environment expects at most on the tasks it
    does not mark as passing without action: `toolrl env check` judges the idle policy against it (None: 5%). A
    port of a benchmark whose own reward passes some tasks with no action declares them with
    `passes_without_action` instead, or this bound where they cannot be told apart."""

    def passes_without_action(self, task: Task) -> bool:
        """Whether a do-nothing agent passes `task` by design (its expected actions leave the state unchanged
        and require nothing said): `task.meta["passes_without_action"]` by default. The idle bound is judged on
        the other tasks."""
        return bool(task.meta.get("passes_without_action", False))

    def limits_for(self, task: Task, limits):
        """The rollout limits (RolloutLimits) of one task's trajectories: the run's by default; an environment
        whose tasks need very different budgets may lower them per task (never raise them past the run's)."""
        return limits

    def offered(self, task: Task) -> list[str] | None:
        """The names of the tools a task's episodes offer (`Episode(offered=...)`), known before an episode starts:
        what the prompt of that task shows, and what the pre-flight counts. None: the run's tools."""
        return None

    @abstractmethod
    def tasks(self, split: str) -> list[Task]: ...

    @abstractmethod
    def messages(self, task: Task) -> list[dict[str, str]]:
        """Prompt messages for a task (system, in-context example, user question)."""

    def reference(self, task: Task) -> list[ReferenceRequest] | None:
        """What a perfect agent does on `task`, request by request (envs/reference.py): `toolrl eval --policy
        reference` plays it and `toolrl env check` expects about 100% from it. By default the task's
        `meta["reference"]`, else its `meta["subproblems"]` as one round of calls answered with
        `<answer>{task.answer}</answer>` when each names its call's arguments; None: the task has no reference
        (counted, and left out of the check)."""
        found = reference_from_meta(task.id, task.meta)
        subproblems = task.meta.get("subproblems")
        if found is not None or not subproblems or not all("arguments" in s for s in subproblems):
            return found
        return answered(task.answer, *(ToolCall(s["name"], dict(s["arguments"])) for s in subproblems))

    def reference_summary(self, task: Task, turns: int) -> str | None:
        """What the reference writes when a context strategy asks it for a summary after `turns` of its turns
        (rollout.context: summarize); None: a generic line. The warm start learns it as it learns the calls."""
        return None

    def check_success(self, trajectory, task: Task) -> str | None:
        """A rule-based second opinion on a successful trajectory, independent of the rubric: why it would be
        rejected (one line), or None. Reward hacking shows up as successes this rejects (suspect_successes).
        By default: the task's reference calls tools, and the trajectory never called one of them with an ok
        result (the answer stated without the calls the task needs). Override it with a stricter check."""
        reference = self.reference(task)
        needed = {call.name for request in reference or () for round_ in request.rounds for call in round_}
        used = {r.call.name for r in trajectory.results if r.call is not None and r.outcome == "ok"}
        missing = sorted(needed - used)
        return f"answered without calling {', '.join(missing)}" if missing else None

    def reset(self, task: Task, seed: int | None = None) -> Episode:
        """Start one trajectory on `task`; environments with per-trajectory state override this. `seed`: what
        the episode may draw from (seeds.episode of the trajectory's seed; None when it has none), as in
        Gymnasium; an override without a `seed` parameter is called without one."""
        return Episode(task, self.messages(task))

    def close(self) -> None:  # noqa: B027 - most environments hold nothing for the run
        """Free what the environment holds for the run (a server or bridge process it started); the workbench
        calls it once, at its close."""


@functools.cache
def _takes_seed(reset: Callable[..., Episode]) -> bool:
    return "seed" in inspect.signature(reset).parameters


def start_episode(env: Environment, task: Task, seed: int | None) -> Episode:
    """`env.reset(task, seed=seed)`, or `env.reset(task)` for an environment whose reset takes no seed."""
    return env.reset(task, seed=seed) if _takes_seed(type(env).reset) else env.reset(task)


ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment", "env.name", options_attribute="Options")
"""The built-in environments are declared in toolrl/envs/__init__.py and imported when first asked for, each
alone (checking a config for the calculator, or a tool's worker process importing it, imports no other)."""
register_env = ENVIRONMENTS.register
ENTRY_POINTS = "toolrl.environments"
"""The entry-point group where installed packages list their environment modules."""


def environment_class(config) -> Callable[..., Environment]:
    """The registered environment `config.name` names. A resolved config (config/resolve.py) had its `plugins`
    and `env.module` imported already; for a name still unknown (an EnvConfig built in Python) `env.module` is
    imported, then the modules of the `toolrl.environments` entry points."""
    if config.name not in ENVIRONMENTS:
        from importlib.metadata import entry_points

        import_modules(config.modules(), "env.module")

        for point in entry_points(group=ENTRY_POINTS):
            if point.name == config.name:
                point.load()
    try:
        return ENVIRONMENTS.lookup(config.name)
    except ConfigError as exc:
        hint = "an environment of your own: set env.module to the module that registers it (or list it in plugins)"
        raise ConfigError(f"{exc}; {hint}") from None


def apply_rollout_defaults(config) -> None:
    """Fill the rollout keys `config` (a RunConfig) leaves unset with its environment's `rollout_defaults`."""
    cls = environment_class(config.env)
    defaults = dict(getattr(cls, "rollout_defaults", {}))
    if getattr(cls, "rollout_needs", None) is not None:
        for key, value in cls.rollout_needs(environment_options(config.env)).items():
            defaults[key] = max(value, defaults.get(key, value))
    for key, value in defaults.items():
        if key not in config.rollout.model_fields_set:
            setattr(config.rollout, key, value)
            config.rollout._from_environment.add(key)
            continue
        section = getattr(config.rollout, key)
        if isinstance(value, dict) and isinstance(section, BaseModel):  # a section the config set in part takes
            chosen = section.model_fields_set  # the rest from the environment (rollout.context.options alone: its
            if all(getattr(section, k) == v for k, v in value.items() if k in chosen and not isinstance(v, dict)):
                for inner, given in value.items():  # strategy), unless it chose otherwise (another strategy)
                    if inner not in chosen:
                        setattr(section, inner, given)


def environment_options(config) -> EnvOptions:
    """`config.options` validated by the environment's Options model (once: a resolved config keeps them); a
    ConfigError naming env.options.KEY."""
    kept = config.kept_options()
    if kept is not None:
        return kept
    options_model = getattr(environment_class(config), "Options", EnvOptions)
    try:
        return options_model.model_validate(config.options)
    except ValidationError as exc:
        message = format_validation_error(exc, f"env.options of {config.name}", options_model, "env.options.")
        raise ConfigError(message) from None


def parser_name(config, rollout_parser: str | None = None) -> str:
    """The run's parser: rollout.parser, else the environment's own, else hermes."""
    return rollout_parser or getattr(environment_class(config), "parser", None) or "hermes"


def make_env(config, model_name: str | None = None, parser: str | None = None) -> Environment:
    """The environment `config` (an EnvConfig) names, writing its in-context calls in the syntax of `parser`
    (rollout.parser; None: its own, else hermes), its rubric adjusted by `reward_weights` and joined by the
    model judge when `judge` is set (a local judge defaults to `model_name`, the run's model)."""
    env = environment_class(config)(config, environment_options(config))
    if unread := config.unread_task_files():  # given a file it would never read: refused, not ignored
        raise ConfigError(
            f"env.{unread[0]}: environment {config.name} takes no task files (its tasks() are its own); remove "
            f"env.{unread[0]}, or have it read them with toolrl.envs.tasks.TaskSplits(config, own_tasks)"
        )
    env.syntax = get_parser(parser_name(config, parser))
    bad = [tool for tool in env.tools() if not isinstance(tool, Tool)]
    if bad:
        raise ConfigError(
            f"env {config.name}: tools() returned a {type(bad[0]).__name__}, not a Tool; build tools with "
            "toolrl.tools.tool_from_function"
        )
    weights = config.reward_weights or {}
    judge = config.judge
    if judge is not None or weights:
        from toolrl.rewards.judge import make_judge
        from toolrl.rewards.rubric import Criterion

        extra = [Criterion("judge", make_judge(judge, model_name or ""), judge.weight)] if judge else []
        env.rubric = env.rubric.with_weights(weights, extra)
    return env
