"""Whether llguidance can compile a grammar, importing llguidance alone: the gateway runs this in a worker process
killed past its compile budget (gateway/limits.py), and the worker's start is part of a request's wait (importing
torch with it had taken 5 s of a 1 s budget on a busy machine)."""

from __future__ import annotations


def grammar_problem(grammar: str) -> str | None:
    """Why llguidance cannot compile `grammar` (one line), or None."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0].splitlines()[0] if is_error and messages else None


def grammar_check(grammar: str) -> str:
    """grammar_problem's line, or "" (what a worker process answers)."""
    return grammar_problem(grammar) or ""
