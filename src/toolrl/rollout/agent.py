"""Rollouts of an agent environment: each sample is one run of the user's agent against its own base URL on the
gateway; the turns the gateway recorded are the sample's trajectory.

A sample whose agent made several unrelated requests (a sub-agent, a retry with a summarised history) has
several segments: the one with the most sampled tokens is the sample's trajectory, the others ride along in its
`extra` and share its reward (trained with its advantage by a sequence-level estimator: grpo, dr_grpo, rloo).
An agent that fails (raises, exits non-zero, outlives env.options.timeout_s) fails its sample: reward 0, its
reason in the trajectory's env_fault.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from toolrl.envs.agent.env import AgentEnv, AgentOutcome
from toolrl.envs.base import Task
from toolrl.gateway import Gateway, Sample
from toolrl.rewards.rubric import mark_suspects
from toolrl.rollout.trajectory import Trajectory
from toolrl.text import first_line

log = logging.getLogger(__name__)


class AgentRollout:
    """The Rollout interface (run, arun, env, executor) over an agent environment and a gateway."""

    def __init__(self, env: AgentEnv, gateway: Gateway, executor, chat):
        self.env, self.gateway, self.executor, self.chat = env, gateway, executor, chat
        self.engine = gateway.engine
        self.stats = env.counts.stats

    def refuse_long_prompts(self, tasks: Sequence[Task], context: int) -> None:
        """The agent writes its own prompts: the gateway refuses one past the context, per request."""

    def run(self, tasks: Sequence[Task], seed: int | None = None, first: int = 0) -> list[Trajectory]:
        try:
            return asyncio.run(self.arun(tasks, seed, first))
        finally:
            self.gateway.run_coroutine(_free(self.engine))

    async def arun(self, tasks: Sequence[Task], seed: int | None = None, first: int = 0) -> list[Trajectory]:
        limit = asyncio.Semaphore(self.env.options.concurrency)

        async def one(task: Task) -> tuple[Sample, AgentOutcome]:
            sample = self.gateway.open_sample(task)
            started = time.perf_counter()
            async with limit:
                try:
                    result = await self.env.run_agent(task, self.gateway.base_url(sample), self.gateway.key)
                    outcome = AgentOutcome(result)
                except TimeoutError:
                    outcome = AgentOutcome(
                        error=f"the agent ran past env.options.timeout_s ({self.env.options.timeout_s:g} s)"
                    )
                except Exception as exc:  # the agent's own failure: its sample fails, the run goes on
                    outcome = AgentOutcome(error=first_line(exc) or type(exc).__name__)
            outcome.seconds = time.perf_counter() - started
            return self.gateway.close_sample(sample.id), outcome

        done = await asyncio.gather(*(one(task) for task in tasks))
        trajs = [self._trajectory(sample, outcome) for sample, outcome in done]
        await self.env.rubric.score_all(trajs)
        mark_suspects(self.env, trajs)
        for traj in trajs:
            traj.episode = None
        return trajs

    def _trajectory(self, sample: Sample, outcome: AgentOutcome) -> Trajectory:
        segments = sample.trajectories()
        self.stats["segments"] += len(segments)
        self.stats["extra_segments"] += max(len(segments) - 1, 0)
        self.stats["requests"] += sample.requests
        self.stats["continued_requests"] += sample.continued
        if segments:
            traj = max(segments, key=lambda t: sum(t.loss_mask))
        else:  # the agent asked nothing: a trajectory of its task's prompt, nothing to train
            traj = Trajectory.start(sample.task, self.chat.prompt_ids(self.env.messages(sample.task), []))
        outcome.calls = []
        for segment in sample.segments:
            answered = {id(r.call): r.content for r in segment.traj.results}
            outcome.calls += [{"name": c.name, "arguments": c.arguments, "result": answered.get(id(c))}
                              for c in segment.calls.values()]  # fmt: skip
        traj.extra = [t for t in segments if t is not traj]
        traj.episode = outcome
        traj.timings["agent_s"] = outcome.seconds
        traj.infos.append({"segments": len(segments), "requests": sample.requests})
        if outcome.error is not None:
            self.stats["agent_failures"] += 1
            log.warning("env agent: task %s failed: %s", sample.task.id, outcome.error)
            traj.env_fault, traj.stop_reason = outcome.error, "agent_failed"
            for other in traj.extra:  # the sample failed: every sequence of it did
                other.env_fault = outcome.error
        else:
            traj.stop_reason = "agent_done"
        return traj


async def _free(engine) -> None:
    engine.free_memory()
