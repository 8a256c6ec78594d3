"""Generate -> parse -> invoke -> update, each trajectory on its own.

Every trajectory is a small state machine driven by asyncio: GENERATING (waiting for the engine to sample a
turn) -> RUNNING_TOOLS (its calls in flight) or REPLYING (a turn without calls: the episode answers, with the
user's next message or the end) -> GENERATING ... -> DONE. A trajectory whose tools or user have answered asks
the engine for its next turn at once; the engine batches whichever trajectories are asking. Nothing waits for
the slowest tool call of the batch. Why a trajectory stops is decided by the small named rules below.

With a context strategy (`rollout.context`, toolrl/context), a trajectory whose next round does not fit its open
segment is compacted before it generates: the strategy closes the segment and says what the next one starts from.

`schedule="lockstep"` runs turns in lock-step instead (every trajectory generates, then every trajectory's
tools run, then the next turn), as RL-Factory and Search-R1 do: reproducible scheduling, and the baseline of
`bench/rollout.py`.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from toolrl import seeds
from toolrl.aio import all_or_none, result_or_line
from toolrl.chat.format import ChatFormat
from toolrl.context.base import ContextStrategy, ContextView
from toolrl.envs.base import Environment, Episode, StepResult, Task, start_episode
from toolrl.errors import ConfigError, DataError
from toolrl.parsers.base import Parser, ParseResult
from toolrl.rewards.rubric import mark_suspects
from toolrl.rollout.engine import Engine, Sampled
from toolrl.rollout.limits import RolloutLimits, answer_reason, out_of_turns, over_token_budget
from toolrl.rollout.preflight import refuse_long_prompts
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.executor import ToolExecutor
from toolrl.tools.function import Tool
from toolrl.tools.images import name_images
from toolrl.tools.observation import clip_observation

log = logging.getLogger(__name__)


class State(enum.Enum):
    GENERATING = "generating"
    RUNNING_TOOLS = "running_tools"
    REPLYING = "replying"
    DONE = "done"


def _count_user(traj: Trajectory, step: StepResult) -> None:
    """What the user's message of this step cost (a simulated user's tokens and seconds)."""
    traj.user_tokens += step.user_tokens
    traj.timings["user_s"] = traj.timings.get("user_s", 0.0) + step.user_seconds


@dataclass
class _Turn:
    """What one generated turn leads to: the next state, and what it needs."""

    state: State
    parsed: ParseResult | None = None
    sampled: Sampled | None = None
    text: str = ""


@dataclass
class _Run:
    """One trajectory in flight: its engine key, its record, its episode and the tools that episode offers."""

    seq: object
    traj: Trajectory
    episode: Episode
    tools: dict[str, Tool]
    limits: RolloutLimits
    """The run's limits as the environment sets them for this task (Environment.limits_for)."""
    context: ContextStrategy | None = None
    """Its context strategy (None: none)."""
    ended: bool = True
    """Whether its last model turn emitted its end-of-turn token."""
    turns: int = 0
    """Model turns generated; `noticed`: those the context strategy was told of."""
    noticed: int = 0


