"""Rollouts of an agent environment: each sample is one run of the user's agent against its own base URL on the
gateway; the turns the gateway recorded are the sample's trajectory.

A sample whose agent made several unrelated requests (a sub-agent, a retry, a history it summarised and started
again from) has several segments: they are linked, in the order they began, into one trajectory with one reward
(rollout/trajectory.py), whose every segment is trained under every estimator.
An agent that fails (raises, exits non-zero, outlives env.options.timeout_s, or had every request refused by
the gateway) fails its sample: reward 0, its reason in the trajectory's env_fault, its cause counted. A rollout in
which every agent failed is a warning naming the most common cause with an example line;
env.options.max_failed_steps such rollouts in a row stop the run.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Sequence

from toolrl.envs.agent.env import AgentEnv, AgentOutcome
from toolrl.envs.base import Task
from toolrl.errors import ToolRLError
from toolrl.gateway import Gateway, Sample
from toolrl.rewards.rubric import mark_suspects
from toolrl.rollout.engine import common_prefix_length
from toolrl.rollout.trajectory import Segment, Trajectory
from toolrl.text import clip

log = logging.getLogger(__name__)


def cause_key(cause: str) -> str:
    """A failure's cause as a metric name: 'HTTP 404' -> http_404, 'raised ValueError' -> raised_valueerror."""
    return re.sub(r"[^a-z0-9]+", "_", cause.lower()).strip("_") or "unknown"


class AgentRollout:
    """The Rollout interface (run, arun, env, executor) over an agent environment and a gateway."""

    def __init__(self, env: AgentEnv, gateway: Gateway, executor, chat):
        self.env, self.gateway, self.executor, self.chat = env, gateway, executor, chat
        self.engine = gateway.engine
        self.stats = env.counts.stats
        self.failed_in_a_row = 0
        """Rollouts in a row in which every agent failed."""
        self.rollouts = 0
        self.last_failure = ""

    def nothing_trained(self) -> str | None:
        if not self.rollouts or self.failed_in_a_row < self.rollouts:
            return None
        return (f"env agent: every agent failed in each of the run's {self.rollouts} rollouts (the last: "
                f"{self.last_failure}); nothing was trained and no final model is written: fix the agent")  # fmt: skip

    def refuse_long_prompts(self, tasks: Sequence[Task], context: int) -> None:
        """The agent writes its own prompts: the gateway refuses one past the context, per request."""

    def run(self, tasks: Sequence[Task], seed: int | None = None, first: int = 0) -> list[Trajectory]:
        try:  # the engine's steps on this thread while the agents run (rollout/caller_thread.py)
            return self.engine.run(self.arun(tasks, seed, first))
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
                except Exception as exc:  # the agent's own failure: its sample fails, the run goes on
                    outcome = AgentOutcome.failed(exc, self.env.options.timeout_s)
            outcome.seconds = time.perf_counter() - started
            sample = self.gateway.close_sample(sample.id)
            blame_refusals(sample, outcome)
            return sample, outcome

        done = await asyncio.gather(*(one(task) for task in tasks))
        trajs = [self._trajectory(sample, outcome) for sample, outcome in done]
        self._judge_failures([outcome for _, outcome in done])
        await self.env.rubric.score_all(trajs)
        mark_suspects(self.env, trajs)
        for traj in trajs:
            traj.episode = None
        return trajs

    def _judge_failures(self, outcomes: list[AgentOutcome]) -> None:
        """A warning when every agent failed (its most common cause, an example line), and the run stopped after
        env.options.max_failed_steps such rollouts in a row."""
        failed = [o for o in outcomes if o.error is not None]
        self.rollouts += 1
        if not failed or len(failed) < len(outcomes):
            self.failed_in_a_row = 0
            if failed:
                log.info("env agent: %d of %d agents failed (%s)", len(failed), len(outcomes), _causes(failed))
            return
        self.failed_in_a_row += 1
        top = Counter(o.cause for o in failed).most_common(1)[0][0]
        example = next(o.example for o in failed if o.cause == top)
        told = f"every agent failed ({len(failed)} of {len(outcomes)}: {_causes(failed)}); e.g. {clip(example, 300)}"
        log.warning("env agent: %s", told)
        self.last_failure = told
        limit = self.env.options.max_failed_steps
        if limit and self.failed_in_a_row >= limit:
            raise ToolRLError(f"env.options.max_failed_steps: {told}, in {self.failed_in_a_row} rollouts in a row; "
                              "fix the agent (or raise max_failed_steps)")  # fmt: skip

    def _trajectory(self, sample: Sample, outcome: AgentOutcome) -> Trajectory:
        segments = sample.trajectories()
        self.stats["segments"] += len(segments)
        self.stats["extra_segments"] += max(len(segments) - 1, 0)
        self.stats["requests"] += sample.requests
        self.stats["continued_requests"] += sample.continued
        if segments:
            traj = linked(segments)
        else:  # the agent asked nothing: a trajectory of its task's prompt, nothing to train
            traj = Trajectory.start(sample.task, self.chat.prompt_ids(self.env.messages(sample.task), []))
        outcome.calls = []
        for segment in sample.segments:
            answered = {id(r.call): r.content for r in segment.traj.results}
            outcome.calls += [{"name": c.name, "arguments": c.arguments, "result": answered.get(id(c))}
                              for c in segment.calls.values()]  # fmt: skip
        traj.episode = outcome
        traj.timings["agent_s"] = outcome.seconds
        traj.infos.append({"segments": len(segments), "requests": sample.requests})
        for protocol, count in sample.protocols.items():
            self.stats[f"requests/{protocol}"] += count
        if outcome.error is not None:
            self.stats["agent_failures"] += 1
            self.stats[f"agent_failures/{cause_key(outcome.cause)}"] += 1
            log.debug("env agent: task %s failed: %s", sample.task.id, outcome.error)
            traj.env_fault, traj.stop_reason = outcome.error, "agent_failed"
        else:
            traj.stop_reason = "agent_done"
        return traj


