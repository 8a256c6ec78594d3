"""The `support` environment (customer service, tau-bench style) and the simulated user it is played with: the
reference scores 100% and idling 0 per errand; the tools hold the policy; the reward is the final database plus
what the user had to hear; a simulated user reads its scenario (never shown to the agent) and the whole
conversation, writes its opening message itself, ends the conversation with ###STOP###, reports its cost, and
when it fails, fails its own sample as an environment fault."""

import asyncio

import pytest

from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.support.shop import Shop
from toolrl.envs.users import STOP, SimulatedUser
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import register_policy, scripted_engine
from toolrl.tools import ToolCall, ToolExecutor
from toolrl.tools.model import Completion
from toolrl.train.evaluate import breakdown, summarize


def support(*overrides):
    return make_env(load_config(overrides=["env.name=support", "env.options.num_test=24", *overrides]).env)


def play(env, chat, policy="reference", tasks=None, seed=None):
    tasks = tasks or env.tasks("test")
    engine = scripted_engine(policy, chat, env.syntax, env)
    return Rollout(env, engine, chat, env.syntax, ToolExecutor([]), RolloutLimits(6, 128, 2000, 200)).run(tasks, seed)


def test_the_reference_scores_every_errand_and_idling_none(chat):
    env = support()
    trajs = play(env, chat)
    assert summarize(trajs, "correct")["success"] == 1.0
    by_errand = breakdown(trajs, "correct")["by_category"]
    assert set(by_errand) == {"cancel", "address", "return", "total"}, by_errand
    assert all(t.stop_reason == "user_ended" for t in trajs)  # the scripted user ends after the answer
    idle = play(env, chat, "idle")
    assert summarize(idle, "correct")["success"] == 0.0


@register_policy("support-careless")
def careless(env, task):
    """Does the errand's action without identifying the customer, and says no amount."""
    return [(ToolCall(**task.meta["calls"][1]),), "Done."]


@register_policy("support-silent")
def silent(env, task):
    """Does everything right and never says the amount."""
    return [(ToolCall(**c),) for c in task.meta["calls"]] + ["Done."]


def test_the_tools_hold_the_policy_and_the_reward_wants_state_and_words(chat):
    env = support()
    tasks = env.tasks("test")
    careless_trajs = play(env, chat, "support-careless", tasks)
    assert all(t.rewards["correct"] == 0.0 for t in careless_trajs)
    assert all("identify the customer first" in t.results[0].content for t in careless_trajs)
    changed = [t for t in careless_trajs if t.task.meta["intent"] != "total"]
    assert all(t.rewards["db"] == 0.0 for t in changed)  # nothing changed without an identified customer
    quiet = play(env, chat, "support-silent", tasks)
    assert all(t.rewards["db"] == 1.0 for t in quiet)
    told = {t.task.meta["intent"]: t.rewards["correct"] for t in quiet}
    assert told["address"] == 1.0 and told["cancel"] == told["return"] == told["total"] == 0.0

    shop = Shop(env.db)
    customers = sorted(env.db["customers"].items())
    (_, me), (_, other) = customers[0], customers[1]
    shop.find_customer(me["email"].upper(), me["zip"])
    with pytest.raises(ValueError, match=r"no order .* of this customer"):
        shop.cancel_order(other["orders"][0])
    delivered = next(o for o in me["orders"] if env.db["orders"][o]["status"] == "delivered")
    with pytest.raises(ValueError, match="only a pending order can be cancelled"):
        shop.cancel_order(delivered)
    assert shop.db == env.db  # refusals change nothing


class UserModelStub:
    """A user model: opens with its errand, then ends the conversation; it records what it was shown."""

    def __init__(self, fail=False):
        self.seen, self.fail = [], fail

    def complete(self, messages, seed=None):
        self.seen.append(messages)
        if self.fail:
            raise ConnectionError("user model unreachable")
        heard = [m for m in messages[1:] if m["role"] == "user"]
        if len(heard) == 1:  # only the greeting: the opening message, from the scenario
            first = messages[0]["content"].split("You are ", 1)[1].split(".")[0]
            return Completion(f"Hello, I am {first} and I need help with an order.", 100, 12)
        return Completion(f"Thanks. {STOP}", 120, 5)


def test_a_simulated_user_opens_reads_everything_ends_and_costs(chat):
    env = support("env.options.user=simulated", "env.options.user_model={base_url: 'http://127.0.0.1:9/v1', model: m}")
    model = UserModelStub()
    env.user = SimulatedUser(model)
    tasks = env.tasks("test")[:4]
    trajs = play(env, chat, tasks=tasks, seed=5)
    for traj, task in zip(trajs, tasks, strict=True):
        prompt = chat.tokenizer.decode(traj.token_ids[: traj.prompt_length])
        assert "I need help with an order." in prompt  # the opening the user model wrote, the prompt's end
        assert task.meta["instructions"] not in prompt and task.meta["instructions"].split("\n")[1] not in prompt
        assert traj.stop_reason == "user_ended" and traj.rewards["correct"] == 1.0
        assert traj.rewards["faithful"] == 1.0  # its user said nothing its scenario does not give
        assert traj.user_tokens == 112 + 125 and traj.timings["user_s"] > 0
    scenario_shown = [m[0]["content"] for m in model.seen]
    assert all(any(t.meta["instructions"] in s for s in scenario_shown) for t in tasks)
    # the last message a user model read: the whole conversation from its side, the agent's answer last
    ending = next(m for m in model.seen if len(m) > 3)
    assert [m["role"] for m in ending] == ["system", "user", "assistant", "user"] and "Done." in ending[-1]["content"]
    stats = summarize(trajs, "correct")
    assert stats["user_tokens"] == 237 and stats["user_s"] > 0 and stats["stop/user_ended"] == 1.0


