"""Stop strings and grammars in the hf engine: a turn ends at the token that completes its first stop string (one
that ends inside a token, one split across tokens), a forced call samples only what its grammar allows, and the
log-prob recorded for a constrained token is the one it was drawn with (under the mask)."""

import asyncio
import json

import jsonschema
import torch

from tests.rollout.test_engine import full_logprobs
from toolrl.parsers import get_parser
from toolrl.parsers.base import JSON_STYLE
from toolrl.rollout import HFEngine, SamplingParams
from toolrl.rollout.guidance import IncrementalText, StopStrings, TurnGuide, Vocabulary, cut_at_stop

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}  # fmt: skip


def guided_engine(model, tokenizer):
    return HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), tokenizer=tokenizer)


def test_incremental_text_is_the_whole_decode_and_holds_a_split_character(tokenizer):
    ids = tokenizer.encode("Sunny 🌞, 21 °C. Ünïcödé", add_special_tokens=False)
    text, pieces = IncrementalText(tokenizer), []
    for token in ids:
        pieces.append(text.add([token]))
    assert "".join(pieces) == tokenizer.decode(ids) and not any("\ufffd" in p for p in pieces)
    emoji = tokenizer.encode("🌞", add_special_tokens=False)
    assert len(emoji) > 1 and [IncrementalText(tokenizer).add(emoji[:1])] == [""]  # the first byte waits


def test_a_stop_string_cuts_at_the_token_that_completes_it_inside_or_across_tokens(tokenizer):
    ids = tokenizer.encode("Hello world, and goodbye", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    inside = next(p for p in pieces if len(p.strip()) >= 4).strip()[:3]  # the first 3 letters of a long token
    at = next(k for k, p in enumerate(pieces) if inside in p)
    cut = cut_at_stop(tokenizer, ids, [inside])
    assert cut.tokens == at + 1 and cut.text == tokenizer.decode(ids[:at]) + pieces[at][: pieces[at].index(inside)]
    across = pieces[0][-2:] + pieces[1][:2]  # ends of the first token, start of the second
    cut = cut_at_stop(tokenizer, ids, [across, "goodbye"])
    assert cut.tokens == 2 and cut.stop == across and cut.text == pieces[0][:-2]
    assert cut_at_stop(tokenizer, ids, ["nowhere"]) is None
    assert StopStrings(["Observation:"]).held("I see. Obs") == 3 and StopStrings(["ab"]).held("xyz") == 0


def test_the_engine_ends_a_turn_at_its_stop_string_and_samples_nothing_after(tiny_model, tokenizer):
    engine = guided_engine(tiny_model, tokenizer)
    context = tokenizer.encode("<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n")
    free = asyncio.run(engine.generate("a", context, SamplingParams(temperature=0, max_new_tokens=40)))
    engine.release("a")
    text = tokenizer.decode(free.ids, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # three characters from the middle of the greedy reply
    expected = cut_at_stop(tokenizer, free.ids, [stop])
    stopped = asyncio.run(engine.generate("b", context, SamplingParams(temperature=0, max_new_tokens=40, stop=(stop,))))
    assert stopped.ids == free.ids[: expected.tokens] and not stopped.ended  # the completing token is the last
    assert stopped.logprobs == free.logprobs[: expected.tokens]


def test_a_forced_call_follows_its_grammar_and_records_the_masked_log_prob(tiny_model, tokenizer):
    """A random tiny model forced to call `weather`: every sampled turn parses as one call whose arguments validate
    against the schema; each recorded log-prob is log softmax over the allowed tokens (>= the unconstrained one,
    equal where the grammar allowed one token, 0)."""
    syntax = get_parser("hermes")
    grammar = "start: calls\n" + syntax.grammar([("weather", WEATHER)], False)
    engine = guided_engine(tiny_model, tokenizer)
    context = tokenizer.encode("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")

    async def turns():
        params = [SamplingParams(temperature=1.0, max_new_tokens=96, seed=s, grammar=grammar) for s in range(4)]
        return await asyncio.gather(*(engine.generate(i, context, p) for i, p in enumerate(params)))

    vocabulary = Vocabulary(tokenizer, tiny_model.config.vocab_size)
    for out in asyncio.run(turns()):
        assert out.ended and out.ids[-1] == tokenizer.eos_token_id
        parsed = syntax(tokenizer.decode(out.ids, skip_special_tokens=True), {"weather": ["city", "days"]})
        assert not parsed.errors and [c.name for c in parsed.calls] == ["weather"]
        jsonschema.validate(parsed.calls[0].arguments, WEATHER)
        guide = TurnGuide(vocabulary, grammar=grammar)  # the masks again, token by token
        full = full_logprobs(tiny_model, context + out.ids)
        for k, (token, recorded) in enumerate(zip(out.ids, out.logprobs, strict=True)):
            allowed = guide.allowed()
            logits = full[len(context) + k - 1].clone()
            masked = torch.log_softmax(logits.masked_fill(~allowed[: len(logits)], float("-inf")), -1)[token]
            assert abs(recorded - float(masked)) < 1e-4 and recorded >= float(logits[token]) - 1e-4
            assert guide.accept(token) is False


def test_a_json_schema_reply_validates(tiny_model, tokenizer):
    """Written as json.dumps writes it (JSON_STYLE): with free white space a random model writes only that."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "maximum": 999}}, "required": ["answer"],
              "additionalProperties": False, "x-guidance": JSON_STYLE}  # fmt: skip
    grammar = f"start: %json {json.dumps(schema)}"
    engine = guided_engine(tiny_model, tokenizer)
    context = tokenizer.encode("<|im_start|>user\n2 + 2? Answer in JSON.<|im_end|>\n<|im_start|>assistant\n")
    out = asyncio.run(
        engine.generate("j", context, SamplingParams(temperature=0.7, max_new_tokens=64, grammar=grammar))
    )
    jsonschema.validate(json.loads(tokenizer.decode(out.ids, skip_special_tokens=True)), schema)


def test_two_requests_of_one_sequence_are_refused_even_while_the_first_compiles_its_grammar(tiny_model, tokenizer):
    """A sequence has one request in flight: a second one that arrives while the first compiles its grammar (off
    the loop) is refused, not let in to overwrite the first (which then was never answered)."""
    grammar = f"start: %json {json.dumps({'type': 'object', 'properties': {'a': {'type': 'integer'}}})}"
    engine = guided_engine(tiny_model, tokenizer)
    context = tokenizer.encode("<|im_start|>user\nJSON?<|im_end|>\n<|im_start|>assistant\n")
    params = SamplingParams(temperature=0.7, max_new_tokens=8, grammar=grammar)

    async def both():  # before the fix the first request was overwritten and never answered: a hang, cut at 120 s
        requests = asyncio.gather(*(engine.generate("s", context, params) for _ in range(2)), return_exceptions=True)
        return await asyncio.wait_for(requests, 120)

    results = asyncio.run(both())  # whichever compiled first is served
    [refused] = [r for r in results if isinstance(r, Exception)]
    [served] = [r for r in results if not isinstance(r, Exception)]
    assert str(refused) == "sequence 's' already has a request in flight" and len(served.ids) >= 1
