"""Generate -> parse -> invoke -> update, for a batch of trajectories, turn by turn."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from toolrl.chat.format import ChatFormat
from toolrl.envs.base import Environment, Task, final_answer
from toolrl.parsers.base import Parser
from toolrl.rollout.engine import HFEngine
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.executor import ToolExecutor
from toolrl.tools.observation import clip_observation

STOP_REASONS = ("answer", "no_tool_call", "max_turns", "length")


@dataclass
class RolloutLimits:
    max_turns: int
    max_new_tokens: int
    max_response_tokens: int
    max_observation_tokens: int
    temperature: float


class Rollout:
    """Runs an environment's tasks through the model and its tools."""

    def __init__(
        self,
        env: Environment,
        engine: HFEngine,
        chat: ChatFormat,
        parser: Parser,
        executor: ToolExecutor,
        limits: RolloutLimits,
    ):
        self.env, self.engine, self.chat, self.parser, self.executor = env, engine, chat, parser, executor
        self.limits = limits
        self.tool_schemas = [tool.to_openai() for tool in executor.tools.values()]
        self.tokenizer = chat.tokenizer

    def prompt_ids(self, task: Task) -> list[int]:
        return self.chat.prompt_ids(self.env.messages(task), self.tool_schemas)

    def run(self, tasks: Sequence[Task]) -> list[Trajectory]:
        return asyncio.run(self.arun(tasks))

    async def arun(self, tasks: Sequence[Task]) -> list[Trajectory]:
        limits = self.limits
        trajs = [Trajectory.start(task, self.prompt_ids(task)) for task in tasks]
        session = self.engine.start([t.token_ids for t in trajs])
        active = list(range(len(trajs)))
        for turn in range(limits.max_turns):
            budgets = [
                min(limits.max_new_tokens, limits.max_response_tokens - trajs[i].response_length) for i in active
            ]
            sampled = session.sample(active, budgets, limits.temperature)
            steps = await asyncio.gather(*(self._after_turn(trajs[i], sampled[i], turn) for i in active))
            feed = {i: obs for i, obs in zip(active, steps, strict=True) if obs is not None}
            for i, obs in feed.items():
                trajs[i].add_observation(obs)
            active = list(feed)
            if not active:
                break
            session.keep(active)
            session.extend(feed)
        for traj in trajs:
            traj.reward, traj.rewards = self.env.rubric.score(traj, traj.task)
        return trajs

    async def _after_turn(self, traj: Trajectory, sampled, turn: int) -> list[int] | None:
        """Record the turn, run its tool calls; return the observation ids to feed, or None when done."""
        text = self.tokenizer.decode(sampled.ids, skip_special_tokens=True)
        traj.add_model_turn(sampled.ids, sampled.logprobs, text)
        parsed = self.parser(text, self.executor.tools.keys())
        traj.num_format_errors += len(parsed.errors)
        if not parsed.calls and not parsed.errors:
            traj.stop_reason = "answer" if final_answer(text) is not None else "no_tool_call"
            traj.truncated = not sampled.ended
            return None
        if traj.response_length >= self.limits.max_response_tokens:
            traj.stop_reason, traj.truncated = "length", True
            return None
        if turn == self.limits.max_turns - 1:
            traj.stop_reason = "max_turns"
            return None
        results = await self.executor.invoke_all(parsed.calls)
        traj.num_tool_calls += len(parsed.calls)
        traj.num_tool_errors += sum(r.error for r in results)
        clip = self.limits.max_observation_tokens
        contents = [clip_observation(r.content, self.tokenizer, clip) for r in results] + parsed.errors
        obs = self.chat.observation_ids(contents, model_ended_turn=sampled.ended)
        if traj.response_length + len(obs) >= self.limits.max_response_tokens:
            traj.stop_reason, traj.truncated = "length", True
            return None
        return obs
