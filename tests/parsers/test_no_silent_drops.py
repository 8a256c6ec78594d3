"""No call is dropped silently, by any parser: every span that looks like a call is either run or reported to
the model as a format error and counted (`ParseResult.not_run`, the `format_errors` metric); the cap on calls
per turn reports what it does not run."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.parsers import PARSERS
from toolrl.parsers.base import ParseResult
from toolrl.tools.call import ToolCall

KNOWN = {"ls": ["path"], "cd": ["folder"], "search": ["query"]}
PROSE = ["Let me check that.", "I think (maybe) so.", "Done", "Next, the folder", "ok: fine"]

BROKEN = {
    "hermes": [
        '<tool_call>{"name": "ls", "arguments": {"path": }</tool_call>',
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
    ],
    "llama3-json": ['{"name": "ls", "parameters": {"path": }}', '{"name": "rm", "parameters": {}}'],
    "pythonic": ["ls(path=)", 'rm(path="a")', "[ls(path='a'), 3]"],
    "search-r1": ["<search></search>"],
}
JOINS = {
    "hermes": ["\n", " ", "\n\n"],
    "llama3-json": ["; ", "\n"],
    "pythonic": ["\n", ", ", "; "],
    "search-r1": ["\n"],
}


def calls_for(parser: str, draw) -> list[ToolCall]:
    if parser == "search-r1":
        return [ToolCall("search", {"query": draw(st.sampled_from(["cats", "who won", "x y"]))})]
    name = draw(st.sampled_from(["ls", "cd"]))
    value = draw(st.sampled_from(["a", "docs/b", "it's", "x(y)", "[1]"]))
    return [ToolCall(name, {KNOWN[name][0]: value})]


@st.composite
def replies(draw, parser: str):
    """A reply of good calls (rendered by the parser itself), broken spans and prose, in any order: (text, good
    calls, broken spans)."""
    syntax = PARSERS[parser]
    parts, good, broken = [], [], 0
    for kind in draw(st.lists(st.sampled_from(["good", "good", "broken", "prose"]), min_size=1, max_size=12)):
        if kind == "good":
            calls = [c for _ in range(draw(st.integers(1, 3))) for c in calls_for(parser, draw)]
            good += calls
            parts.append(syntax.render(calls))
        elif kind == "broken":
            broken += 1
            parts.append("\n" + draw(st.sampled_from(BROKEN[parser])))  # an unknown name counts at a line's start
        else:
            parts.append("\n" + draw(st.sampled_from(PROSE)))
    joins = draw(st.lists(st.sampled_from(JOINS[parser]), min_size=len(parts), max_size=len(parts)))
    return "".join(part + join for part, join in zip(parts, joins, strict=True)), good, broken


@pytest.mark.parametrize("parser", sorted(BROKEN))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_call_is_run_or_reported(parser, data):
    text, good, broken = data.draw(replies(parser))
    result = PARSERS[parser](text, KNOWN)
    assert [(c.name, c.arguments) for c in result.calls] == [(c.name, c.arguments) for c in good], text
    assert result.not_run == broken, (text, result.errors)


@pytest.mark.parametrize(
    ("text", "calls", "errors"),
    [
        ('ls(path="a"), cd(folder="b")', 2, 0),  # separated by a comma
        ('ls(path="a"); cd(folder="b")', 2, 0),  # by a semicolon
        ("\n".join(['ls(path="a")'] * 17), 17, 0),  # the 17th bare call (the cap is the rollout's, and reported)
        ("[" + ", ".join(['ls(path="a")'] * 17) + "]", 17, 0),
        ('[ls(path="a")]\ncd(folder="b")', 2, 0),  # a bare call after a list
        ('[ls(path="a")]\n[cd(folder="b")]', 2, 0),  # a second list
        ('rm(path="a")', 0, 1),  # a bare call to an unknown tool
        ('ls(path="a"), rm(path="a")', 1, 1),
        ('I will list it. ls(path="a")', 1, 0),  # a known tool's call after prose on its line
        ('Sure.\nls(path="a")', 1, 0),
        ('ls(path=), cd(folder="b")', 1, 1),  # a broken call does not take the next one with it
        ("I think (maybe) the answer f(x) is 3.\nNote (this) matters. Hello (world", 0, 0),  # prose
    ],
)
def test_the_pythonic_spans_a_benchmark_adapter_found_dropped(text, calls, errors):
    result = PARSERS["pythonic"](text, KNOWN)
    assert (len(result.calls), result.not_run) == (calls, errors), result.errors


def test_hermes_reports_a_call_opened_inside_another_and_a_close_without_an_open():
    good = '<tool_call>{"name": "ls", "arguments": {"path": "a"}}</tool_call>'
    result = PARSERS["hermes"]('<tool_call>{"name": "ls"' + good + "\n</tool_call>", KNOWN)
    assert len(result.calls) == 1 and result.not_run == 2
    assert result.errors[0].startswith("Error: tool call is not closed with </tool_call>")
    assert result.errors[1].startswith("Error: </tool_call> without its <tool_call> (1x)")


def test_llama3_reports_what_it_stops_reading():
    text = '{"name": "ls", "parameters": {"path": }} ' * 70 + json.dumps({"name": "ls", "parameters": {"path": "a"}})
    result = PARSERS["llama3-json"](text, KNOWN)
    assert result.calls == [] and result.errors[-1] == "Error: 39 more calls after 64 malformed objects were not read"
    assert result.not_run == 71  # each broken object fails twice (it and its arguments): 32 told, 39 summed up


def test_the_cap_on_calls_per_turn_reports_and_counts_what_it_does_not_run():
    calls = [ToolCall("ls", {"path": str(i)}) for i in range(20)]
    capped = ParseResult(calls, [f"Error: {i}" for i in range(3)]).within(16)
    assert [c.arguments["path"] for c in capped.calls] == [str(i) for i in range(16)]
    assert capped.errors[-1] == "Error: at most 16 tool calls per turn; 4 calls after the first 16 were not run"
    assert capped.not_run == 3 + 4
    noisy = ParseResult([], [f"Error: {i}" for i in range(40)]).within(16)
    assert len(noisy.errors) == 17 and noisy.not_run == 40
    assert noisy.errors[-1] == "Error: at most 16 tool calls per turn; 24 more malformed calls are not shown"


PROBE_CALLS = {
    "search-r1": [ToolCall("search", {"query": "cats"}), ToolCall("search", {"query": "dogs"})],
}


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_no_parser_drops_a_call_that_strays_from_its_syntax(parser):
    """Issue 51: case variants of a syntax's tags and keys, attributes on its tag, several calls in one tag and a
    call nested in its own tag are each run or reported (hermes had dropped `<TOOL_CALL>...</TOOL_CALL>`, counted
    two calls in one tag as one error; search-r1 had dropped `<SEARCH>` and `<search top="3">` and run the query
    `<search>x` of a nested tag). Every registered parser, a plug-in's too."""
    from toolrl.parsers.fuzz import call_shapes, drop_probe

    calls = PROBE_CALLS.get(parser, [ToolCall("ls", {"path": "a"}), ToolCall("cd", {"folder": "b"})])
    assert len(call_shapes(PARSERS[parser], calls)) >= 2
    assert drop_probe(PARSERS[parser], calls, KNOWN) == []


