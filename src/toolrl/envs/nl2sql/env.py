"""NL2SQL environment: the model explores a sqlite database with an `execute_sql` tool and answers with SQL.

Every trajectory gets a fresh in-memory copy of the database (closed at its end), so a model that writes
(`DELETE`, `DROP`) harms nobody else. The reward verifies with the environment's own tool: the final SQL and
the gold SQL run on a fresh copy, and their result sets are compared (in order only when the gold query
has ORDER BY). Tasks: 40 bundled questions on a small shop (10 test, 30 train), or `env.train_file` /
`env.test_file` with the gold SQL as each task's answer and `env.options.database` as the database.
"""

from __future__ import annotations

import json
import re
import sqlite3
from importlib import resources

from pydantic import Field

from toolrl.envs.base import Environment, EnvOptions, Episode, Task, final_answer, register_env, tool_call_example
from toolrl.envs.nl2sql.database import Database, format_rows, load_template, same_results, schema_text
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.envs.tasks import TaskSplits, task_from_record
from toolrl.rewards.rubric import Criterion, Rubric, process_reward
from toolrl.rewards.rules import common_criteria
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import tool_from_function
from toolrl.tools.limits import ToolFailed

SYSTEM = (
    "You answer questions about a sqlite database by writing SQL. Use the execute_sql tool to run a query and "
    "see its rows. When the query is right, reply with it as <answer>SQL</answer>.\n\nThe database schema:\n{schema}"
)
EXAMPLES = (
    ("How many products cost more than 100?", "SELECT COUNT(*) FROM products WHERE price > 100"),
    ("What is the name of the cheapest product?", "SELECT name FROM products ORDER BY price LIMIT 1"),
)
"""In-context exchanges on the bundled database (as for the calculator, the default model needs two)."""
FAILED_QUERY_PENALTY = -0.1
_FENCE = re.compile(r"^```(?:sql)?\s*|\s*```$", re.IGNORECASE)


def execute_sql(query: str, db: Database) -> str:
    """Run one SQL query on the database and return its rows.

    Args:
        query: A single SQL statement, for example SELECT name FROM customers.
    """
    if db is None:
        raise RuntimeError("execute_sql runs inside an episode")
    try:
        return format_rows(*db.run(query), db.max_rows)
    except sqlite3.Error as exc:
        if str(exc) == "interrupted":
            raise ToolFailed(f"SQL error: the query ran longer than {db.timeout_s:g} s and was stopped") from None
        raise ToolFailed(f"SQL error: {type(exc).__name__}: {exc}") from None


def answer_sql(text: str) -> str | None:
    answer = final_answer(text)
    return _FENCE.sub("", answer).strip() if answer else None


def _bundled_tasks() -> dict[str, list[Task]]:
    lines = (resources.files("toolrl.envs.nl2sql") / "data" / "tasks.jsonl").read_text(encoding="utf-8")
    splits: dict[str, list[Task]] = {"train": [], "test": []}
    for row, line in enumerate(lines.splitlines()):
        record = json.loads(line)
        splits[record["split"]].append(task_from_record(record, row, "nl2sql tasks"))
    return splits


class SQLOptions(EnvOptions):
    database: str | None = None
    """A sqlite file, or a .sql script that builds one; unset: the bundled shop database."""
    max_rows: int = Field(20, ge=1)
    """Rows shown to the model per query."""
    timeout_s: float = Field(2.0, gt=0)
    """A query running longer is interrupted."""


class SQLEpisode(Episode):
    def __init__(self, task: Task, messages, db: Database):
        super().__init__(task, messages, [tool_from_function(execute_sql, inject={"db": db})])
        self.db = db

    def process_reward(self, results: list[ToolResult]) -> float:
        """-0.1 for each query that failed (logged as reward/process; weight it to train on it)."""
        return FAILED_QUERY_PENALTY * sum(r.error for r in results)

    def close(self) -> None:
        self.db.close()


@register_env("nl2sql")
class NL2SQLEnv(Environment):
    name = "nl2sql"

    Options = SQLOptions

    def __init__(self, config, options: SQLOptions):
        super().__init__(config, options)
        self.template = load_template(options.database)
        self.schema = schema_text(self.template)
        own = _bundled_tasks() if options.database is None else {}
        self.splits = TaskSplits(config, own)
        self._example_results = self._example_results_of() if options.database is None else []
        self.rubric = Rubric(
            [
                Criterion("correct", self.verify, 1.0),
                Criterion("executes", self.executes, 0.0),
                Criterion("process", process_reward, 0.0),
                *common_criteria(),
            ],
            success="correct",
        )

    def tools(self):
        return [tool_from_function(execute_sql, inject={"db": None})]

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def _example_results_of(self) -> list[tuple[str, str, str]]:
        """(question, SQL, rows) of the in-context exchanges on the bundled database (a user's own database
        gets none); run once."""
        return [(q, sql, format_rows(*self._run_fresh(sql), self.options.max_rows)) for q, sql in EXAMPLES]

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """Run the gold query, then answer with it."""
        return answered(task.answer, ToolCall("execute_sql", {"query": task.answer}))

    def messages(self, task: Task) -> list[dict[str, str]]:
        system = {"role": "system", "content": SYSTEM.format(schema=self.schema)}
        examples = []
        for question, sql, rows in self._example_results:  # written in the run's call syntax
            examples += tool_call_example(question, "execute_sql", {"query": sql}, rows, sql, self.syntax)
        return [system, *examples, {"role": "user", "content": task.question}]

    def reset(self, task: Task) -> SQLEpisode:
        db = Database(self.template, self.options.timeout_s, self.options.max_rows)
        return SQLEpisode(task, self.messages(task), db)

    def _run_fresh(self, query: str):
        db = Database(self.template, self.options.timeout_s, self.options.max_rows)
        try:
            return db.run(query)
        finally:
            db.close()

    def executes(self, trajectory, task: Task) -> float:
        sql = answer_sql(trajectory.final_text)
        if not sql:
            return 0.0
        try:
            self._run_fresh(sql)
            return 1.0
        except sqlite3.Error:
            return 0.0

    def verify(self, trajectory, task: Task) -> float:
        """Tool verification: the answered SQL and the gold SQL give the same result set on a fresh copy."""
        sql = answer_sql(trajectory.final_text)
        if not sql:
            return 0.0
        try:
            _, predicted = self._run_fresh(sql)
        except sqlite3.Error:
            return 0.0
        _, gold = self._run_fresh(task.answer)
        return float(same_results(predicted, gold, ordered="order by" in task.answer.lower()))
