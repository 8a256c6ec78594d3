"""No input string makes any registered parser raise; error messages stay one bounded line; arguments come out
well-formed (no lone surrogates); a parser written outside the package is checked the same way."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.parsers import PARSERS, ParseResult, register_parser
from toolrl.parsers.fuzz import FRAGMENTS, adversarial_inputs, fuzz_parser

model_like = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join)
huge_numbers = st.integers(min_value=4_000, max_value=20_000).map(
    lambda n: [
        '<tool_call>{"name": "f", "arguments": {"x": ' + "7" * n + "}}</tool_call>",
        '{"name": "f", "parameters": {"x": -' + "7" * n + "}}",
        "[f(x=" + "7" * n + ")]",
    ]
)
surrogates = st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=5)


def check(result: ParseResult) -> None:
    assert isinstance(result, ParseResult)
    assert all("\n" not in error and len(error) <= 1_000 for error in result.errors)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), model_like), known=st.one_of(st.none(), st.just({"search", "calculator"})))
def test_parsers_never_raise(name, text, known):
    check(PARSERS[name](text, known))


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=20, deadline=None)
@given(texts=huge_numbers)
def test_numbers_past_pythons_digit_limit_are_format_errors(name, texts):
    for text in texts:
        check(PARSERS[name](text, None))


@pytest.mark.parametrize("name", ["hermes", "llama3-json"])
@settings(max_examples=50, deadline=None)
@given(bad=surrogates)
def test_escaped_lone_surrogates_never_reach_a_tool(name, bad):
    escaped = "x".join(f"\\u{ord(c):04x}" for c in bad)  # apart: a high and a low surrogate would pair up
    value = f'"a{escaped}b"'
    body = f'{{"name": "f", "arguments": {{"x": {value}}}, "parameters": {{"x": {value}}}}}'
    text = f"<tool_call>{body}</tool_call>" if name == "hermes" else body
    [call] = PARSERS[name](text, None).calls
    assert call.arguments["x"] == "a" + "x".join("\ufffd" * len(bad)) + "b"
    call.arguments["x"].encode("utf-8")  # encodable: a tokenizer or a JSON-RPC transport can take it


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_fuzz_sample_and_every_adversarial_input(name):
    """A sample of bench/fuzz.py (which runs >= 100,000 inputs per parser): no exception, no malformed result."""
    report = fuzz_parser(PARSERS[name], inputs=3_000, seed=7)
    assert (report.exceptions, report.bad_results) == (0, 0), report.failures
    assert report.inputs == 3_000 + len(adversarial_inputs())


def test_a_parser_written_outside_the_package_is_fuzzed_the_same_way():
    @register_parser("test-naive-json")
    def naive(text, known_tools=None):  # the kind of parser a user writes first: json.loads on the reply
        import json

        json.loads(text)
        return ParseResult()

    try:
        report = fuzz_parser(PARSERS["test-naive-json"], inputs=200)
        assert report.exceptions > 0 and "JSONDecodeError" in report.failures[0]
    finally:
        PARSERS.pop("test-naive-json")


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_deep_nesting_is_a_format_error_not_a_crash(name):
    deep = "[" * 100_000
    text = f"<tool_call>{deep}</tool_call> <search>{deep}</search> [f(a={'[' * 5000}{']' * 5000})] [g(b={deep}"
    check(PARSERS[name](text, None))
