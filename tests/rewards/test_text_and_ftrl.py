"""SQuAD normalisation and exact match, and FTRL's reward and Solve-P/R/F1 against hand-computed values."""

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.rewards.ftrl import ftrl_reward, solve_scores, solved_count
from toolrl.rewards.text import exact_match, normalize_answer, token_f1
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.call import ToolCall, ToolResult


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("A cat, an owl and THE dog.") == "cat owl and dog"
    assert exact_match(" the Beatles ", ["Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0
    # "sidney poitier" vs "poitier": precision 1/2, recall 1 -> F1 2/3
    assert token_f1("Sidney Poitier", ["Poitier", "nobody"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("p", "q", "t", "correct", "empty", "fmt", "expected"),
    [
        (3, 2, 1, True, False, False, 2 * 2 / 4 + 1 / 2),  # 1.5
        (3, 2, 1, False, False, False, 1.0),
        (1, 1, 0, True, False, False, 2 * 1 / 2 + 1.0),  # 2.0: one exact call and a right answer
        (4, 1, 0, False, False, False, 0.4),  # tool abuse is paid for
        (0, 0, 2, True, False, False, 1 / 3),  # no call: only the answer term
        (0, 0, 1, False, False, False, 0.0),
        (2, 2, 0, True, True, False, -0.5),  # empty reply
        (2, 2, 0, True, False, True, -0.3),  # format error
    ],
)
def test_ftrl_reward(p, q, t, correct, empty, fmt, expected):
    assert ftrl_reward(p, q, t, correct, empty, fmt) == pytest.approx(expected)


def test_solve_scores():
    assert solve_scores(4, 2, 2) == pytest.approx((0.5, 1.0, 2 / 3))
    assert solve_scores(0, 0, 3) == (0.0, 0.0, 0.0)


def result(name, args, content="ok", error=False):
    return ToolResult(ToolCall(name, args), content, "tool_error" if error else "ok")


def test_each_subproblem_is_solved_once_and_failed_calls_never_solve():
    subs = [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "mul", "result": "6"}]
    calls = [
        result("add", {"a": 1, "b": 2}),
        result("add", {"b": 2, "a": 1}),  # the same sub-problem again: not counted twice
        result("mul", {"x": 9}, "6", error=True),  # failed
        result("mul", {"x": 2}, " 6 "),  # result matches
    ]
    assert solved_count(calls, subs) == 2
    assert solved_count(calls[:3], subs) == 1


def test_calculator_with_ftrl_reward(chat):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1, "reward": "ftrl"}))
    task = env.tasks("test")[0]
    traj = Trajectory.start(task, [1, 2])
    traj.add_model_turn([5], [0.0], "<tool_call>...</tool_call>")
    traj.results = [
        result("calculator", {"expression": "1+1"}, "2"),
        result("calculator", {"expression": "x"}, task.answer),
    ]
    traj.num_tool_calls = 2
    traj.add_model_turn([6], [0.0], f"<answer>{task.answer}</answer>")
    total, parts = env.rubric.score(traj, task)
    # p = 2 calls, q = 1 solved (the second returned the value), t = 0 left, correct: 2/3 + 1
    assert parts["ftrl"] == pytest.approx(2 / 3 + 1) and total == pytest.approx(2 / 3 + 1)
    assert parts["solve_p"] == 0.5 and parts["solve_r"] == 1.0 and parts["solve_f1"] == pytest.approx(2 / 3)
    assert parts["correct"] == 1.0
