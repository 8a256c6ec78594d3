"""Observation text is cut to the token budget with a marker, and huge results are cut before tokenizing."""

from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.tools.observation import clip_observation


def test_text_within_budget_is_unchanged(tokenizer):
    assert clip_observation("42", tokenizer, 5) == "42"
    text = "word " * 20
    assert clip_observation(text, tokenizer, len(tokenizer.encode(text))) == text


def test_long_text_keeps_its_first_tokens_and_says_how_much_was_cut(tokenizer):
    text = " ".join(f"item{i}" for i in range(500))
    clipped = clip_observation(text, tokenizer, 50)
    kept, marker = clipped.rsplit("... [truncated ", 1)
    assert text.startswith(kept) and len(tokenizer.encode(kept)) <= 50
    assert marker == f"{len(text) - len(kept)} characters]"


def test_ten_megabyte_result_is_cut_before_tokenizing(tokenizer):
    text = "x" * (10 * 1024 * 1024)
    clipped = clip_observation(text, tokenizer, 128)
    assert len(clipped) < 128 * 32 + 50 and clipped.endswith(
        f"[truncated {len(text) - len(clipped.split('...')[0])} characters]"
    )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(1, 40))
def test_any_text_fits_the_budget_after_clipping(tokenizer, text, budget):
    clipped = clip_observation(text, tokenizer, budget)
    if clipped == text:
        assert len(tokenizer.encode(text)) <= budget
    else:
        kept = clipped.rsplit("... [truncated ", 1)[0]
        assert len(tokenizer.encode(kept)) <= budget


def test_a_lone_surrogate_a_tool_echoes_back_is_replaced_not_a_crash(tokenizer):
    from toolrl.tools.observation import clip_observation

    assert clip_observation("a\ud800b", tokenizer, 50) == "a\ufffdb"
