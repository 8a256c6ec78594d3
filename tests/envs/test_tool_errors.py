"""A tool's failure is something a policy can learn from: in every built-in environment, a call that fails puts the
exception's type and message into the model's observation (the tokens it reads next), and the code environment
shows the traceback's tail (the frames with their source lines, the type and message) with the exit code, the way a
Python user sees it, bounded."""

import pytest

from toolrl.build import build, load_spec
from toolrl.build.artifacts import Workspace
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import register_policy, scripted_engine
from toolrl.tools import ToolExecutor
from toolrl.tools.call import ToolCall
from toolrl.tools.executor import TOOL_ERROR_CHARS

LOUD = "for i in range(500):\n    print(str(i) * 100)\nprint(1 / 0)"

CASES = {
    # env: (the failing call, what the observation must say)
    "calculator": (ToolCall("calculator", {"expression": "7 / (3 - 3)"}), ["ValueError: division by zero"]),
    "search": (ToolCall("search", {"query": "   "}), ["ValueError: empty query"]),  # hermes: search-r1 tags parse none
    "nl2sql": (
        ToolCall("execute_sql", {"query": "SELEC name FROM t"}),
        ['OperationalError: near "SELEC": syntax error'],
    ),
    "code": (
        ToolCall("python", {"code": "def half(n):\n    return n / 0\nprint('before')\nprint(half(3))"}),
        ["exit 1", "before", 'File "main.py", line 4', "return n / 0", "ZeroDivisionError: division by zero"],
    ),
    "files": (ToolCall("cat", {"name": "no/such/file.txt"}), ["ValueError: no folder 'no/such/file.txt'"]),
    "support": (ToolCall("cancel_order", {"order_id": "W0000"}), ["ValueError: identify the customer first"]),
    "images": (
        ToolCall("crop", {"image": "task", "left": 0.5, "top": 0, "right": 0.1, "bottom": 1}),
        ["invalid arguments", "need 0 <= left < right <= 1"],
    ),
    "built": (None, ["ValueError: no ", "'Atlantis-0' is known to this tool"]),  # a reference call, key replaced
}


def unknown_key(env, task) -> ToolCall:
    """The task's first reference call with its first text argument (the key it looks up) made unknown."""
    call = env.reference(task)[0].rounds[0][0]
    key = next(k for k, v in call.arguments.items() if isinstance(v, str))
    return ToolCall(call.name, {**call.arguments, key: "Atlantis-0"})


PLAYING: dict[str, ToolCall] = {}


@register_policy("fails-once")
def fails_once(env, task):
    """The failing call being tried, then a reply."""
    return [(PLAYING["call"],), "Done."]


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("built")
    build(load_spec(None, {"train_per_scenario": 1, "test_per_scenario": 1}), Workspace(folder))
    return folder


def observation(env, chat, call: ToolCall | None) -> tuple[str, str]:
    """The failed call's result as recorded, and the text of the observation tokens the model read after it."""
    task = env.tasks("test")[0]
    PLAYING["call"] = call or unknown_key(env, task)
    executor = ToolExecutor(env.tools(), timeout_s=120.0)
    rollout = Rollout(env, scripted_engine("fails-once", chat, env.syntax, env), chat, env.syntax, executor,
                      RolloutLimits(3, 128, 6000, 200))  # fmt: skip
    (traj,) = rollout.run([task], seed=0)
    executor.close()
    seen = "".join(chat.tokenizer.decode(traj.token_ids[a:b]) for kind, a, b in traj.spans if kind == "observation")
    return traj.results[0].content, seen


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_models_observation_names_the_failure(name, chat, built_dir):
    extra = [f"env.options.path={built_dir}"] if name == "built" else []
    env = make_env(
        load_config(overrides=[f"env.name={name}", *extra]).env, parser="hermes" if name == "search" else None
    )
    result, seen = observation(env, chat, CASES[name][0])
    assert result.startswith("Error: "), result
    for words in CASES[name][1]:
        assert words in result, (words, result)
        assert words in seen, (words, seen)


def test_a_long_failure_keeps_its_traceback_and_stays_bounded(chat):
    env = make_env(load_config(overrides=["env.name=code"]).env)
    result, _ = observation(env, chat, ToolCall("python", {"code": LOUD}))
    assert len(result) <= TOOL_ERROR_CHARS + 100, len(result)
    assert result.rstrip().endswith("ZeroDivisionError: division by zero"), result[-300:]
    assert "[cut]" in result and "Traceback (most recent call last)" in result  # the output gave way, not the end
