"""The multi-turn loop on a scripted engine: exact ids, loss mask and log-probs, turn by turn."""

import asyncio
import json

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.parsers import get_parser
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.engine import Engine, Sampled
from toolrl.tools import ToolExecutor


class ScriptedEngine(Engine):
    """Plays back fixed token ids per trajectory (in order of first request) and turn; records what the loop
    feeds back after each turn (the tokens past what the engine last returned)."""

    def __init__(self, turns):
        self.turns, self.fed, self.rows, self.seen = turns, {}, {}, {}
        self.released = 0

    async def generate(self, seq, tokens, params):
        row = self.rows.setdefault(seq, len(self.rows))
        if seq in self.seen:
            self.fed.setdefault(row, []).append(list(tokens[self.seen[seq] :]))
        turn = len(self.fed.get(row, []))
        ids = self.turns[row][turn][: params.max_new_tokens]
        self.seen[seq] = len(tokens) + len(ids)
        await asyncio.sleep(0)
        return Sampled(ids, [-0.5 - 0.01 * i for i in range(len(ids))], ended=ids[-1] == 2)

    def release(self, seq):
        self.released += 1


def make_rollout(chat, turns, **limits):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 2}))
    engine = ScriptedEngine(turns)
    defaults = {"max_turns": 3, "max_new_tokens": 64, "max_response_tokens": 400, "max_observation_tokens": 50}
    limits = RolloutLimits(**{**defaults, **limits})
    return env, engine, Rollout(env, engine, chat, get_parser("hermes"), ToolExecutor(env.tools()), limits)


def call_ids(chat, expression):
    text = (
        "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "\n</tool_call>"
    )
    return chat.encode(text) + [chat.end_of_turn_id]


def test_two_turn_trajectory_ids_mask_and_logprobs(chat):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 2}))
    task = env.tasks("test")[0]
    first = call_ids(chat, task.meta["expression"])
    second = chat.encode(f"<answer>{task.answer}</answer>") + [chat.end_of_turn_id]
    env, engine, rollout = make_rollout(chat, [[first, second]])
    [traj] = rollout.run([task])

    prompt = rollout.prompt_ids(task)
    observation = chat.observation_ids([task.answer], model_ended_turn=True)
    assert traj.token_ids == prompt + first + observation + second
    assert engine.fed[0] == [observation]  # exactly the ids trained on were fed to the model
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(first) + [0] * len(observation) + [1] * len(second)
    assert traj.trained_logprobs[: len(first)] == [-0.5 - 0.01 * i for i in range(len(first))]
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
    assert [kind for kind, _, _ in traj.spans] == ["prompt", "model", "observation", "model"]
    assert (traj.stop_reason, traj.num_tool_calls, traj.num_turns) == ("answer", 1, 2)
    assert traj.rewards == {"correct": 1.0, "format": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}


def test_malformed_call_gets_a_format_error_observation_and_the_rollout_goes_on(chat, tokenizer):
    bad = chat.encode('<tool_call>{"name": "calculator", "arguments": {</tool_call>') + [chat.end_of_turn_id]
    answer = chat.encode("<answer>1</answer>") + [chat.end_of_turn_id]
    env, engine, rollout = make_rollout(chat, [[bad, answer]])
    [traj] = rollout.run(env.tasks("test")[:1])
    fed = tokenizer.decode(engine.fed[0][0])
    assert fed.startswith("\n<|im_start|>tool\nError: tool call is not valid JSON")
    assert (traj.num_format_errors, traj.num_tool_calls, traj.stop_reason) == (1, 0, "answer")
    assert traj.rewards["format"] == 0.0


def test_stop_reasons_no_tool_call_max_turns_and_length(chat):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 3}))
    tasks = env.tasks("test")
    chatter = chat.encode("I think it is big.") + [chat.end_of_turn_id]
    call = call_ids(chat, "1 + 1")
    long_call = call_ids(chat, " + ".join(["1"] * 30))
    turns = [[chatter], [call, call], [long_call]]
    limits = {"max_turns": 2, "max_new_tokens": 200, "max_response_tokens": len(long_call) + 5}
    _, _, rollout = make_rollout(chat, turns, **limits)
    no_call, max_turns, length = rollout.run(tasks)
    assert no_call.stop_reason == "no_tool_call" and no_call.num_turns == 1
    assert max_turns.stop_reason == "max_turns" and max_turns.num_turns == 2
    assert length.stop_reason == "length" and length.truncated
    assert length.response_length <= len(long_call) + 5


def test_turn_cut_by_token_limit_gets_end_of_turn_in_the_masked_observation(chat):
    call = call_ids(chat, "2 * 3")[:-1]  # no end-of-turn token: the model ran out of tokens after the call
    answer = chat.encode("<answer>6</answer>") + [chat.end_of_turn_id]
    env, _, rollout = make_rollout(chat, [[call, answer]])
    [traj] = rollout.run(env.tasks("test")[:1])
    obs_start = len(rollout.prompt_ids(traj.task)) + len(call)
    assert traj.token_ids[obs_start] == chat.end_of_turn_id and traj.loss_mask[obs_start] == 0


def test_tool_faults_are_counted_apart_from_the_models_mistakes(chat):
    """A timed-out call is an infrastructure fault of the trajectory; a call with bad arguments is the model's."""
    from toolrl.tools import tool_from_function

    async def calculator(expression: str) -> str:
        if expression == "hang":
            await asyncio.sleep(30)
        return "4"

    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 2}))
    task = env.tasks("test")[0]
    answer = chat.encode("<answer>4</answer>") + [chat.end_of_turn_id]
    bad_arguments = chat.encode('<tool_call>\n{"name": "calculator", "arguments": {"x": 1}}\n</tool_call>')
    turns = [[call_ids(chat, "hang"), answer], [bad_arguments + [chat.end_of_turn_id], answer]]
    engine = ScriptedEngine(turns)
    limits = RolloutLimits(max_turns=3, max_new_tokens=64, max_response_tokens=400, max_observation_tokens=50)
    executor = ToolExecutor([tool_from_function(calculator)], timeout_s=0.2)
    rollout = Rollout(env, engine, chat, get_parser("hermes"), executor, limits)
    faulted, mistaken = rollout.run([task, task])
    assert (faulted.num_tool_errors, faulted.num_tool_faults) == (1, 1)
    assert faulted.results[0].outcome == "timeout"
    assert (mistaken.num_tool_errors, mistaken.num_tool_faults) == (1, 0)
    assert mistaken.results[0].outcome == "invalid_arguments"
    assert (executor.metrics["infra_faults"], executor.metrics["model_errors"]) == (1, 1)


def test_calls_past_the_cap_of_a_turn_are_told_to_the_model_and_counted(chat, tokenizer):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 2}))
    task = env.tasks("test")[0]
    calls = "\n".join(
        "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": e}}) + "</tool_call>"
        for e in ["1+1", "2+2", "3+3"]
    )
    turn = chat.encode(calls) + [chat.end_of_turn_id]
    answer = chat.encode("<answer>1</answer>") + [chat.end_of_turn_id]
    env, engine, rollout = make_rollout(chat, [[turn, answer]], max_calls_per_turn=2, max_new_tokens=300)
    [traj] = rollout.run([task])
    fed = tokenizer.decode(engine.fed[0][0])
    assert "Error: at most 2 tool calls per turn; 1 calls after the first 2 were not run" in fed
    assert (traj.num_tool_calls, traj.num_format_errors) == (2, 1)
