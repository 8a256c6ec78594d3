"""Observation text cut to a token budget, with a marker that says how much was left out."""

from __future__ import annotations

from toolrl.text import well_formed_text

CHARS_PER_TOKEN_BOUND = 32
"""Text beyond max_tokens x this many characters is cut before tokenizing: a 10 MB result would otherwise take
seconds to tokenize only to be thrown away. Real tokenizers average 3 to 5 characters per token."""


def clip_observation(text: str, tokenizer, max_tokens: int) -> str:
    """`text` if it fits in `max_tokens` tokens, else its first `max_tokens` tokens and a marker such as
    `... [truncated 10485632 characters]` (the marker's own tokens come on top of the budget)."""
    text = well_formed_text(text)
    head = text[: max_tokens * CHARS_PER_TOKEN_BOUND]
    ids = tokenizer.encode(head, add_special_tokens=False)
    if len(ids) <= max_tokens and len(head) == len(text):
        return text
    if len(ids) <= max_tokens:  # only the character cut applied
        return f"{head}... [truncated {len(text) - len(head)} characters]"
    kept = tokenizer.decode(ids[:max_tokens])
    # A cut inside a multi-byte character decodes to U+FFFD: keep only what is truly a prefix of the text.
    same = 0
    while same < min(len(kept), len(head)) and kept[same] == head[same]:
        same += 1
    kept = head[:same]
    return f"{kept}... [truncated {max(len(text) - len(kept), 1)} characters]"


def clipped(text: str, tokenizer, max_tokens: int) -> bool:
    """Whether clip_observation cuts `text` at `max_tokens` (a result the model was shown only in part)."""
    return clip_observation(text, tokenizer, max_tokens) != well_formed_text(text)


def results_cut(results, tokenizer, max_tokens: int) -> int:
    """How many of `results` (ToolResults, their content before clipping) `max_tokens` cut."""
    return sum(clipped(r.content, tokenizer, max_tokens) for r in results)
