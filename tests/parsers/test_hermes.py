from toolrl.parsers import get_parser
from toolrl.tools import ToolCall

parse = get_parser("hermes")
TOOLS = {"calculator", "search"}


def test_valid_call():
    text = 'ok <tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    result = parse(text, TOOLS)
    assert result.calls == [ToolCall("calculator", {"expression": "1 + 2"})]
    assert result.errors == []


def test_several_calls_in_one_turn_keep_their_order():
    text = (
        '<tool_call>{"name": "search", "arguments": {"q": "a"}}</tool_call> then '
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    )
    result = parse(text, TOOLS)
    assert [c.name for c in result.calls] == ["search", "calculator"]
    assert result.calls[1].arguments == {"expression": "2*3"}


def test_malformed_json_becomes_one_line_error_and_other_calls_survive():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": }</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    )
    result = parse(text, TOOLS)
    assert result.calls == [ToolCall("search", {"q": "x"})]
    assert len(result.errors) == 1
    assert "not valid JSON" in result.errors[0] and "\n" not in result.errors[0]


def test_unknown_tool_is_an_error_naming_the_available_tools():
    result = parse('<tool_call>{"name": "weather", "arguments": {}}</tool_call>', TOOLS)
    assert result.calls == []
    assert "unknown tool 'weather'" in result.errors[0] and "calculator" in result.errors[0]


def test_unclosed_call_missing_name_and_non_object_arguments():
    assert "not closed" in parse('<tool_call>{"name": "search"', TOOLS).errors[0]
    assert '"name"' in parse('<tool_call>{"arguments": {}}</tool_call>', TOOLS).errors[0]
    assert "JSON object" in parse('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', TOOLS).errors[0]


def test_arguments_given_as_json_string_are_decoded():
    text = '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
    assert parse(text, TOOLS).calls == [ToolCall("search", {"q": "x"})]


def test_text_without_calls_parses_to_nothing():
    result = parse("<answer>42</answer>", TOOLS)
    assert result.calls == [] and result.errors == []
