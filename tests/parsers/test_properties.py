"""No input string makes any registered parser raise."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.parsers import PARSERS, ParseResult

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<|python_tag|>", "<search>", "</search>", "{", "}", "[", "]", "(", ")",
    '"name"', '"arguments"', '"parameters"', ":", ",", ";", "=", '"', "\\", "search", "calculator", "f(", "a=1",
    "**x", "\x00", "1e999", "null", "[" * 50, "{" * 50,
]  # fmt: skip
model_like = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), model_like), known=st.one_of(st.none(), st.just({"search", "calculator"})))
def test_parsers_never_raise(name, text, known):
    result = PARSERS[name](text, known)
    assert isinstance(result, ParseResult)
    assert all("\n" not in error for error in result.errors)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_deep_nesting_is_a_format_error_not_a_crash(name):
    deep = "[" * 100_000
    text = f"<tool_call>{deep}</tool_call> <search>{deep}</search> [f(a={'[' * 5000}{']' * 5000})] [g(b={deep}"
    assert isinstance(PARSERS[name](text, None), ParseResult)
