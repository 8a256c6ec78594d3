"""Tools and rewards see real values: a pydantic model, a dataclass or a dict holding them becomes JSON text
(never a repr) and reaches rewards as the object itself (in-process tools) or as its decoded JSON (a worker
process); tool_from_function takes a name, description and JSON schema of the caller's, and can leave argument
checks to the function; an environment whose episodes bring their tools needs no tools()."""

import asyncio
import json

import pytest

from tests.fixtures.typed_tools import Booking, Flight, book, find_flight
from toolrl.config import load_config
from toolrl.envs import Environment, Episode, Task, make_env, register_env
from toolrl.errors import ToolError
from toolrl.rewards import Criterion, Rubric
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.scripted import scripted_engine
from toolrl.tools import ToolCall, ToolExecutor, tool_from_function


def run(tool, arguments):
    executor = ToolExecutor([tool])
    try:
        return asyncio.run(executor.invoke(ToolCall(tool.name, arguments)))
    finally:
        executor.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_typed_values_are_json_text_and_reach_rewards_as_values(isolation):
    found = run(tool_from_function(find_flight, isolation=isolation), {"number": "TR1"})
    assert json.loads(found.content) == {"number": "TR1", "seats": 3, "day": "2026-11-25"}
    booked = run(tool_from_function(book, isolation=isolation), {"number": "TR1", "passenger": "Ada"})
    assert json.loads(booked.content) == {
        "booking": {"flight": {"number": "TR1", "seats": 3, "day": "2026-11-25"}, "passengers": ["Ada"]},
        "tags": ["new"],
    }
    assert "Flight(" not in booked.content and "Booking(" not in booked.content
    if isolation == "thread":  # the object itself
        assert isinstance(found.value, Flight) and isinstance(booked.value["booking"], Booking)
    else:  # only text crossed the process boundary: what it decodes to
        assert found.value == json.loads(found.content) and booked.value == json.loads(booked.content)
    failed = run(tool_from_function(find_flight, isolation=isolation), {"number": 7})
    assert failed.error and failed.value is None


def test_name_description_and_schema_of_ones_own():
    def lookup(flight_no, cabin="economy"):  # no type hints: the benchmark's schema describes it
        return {"flight": flight_no, "cabin": cabin}

    schema = {
        "type": "object",
        "properties": {
            "flight_no": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"},
            "cabin": {"enum": ["economy", "business"]},
        },
        "required": ["flight_no"],
    }  # fmt: skip
    tool = tool_from_function(lookup, name="get_flight", description="Get a flight.", parameters=schema)
    assert tool.to_openai()["function"] == {"name": "get_flight", "description": "Get a flight.", "parameters": schema}
    assert run(tool, {"flight_no": "TR12"}).value == {"flight": "TR12", "cabin": "economy"}
    bad = run(tool, {"flight_no": "tr", "cabin": "first"})
    assert bad.outcome == "invalid_arguments" and "flight_no" in bad.content and "cabin" in bad.content

    def typed(count: int) -> int:
        """Count."""
        return count

    unchecked = tool_from_function(typed, validate=False)  # the benchmark checks its arguments itself
    assert run(unchecked, {"count": "3"}).value == "3"  # as the model wrote it, not coerced
    assert run(tool_from_function(typed), {"count": "3"}).value == 3
    loose = tool_from_function(lookup, parameters=schema, validate=False)
    assert run(loose, {"flight_no": "anything"}).outcome == "ok"
    assert run(loose, {"nope": 1}).outcome == "tool_error"  # the function's own TypeError is the call's error


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parameters": ["flight_no"]}, r"^tool lookup: parameters is a JSON schema object"),
        ({"parameters": {"type": "array"}}, r"^tool lookup: parameters is a JSON schema object"),
        ({"parameters": {"properties": {"x": {"type": "nonsense"}}}}, r"^tool lookup: parameters: not a valid JSON"),
        ({"parameters": {"properties": {"db": {}}}, "inject": {"db": None}}, r"^tool lookup: parameters names 'db'"),
        ({}, r"^tool lookup: parameter 'flight_no' needs a type hint \(or give the tool's JSON schema"),
    ],
)  # fmt: skip
def test_a_schema_of_ones_own_that_cannot_work_is_one_line(kwargs, message):
    def lookup(flight_no, db=None):
        return flight_no

    with pytest.raises(ToolError, match=message):
        tool_from_function(lookup, **kwargs)


def booked_for_ada(trajectory, task) -> float:
    """A reward on the value: the booking object the tool returned, not its text."""
    values = [r.value for r in trajectory.results if not r.error]
    return float(any(isinstance(v, dict) and v["booking"].passengers == ["Ada"] for v in values))


@register_env("booking-values")
class BookingEnv(Environment):  # no tools(): each episode brings its own
    name = "booking-values"

    def __init__(self, config, options):
        super().__init__(config, options)
        self.rubric = Rubric([Criterion("booked", booked_for_ada)], success="booked")

    def tasks(self, split):
        call = {"name": "book", "arguments": {"number": "TR1", "passenger": "Ada"}}
        return [Task("ada", "Book TR1 for Ada.", "", {"reference": [[call]]})]

    def messages(self, task):
        return [{"role": "user", "content": task.question}]

    def reset(self, task):
        return Episode(task, self.messages(task), [tool_from_function(book, isolation="thread")])


def test_a_reward_reads_the_value_a_tool_returned_in_an_environment_without_tools(chat):
    env = make_env(load_config(overrides=["env.name=booking-values"]).env)
    assert env.tools() == []
    rollout = Rollout(env, scripted_engine("reference", chat, env.syntax, env), chat, env.syntax, ToolExecutor([]),
                      RolloutLimits(4, 128, 1000, 200))  # fmt: skip
    (traj,) = rollout.run(env.tasks("test"))
    assert traj.rewards["booked"] == 1.0
    assert json.loads(traj.results[0].content)["booking"]["passengers"] == ["Ada"]


def test_hostile_tool_values_become_text_not_a_crash():
    from toolrl.text import from_text, to_text

    deep, long_number = "[" * 100_000 + "]" * 100_000, "7" * 5000  # past the recursion and digit limits
    assert from_text(deep) == deep and from_text(long_number) == long_number  # kept as the text it was
    loop: dict = {"name": "me"}
    loop["self"] = loop  # a value that holds itself
    assert to_text(loop).startswith("{'name': 'me'")  # its str(), not an exception

    class Opaque:
        def __str__(self):
            return "opaque thing"

    assert json.loads(to_text({"thing": Opaque(), "when": {1, 2}})) == {"thing": "opaque thing", "when": [1, 2]}


def test_an_injected_parameter_is_filled_hidden_and_cannot_be_overridden_by_the_model():
    """docs/tools.md, `inject` (issue 77 item 5): the parameter is out of the schema, filled on every call, and a
    call that names it is the model's invalid-arguments error, never a way to swap the state."""
    from toolrl.tools import ToolCall, ToolExecutor, tool_from_function

    def lookup(key: str, db: dict) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return str(db.get(key))

    tool = tool_from_function(lookup, inject={"db": {"a": 1}})
    assert list(tool.parameters["properties"]) == ["key"]
    executor = ToolExecutor([tool])
    assert asyncio.run(executor.invoke(ToolCall("lookup", {"key": "a"}))).content == "1"
    swapped = asyncio.run(executor.invoke(ToolCall("lookup", {"key": "a", "db": {"a": 2}})))
    assert swapped.outcome == "invalid_arguments" and "db: not a parameter" in swapped.content
