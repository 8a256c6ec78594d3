"""Benchmark: the constrained-decoding libraries that run on CPU, on the default model's tokenizer and the grammar
a forced call needs (a Hermes `<tool_call>` around a JSON object of one of two tools' schemas), to say why the
gateway uses llguidance.

For each library that imports (llguidance is toolrl's dependency; put xgrammar and outlines-core on PYTHONPATH to
compare, e.g. `pip install --target /tmp/cd xgrammar outlines-core apache-tvm-ffi --no-deps`): the time to read the
tokenizer, to compile the grammar, the median time of one token's mask over a 40-token call, whether it can wrap
a JSON schema in the call syntax's tags (llguidance: Lark with %json; outlines-core: a regex built from the
schema; xgrammar: its JSON schema grammar, here without the tags), and what it installs (its wheel's
declared dependencies).

Prints a table and writes bench/results/constrained.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time

from common import machine, write_results

from toolrl.models import load_tokenizer
from toolrl.parsers import get_parser

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}  # fmt: skip
CALC = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
TOOLS = [("weather", WEATHER), ("calculator", CALC)]
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'


def _schema() -> dict:
    bodies = [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
               "required": ["name", "arguments"], "additionalProperties": False} for n, p in TOOLS]  # fmt: skip
    return {"anyOf": bodies}


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def llguidance_row(tokenizer) -> dict:
    import llguidance
    import llguidance.hf

    lt, read_s = timed(lambda: llguidance.hf.from_tokenizer(tokenizer))
    grammar = "start: calls\n" + get_parser("hermes").grammar(TOOLS, False)
    matcher, compile_s = timed(lambda: llguidance.LLMatcher(lt, grammar, log_level=0))
    masks = []
    for token in tokenizer.encode(CALL, add_special_tokens=False):
        masks.append(timed(matcher.compute_bitmask)[1])
        assert matcher.consume_token(token), matcher.get_error()
    return {"tokenizer_s": read_s, "compile_s": compile_s, "mask_ms": statistics.median(masks) * 1000,
            "wraps_json_in_tags": True, "package": "llguidance"}  # fmt: skip


def xgrammar_row(tokenizer) -> dict:
    import xgrammar

    info, read_s = timed(lambda: xgrammar.TokenizerInfo.from_huggingface(tokenizer))
    compiler = xgrammar.GrammarCompiler(info)
    body = CALL.split("\n")[1]  # its JSON grammar: the call's object without the tags
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(_schema()), any_whitespace=False))
    matcher, bitmask, masks = xgrammar.GrammarMatcher(compiled), xgrammar.allocate_token_bitmask(1, info.vocab_size), []
    for token in tokenizer.encode(body, add_special_tokens=False):
        masks.append(timed(lambda: matcher.fill_next_token_bitmask(bitmask))[1])
        assert matcher.accept_token(token)
    return {"tokenizer_s": read_s, "compile_s": compile_s, "mask_ms": statistics.median(masks) * 1000,
            "wraps_json_in_tags": False, "package": "xgrammar"}  # fmt: skip


def outlines_row(tokenizer) -> dict:
    from collections import defaultdict

    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    def vocabulary():
        tokens = defaultdict(list)
        for token, i in tokenizer.get_vocab().items():
            if i != tokenizer.eos_token_id:
                tokens[tokenizer.convert_tokens_to_string([token])].append(i)
        return Vocabulary(tokenizer.eos_token_id, dict(tokens))

    vocab, read_s = timed(vocabulary)
    regex = "<tool_call>\n" + build_regex_from_schema(json.dumps(_schema()), r"[ ]?") + "\n</tool_call>"
    index, compile_s = timed(lambda: Index(regex, vocab))
    guide, masks = Guide(index), []
    for token in tokenizer.encode(CALL, add_special_tokens=False):
        masks.append(timed(guide.get_tokens)[1])
        guide.advance(token)
    return {"tokenizer_s": read_s, "compile_s": compile_s, "mask_ms": statistics.median(masks) * 1000,
            "wraps_json_in_tags": True, "package": "outlines-core"}  # fmt: skip


def requirements(package: str) -> list[str]:
    try:
        return [r.split(";")[0].strip() for r in importlib.metadata.requires(package) or [] if "extra ==" not in r]
    except importlib.metadata.PackageNotFoundError:
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/constrained.json")
    args = parser.parse_args()
    tokenizer = load_tokenizer(MODEL)
    rows = {}
    for name, row in [("llguidance", llguidance_row), ("xgrammar", xgrammar_row), ("outlines-core", outlines_row)]:
        try:
            rows[name] = row(tokenizer)
        except ImportError as exc:
            print(f"{name}: not importable ({exc}); put it on PYTHONPATH to compare")
            continue
        rows[name]["version"] = importlib.metadata.version(rows[name]["package"])
        rows[name]["requires"] = requirements(rows[name]["package"])
    print(f"{'library':<15}{'tokenizer s':>12}{'compile ms':>12}{'mask ms':>10}  tags  requires")
    for name, row in rows.items():
        print(f"{name:<15}{row['tokenizer_s']:>12.3f}{row['compile_s'] * 1000:>12.2f}{row['mask_ms']:>10.3f}  "
              f"{'yes' if row['wraps_json_in_tags'] else 'no ':<5} {', '.join(row['requires']) or '-'}")  # fmt: skip
    write_results(args.out, {"machine": machine(), "model": MODEL, "libraries": rows})


if __name__ == "__main__":
    main()
