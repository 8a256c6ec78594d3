"""The Gymnasium-like episode API inside the rollout: per-trajectory tool state, observations from step,
process rewards summed into the rubric, an environment ending an episode, and close() always called."""

import json

from tests.rollout.test_loop import ScriptedEngine
from toolrl.envs import Environment, Task
from toolrl.envs.base import Episode, StepResult
from toolrl.parsers import get_parser
from toolrl.rewards.rubric import Criterion, Rubric, process_reward
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.tools import ToolExecutor
from toolrl.tools.function import tool_from_function


def tick(counter: list) -> str:
    """Count one more."""
    counter.append(1)
    return str(len(counter))


class CounterEpisode(Episode):
    closed = 0

    def __init__(self, task, messages, counter):
        super().__init__(task, messages, [tool_from_function(tick, inject={"counter": counter})])
        self.counter = counter

    async def step(self, calls, executor):
        result = await super().step(calls, executor)
        return StepResult(result.observations, reward=0.5, done=len(self.counter) >= 2)

    def close(self):
        CounterEpisode.closed += 1


class CounterEnv(Environment):
    name = "counter"

    def __init__(self):
        super().__init__(None, None)
        self.rubric = Rubric([Criterion("process", process_reward, 1.0)])

    def tools(self):
        return [tool_from_function(tick, inject={"counter": None})]

    def tasks(self, split):
        return [Task("a", "count", ""), Task("b", "count", "")]

    def messages(self, task):
        return [{"role": "user", "content": task.question}]

    def reset(self, task):
        return CounterEpisode(task, self.messages(task), [])


def test_episodes_keep_their_own_state_and_end_when_the_environment_says(chat):
    call = chat.encode("<tool_call>\n" + json.dumps({"name": "tick", "arguments": {}}) + "\n</tool_call>")
    turn = [*call, chat.end_of_turn_id]
    engine = ScriptedEngine([[turn, turn, turn], [turn, turn, turn]])
    env = CounterEnv()
    limits = RolloutLimits(max_turns=5, max_new_tokens=64, max_response_tokens=800, max_observation_tokens=20)
    rollout = Rollout(env, engine, chat, get_parser("hermes"), ToolExecutor(env.tools()), limits)
    CounterEpisode.closed = 0
    trajs = rollout.run(env.tasks("train"))
    for traj in trajs:
        assert [r.content for r in traj.results] == ["1", "2"]  # each trajectory counts on its own
        assert traj.stop_reason == "env_done" and traj.num_turns == 2
        assert traj.turn_rewards == [0.5, 0.5] and traj.rewards == {"process": 1.0} and traj.reward == 1.0
    assert CounterEpisode.closed == 2
