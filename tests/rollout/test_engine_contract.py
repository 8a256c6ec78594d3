"""One suite for every engine: the same requests, checked against a full forward pass of the same model.

`hf` runs in-process; `openai` talks to a local OpenAI-compatible completions server whose sampler is an
in-process engine on the same model, so the round trip (token ids out, token ids and log-probs back) is what
is tested. The vLLM engine has its own test (it needs vllm and a model vLLM supports)."""

import asyncio
import contextlib
import threading

import pytest
import torch

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.rollout import HFEngine, OpenAIEngine, SamplingParams


def full_logprobs(model, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits / (temperature or 1.0), -1)


@contextlib.contextmanager
def hf_engine(model, tokenizer):
    yield HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))


@contextlib.contextmanager
def openai_engine(model, tokenizer):
    sampler = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    one_at_a_time = threading.Lock()  # the server answers in threads; an HFEngine serves one event loop

    def complete(body):
        params = SamplingParams(body["temperature"], body["top_p"], body.get("top_k", 0), body["max_tokens"])
        with one_at_a_time:
            out = asyncio.run(sampler.generate(object(), body["prompt"], params))
        tokens = {"tokens": [f"token_id:{i}" for i in out.ids], "token_logprobs": out.logprobs}
        return {"choices": [{"text": "", "logprobs": tokens, "finish_reason": "stop" if out.ended else "length"}]}

    with LocalHTTPServer(complete=complete) as server:
        engine = OpenAIEngine(f"{server.url}/v1", "tiny", tokenizer, [tokenizer.eos_token_id])
        try:
            yield engine
        finally:
            engine.close()


ENGINES = {"hf": hf_engine, "openai": openai_engine}


@pytest.fixture(params=list(ENGINES))
def engine(request, tiny_model, tokenizer):
    with ENGINES[request.param](tiny_model, tokenizer) as engine:
        yield engine


def test_greedy_turn_is_the_argmax_path_with_its_logprobs(engine, tiny_model, tokenizer):
    prompt = tokenizer("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    out = asyncio.run(engine.generate("s", prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
    seq = list(prompt)
    for token, logprob in zip(out.ids, out.logprobs, strict=True):
        expected = full_logprobs(tiny_model, seq, 0.0)[-1]
        assert token == int(expected.argmax()) and abs(logprob - float(expected[token])) < 1e-4
        seq.append(token)
    assert len(out.ids) == 6 and not out.ended


def test_concurrent_multi_turn_sequences_have_exact_logprobs(engine, tiny_model, tokenizer):
    prompts = [list(range(100, 140)) + [i] for i in range(3)]

    async def sequence(i):
        context, checks = list(prompts[i]), []
        for turn in range(2):
            out = await engine.generate(i, context, SamplingParams(temperature=0.8, max_new_tokens=3 + i + turn))
            checks.append((list(context), out))
            context += out.ids + [500 + i, 501]  # an observation
        engine.release(i)
        return checks

    async def main():
        return await asyncio.gather(*(sequence(i) for i in range(3)))

    for checks in asyncio.run(main()):
        for context, out in checks:
            lp = full_logprobs(tiny_model, context + out.ids, 0.8)
            expected = [float(lp[len(context) + k - 1, t]) for k, t in enumerate(out.ids)]
            assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expected), atol=1e-4)