class Rollout:
    """Runs an environment's tasks through an engine and the executor's tools."""

    def __init__(
        self,
        env: Environment,
        engine: Engine,
        chat: ChatFormat,
        parser: Parser,
        executor: ToolExecutor,
        limits: RolloutLimits,
        schedule: Literal["async", "lockstep"] = "async",
        context: Callable[[], ContextStrategy] | None = None,
    ):
        self.env, self.engine, self.chat, self.parser, self.executor = env, engine, chat, parser, executor
        self.limits, self.schedule, self.context = limits, schedule, context
        """Makes each trajectory's context strategy (rollout.context), or None for `none`."""
        self.context_tools: dict[str, Tool] = {t.name: t for t in context().tools()} if context is not None else {}
        """The tools a context strategy offers (fold's branch and return), shown in every prompt."""
        self.tokenizer = chat.tokenizer
        self.on_finished: Callable[[], None] | None = None
        """Told each time a trajectory ends (an evaluation's progress)."""

    @property
    def tool_schemas(self) -> list[dict]:
        """The run's tools as the prompt shows them (episodes may offer others)."""
        return self._schemas(self.executor.tools)

    def _schemas(self, tools: dict[str, Tool]) -> list[dict]:
        shown = [*tools.values(), *self.context_tools.values()]
        return [tool.to_openai() for tool in shown] if self.env.show_tool_schemas else []

    def prompt_ids(self, task: Task, messages: list[dict[str, str]] | None = None, tools=None) -> list[int]:
        schemas = self.tool_schemas if tools is None else self._schemas(tools)
        instructions = getattr(self.parser, "instructions", None)  # the parser's own call syntax
        return self.chat.prompt_ids(messages or self.env.messages(task), schemas, instructions)

    def nothing_trained(self) -> str | None:
        """Why the rollouts gave the run nothing to learn from (it then writes no final model); here: None."""
        return None

    def refuse_long_prompts(self, tasks: Sequence[Task], context: int) -> None:
        """Before anything runs: a task whose prompt leaves no room for one generated token is a DataError naming
        it (rollout/preflight.py)."""
        refuse_long_prompts(self, tasks, context)

    def prompt(self, task: Task, messages: list[dict[str, str]] | None = None, tools=None) -> tuple[list[int], list]:
        """The prompt's ids and, for a vision-language policy, the task's images in them."""
        if not (task.images and self.chat.supports_images):
            return self.prompt_ids(task, messages, tools), []
        schemas = self.tool_schemas if tools is None else self._schemas(tools)
        instructions = getattr(self.parser, "instructions", None)
        try:
            messages = messages or self.env.messages(task)
            room = self.limits.max_image_tokens
            return self.chat.prompt_with_images(messages, schemas, task.images, instructions, room)
        except DataError as exc:
            raise DataError(f"env {self.env.name}, task {task.id}: {exc}") from None

    def run(self, tasks: Sequence[Task], seed: int | None = None, first: int = 0) -> list[Trajectory]:
        """`arun` on an event loop of its own (the engine's `run`), then the engine frees what it keeps."""
        try:
            return self.engine.run(self.arun(tasks, seed, first))
        finally:
            self.engine.free_memory()

    def _start(self, episode: Episode, seq: object) -> _Run:
        try:
            tools = episode.available(self.executor.tools)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("env:", f"env {self.env.name}:", 1)) from None
        if not isinstance(episode.messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in episode.messages
        ):
            raise ConfigError(
                f"env {self.env.name}: reset({episode.task.id!r}).messages must be a list of "
                "{'role': str, 'content': str} messages"
            )
        traj = Trajectory.start(episode.task, *self.prompt(episode.task, episode.messages, tools))
        traj.episode, traj.role = episode, episode.role
        self.engine.begin(seq, episode.task)
        context = self.context() if self.context is not None else None
        return _Run(seq, traj, episode, tools, self.env.limits_for(episode.task, self.limits), context)

    async def arun(self, tasks: Sequence[Task], seed: int | None = None, first: int = 0) -> list[Trajectory]:
        """Roll out one trajectory per task. With `seed`, trajectory i samples with its own seed derived from
        (seed, first + i): its tokens do not depend on what else shares a batch or on timing (`first`: the
        index of the first task in the whole step, for a data-parallel rank's share)."""
        episodes: list[Episode] = []
        seqs = [object() for _ in tasks]  # engine sequence keys, unique even across concurrent rollouts
        runs: list[_Run] = []
        own = [None if seed is None else seeds.derive(seed, first + i) for i in range(len(tasks))]
        try:
            for task, traj_seed in zip(tasks, own, strict=True):
                episodes.append(start_episode(self.env, task, seeds.episode(traj_seed)))
            if self.schedule == "lockstep":
                opened = await asyncio.gather(*(self._open(episode) for episode in episodes))
                runs = [self._begin(*args) for args in zip(episodes, seqs, own, opened, strict=True)]
                await self._lockstep([run for run in runs if not self._ended_early(run)])
            else:  # each trajectory plays once its episode has opened: one may wait for another to move first
                runs = await all_or_none([self._open_and_play(*a) for a in zip(episodes, seqs, own, strict=True)])
            trajs = [run.traj for run in runs]
            await self.env.rubric.score_all(trajs)  # before close: criteria may read the episode's final state
            mark_suspects(self.env, trajs)
        finally:
            for seq in seqs:
                self.engine.release(seq)
            for episode in episodes:
                episode.close()
            for run in runs:
                run.traj.episode = None  # closed: its state is no longer there to read
        return trajs

    async def _open_and_play(self, episode: Episode, seq: object, seed: int | None) -> _Run:
        run = self._begin(episode, seq, seed, await self._open(episode))
        if not self._ended_early(run):
            await self._run_one(run)
        return run

    def _begin(self, episode: Episode, seq: object, seed: int | None, opening: StepResult | str | None) -> _Run:
        run = self._start(episode, seq)
        run.traj.seed = seed
        if isinstance(opening, str):  # the user's opening failed: this trajectory alone fails
            self._user_failed(run.traj, opening)
        elif opening is not None:
            _count_user(run.traj, opening)
            if opening.done:  # the episode ended before the policy's first turn (an opponent that gave up)
                self._stop(run.traj, opening.stop_reason or "env_done")
        return run

    def _ended_early(self, run: _Run) -> bool:
        """Whether the trajectory ended at its opening (then it is counted as finished here)."""
        if run.traj.stop_reason:
            self._finished(run)
        return bool(run.traj.stop_reason)

    async def _open(self, episode: Episode) -> StepResult | str | None:
        """The episode's opening (Episode.open): its first user message joins the prompt; a failure is returned as
        its one line (that trajectory fails), a ConfigError (a task's box that cannot be built) stops the run."""
        opening = await result_or_line(episode.open())  # a failure's line: a simulated user whose model is down
        if isinstance(opening, str):
            return opening
        said = opening.user_message if isinstance(opening, StepResult) else None
        if opening is not None and (not isinstance(opening, StepResult) or not (isinstance(said, str) or opening.done)):
            raise ConfigError(f"env {self.env.name}: episode.open must return None, a StepResult with a user_message, "
                              "or one with done")  # fmt: skip
        episode.messages = episode.messages + ([{"role": "user", "content": said}] if said is not None else [])
        return opening

    def _user_failed(self, traj: Trajectory, why: str) -> _Turn:
        """The user failed (an environment fault, not the policy's): this trajectory ends, counted."""
        log.warning("env %s: the user of task %s failed: %s", self.env.name, traj.task.id, why)
        traj.env_fault = why
        traj.record_step(0.0, {"user_error": why})
        return self._stop(traj, "user_failed")

    # ---- the state machine -------------------------------------------------------------------------------

    async def _run_one(self, run: _Run) -> None:
        turn = _Turn(State.GENERATING)
        while turn.state is not State.DONE:
            if turn.state is State.GENERATING:
                if await self._make_room(run):
                    turn = self._after_generation(run, await self._generate(run))
                else:
                    turn = self._stop(run.traj, "length", truncated=True)
            elif turn.state is State.RUNNING_TOOLS:
                turn = await self._run_tools(run, turn)
            else:
                turn = await self._reply(run, turn)
        self._finished(run)

    def _finished(self, *runs: _Run) -> None:
        """The trajectories of `runs` ended: their episodes are told (Episode.finish), then the progress."""
        for run in runs:
            run.episode.finish(run.traj.stop_reason or "")
            if self.on_finished is not None:
                self.on_finished()

    async def _lockstep(self, runs: list[_Run]) -> None:
        active = list(range(len(runs)))
        while active:
            roomy = await asyncio.gather(*(self._make_room(runs[i]) for i in active))
            full = [i for i, ok in zip(active, roomy, strict=True) if not ok]
            active = [i for i, ok in zip(active, roomy, strict=True) if ok]
            turns = {i: self._stop(runs[i].traj, "length", truncated=True) for i in full}
            sampled = await asyncio.gather(*(self._generate(runs[i]) for i in active))
            turns |= {i: self._after_generation(runs[i], s) for i, s in zip(active, sampled, strict=True)}
            calling = [i for i in active if turns[i].state is State.RUNNING_TOOLS]
            replying = [i for i in active if turns[i].state is State.REPLYING]
            after = await asyncio.gather(*(self._run_tools(runs[i], turns[i]) for i in calling))
            turns.update(zip(calling, after, strict=True))
            replies = await asyncio.gather(*(self._reply(runs[i], turns[i]) for i in replying))
            turns.update(zip(replying, replies, strict=True))
            still = [i for i in active if turns[i].state is State.GENERATING]
            self._finished(*(runs[i] for i in [*active, *full] if i not in still))
            active = still

    def _view(self, run: _Run) -> ContextView:
        limits, sample = run.limits, functools.partial(self._generate, run, purpose="summary")
        limit = limits.segment_limit(run.traj)
        return ContextView(run.traj, self.chat, limit, limits.round_tokens(), sample, run.ended)

    async def _make_room(self, run: _Run) -> bool:
        """Before a turn, with a context strategy: it is told of the round just completed and compacts the trajectory
        when the next does not fit. False: there is no room left for a turn (the trajectory stops: length)."""
        if run.context is None:
            return True
        new_round, run.noticed = run.turns > run.noticed, run.turns
        return await run.context.before_round(self._view(run), new_round)

    async def _generate(self, run: _Run, most: int | None = None, purpose: str = "turn") -> Sampled:
        """The next turn, at most rollout.max_new_tokens (`most` in its place: a context strategy's summary)."""
        limits, traj = run.limits, run.traj
        budget = min(limits.max_new_tokens if most is None else most, limits.max_response_tokens - traj.response_length)
        if limits.max_context_tokens is not None:
            budget = min(budget, limits.max_context_tokens - len(traj.token_ids))
        s = limits.sampling
        params = SamplingParams(s.temperature, s.top_p, s.top_k, budget, traj.seed, purpose=purpose)
        started = time.perf_counter()
        images = {"images": traj.images} if traj.images else {}  # only a vision engine is given images
        version = self.engine.weights_version  # what its tokens were sampled by, where it does not say (inflight.py)
        sampled = await self.engine.generate(run.seq, traj.token_ids, params, **images)
        sampled.versions = sampled.versions or [version] * len(sampled.ids)
        traj.timings["generate_s"] = traj.timings.get("generate_s", 0.0) + time.perf_counter() - started
        return sampled

    def _after_generation(self, run: _Run, sampled: Sampled) -> _Turn:
        """Record the turn and decide: the episode replies (no tool call), done, or run its tool calls."""
        traj = run.traj
        text = self.tokenizer.decode(sampled.ids, skip_special_tokens=True)
        traj.add_model_turn(sampled.ids, sampled.logprobs, text, sampled.versions)
        run.turns, run.ended = run.turns + 1, sampled.ended
        run.tools = run.episode.available(self.executor.tools)  # an episode may offer more at a later turn
        known = {name: list(tool.parameters.get("properties", {}))
                 for name, tool in {**run.tools, **self.context_tools}.items()}  # fmt: skip
        parsed = self.parser(text, known).within(run.limits.max_calls_per_turn)
        unknown = parsed.unknown_tools  # calls of a tool not offered: failed calls, as the executor counts them
        traj.num_format_errors += parsed.not_run - unknown
        traj.num_tool_calls, traj.num_tool_errors = traj.num_tool_calls + unknown, traj.num_tool_errors + unknown
        self.executor.count_unknown(unknown)
        if not parsed.calls and not parsed.errors:
            traj.truncated = not sampled.ended
            return _Turn(State.REPLYING, sampled=sampled, text=text)
        if over_token_budget(traj, run.limits):
            return self._stop(traj, "length", truncated=True)
        if out_of_turns(traj, run.limits):
            traj.stop_reason = "max_turns"
            if not run.limits.last_turn_tools:
                return _Turn(State.DONE)
        return _Turn(State.RUNNING_TOOLS, parsed, sampled)

    @staticmethod
    def _stop(traj: Trajectory, reason: str, truncated: bool = False) -> _Turn:
        traj.stop_reason = reason
        traj.truncated = traj.truncated or truncated
        return _Turn(State.DONE)

    async def _run_tools(self, run: _Run, turn: _Turn) -> _Turn:
        """Run the turn's calls in the trajectory's episode and append the observation; decide: generate again
        or done."""
        traj, started = run.traj, time.perf_counter()
        calls = turn.parsed.calls
        step = await self._step(run, calls)
        traj.num_tool_calls += len(calls)
        if step is None:  # the context strategy compacted the trajectory in the turn's place (fold's return)
            return _Turn(State.GENERATING)
        results = step.observations
        traj.timings["tools_s"] = traj.timings.get("tools_s", 0.0) + time.perf_counter() - started
        traj.results.extend(results)
        traj.record_step(step.reward, step.info)
        failed = sum(r.error for r in results)
        traj.num_tool_errors += failed
        traj.num_tool_faults += sum(r.infra_fault for r in results)
        if failed and run.limits.stop_on_tool_error:
            return self._stop(traj, "tool_error")
        clip = run.limits.max_observation_tokens
        contents = [clip_observation(r.content, self.tokenizer, clip) for r in results] + turn.parsed.errors
        images = [list(r.images) for r in results] + [[] for _ in turn.parsed.errors]
        ended = turn.sampled.ended
        if self.chat.supports_images:
            room = run.limits.max_images - len(traj.images)
            tokens = run.limits.max_image_tokens - sum(image.tokens for image in traj.images)
            at = len(traj.token_ids)
            obs, seen, unshown = self.chat.observation_with_images(contents, images, ended, at, room, tokens)
            traj.num_tool_errors += unshown  # an image the model cannot take: the tool's error, not a crash
        else:  # a text-only policy is told what it cannot see
            why = "images are not shown to a text-only model"
            contents = [name_images(c, per_result, why) for c, per_result in zip(contents, images, strict=True)]
            obs, seen = self.chat.observation_ids(contents, model_ended_turn=ended), []
        if over_token_budget(traj, run.limits, len(obs)):
            return self._stop(traj, "length", truncated=True)
        traj.add_observation(obs, seen)
        if traj.stop_reason == "max_turns":  # the last allowed turn's calls ran (last_turn_tools)
            return _Turn(State.DONE)
        if step.done:
            return self._stop(traj, "env_done")
        return _Turn(State.GENERATING)

    async def _step(self, run: _Run, calls: list) -> StepResult | None:
        """The turn's calls in the episode, but a context strategy's own tools' by the strategy; None where the
        strategy compacted the trajectory in the turn's place."""
        if run.context is None:
            return await run.episode.step(calls, self.executor)
        return await run.context.run_calls(self._view(run), calls, lambda rest: run.episode.step(rest, self.executor))

    async def _reply(self, run: _Run, turn: _Turn) -> _Turn:
        """A turn without tool calls: the episode answers with the user's next message, or ends it."""
        traj = run.traj
        step = await result_or_line(run.episode.reply(turn.text))  # a user that failed: this trajectory ends
        if isinstance(step, str):
            return self._user_failed(traj, step)
        if not isinstance(step, StepResult) or not (step.user_message is None or isinstance(step.user_message, str)):
            raise ConfigError(f"env {self.env.name}: episode.reply must return a StepResult with a str user_message")
        traj.record_step(step.reward, step.info)
        _count_user(traj, step)
        if step.done or step.user_message is None:
            return self._stop(traj, step.stop_reason or answer_reason(turn.text))
        if out_of_turns(traj, run.limits):
            return self._stop(traj, "max_turns")
        user = self.chat.user_ids(step.user_message, model_ended_turn=turn.sampled.ended)
        if over_token_budget(traj, run.limits, len(user)):
            return self._stop(traj, "length", truncated=True)
        traj.truncated = False  # the user goes on: the turn's being cut (if it was) ends nothing
        traj.add_user_message(user, step.user_message)
        return _Turn(State.GENERATING)
