"""A simulated user shaped by config alone (issue 51, item 3): its whole system prompt (a template with the
scenario and the benchmark's guidelines as fields), the stop markers and the outcome each ends a conversation
with (`user_ended`, its outcome in the step's info and the `user_outcome/NAME` metric), its model and sampling.
A tau-bench-style user written in a YAML file plays the shipped `support` environment; no `User` subclass."""

import asyncio

import pytest

from tests.envs.test_support import play
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.support.env import SUPPORT_USER
from toolrl.envs.users import Scenario, SimulatedUser, Transcript, UserPrompt
from toolrl.errors import ConfigError
from toolrl.tools.model import Completion
from toolrl.train.evaluate import summarize

TAU_STYLE = """\
env:
  name: support
  options:
    num_test: 24
    user: simulated
    user_model: {base_url: "http://127.0.0.1:9/v1", model: user-sim, temperature: 1.0, max_tokens: 128}
    user_prompt:
      template: |
        You are a user interacting with an agent.

        Instruction: {instructions}

        {guidelines}
        {stop_rules}
      guidelines: |
        Rules:
        - Just generate one line at a time to simulate the user's message.
        - Do not give away all the instruction at once.
      stop:
        "###STOP###": done
        "###TRANSFER###": transfer
        "###OUT-OF-SCOPE###": out_of_scope
      opening: "Hello, this is the help desk."
"""


class Ending:
    """A user model that opens with its errand, then ends the conversation with `marker`."""

    def __init__(self, marker):
        self.marker, self.seen = marker, []

    def complete(self, messages, seed=None):
        self.seen.append(messages)
        if sum(m["role"] == "user" for m in messages) == 1:
            return Completion("I need help with an order.", 50, 8)
        return Completion(f"Fine, I will wait. {self.marker}", 60, 6)


def test_a_tau_bench_style_user_written_in_config_only_plays_support(tmp_path, chat):
    path = tmp_path / "tau.yaml"
    path.write_text(TAU_STYLE)
    env = make_env(load_config(path).env)
    prompt, backend = env.user.prompt, env.options.user_model
    assert (backend.temperature, backend.max_tokens, backend.model) == (1.0, 128, "user-sim")  # model and sampling
    assert prompt.stop == {"###STOP###": "done", "###TRANSFER###": "transfer", "###OUT-OF-SCOPE###": "out_of_scope"}
    model = Ending("###TRANSFER###")
    env.user = SimulatedUser(model, prompt)  # the configured user, its endpoint stood in for
    tasks = env.tasks("test")[:3]
    trajs = play(env, chat, tasks=tasks, seed=1)
    system = model.seen[0][0]["content"]
    assert system.startswith("You are a user interacting with an agent.\n\nInstruction: ")
    assert tasks[0].meta["instructions"].strip() in system and "- Do not give away all the instruction" in system
    assert "- To end the conversation as out_of_scope, write ###OUT-OF-SCOPE### and nothing else." in system
    assert model.seen[0][1] == {"role": "user", "content": "Hello, this is the help desk."}  # its opening line
    assert all(t.stop_reason == "user_ended" and t.infos[-1]["user_outcome"] == "transfer" for t in trajs)
    stats = summarize(trajs, "correct")
    assert stats["stop/user_ended"] == 1.0 and stats["user_outcome/transfer"] == 1.0
    prompt_text = chat.tokenizer.decode(trajs[0].token_ids)
    assert "###TRANSFER###" not in prompt_text  # the marker is taken out of what the agent hears


@pytest.mark.parametrize(
    ("reply", "text", "outcome"),
    [
        ("All good, thanks! ###STOP###", "All good, thanks!", "done"),
        ("###TRANSFER###", "", "transfer"),
        ("I don't know that. ###OUT-OF-SCOPE###", "I don't know that.", "out_of_scope"),
        ("###OUT-OF-SCOPE### then ###STOP###", "then", "out_of_scope"),  # the first marker written decides
        ("My order is #12.", "My order is #12.", None),
    ],
)
def test_the_support_user_ends_three_ways(reply, text, outcome):
    assert SUPPORT_USER.ending(reply) == (text, outcome)


def test_the_user_turn_says_how_it_ended():
    class Says:
        def complete(self, messages, seed=None):
            return Completion("Please hold on. ###OUT-OF-SCOPE###", 10, 4)

    said = asyncio.run(SimulatedUser(Says(), SUPPORT_USER).respond(Scenario("You want a refund."), Transcript()))
    assert (said.text, said.ended, said.outcome) == ("Please hold on.", True, "out_of_scope")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.options.user_prompt.template=Be a user.", "put {instructions} in it"),
        ("env.options.user_prompt.template='{instructions} {persona}'", "unknown field {persona}"),
        ("env.options.user_prompt.template='{instructions} {'", "write a literal brace doubled"),
        ("env.options.user_prompt.template='{instructions:>999999999}'", "takes no format spec"),
        ("env.options.user_prompt.template='{instructions.__class__}'", "unknown field {instructions.__class__}"),
        ("env.options.user_prompt.stop={'###X###': 'Hand Off'}", "outcome 'Hand Off' of '###X###'"),
        ("env.options.user_prompt.stop={' ': done}", "a stop marker is empty"),
        ("env.options.user_prompt.stop={}", "give at least one marker"),
    ],
)
def test_a_wrong_user_prompt_is_one_line_naming_its_field(override, message):
    with pytest.raises(ConfigError) as raised:
        make_env(load_config(overrides=["env.name=support", override]).env)
    said = str(raised.value)
    assert "env.options.user_prompt" in said and message in said and "\n" not in said


def test_the_default_prompt_is_the_one_before_and_lists_more_markers_after_its_rules():
    default = UserPrompt()
    assert default.system("Be Ann.").endswith("write ###STOP### and nothing else.")
    more = UserPrompt(stop={"###STOP###": "done", "###TRANSFER###": "transfer"}, guidelines="Be brief.")
    assert more.system("Be Ann.").endswith(
        "write ###STOP### and nothing else.\n- To end the conversation as transfer, write ###TRANSFER### and "
        "nothing else.\n\nBe brief."
    )
