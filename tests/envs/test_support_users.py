"""The support environment's user played by the policy (`env.options.user: policy`): a task's samples are seated in
pairs, an agent (role `agent`) and its user (role `user`), each a trajectory of its own; the user seat is shown its
scenario and the agent's replies, the agent only the user's messages; the user is scored on its agreement with the
scenario (the errand done, nothing made up); a user seat that stops, goes silent or makes up an id ends the
conversation as it should; an odd sample out talks with the scripted user; lock-step scheduling is refused in one
line; and `toolrl train` trains both roles from the command line."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.gateway.policies import RulePolicy, call, last_message
from tests.harness.cli_train import train_steps
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.seated_user import Conversation, UserSeat
from toolrl.envs.support.env import SUPPORT_USER, told
from toolrl.envs.users import Scenario, Transcript
from toolrl.errors import ConfigError
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.tools import ToolExecutor

ROOT = Path(__file__).parents[2]


def policy_users(*overrides):
    return make_env(load_config(overrides=["env.name=support", "env.options.user=policy", *overrides]).env)


def cancels(env, n=2):
    return [t for t in env.tasks("test") if t.meta["intent"] == "cancel"][:n]


def scenario(context: str) -> tuple[str, str, str]:
    """The email, zip and order of the scenario a user seat is shown."""
    found = re.search(r"Your email is (\S+) and your zip code is (\d+)\..*cancel order (O\d+)", context, re.S)
    return found.group(1), found.group(2), found.group(3)


def player(user_says=None):
    """A rule for both roles: the user asks for its cancellation, then thanks and stops once the refund is said;
    the agent identifies the customer, cancels and says the refund (`user_says` overrides the user's opening)."""

    def rule(context: str, params) -> str:
        role, text = last_message(context)
        if "You are playing a user" in context:
            if text.startswith("Hi! How can I help you today?"):
                email, zip_code, order = scenario(context)
                return (user_says or "Please cancel order {order}; my email is {email}, zip {zip}.").format(
                    order=order, email=email, zip=zip_code
                )
            return "Thanks! ###STOP###" if "refund" in text else "Please go on."
        if role == "user":
            ids = re.search(r"email is (\S+), zip (\d+)", text)
            return call("find_customer", email=ids.group(1), zip=ids.group(2)) if ids else "How can I help?"
        if text.startswith("customer "):
            order = re.search(r"cancel (?:my )?order (O\d+)", context).group(1)
            return call("cancel_order", order_id=order)
        refund = re.search(r"refund ([\d.]+)", text)
        return f"Done. Your refund is {refund.group(1)}." if refund else "I could not do that."

    return rule


def rollout(chat, env, rule, schedule="async"):
    limits = RolloutLimits(6, 256, 6000, 400)
    return Rollout(env, RulePolicy(chat, rule), chat, env.syntax, ToolExecutor([]), limits, schedule)


def test_the_policy_plays_the_user_as_a_trajectory_of_its_own_scored_on_its_scenario(chat):
    env = policy_users()
    task = cancels(env, 1)[0]
    agent, user = rollout(chat, env, player()).run([task] * 2, seed=0)
    assert (agent.role, user.role) == ("agent", "user")
    assert agent.rewards["correct"] == 1.0 and agent.stop_reason == "user_ended"
    assert (user.rewards["correct"], user.rewards["faithful"], user.stop_reason) == (1.0, 1.0, "user_ended")
    assert (user.rewards["told"], user.reward) == (1.0, 1.5)  # it gave its order, email and zip: told, weighted 0.5
    assert (agent.rewards["told"], agent.reward) == (0.0, 1.0)  # the agent's reward is its own
    agent_text, user_text = chat.tokenizer.decode(agent.token_ids), chat.tokenizer.decode(user.token_ids)
    assert task.meta["instructions"] not in agent_text  # the scenario is the user's alone
    assert task.meta["instructions"] in user_text and "Please cancel order" in agent_text
    refund = task.meta["outputs"][0]
    assert f"Done. Your refund is {refund}." in user_text  # the agent's reply is what the user seat hears
    assert "find_customer" not in user_text  # never the agent's tool calls
    assert user.num_turns == 2 and agent.num_tool_calls == 2


def test_a_user_that_makes_up_an_id_or_goes_silent_is_scored_and_ends_the_conversation(chat):
    env = policy_users()
    tasks = cancels(env, 2)
    made_up = "Please cancel order {order}; my email is {email}, zip 00000."
    agent, user = rollout(chat, env, player(made_up)).run([tasks[0]] * 2, seed=0)
    assert user.rewards["faithful"] == user.rewards["correct"] == user.rewards["told"] == 0.0  # a made-up zip: 0
    assert agent.rewards["faithful"] == 0.0  # the agent's trajectory shows what its user made up
    assert agent.rewards["correct"] == 0.0  # no such customer: nothing cancelled

    agent, user = rollout(chat, env, player(" ")).run([tasks[1]] * 2, seed=0)  # an empty message ends it
    assert (agent.stop_reason, agent.num_turns, user.stop_reason) == ("user_ended", 0, "user_ended")
    assert user.rewards["correct"] == 0.0


def test_told_is_the_share_of_the_scenarios_facts_a_user_gave_and_nothing_made_up():
    instructions = "You are Ann. Your email is ann@x.org and your zip code is 12345.\nYou want to cancel order O1002."
    assert told(["Hi, cancel O1002 please."], instructions) == pytest.approx(1 / 3)
    assert told(["I am ann@x.org, zip 12345.", "Order O1002."], instructions) == 1.0  # over all its messages
    assert told(["ann@x.org, 12345, O1002, and O1003"], instructions) == 0.0  # an order it does not have
    assert told(["Hello!"], instructions) == 0.0
    names = [[c.name for c in policy_users(f"env.options.user={u}").rubric.criteria] for u in ("policy", "scripted")]
    assert "told" in names[0] and "told" not in names[1]  # only a policy-played user is paid for it


def test_either_side_that_stops_lets_the_other_stop(chat):
    env = policy_users()
    roll = rollout(chat, env, player())
    roll.limits = RolloutLimits(2, 256, 6000, 400)  # the agent runs out of turns before it can answer
    agent, user = roll.run([cancels(env, 1)[0]] * 2, seed=0)
    assert (agent.stop_reason, agent.num_tool_calls, user.stop_reason) == ("max_turns", 1, "agent_ended")  # 2nd not run

    task = cancels(env, 1)[0]  # a user seat that stops without ending the conversation: its agent hears it left
    conversation = Conversation(Scenario(task.meta["instructions"]), SUPPORT_USER, 1.0, "test")
    UserSeat(task, conversation).finish("max_turns")
    heard = asyncio.run(conversation.respond(conversation.scenario, Transcript()))
    assert (heard.ended, heard.outcome, conversation.outcome) == (True, "user_left", "user_left")


def test_an_odd_sample_out_talks_with_the_scripted_user_and_is_counted(chat):
    env = policy_users()
    task = cancels(env, 1)[0]
    trajs = rollout(chat, env, player()).run([task] * 3, seed=0)
    assert [t.role for t in trajs] == ["agent", "user", "agent"]
    assert trajs[2].rewards["correct"] == trajs[2].rewards["faithful"] == 1.0  # the task's question, scripted
    assert env.rubric.stats()["support/unpaired"] == 1 and env.waiting == {}
    assert env.rubric.with_weights({"faithful": 0.5}).stats()["support/unpaired"] == 1  # a config's weights keep it


def test_lockstep_cannot_seat_a_user_and_says_so(chat):
    env = policy_users("env.options.wait_s=0.2")
    with pytest.raises(ConfigError, match=r"waited 0.2 s .*rollout.schedule: async"):
        rollout(chat, env, player(), schedule="lockstep").run([cancels(env, 1)[0]] * 2, seed=0)


def test_agent_and_user_train_from_the_command_line(tmp_path, tiny_model_dir):
    """`toolrl train` with the user played by the policy: half of each step is each role, both trained."""
    steps = train_steps(tmp_path, tiny_model_dir, "env.name=support", "env.options.user=policy",
                        "train.prompts_per_step=2", "train.group_size=4", "rollout.max_new_tokens=8",
                        "rollout.max_turns=2")  # fmt: skip
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["role/agent/share"] == s["role/user/share"] == 0.5 and s.get("support/unpaired", 0) == 0
