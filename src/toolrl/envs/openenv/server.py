"""A toolrl environment served as an OpenEnv server (`toolrl env serve-openenv`): any OpenEnv client (TRL's,
openenv-core's) plays its tasks with reset/step/state over HTTP or WebSocket, one session per episode.

reset(seed, split="train", task_id=None) starts an episode on a task (task_id, else the seed's task of the
split): the observation's `prompt` is its last message, `messages` the whole prompt and `tools` the OpenAI
schemas of the tools it offers. step({"message": the model's reply}): calls in the run's syntax run in the
episode (their results come back as `prompt`, one per line, and in `results`); a reply without calls is
answered by the episode (its user's next message, or the end). At the end the environment's rubric scores the
episode as it scores a trajectory: `reward` is its total, `rewards` its components.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

from toolrl.envs.base import Environment as ToolrlEnvironment
from toolrl.envs.base import start_episode
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolExecutor


class ReplyAction(Action):
    message: str = Field(..., description="The model's reply: text, with tool calls in the environment's syntax")


class EpisodeObservation(Observation):
    prompt: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    results: list[str] = Field(default_factory=list)
    rewards: dict[str, float] = Field(default_factory=dict)


def served_environment(env: ToolrlEnvironment, executor: ToolExecutor, max_turns: int = 16):
    """The OpenEnv Environment class that plays `env` (its tools run by `executor`)."""

    class Served(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(episode_id=str(uuid4()), step_count=0)
            self.episode, self.traj = None, None

        async def reset_async(self, seed=None, episode_id=None, split: str = "train", task_id=None, **kwargs):
            self._close()
            tasks = env.tasks(split)
            task = next((t for t in tasks if t.id == task_id), None) if task_id else tasks[(seed or 0) % len(tasks)]
            if task is None:
                raise ValueError(f"no task {str(task_id)[:80]!r} in the {split} split")
            self.episode = start_episode(env, task, seed)
            opening = await self.episode.open()
            if opening is not None and opening.user_message is not None:
                self.episode.messages = [*self.episode.messages, {"role": "user", "content": opening.user_message}]
            self.traj = Trajectory.start(task, [])
            self.traj.episode = self.episode
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            tools = [t.to_openai() for t in self.episode.available(executor.tools).values()]
            messages = self.episode.messages
            return EpisodeObservation(prompt=messages[-1]["content"] if messages else "", messages=messages,
                                      tools=tools if env.show_tool_schemas else [])  # fmt: skip

        def reset(self, seed=None, episode_id=None, **kwargs):
            return asyncio.run(self.reset_async(seed, episode_id, **kwargs))

        async def step_async(self, action: ReplyAction, timeout_s=None, **kwargs):
            if self.episode is None or self.traj is None:
                raise ValueError("reset first: there is no episode")
            self._state.step_count += 1
            traj, text = self.traj, action.message
            traj.add_model_turn([], [], text)
            offered = self.episode.available(executor.tools)
            known = {name: list(tool.parameters.get("properties", {})) for name, tool in offered.items()}
            parsed = env.syntax(text, known).within(16)
            traj.num_format_errors += parsed.not_run
            if parsed.calls or parsed.errors:
                step = await self.episode.step(parsed.calls, executor)
                traj.results.extend(step.observations)
                traj.num_tool_calls += len(parsed.calls)
                traj.num_tool_errors += sum(r.error for r in step.observations)
                traj.record_step(step.reward, step.info)
                results = [r.content for r in step.observations] + parsed.errors
                done = step.done or traj.num_turns >= max_turns
                return await self._observe("\n".join(results), step.reward, done, results)
            step = await self.episode.reply(text)
            traj.record_step(step.reward, step.info)
            done = step.done or step.user_message is None or traj.num_turns >= max_turns
            if not done:
                traj.user_messages.append(step.user_message)
            return await self._observe(step.user_message or "", step.reward, done, [])

        def step(self, action, timeout_s=None, **kwargs):
            return asyncio.run(self.step_async(action, timeout_s, **kwargs))

        async def _observe(self, prompt: str, reward: float, done: bool, results: list[str]) -> EpisodeObservation:
            if not done:
                return EpisodeObservation(prompt=prompt, results=results, reward=reward, done=False)
            traj = self.traj
            await env.rubric.score_all([traj])
            self._close()
            return EpisodeObservation(prompt=prompt, results=results, reward=traj.reward, done=True,
                                      rewards=traj.rewards)  # fmt: skip

        def _close(self) -> None:
            if self.episode is not None:
                self.episode.close()
            if self.traj is not None:
                self.traj.episode = None
            self.episode = None

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            self._close()

    return Served


def make_app(env: ToolrlEnvironment, executor: ToolExecutor, max_turns: int = 16, sessions: int = 64):
    """The FastAPI app of an OpenEnv server over `env`."""
    return create_app(served_environment(env, executor, max_turns), ReplyAction, EpisodeObservation,
                      max_concurrent_envs=sessions)  # fmt: skip
