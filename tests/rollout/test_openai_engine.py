"""The OpenAI-compatible engine against a local completions server: token ids in, token ids and log-probs out."""

import asyncio
import json

import pytest
import torch

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.parsers import get_parser
from toolrl.rollout import HFEngine, OpenAIEngine, Rollout, RolloutLimits, SamplingParams
from toolrl.tools import ToolExecutor


def token_reply(ids, logprobs, finish="stop"):
    tokens = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": logprobs}
    return {"choices": [{"text": "ignored", "logprobs": tokens, "finish_reason": finish}]}


def test_prompt_goes_as_token_ids_and_the_reply_keeps_ids_and_logprobs(tiny_model, tokenizer):
    """The server here samples with toolrl's own HFEngine on the tiny model: the OpenAI engine must hand back
    exactly what the server sampled, and send the prompt ids and settings it was given."""
    local = HFEngine(tiny_model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    bodies = []

    def complete(body):
        bodies.append(body)
        params = SamplingParams(body["temperature"], body["top_p"], body.get("top_k", 0), body["max_tokens"])
        out = asyncio.run(local.generate(len(bodies), body["prompt"], params))
        return token_reply(out.ids, out.logprobs, "stop" if out.ended else "length")

    prompt = tokenizer("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    with LocalHTTPServer(complete=complete) as server:
        engine = OpenAIEngine(f"{server.url}/v1", "tiny", tokenizer, [tokenizer.eos_token_id])
        out = asyncio.run(engine.generate("s", prompt, SamplingParams(0.0, max_new_tokens=5)))
        engine.close()
    expected = asyncio.run(local.generate("again", prompt, SamplingParams(0.0, max_new_tokens=5)))
    assert (out.ids, out.ended) == (expected.ids, expected.ended)
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expected.logprobs))
    body = bodies[0]
    assert body["prompt"] == prompt and body["max_tokens"] == 5 and body["temperature"] == 0.0
    assert body["stop_token_ids"] == [tokenizer.eos_token_id] and body["return_tokens_as_token_ids"] is True
    assert engine.token_exact


def test_a_server_without_token_ids_is_encoded_and_flagged(tokenizer):
    def complete(body):
        return {"choices": [{"text": "<answer>12</answer>", "finish_reason": "stop"}]}

    with LocalHTTPServer(complete=complete) as server:
        engine = OpenAIEngine(f"{server.url}/v1", "m", tokenizer, [tokenizer.eos_token_id])
        out = asyncio.run(engine.generate("s", [1, 2, 3], SamplingParams(max_new_tokens=20)))
        engine.close()
    assert out.ids == tokenizer.encode("<answer>12</answer>", add_special_tokens=False)
    assert not engine.token_exact and not out.ended  # no stop id among the ids: the rollout adds it as observation


def test_a_multi_turn_rollout_through_the_server(chat, tokenizer):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1}))
    task = env.tasks("test")[0]
    call = {"name": "calculator", "arguments": {"expression": task.meta["expression"]}}
    turns = [
        chat.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [chat.end_of_turn_id],
        chat.encode(f"<answer>{task.answer}</answer>") + [chat.end_of_turn_id],
    ]
    prompts = []

    def complete(body):
        prompts.append(body["prompt"])
        ids = turns[len(prompts) - 1]
        return token_reply(ids, [-0.25] * len(ids))

    with LocalHTTPServer(complete=complete) as server:
        engine = OpenAIEngine(f"{server.url}/v1", "m", tokenizer, chat.stop_ids)
        rollout = Rollout(
            env, engine, chat, get_parser("hermes"), ToolExecutor(env.tools()), RolloutLimits(3, 64, 400, 50)
        )
        [traj] = rollout.run([task])
        engine.close()
    observation = chat.observation_ids([task.answer], model_ended_turn=True)
    assert prompts[1] == rollout.prompt_ids(task) + turns[0] + observation
    assert traj.token_ids == prompts[1] + turns[1]
    assert (traj.stop_reason, traj.rewards["correct"], traj.trained_logprobs[0]) == ("answer", 1.0, -0.25)


def test_training_refuses_a_server_engine(tiny_model_dir):
    from toolrl.config import load_config
    from toolrl.errors import ConfigError
    from toolrl.train import GRPOTrainer, Workbench

    config = load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", "rollout.engine=openai"])
    bench = Workbench.load(config)
    try:
        with pytest.raises(ConfigError, match=r"rollout\.engine: openai serves evaluation only"):
            GRPOTrainer(bench)
    finally:
        bench.close()


