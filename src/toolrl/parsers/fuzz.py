"""Hostile model text for any parser: `fuzz_parser(parse)` checks that it never raises and stays fast.

A parser sees whatever the model writes, and a model under RL writes anything: unclosed tags, runs of braces,
numbers with thousands of digits, JSON nested past Python's recursion limit, escapes that decode to lone
surrogates. The inputs here are seeded, so a failure is reproducible: model-like text built from the syntax of
every registered format, mutations of well-formed calls, random unicode, and 100 KB adversarial constructions.
Used by the test suite (a sample), by `bench/fuzz.py` (>= 100,000 inputs) and by anyone writing a parser.

`drop_probe(syntax, calls, known)` checks the other promise: every span that looks like a call in a syntax (its
tags in another case or with attributes, several calls in one tag, a call nested in its own tag, keys in another
case) is run or reported as a format error, never dropped.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

from toolrl.parsers.base import CallSyntax, ParseResult
from toolrl.tools.call import ToolCall

FRAGMENTS = (
    "<tool_call>", "</tool_call>", "<|python_tag|>", "<search>", "</search>", "<answer>", "</answer>",
    "{", "}", "[", "]", "(", ")", '"name"', '"arguments"', '"parameters"', ":", ",", ";", "=", '"', "'",
    "\\", "\\u", "\\ud800", "\\udfff", "search", "calculator", "f(", "a=1", "**x", "*", "\x00", "\n", " ",
    "1e999", "-0", "null", "true", "NaN", "Infinity", "9" * 40, "0x1F", "lambda: 0", "__import__('os')",
    "\ufffd", "\ud800", "é", "🙂", "\u202e",
)  # fmt: skip
"""Pieces of every format's syntax, and of text that breaks decoders."""

WELL_FORMED = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": "mona lisa", "k": [1, 2.5, null]}}</tool_call>',
    '{"name": "calculator", "parameters": {"expression": "7 * 6"}}',
    '<|python_tag|>{"name": "search", "parameters": {"query": "x"}}; {"name": "f", "parameters": {}}',
    '[calculator(expression="2 + 3"), search(query="mona lisa", k=3)]',
    'calculator(expression="2 + 3")\nsearch("mona lisa")',
    "<search> who painted the mona lisa </search>",
    "I think the answer is <answer>5</answer>.",
)
"""Calls each format accepts, to be mutated."""

ADVERSARIAL_CHARS = 100_000


