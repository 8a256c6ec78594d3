"""Generate -> parse -> invoke -> update, each trajectory on its own.

Every trajectory is a small state machine driven by asyncio: GENERATING (waiting for the engine to sample a
turn) -> RUNNING_TOOLS (its calls in flight) -> GENERATING ... -> DONE. A trajectory whose tools have returned
asks the engine for its next turn at once; the engine batches whichever trajectories are asking. Nothing waits
for the slowest tool call of the batch.

`schedule="lockstep"` runs turns in lock-step instead (every trajectory generates, then every trajectory's
tools run, then the next turn), as RL-Factory and Search-R1 do: reproducible scheduling, and the baseline of
`bench/rollout.py`.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from toolrl.chat.format import ChatFormat
from toolrl.envs.base import Environment, Episode, Task, final_answer
from toolrl.parsers.base import Parser, ParseResult
from toolrl.rollout.engine import Engine, Sampled
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.executor import ToolExecutor
from toolrl.tools.observation import clip_observation

STOP_REASONS = ("answer", "no_tool_call", "max_turns", "length", "tool_error", "env_done")


class State(enum.Enum):
    GENERATING = "generating"
    RUNNING_TOOLS = "running_tools"
    DONE = "done"


@dataclass
class RolloutLimits:
    max_turns: int
    max_new_tokens: int
    """Per turn."""
    max_response_tokens: int
    """Per trajectory after its prompt: generated plus observation tokens."""
    max_observation_tokens: int
    """Per tool result."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_on_tool_error: bool = False
    """End a trajectory (stop reason tool_error) when a tool call fails, instead of showing the model the error."""
    last_turn_tools: bool = False
    """Run the calls of the last allowed turn too (their results end the trajectory, masked out of the loss):
    for rewards that look at the final tool result, such as the rows a final SQL query returns."""


