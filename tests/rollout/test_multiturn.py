"""Multi-turn episodes in the rollout: the user speaks again after an answer, episodes offer their own tools
(and more at a later turn), calls that depend on each other run in order, rewards read the episode's state,
a failing user ends only its trajectory."""

import asyncio
import json

import pytest

from tests.rollout.test_loop import ScriptedEngine
from toolrl.envs import Environment, Task
from toolrl.envs.base import Episode, StepResult
from toolrl.errors import ConfigError
from toolrl.parsers import get_parser
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.tools import ToolCall, ToolExecutor
from toolrl.tools.function import tool_from_function


class Shelf:
    """A tiny stateful backend: a current folder and files in folders."""

    def __init__(self):
        self.cwd, self.files = "home", {"home": ["notes.txt"], "docs": []}

    async def cd(self, folder: str) -> str:
        """Change the current folder."""
        await asyncio.sleep(0.05)  # slower than mv: run concurrently, mv would act in the old folder
        self.cwd = folder
        return f"in {folder}"

    async def mv(self, name: str) -> str:
        """Move a file of home into the current folder."""
        self.files["home"].remove(name)
        self.files[self.cwd].append(name)
        return f"moved {name} to {self.cwd}"


class ShelfEpisode(Episode):
    def __init__(self, task, messages, ordered, requests):
        self.shelf = Shelf()
        tools = [tool_from_function(self.shelf.cd), tool_from_function(self.shelf.mv)]
        super().__init__(task, messages, tools, offered=["cd", "mv"], ordered=ordered)
        self.requests = list(requests)

    async def reply(self, text):
        if not self.requests:
            return StepResult(reward=1.0, done=True, info={"request": "last"})
        request = self.requests.pop(0)
        if request == "FAIL":
            raise ConnectionError("the user simulator's endpoint is down")
        return StepResult(reward=0.5, user_message=request, info={"request": request})


def filed(trajectory, task) -> float:
    """Reads the episode's final state: was notes.txt moved into docs?"""
    return float("notes.txt" in trajectory.episode.shelf.files["docs"])


class ShelfEnv(Environment):
    name = "shelf"

    def __init__(self, ordered=True, requests=("Now say done.",)):
        super().__init__(None, None)
        self.ordered, self.requests = ordered, requests
        self.rubric = Rubric([Criterion("filed", filed, 1.0)], success="filed")

    def tools(self):
        return [tool_from_function(lambda: "x", name="shared_only")]  # the run's; episodes do not offer it

    def tasks(self, split):
        return [Task("t", "Move notes.txt into docs.", "")]

    def messages(self, task):
        return [{"role": "user", "content": task.question}]

    def reset(self, task):
        return ShelfEpisode(task, self.messages(task), self.ordered, self.requests)


def turn(chat, text):
    return chat.encode(text) + [chat.end_of_turn_id]


def calls(chat, *pairs):
    body = "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in pairs)
    return turn(chat, body)


def rollout_for(chat, env, turns, max_turns=6):
    limits = RolloutLimits(max_turns, 64, 600, 50)
    executor = ToolExecutor(env.tools())
    return Rollout(env, ScriptedEngine([turns]), chat, get_parser("hermes"), executor, limits)


def test_the_user_speaks_again_after_an_answer_and_user_tokens_are_never_trained(chat):
    env = ShelfEnv(requests=("Thanks. Now check home.", "Great, that is all."))
    first = calls(chat, ("cd", {"folder": "docs"}), ("mv", {"name": "notes.txt"}))
    answers = [turn(chat, "<answer>moved</answer>"), turn(chat, "<answer>checked</answer>"), turn(chat, "bye")]
    rollout = rollout_for(chat, env, [first, *answers])
    [traj] = rollout.run(env.tasks("test"))
    kinds = [kind for kind, _, _ in traj.spans]
    assert kinds == ["prompt", "model", "observation", "model", "user", "model", "user", "model"]
    assert traj.user_messages == ["Thanks. Now check home.", "Great, that is all."]
    for kind, a, b in traj.spans:
        assert set(traj.loss_mask[a:b]) == ({1} if kind == "model" else {0})
    _, a, b = traj.spans[4]
    assert traj.token_ids[a:b] == chat.user_ids("Thanks. Now check home.", model_ended_turn=True)
    assert traj.turn_rewards == [0.0, 0.5, 0.5, 1.0]  # tool step, two requests answered, the last reply
    assert [i.get("request") for i in traj.infos] == [None, "Thanks. Now check home.", "Great, that is all.", "last"]
    assert (traj.stop_reason, traj.rewards, traj.episode) == ("no_tool_call", {"filed": 1.0}, None)


