"""NL2SQL: a fresh database per trajectory, SQL run under a time limit, rewards by executing gold and
predicted SQL and comparing result sets."""

import asyncio

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.nl2sql.database import same_results
from toolrl.errors import DataError
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolExecutor
from toolrl.tools.call import ToolCall


def sql(query):
    return ToolCall("execute_sql", {"query": query})


@pytest.fixture(scope="module")
def env():
    return make_env(EnvConfig(name="nl2sql", options={"timeout_s": 0.5}))


def test_bundled_tasks_have_gold_sql_that_runs(env):
    assert (len(env.tasks("train")), len(env.tasks("test"))) == (30, 10)
    for task in env.tasks("train") + env.tasks("test"):
        _, rows = env._run_fresh(task.answer)
        assert rows, task.question
    assert "CREATE TABLE customers" in env.messages(env.tasks("test")[0])[0]["content"]


def test_each_trajectory_has_its_own_database(env):
    executor = ToolExecutor(env.tools())
    task = env.tasks("test")[0]
    first, second = env.reset(task), env.reset(task)
    try:
        step = asyncio.run(first.step([sql("DELETE FROM customers"), sql("SELECT COUNT(*) FROM customers")], executor))
        # the two calls of a turn run concurrently; the count is 0 or 10 depending on order, the delete is real
        after = asyncio.run(first.step([sql("SELECT COUNT(*) FROM customers")], executor))
        assert after.observations[0].content == "COUNT(*)\n0"
        other = asyncio.run(second.step([sql("SELECT COUNT(*) FROM customers")], executor))
        assert other.observations[0].content == "COUNT(*)\n10"  # untouched by the first trajectory
        assert not step.observations[0].error
    finally:
        first.close()
        second.close()
    assert env._run_fresh("SELECT COUNT(*) FROM customers")[1] == [(10,)]


def test_errors_timeouts_and_process_reward(env):
    executor = ToolExecutor(env.tools())
    episode = env.reset(env.tasks("test")[0])
    try:
        slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
        step = asyncio.run(episode.step([sql("SELEC 1"), sql(slow), sql("SELECT name FROM customers")], executor))
        contents = [r.content for r in step.observations]
        assert contents[0] == 'Error: execute_sql failed: SQL error: OperationalError: near "SELEC": syntax error'
        assert contents[1] == "Error: execute_sql failed: SQL error: the query ran longer than 0.5 s and was stopped"
        assert contents[2].startswith("name\nAda\nBruno")
        assert step.reward == pytest.approx(-0.2)  # -0.1 per failed query
    finally:
        episode.close()


def test_rows_are_capped():
    env = make_env(EnvConfig(name="nl2sql", options={"max_rows": 3}))
    episode = env.reset(env.tasks("test")[0])
    out = asyncio.run(episode.step([sql("SELECT product_id FROM order_items")], ToolExecutor(env.tools())))  # 28 rows
    assert out.observations[0].content.splitlines()[-1] == "... 25 more rows"
    episode.close()


def answered(task, text):
    traj = Trajectory.start(task, [1])
    traj.add_model_turn([2], [0.0], text)
    return traj


def test_reward_compares_result_sets(env):
    task = next(
        t
        for t in env.tasks("train") + env.tasks("test")
        if t.question.startswith("List the names of the customers who live in London")
    )
    scores = lambda text: env.rubric.score(answered(task, text), task)[1]  # noqa: E731
    right = scores("<answer>SELECT name FROM customers WHERE city = 'London' ORDER BY name DESC</answer>")
    assert right["correct"] == 1.0 and right["executes"] == 1.0  # same rows, any order (gold has no ORDER BY)
    fenced = scores("<answer>```sql\nSELECT name FROM customers WHERE city='London'\n```</answer>")
    assert fenced["correct"] == 1.0
    wrong = scores("<answer>SELECT name FROM customers</answer>")
    assert wrong["correct"] == 0.0 and wrong["executes"] == 1.0
    broken = scores("<answer>SELECT nme FROM customers</answer>")
    assert broken["correct"] == 0.0 and broken["executes"] == 0.0
    assert scores("no answer")["correct"] == 0.0


def test_same_results_order_and_floats():
    assert same_results([(1,), (2,)], [(2,), (1,)], ordered=False)
    assert not same_results([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert same_results([(0.1 + 0.2,)], [(0.3,)], ordered=True)
    assert not same_results([(1,), (1,)], [(1,)], ordered=False)  # multisets, not sets


def test_user_database_script_and_bad_database(tmp_path):
    script = tmp_path / "db.sql"
    script.write_text("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2);")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "Sum of x?", "answer": "SELECT SUM(x) FROM t"}\n')
    env = make_env(
        EnvConfig(name="nl2sql", train_file=str(tasks), test_file=str(tasks), options={"database": str(script)})
    )
    assert env.tasks("test")[0].answer == "SELECT SUM(x) FROM t"
    assert len(env.messages(env.tasks("test")[0])) == 2  # no in-context example on a user's database
    with pytest.raises(DataError, match=r"env\.options\.database: .*missing\.db not found"):
        make_env(EnvConfig(name="nl2sql", options={"database": str(tmp_path / "missing.db")}))
    (tmp_path / "bad.sql").write_text("CREATE TABLE (;")
    with pytest.raises(DataError, match="is not a usable sqlite database or script"):
        make_env(EnvConfig(name="nl2sql", options={"database": str(tmp_path / "bad.sql")}))