@dataclass
class _Turn:
    """What one generated turn leads to: the next state, and the calls to run if any."""

    state: State
    parsed: ParseResult | None = None
    sampled: Sampled | None = None


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
        sequential_tools: bool = False,
    ):
        self.env, self.engine, self.chat, self.parser, self.executor = env, engine, chat, parser, executor
        self.limits = limits
        self.schedule = schedule
        self.sequential_tools = sequential_tools
        """Run a turn's calls one after another (lock-step only): the naive baseline of the benchmark."""
        self.tool_schemas = [tool.to_openai() for tool in executor.tools.values()] if env.show_tool_schemas else []
        self.tokenizer = chat.tokenizer

    def prompt_ids(self, task: Task, messages: list[dict[str, str]] | None = None) -> list[int]:
        return self.chat.prompt_ids(messages or self.env.messages(task), self.tool_schemas)

    def run(self, tasks: Sequence[Task], seed: int | None = None) -> list[Trajectory]:
        return asyncio.run(self.arun(tasks, seed))

    async def arun(self, tasks: Sequence[Task], seed: int | None = None) -> list[Trajectory]:
        """Roll out one trajectory per task. With `seed`, trajectory i samples with its own seed derived from
        (seed, i): its tokens do not depend on what else shares a batch or on timing."""
        episodes: list[Episode] = []
        seqs = [object() for _ in tasks]  # engine sequence keys, unique even across concurrent rollouts
        try:
            for task in tasks:
                episodes.append(self.env.reset(task))
            trajs = [Trajectory.start(e.task, self.prompt_ids(e.task, e.messages)) for e in episodes]
            if seed is not None:
                for i, traj in enumerate(trajs):
                    traj.seed = seed * 1_000_003 + i
            runs = list(zip(seqs, trajs, episodes, strict=True))
            if self.schedule == "lockstep":
                await self._lockstep(runs)
            else:
                await asyncio.gather(*(self._run_one(*run) for run in runs))
            await self.env.rubric.score_all(trajs)  # before close: verifiers may use the episode's state
        finally:
            for seq in seqs:
                self.engine.release(seq)
            for episode in episodes:
                episode.close()
        return trajs

    # ---- the state machine -------------------------------------------------------------------------------

    async def _run_one(self, seq: object, traj: Trajectory, episode: Episode) -> None:
        turn = _Turn(State.GENERATING)
        while turn.state is not State.DONE:
            if turn.state is State.GENERATING:
                turn = self._after_generation(traj, await self._generate(seq, traj))
            else:
                turn = await self._run_tools(traj, episode, turn)

    async def _lockstep(self, runs: list[tuple[object, Trajectory, Episode]]) -> None:
        active = list(range(len(runs)))
        while active:
            sampled = await asyncio.gather(*(self._generate(runs[i][0], runs[i][1]) for i in active))
            turns = {i: self._after_generation(runs[i][1], s) for i, s in zip(active, sampled, strict=True)}
            calling = [i for i in active if turns[i].state is State.RUNNING_TOOLS]
            if self.sequential_tools:
                for i in calling:
                    turns[i] = await self._run_tools(*runs[i][1:], turns[i])
            else:
                after = await asyncio.gather(*(self._run_tools(*runs[i][1:], turns[i]) for i in calling))
                turns.update(zip(calling, after, strict=True))
            active = [i for i in calling if turns[i].state is State.GENERATING]

    async def _generate(self, seq: object, traj: Trajectory) -> Sampled:
        limits = self.limits
        budget = min(limits.max_new_tokens, limits.max_response_tokens - traj.response_length)
        s = limits.sampling
        params = SamplingParams(s.temperature, s.top_p, s.top_k, budget, traj.seed)
        started = time.perf_counter()
        sampled = await self.engine.generate(seq, traj.token_ids, params)
        traj.timings["generate_s"] = traj.timings.get("generate_s", 0.0) + time.perf_counter() - started
        return sampled

    def _after_generation(self, traj: Trajectory, sampled: Sampled) -> _Turn:
        """Record the turn and decide: done (with why) or run its tool calls."""
        text = self.tokenizer.decode(sampled.ids, skip_special_tokens=True)
        traj.add_model_turn(sampled.ids, sampled.logprobs, text)
        parsed = self.parser(text, self.executor.tools.keys())
        traj.num_format_errors += len(parsed.errors)
        if not parsed.calls and not parsed.errors:
            traj.stop_reason = "answer" if final_answer(text) is not None else "no_tool_call"
            traj.truncated = not sampled.ended
            return _Turn(State.DONE)
        if traj.response_length >= self.limits.max_response_tokens:
            traj.stop_reason, traj.truncated = "length", True
            return _Turn(State.DONE)
        if traj.num_turns >= self.limits.max_turns:
            traj.stop_reason = "max_turns"
            if not self.limits.last_turn_tools:
                return _Turn(State.DONE)
        return _Turn(State.RUNNING_TOOLS, parsed, sampled)

    async def _run_tools(self, traj: Trajectory, episode: Episode, turn: _Turn) -> _Turn:
        """Run the turn's calls in the trajectory's episode and append the observation; decide: generate again
        or done."""
        started = time.perf_counter()
        calls = turn.parsed.calls
        step = await episode.step(calls, self.executor, sequential=self.sequential_tools)
        results = step.observations
        traj.timings["tools_s"] = traj.timings.get("tools_s", 0.0) + time.perf_counter() - started
        traj.num_tool_calls += len(calls)
        traj.results.extend(results)
        traj.step_rewards.append(step.reward)
        failed = sum(r.error for r in results)
        traj.num_tool_errors += failed
        traj.num_tool_faults += sum(r.infra_fault for r in results)
        if failed and self.limits.stop_on_tool_error:
            traj.stop_reason = "tool_error"
            return _Turn(State.DONE)
        clip = self.limits.max_observation_tokens
        contents = [clip_observation(r.content, self.tokenizer, clip) for r in results] + turn.parsed.errors
        obs = self.chat.observation_ids(contents, model_ended_turn=turn.sampled.ended)
        if traj.response_length + len(obs) >= self.limits.max_response_tokens:
            traj.stop_reason, traj.truncated = "length", True
            return _Turn(State.DONE)
        traj.add_observation(obs)
        if step.done and traj.stop_reason != "max_turns":
            traj.stop_reason = "env_done"
        return _Turn(State.DONE if traj.stop_reason in ("max_turns", "env_done") else State.GENERATING)