def linked(segments: list[Trajectory]) -> Trajectory:
    """A sample's segments (the gateway's, in the order they began) as one trajectory: the last is its open segment,
    the others closed by the agent ("agent"), each saying how much of it the next one starts with; texts, calls,
    rewards and counters are the whole sample's."""
    last = segments[-1]
    traj = Trajectory(last.task, last.token_ids, last.loss_mask, last.logprobs, last.spans, images=last.images)
    turns = 0
    for k, part in enumerate(segments):
        turns += part.num_turns
        traj.segments += part.segments  # what the gateway compacted of it (rollout.context: gateway/compaction.py)
        if k < len(segments) - 1:
            carried = common_prefix_length([part.token_ids, segments[k + 1].token_ids])
            traj.segments.append(Segment(part.token_ids, part.loss_mask, part.logprobs, part.spans, part.images,
                                         "agent", turns, carried))  # fmt: skip
        for name in ("texts", "results", "turn_rewards", "infos", "summaries"):
            getattr(traj, name).extend(getattr(part, name))
        for name in ("num_tool_calls", "num_format_errors", "num_tool_errors", "num_tool_faults", "user_tokens"):
            setattr(traj, name, getattr(traj, name) + getattr(part, name))
        for key, seconds in part.timings.items():
            traj.timings[key] = traj.timings.get(key, 0.0) + seconds
    traj.truncated, traj.seed = last.truncated, last.seed
    return traj


def blame_refusals(sample: Sample, outcome: AgentOutcome) -> None:
    """An agent the gateway refused: a failed agent's cause is the refusal (its own exit or exception follows from
    it), and an agent none of whose requests was served failed even when it exited 0."""
    if not sample.refusals or (outcome.error is None and sample.requests):
        return
    status = sample.refusals.most_common(1)[0][0]
    outcome.cause, outcome.example = f"HTTP {status}", sample.first_refusal
    if outcome.error is None:
        outcome.error = f"every request was refused by the gateway: {clip(sample.first_refusal, 300)}"


def _causes(failed: list[AgentOutcome]) -> str:
    return ", ".join(f"{n} {cause}" for cause, n in Counter(o.cause for o in failed).most_common())


async def _free(engine) -> None:
    engine.free_memory()
