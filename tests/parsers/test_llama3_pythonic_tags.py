import pytest

from toolrl.parsers import get_parser, tag_parser
from toolrl.tools import ToolCall

TOOLS = {"search", "calculator", "weather.get"}


def test_llama3_json_single_and_several_calls():
    parse = get_parser("llama3-json")
    one = parse('<|python_tag|>{"name": "search", "parameters": {"q": "x"}}', TOOLS)
    assert one.calls == [ToolCall("search", {"q": "x"})] and one.errors == []
    two = parse('{"name": "search", "parameters": {"q": "a"}}; {"name": "calculator", "parameters": {"e": "1"}}', TOOLS)
    assert [c.name for c in two.calls] == ["search", "calculator"]


def test_llama3_json_errors_and_plain_answers():
    parse = get_parser("llama3-json")
    assert "not valid JSON" in parse('{"name": "search", "parameters": {', TOOLS).errors[0]
    assert "unknown tool 'nope'" in parse('{"name": "nope", "parameters": {}}', TOOLS).errors[0]
    plain = parse("The answer is 4. A set looks like {1, 2}.", TOOLS)
    assert plain.calls == [] and plain.errors == []


def test_pythonic_calls_with_literal_keyword_arguments():
    parse = get_parser("pythonic")
    text = 'Sure. [search(q="paris", top_k=3), weather.get(city="Oslo", days=[1, 2])] done'
    result = parse(text, TOOLS)
    assert result.calls == [
        ToolCall("search", {"q": "paris", "top_k": 3}),
        ToolCall("weather.get", {"city": "Oslo", "days": [1, 2]}),
    ]
    assert result.errors == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[search("positional")]', "search needs keyword arguments here"),  # no parameter names to bind with
        ("[search(q=__import__('os').getcwd())]", "literal values"),
        ("[search(**opts)]", "**kwargs"),
        ('[search(q="x"', "not a valid Python list"),
        ('[launch(code="x")]', "unknown tool 'launch'"),
    ],
)
def test_pythonic_errors_execute_nothing(text, message):
    result = get_parser("pythonic")(text, TOOLS)
    assert result.calls == [] and message in result.errors[0]


def test_search_r1_tags():
    parse = get_parser("search-r1")
    result = parse("<think>hm</think><search> capital of France </search>", TOOLS)
    assert result.calls == [ToolCall("search", {"query": "capital of France"})]
    assert "not closed" in parse("<search>capital", TOOLS).errors[0]
    assert "empty" in parse("<search> </search>", TOOLS).errors[0]


def test_custom_tag_mapping():
    parse = tag_parser({"sql": ("execute_sql", "query")})
    assert parse("<sql>SELECT 1</sql>", None).calls == [ToolCall("execute_sql", {"query": "SELECT 1"})]


def test_pythonic_brackets_and_quotes_inside_strings():
    text = "x [search(q=\"a]b\"), calculator(e='[1] \\' ]')] y"
    result = get_parser("pythonic")(text, TOOLS)
    assert result.calls == [ToolCall("search", {"q": "a]b"}), ToolCall("calculator", {"e": "[1] ' ]"})]


SIGNATURES = {"cd": ["folder"], "mv": ["source", "destination"], "sort": ["file_name"]}


def test_pythonic_bare_calls_and_positional_arguments_bound_by_the_signature():
    parse = get_parser("pythonic")
    bare = parse('cd(folder="docs")\nmv("a.txt", destination="docs")', SIGNATURES)
    moved = ToolCall("mv", {"source": "a.txt", "destination": "docs"})
    assert bare.calls == [ToolCall("cd", {"folder": "docs"}), moved]
    assert parse('[sort("a.pdf")]', SIGNATURES).calls == [ToolCall("sort", {"file_name": "a.pdf"})]
    assert parse("I would print(x) here.\nprint(y)", SIGNATURES).calls == []  # not a tool: prose or code
    assert "not valid Python" in parse('cd(folder="docs"', SIGNATURES).errors[0]  # a tool's call: never silence
    assert "at most 2 arguments, got 3" in parse('mv("a", "b", "c")', SIGNATURES).errors[0]
    assert "both by position and by name" in parse('cd("a", folder="b")', SIGNATURES).errors[0]


@pytest.mark.parametrize("name", ["hermes", "llama3-json", "pythonic", "search-r1"])
def test_each_syntax_parses_what_it_renders(name):
    syntax = get_parser(name)
    calls = [ToolCall("search", {"query": "mona lisa"})]
    if name != "search-r1":
        calls.append(ToolCall("calculator", {"expression": "2 + 3", "digits": [1, None, True]}))
    text = syntax.render(calls)
    assert syntax(text, {"search": ["query"], "calculator": ["expression", "digits"]}).calls == calls
    assert syntax.instructions and "\n" not in syntax.name