def adversarial_inputs(size: int = ADVERSARIAL_CHARS) -> dict[str, str]:
    """Named inputs of about `size` characters that make naive parsers slow or crash."""
    n = size
    return {
        "run of {": "{" * n,
        'run of {"': '{"' * (n // 2),
        'run of {"a":': '{"a":' * (n // 5),
        "run of [": "[" * n,
        "run of ]": "]" * n,
        "run of (": "(" * n,
        "run of <tool_call>": "<tool_call>" * (n // 11),
        "run of empty tool calls": "<tool_call></tool_call>" * (n // 23),
        "run of <search>": "<search>" * (n // 8),
        'run of "': '"' * n,
        "run of backslashes": "\\" * n,
        "run of [f(": "[f(" * (n // 3),
        "pythonic list, many calls": "[" + ", ".join(["f(a=1)"] * (n // 8)) + "]",
        "pythonic, ] inside strings": "[f(a='" + "]" * (n - 10) + "')]",
        "pythonic, nested lists": "[f(a=" + "[" * (n // 2 - 5) + "]" * (n // 2 - 5) + ")]",
        "pythonic, bare calls": "f(a=1)\n" * (n // 7),
        "pythonic, bare calls never closed": "f(\n" * (n // 3),
        "pythonic, positional arguments": "[f(" + ", ".join(["1"] * (n // 3 - 2)) + ")]",
        "many JSON calls": '{"name": "f", "parameters": {}} ' * (n // 32),
        "deep JSON in a tool call": "<tool_call>" + '{"a":' * (n // 6) + "1" + "}" * (n // 6) + "</tool_call>",
        "deep JSON list": "<tool_call>" + "[" * (n // 2) + "]" * (n // 2) + "</tool_call>",
        "huge integer (hermes)": '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * (n - 60) + "}}</tool_call>",
        "huge integer (llama3)": '{"name": "f", "parameters": {"x": ' + "9" * (n - 40) + "}}",
        "huge integer (pythonic)": "[f(x=" + "9" * (n - 10) + ")]",
        "huge float": '{"name": "f", "parameters": {"x": 1' + "0" * (n - 40) + ".5}}",
        "long name": '<tool_call>{"name": "' + "n" * (n - 60) + '", "arguments": {}}</tool_call>',
        "lone surrogates": '<tool_call>{"name": "f", "arguments": {"x": "' + "\\ud800" * (n // 7) + '"}}</tool_call>',
        "invalid unicode": "".join(chr(0xD800 + i % 0x800) for i in range(n)),
        "null bytes": "\x00" * n,
        "mixed fragments": "".join(FRAGMENTS[i % len(FRAGMENTS)] for i in range(n // 4))[:n],
    }


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        at = rng.randrange(len(chars) + 1)
        if op < 0.35 and chars:
            del chars[min(at, len(chars) - 1)]
        elif op < 0.7:
            chars.insert(at, rng.choice(FRAGMENTS) if rng.random() < 0.5 else chr(rng.randrange(0x20, 0x7F)))
        elif chars:
            chars[min(at, len(chars) - 1)] = rng.choice(FRAGMENTS)
    return "".join(chars)


def _random_unicode(rng: random.Random, length: int) -> str:
    return "".join(chr(rng.choice((rng.randrange(0x80), rng.randrange(0x110000)))) for _ in range(length))


def random_inputs(count: int, seed: int = 0) -> Iterator[str]:
    """`count` seeded inputs: fragments of every format, mutated well-formed calls, random unicode."""
    rng = random.Random(seed)
    for i in range(count):
        kind = i % 4
        if kind == 0:
            yield "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 60)))
        elif kind == 1:
            yield _mutate(rng.choice(WELL_FORMED), rng)
        elif kind == 2:
            pieces = [rng.choice(WELL_FORMED), _random_unicode(rng, rng.randint(0, 20)), rng.choice(FRAGMENTS)]
            rng.shuffle(pieces)
            yield "".join(pieces)
        else:
            yield _random_unicode(rng, rng.randint(0, 200))


@dataclass
class FuzzReport:
    inputs: int = 0
    exceptions: int = 0
    bad_results: int = 0
    """Results that are not a ParseResult, or with an error message that is not one line."""
    slowest_s: float = 0.0
    slowest_input: str = ""
    """Its name for an adversarial input, else its first 80 characters."""
    failures: list[str] = field(default_factory=list)
    """The first few failures: input (cut) and what happened."""


Parser = Callable[..., ParseResult]


def fuzz_parser(
    parse: Parser,
    inputs: int = 2_000,
    seed: int = 0,
    known_tools: frozenset[str] | None = frozenset({"calculator", "search", "f"}),
    adversarial_size: int = ADVERSARIAL_CHARS,
) -> FuzzReport:
    """Run `parse` on `inputs` random inputs and every adversarial one (half with `known_tools`, half with
    None); count exceptions and malformed results, and time the slowest parse."""
    report = FuzzReport()
    cases = [(text[:80], text) for text in random_inputs(inputs, seed)]
    cases += list(adversarial_inputs(adversarial_size).items())
    for i, (label, text) in enumerate(cases):
        known = known_tools if i % 2 else None
        started = time.perf_counter()
        try:
            result = parse(text, known)
            ok = isinstance(result, ParseResult) and all(
                isinstance(e, str) and "\n" not in e and len(e) <= 1_000 for e in result.errors
            )
            if not ok:
                report.bad_results += 1
                if len(report.failures) < 5:
                    report.failures.append(f"{label!r}: malformed result {result!r:.200}")
        except Exception as exc:
            report.exceptions += 1
            if len(report.failures) < 5:
                report.failures.append(f"{label!r}: {type(exc).__name__}: {exc!s:.200}")
        elapsed = time.perf_counter() - started
        report.inputs += 1
        if elapsed > report.slowest_s:
            report.slowest_s, report.slowest_input = elapsed, label
    return report


_TAG = re.compile(r"</?([A-Za-z_][\w-]*)>")
_KEY = re.compile(r'"(name|arguments|parameters)"')


def call_shapes(syntax: CallSyntax, calls: Sequence[ToolCall]) -> dict[str, tuple[str, int]]:
    """Spans that look like calls in `syntax` but stray from it, made from its own rendering of `calls` (two or
    more): name -> (text, the calls it holds). Case variants of its tags and keys, an attribute on its tag,
    several calls in one tag, a call nested in its own tag, the whole call upper-cased. A syntax without tags
    (JSON objects, Python calls) gets the shapes that apply to it."""
    one, two = syntax.render(calls[:1]), syntax.render(calls[:2])
    shapes = {"upper case": (one.upper(), 1), "two calls": (two, 2)}
    if _KEY.search(one):
        shapes["keys in title case"] = (_KEY.sub(lambda m: f'"{m.group(1).title()}"', one), 1)
    tags = _TAG.findall(one)
    if tags:
        tag = tags[0]
        opening, closing = f"<{tag}>", f"</{tag}>"
        shapes["tags in upper case"] = (one.replace(opening, opening.upper()).replace(closing, closing.upper()), 1)
        shapes["tag with an attribute"] = (one.replace(opening, f'<{tag} id="1">', 1), 1)
        shapes["nested in its own tag"] = (f"{opening}{one}{closing}", 1)
        inner = [syntax.render([c]).strip()[len(opening) : -len(closing)].strip() for c in calls[:2]]
        if one.count(opening) == 1 and one.rstrip().endswith(closing) and inner[0][:1] in "{[":
            # a structured body (JSON) can hold several calls; free text between tags (a query) cannot
            shapes["two calls in one tag"] = (f"{opening}{inner[0]}\n{inner[1]}{closing}", 2)
    return shapes


def drop_probe(syntax: CallSyntax, calls: Sequence[ToolCall], known_tools: Collection[str] | None) -> list[str]:
    """What `syntax` drops silently among `call_shapes`: a shape whose calls are neither all run nor all reported
    (calls run + spans reported < calls it holds), or a run call whose arguments hold the syntax's own tag (the
    nesting read as text). Empty: nothing dropped."""
    failures = []
    tags = {f"<{t.lower()}" for t in _TAG.findall(syntax.render(calls[:1]))}
    for name, (text, holds) in call_shapes(syntax, calls).items():
        result = syntax.parse(text, known_tools)
        if len(result.calls) + result.not_run < holds:
            failures.append(f"{syntax.name}, {name}: {holds} calls, {len(result.calls)} run and "
                            f"{result.not_run} reported in {text[:120]!r}")  # fmt: skip
        leaked = [c for c in result.calls if any(t in str(c.arguments).lower() for t in tags)]
        if leaked:
            failures.append(f"{syntax.name}, {name}: ran {leaked[0]!r:.120} (its own tag read as text)")
    return failures