def test_a_server_that_is_down_is_one_line_naming_the_setting(tokenizer):
    from toolrl.errors import EngineError

    engine = OpenAIEngine("http://127.0.0.1:9/v1", "m", tokenizer, [tokenizer.eos_token_id])
    with pytest.raises(EngineError) as err:
        asyncio.run(engine.generate("s", [1, 2], SamplingParams(max_new_tokens=2)))
    engine.close()
    message = str(err.value)
    assert message.startswith("rollout.openai.base_url: POST http://127.0.0.1:9/v1/completions: ConnectError")
    assert "\n" not in message and message.endswith("is the server up at http://127.0.0.1:9/v1/completions?")


def tagged_server(tag: int):
    """A completions server whose every reply is one token, its tag, so a reply says who answered."""
    from tests.fixtures.http_server import LocalHTTPServer

    def complete(body):
        return {"choices": [{"text": "", "logprobs": {"tokens": [f"token_id:{tag}"], "token_logprobs": [-0.5]}}]}

    return LocalHTTPServer(complete=complete)


def test_sequences_spread_over_servers_and_stay_on_theirs(tokenizer):
    with tagged_server(101) as a, tagged_server(202) as b:
        engine = OpenAIEngine([f"{a.url}/v1", f"{b.url}/v1"], "m", tokenizer, [tokenizer.eos_token_id])
        params = SamplingParams(max_new_tokens=1)

        async def two_turns(i):
            first = await engine.generate(i, [1, 2, i], params)
            second = await engine.generate(i, [1, 2, i, 7], params)
            return first.ids[0], second.ids[0]

        async def main():
            return await asyncio.gather(*(two_turns(i) for i in range(8)))

        answers = asyncio.run(main())
        engine.close()
    assert all(first == second for first, second in answers)  # a sequence stays on its server
    by_server = [first for first, _ in answers]
    assert by_server.count(101) == by_server.count(202) == 4  # fewest in flight first: an even spread


def test_a_server_that_is_down_is_left_out_and_named_when_none_answers(tokenizer):
    from toolrl.errors import EngineError

    with tagged_server(303) as up:
        engine = OpenAIEngine(["http://127.0.0.1:9/v1", f"{up.url}/v1"], "m", tokenizer, [tokenizer.eos_token_id])
        assert engine.health()[f"{up.url}/v1"] == "ok" and "ConnectError" in engine.health()["http://127.0.0.1:9/v1"]
        engine.servers[0].down_until = 0.0  # as if its time out were over: a request tries it again
        outs = [asyncio.run(engine.generate(i, [1, 2], SamplingParams(max_new_tokens=1))) for i in range(4)]
        assert [o.ids for o in outs] == [[303]] * 4
        assert engine.servers[0].down_until > 0 and "ConnectError" in engine.servers[0].last_error
        engine.close()
    engine = OpenAIEngine(["http://127.0.0.1:9/v1", "http://127.0.0.1:8/v1"], "m", tokenizer, [tokenizer.eos_token_id])
    with pytest.raises(EngineError) as err:
        asyncio.run(engine.generate("s", [1, 2], SamplingParams(max_new_tokens=2)))
    engine.close()
    message = str(err.value)
    assert message.startswith("rollout.openai.base_url: no server answered (http://127.0.0.1:9/v1/completions: ")
    assert "http://127.0.0.1:8/v1/completions: " in message and "\n" not in message


def test_a_server_that_cannot_take_the_weights_is_left_out_and_none_is_one_line(tokenizer):
    """vllm-server's weight push against servers without vLLM's reload endpoints (a plain completions server)."""
    from toolrl.errors import EngineError
    from toolrl.rollout.openai import VLLMServers

    weights = {"w": torch.zeros(2)}
    with tagged_server(404) as plain:
        engine = VLLMServers([f"{plain.url}/v1"], "m", tokenizer, [tokenizer.eos_token_id])
        with pytest.raises(EngineError, match=r"no server took the new weights \(http://127\.0\.0\.1:\d+/v1: "):
            engine.load_weights(weights)
        assert (engine.weights_dir / "model.safetensors").is_file()
        assert engine.servers[0].down_until == float("inf")  # never used again: it would sample stale weights
        folder = engine.weights_dir
        engine.close()
    assert not folder.exists()