@pytest.mark.parametrize(
    ("parser", "text", "calls", "reported"),
    [
        ("hermes", '<TOOL_CALL>{"name": "ls", "arguments": {"path": "a"}}</TOOL_CALL>', 0, 1),
        ("hermes", '<tool_call id="1">{"name": "ls", "arguments": {"path": "a"}}</tool_call>', 0, 1),
        ("hermes", '<tool_call>[{"name": "ls", "arguments": {}}, {"name": "cd", "arguments": {}}]</tool_call>', 2, 0),
        ("hermes", '<tool_call>{"name": "ls", "arguments": {}}\n{"name": "cd", "arguments": {}}</tool_call>', 2, 0),
        ("hermes", '<tool_call>{"name": "ls", "arguments": {}} {"name": </tool_call>', 1, 1),
        ("hermes", '<tool_call>{"Name": "ls", "arguments": {"path": "a"}}</tool_call>', 0, 1),
        ("hermes", '<tool_call\n id="1">{"name": "ls", "arguments": {}}</tool_call\n>', 0, 1),  # the error one line
        ("hermes", '<tool_call>{"name": "ls", "Arguments": {"path": "a"}}</tool_call>', 0, 1),  # not run without them
        ("llama3-json", '{"NAME": "ls", "PARAMETERS": {"path": "a"}}', 0, 1),
        ("llama3-json", '[{"name": "ls", "parameters": {}}, {"name": "cd", "parameters": {}}]', 2, 0),
        ("search-r1", '<search top="3">x</search>', 0, 1),
        ("search-r1", "<SEARCH>x</SEARCH>", 0, 1),
        ("search-r1", "<search><search>x</search></search>", 0, 1),  # one broken span, not the query "<search>x"
        ("search-r1", "<search>a <search>b</search>", 1, 1),  # the outer never closed; the inner is read
        ("search-r1", "<search>x</search></search>", 1, 1),
        ("search-r1", '<search\ntop="3">x</search\n>', 0, 1),
        ("pythonic", 'ls(path=cd(folder="x"))', 0, 1),  # a call inside a call's arguments: not run, reported
    ],
)
def test_the_shapes_issue_51_found_dropped(parser, text, calls, reported):
    result = PARSERS[parser](text, KNOWN)
    assert (len(result.calls), result.not_run) == (calls, reported), result.errors
    assert all("\n" not in e for e in result.errors)


def test_the_probe_finds_what_a_plug_in_parser_drops():
    """A user's parser registered from outside the package is probed the same way: one that reads only the exact
    lower-case tag (what hermes did) is caught on the upper-case and attribute shapes."""
    import re

    from toolrl.parsers.base import register_parser
    from toolrl.parsers.fuzz import drop_probe
    from toolrl.parsers.hermes import INSTRUCTIONS, render_hermes

    @register_parser("test-exact-tags", render_hermes, INSTRUCTIONS)
    def exact(text, known_tools=None):
        calls = []
        for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
            try:
                data = json.loads(body)
                calls.append(ToolCall(data["name"], data["arguments"]))
            except (ValueError, KeyError, TypeError):
                pass  # what the probe is for: a span dropped
        return ParseResult(calls)

    try:
        failures = drop_probe(PARSERS["test-exact-tags"], [ToolCall("ls", {"path": "a"}), ToolCall("cd", {})], KNOWN)
    finally:
        PARSERS.pop("test-exact-tags")
    assert any("tags in upper case" in f for f in failures) and any("tag with an attribute" in f for f in failures)


def test_pythonic_reads_its_first_calls_and_counts_the_rest_of_a_flood():
    """100 KB of bare calls (14,285) had taken 300-400 ms, a parse each; past MAX_CALLS the rest is counted in
    one error, not read."""
    from toolrl.parsers.pythonic import MAX_CALLS

    result = PARSERS["pythonic"]('ls(path="a")\n' * (MAX_CALLS + 76), KNOWN)
    assert len(result.calls) == MAX_CALLS and result.not_run == 76
    assert result.errors == [
        f"Error: 76 more call-like spans after the first {MAX_CALLS} calls were not read. Write fewer calls"
    ]