class MakesUpAnEmail(UserModelStub):
    def complete(self, messages, seed=None):
        done = super().complete(messages, seed)
        return Completion(done.text.replace("an order.", "an order; my email is made.up@nowhere.org."), 100, 12)


def test_a_simulated_user_that_makes_up_an_email_is_seen_on_its_agents_trajectory(chat):
    """`faithful` of an agent's trajectory is its user's: a model user that says what its scenario does not give is
    caught (weight 0: the agent's reward is not changed), so a run can watch its simulated user invent things."""
    env = support("env.options.user=simulated", "env.options.user_model={base_url: 'http://127.0.0.1:9/v1', model: m}")
    env.user = SimulatedUser(MakesUpAnEmail())
    trajs = play(env, chat, tasks=env.tasks("test")[:2], seed=5)
    assert [t.rewards["faithful"] for t in trajs] == [0.0, 0.0]
    assert [t.rewards["correct"] for t in trajs] == [1.0, 1.0] and [t.reward for t in trajs] == [1.0, 1.0]


def test_a_failing_simulated_user_fails_only_its_samples_as_environment_faults(chat):
    env = support("env.options.user=simulated", "env.options.user_model={base_url: 'http://127.0.0.1:9/v1', model: m}")
    working, failing = UserModelStub(), UserModelStub(fail=True)
    tasks = env.tasks("test")[:4]

    class Split:  # the second half of the tasks meets a user model that is down
        async def respond(self, scenario, transcript, seed=None):
            model = failing if scenario.instructions in {t.meta["instructions"] for t in tasks[2:]} else working
            return await SimulatedUser(model).respond(scenario, transcript, seed)

    env.user = Split()
    trajs = play(env, chat, tasks=tasks)
    assert [t.stop_reason for t in trajs] == ["user_ended", "user_ended", "user_failed", "user_failed"]
    assert [t.env_fault is not None for t in trajs] == [False, False, True, True]
    assert "user model unreachable" in trajs[2].env_fault and trajs[2].num_turns == 0
    assert summarize(trajs, "correct")["env_faults"] == 0.5


def test_a_user_that_ends_at_once_is_an_error_of_its_opening(chat):
    env = support("env.options.user=simulated", "env.options.user_model={base_url: 'http://127.0.0.1:9/v1', model: m}")

    class Mute:
        def complete(self, messages, seed=None):
            return Completion(STOP)

    env.user = SimulatedUser(Mute())
    (traj,) = play(env, chat, tasks=env.tasks("test")[:1])
    assert traj.stop_reason == "user_failed" and "ended the conversation before saying anything" in traj.env_fault
    assert asyncio.iscoroutinefunction(env.reset(env.tasks("test")[0]).open)


def test_the_handbook_desk_is_a_real_size_prompt_the_reference_solves_and_idling_does_not(chat):
    """`handbook: true`: a ~5k-token prompt (the policy handbook and 12 tools described as a benchmark describes
    its own), the reference still 100% and idling 0%, and the extra tools work the same database."""
    env = support("env.options.handbook=true")
    names = [t.name for t in env.tools()]
    assert len(names) == 12 and {"calculate", "think", "list_orders", "transfer_to_human_agents"} <= set(names)
    prompt = chat.prompt_ids(env.messages(env.tasks("test")[0]), [t.to_openai() for t in env.tools()])
    assert 4500 <= len(prompt) <= 5500, len(prompt)
    assert summarize(play(env, chat), "correct")["success"] == 1.0
    assert summarize(play(env, chat, "idle"), "correct")["success"] == 0.0


def test_the_desk_tools_take_data_not_code():
    """calculate reads numbers and + - * / only: names, calls, attributes, powers are an error, never run."""
    from toolrl.envs.support.desk import Desk
    from toolrl.envs.support.shop import make_database

    desk = Desk(make_database(0))
    assert desk.calculate("24.5 + 8.25 * (2 - 1)") == "32.75"
    assert desk.calculate("-3 / 4") == "-0.75"
    for hostile in ("__import__('os').system('true')", "open('/etc/passwd')", "9 ** 9 ** 9", "(1).__class__", "x"):
        with pytest.raises(ValueError, match="numbers"):
            desk.calculate(hostile)
    with pytest.raises(ValueError, match="identify the customer first"):
        desk.list_orders()
    with pytest.raises(ValueError, match="no product"):
        desk.get_product("../../etc")
    assert [p["product"] for p in desk.search_products("", max_price=10)] == ["candle", "mug"]
