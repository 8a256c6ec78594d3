import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.calculator.tool import evaluate
from toolrl.rollout.trajectory import Trajectory


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", "7"),
        ("(12 + 3) * 4", "60"),
        ("7 / 2", "3.5"),
        ("2 ** 10", "1024"),
        ("-3 + 10 % 4", "-1"),
        ("2^3", "8"),
    ],
)
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("x + 1", "only numbers"),
        ("(1).real", "only numbers"),
        ("[1, 2]", "only numbers"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("9 ** 9 ** 9", "exponent"),
        ("1 / 0", "division by zero"),
        ("1 +", "cannot parse"),
        ("1" * 201, "longer than"),
        ("10 ** 50", "out of range"),
    ],
)
def test_unsafe_or_unbounded_input_is_refused(expression, reason):
    with pytest.raises(ValueError, match=reason):
        evaluate(expression)


def test_tasks_are_seeded_disjoint_and_need_a_tool():
    env = make_env(EnvConfig(options={"num_train": 50, "num_test": 20}))
    again = make_env(EnvConfig(options={"num_train": 50, "num_test": 20}))
    train, test = env.tasks("train"), env.tasks("test")
    assert (len(train), len(test)) == (50, 20)
    assert [t.question for t in train] == [t.question for t in again.tasks("train")]
    assert not {t.question for t in train} & {t.question for t in test}
    for task in test:
        assert evaluate(task.meta["expression"]) == task.answer
        assert len(task.meta["expression"].split()) == 5  # three operands of up to three digits


def test_rubric_components(tokenizer):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1}))
    task = env.tasks("test")[0]
    traj = Trajectory.start(task, [1, 2])
    traj.add_model_turn([3], [-0.1], f"<answer>{task.answer}</answer>")
    traj.num_tool_calls = 1
    total, parts = env.rubric.score(traj, task)
    assert parts == {"correct": 1.0, "format": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
    assert total == pytest.approx(1.1)
    traj.num_format_errors = 1
    traj.texts[-1] = "<answer>-1</answer>"
    assert env.rubric.score(traj, task) == (0.0, {"correct": 0.0, "format": 0.0, "tool_calls": 1.0, "tool_errors": 0.0})


def test_without_in_context_examples_the_prompt_is_the_system_message_and_the_question():
    env = make_env(EnvConfig(name="calculator", options={"in_context": False}))
    task = env.tasks("test")[0]
    assert [m["role"] for m in env.messages(task)] == ["system", "user"]
    default = make_env(EnvConfig(name="calculator"))
    assert len(default.messages(task)) > 2 and default.messages(task)[-1] == env.messages(task)[-1]