def test_calls_that_depend_on_each_other_run_in_order_when_the_episode_says_so(chat):
    first = calls(chat, ("cd", {"folder": "docs"}), ("mv", {"name": "notes.txt"}))
    results = {}
    for ordered in (True, False):
        env = ShelfEnv(ordered=ordered, requests=())
        [traj] = rollout_for(chat, env, [first, turn(chat, "<answer>ok</answer>")]).run(env.tasks("test"))
        results[ordered] = ([r.content for r in traj.results], traj.rewards["filed"])
    assert results[True] == (["in docs", "moved notes.txt to docs"], 1.0)
    assert results[False] == (["in docs", "moved notes.txt to home"], 0.0)  # mv ran before cd finished


def test_an_episode_offers_its_own_tools_only_and_can_add_one_later(chat, tokenizer):
    class Later(ShelfEpisode):
        async def reply(self, text):
            if "check" not in self.offered:

                def check() -> str:
                    """Say what is in docs."""
                    return ", ".join(self.shelf.files["docs"]) or "empty"

                self.offer(tool_from_function(check))
                return StepResult(user_message="You can now call check. Use it.")
            return StepResult(done=True)

    class LaterEnv(ShelfEnv):
        def reset(self, task):
            return Later(task, self.messages(task), True, ())

    env = LaterEnv()
    turns = [
        calls(chat, ("shared_only", {})),
        calls(chat, ("cd", {"folder": "docs"}), ("mv", {"name": "notes.txt"})),
        turn(chat, "done"),
        calls(chat, ("check", {})),
        turn(chat, "<answer>notes.txt</answer>"),
    ]
    rollout = rollout_for(chat, env, turns)
    [traj] = rollout.run(env.tasks("test"))
    prompt = tokenizer.decode(traj.token_ids[: traj.prompt_length])
    assert '"name": "cd"' in prompt and "shared_only" not in prompt  # the episode's tools, not the run's
    _, a, b = traj.spans[2]  # the parser already refuses a tool the episode does not offer
    assert "Error: unknown tool 'shared_only'; available tools: cd, mv" in tokenizer.decode(traj.token_ids[a:b])
    assert [r.call.name for r in traj.results] == ["cd", "mv", "check"]
    # a well-formed call of a tool not offered is a failed call, not a format error (issue 77 item 4): it counts in
    # tool_calls and tool_errors (the UI's badge and "tool errors" filter read them), as the executor counts one
    assert (traj.num_format_errors, traj.num_tool_calls, traj.num_tool_errors) == (0, 4, 1)
    assert rollout.executor.metrics["errors_unknown_tool"] == 1
    assert traj.results[-1].content == "notes.txt" and traj.stop_reason == "answer"
    # And the executor too: an episode's step never falls through to the run's tool of that name.
    episode = env.reset(env.tasks("test")[0])
    step = asyncio.run(episode.step([ToolCall("shared_only", {})], ToolExecutor(env.tools())))
    assert step.observations[0].outcome == "unknown_tool"


def test_a_failing_user_ends_its_trajectory_with_a_counted_stop_reason(chat):
    env = ShelfEnv(requests=("FAIL",))
    [traj] = rollout_for(chat, env, [turn(chat, "<answer>hi</answer>")]).run(env.tasks("test"))
    assert traj.stop_reason == "user_failed" and "endpoint is down" in traj.infos[-1]["user_error"]


def test_an_environment_with_malformed_messages_gets_one_line_naming_it(chat):
    class Broken(ShelfEnv):
        def messages(self, task):
            return [{"role": "user", "text": task.question}]

    with pytest.raises(ConfigError, match=r"^env shelf: reset\('t'\)\.messages must be a list of"):
        rollout_for(chat, Broken(), [turn(chat, "x")]).run(Broken().tasks("test"))
