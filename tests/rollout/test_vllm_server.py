"""`rollout.engine: vllm-server`: vLLM servers that train. Runs where vllm is installed (`make test-vllm`): a real
`vllm serve` (VLLM_SERVER_DEV_MODE=1) gets the trainer's weights without a restart, and then samples with them."""

import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

vllm = pytest.importorskip("vllm")

from toolrl.models import load_model, load_tokenizer  # noqa: E402
from toolrl.models.resolve import resolve_model  # noqa: E402
from toolrl.rollout import SamplingParams  # noqa: E402
from toolrl.rollout.openai import VLLMServers  # noqa: E402

MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
    }
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(resolve_model(MODEL)),
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--served-model-name",
        "policy",
    ]  # fmt: skip  (what `vllm serve` runs; vllm-cpu lacks its metadata)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 400
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            pytest.fail("vllm serve exited")
        time.sleep(2)
    yield url
    process.terminate()
    process.wait(60)


def greedy(engine, prompt, n=8):
    return asyncio.run(engine.generate("s", prompt, SamplingParams(temperature=0.0, max_new_tokens=n)))


def trainer_logprobs(model, prompt, ids):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)


def test_a_vllm_server_takes_the_trainer_s_weights_without_a_restart(server):
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    engine = VLLMServers(f"{server}/v1", "policy", tokenizer, [tokenizer.eos_token_id])
    try:
        out = greedy(engine, prompt)
        assert torch.allclose(torch.tensor(out.logprobs), trainer_logprobs(model, prompt, out.ids), atol=2e-3)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.model.layers[5].parameters():
                p.add_(torch.randn_like(p) * 0.05)
        stale = greedy(engine, prompt)
        assert float((torch.tensor(stale.logprobs) - trainer_logprobs(model, prompt, stale.ids)).abs().max()) > 0.05
        engine.load_weights(model.state_dict())
        synced = greedy(engine, prompt)
        diff = float((torch.tensor(synced.logprobs) - trainer_logprobs(model, prompt, synced.ids)).abs().max())
        print(f"max |server - trainer| log-prob after the sync: {diff:.2e}")
        assert diff < 2e-3
    finally:
        engine.close()
