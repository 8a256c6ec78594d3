"""The gateway's three wire protocols (OpenAI chat completions and Responses, Anthropic Messages) over one capture
core: the official SDKs parse every reply and stream event, a forced call and a structured reply follow their
grammar on a real model, stop strings end the turn (streamed or not, on an engine that stops there itself or one
cut afterwards) with nothing past them captured, text streams as it is sampled, and what is not supported is
refused in one line in each protocol's own error shape."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import jsonschema
import pytest
import torch

from tests.gateway import policies
from tests.gateway.clients import PROGRAMS, client_python
from tests.gateway.policies import RulePolicy, StepwisePolicy
from toolrl.envs.base import Task
from toolrl.gateway import PROTOCOLS, Gateway
from toolrl.parsers import get_parser
from toolrl.rollout import HFEngine
from toolrl.rollout.guidance import cut_at_stop

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}  # fmt: skip
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"], "additionalProperties": False}  # fmt: skip


@pytest.fixture
def serve(chat):
    made = []

    def start(engine, **kwargs) -> Gateway:
        made.append(Gateway(engine, chat, get_parser("hermes"), "tiny", **kwargs).start())
        return made[-1]

    yield start
    for gateway in made:
        gateway.stop()


@pytest.fixture
def hf(tiny_model, tokenizer):
    return HFEngine(tiny_model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"),
                    tokenizer=tokenizer)  # fmt: skip


def post(gateway, path, body, base=None, anthropic=False):
    headers = {"x-api-key": gateway.key} if anthropic else {"Authorization": f"Bearer {gateway.key}"}
    return httpx.post(f"{base or gateway.base_url()}{path}", json=body, headers=headers, timeout=120)


def events(gateway, path, body, base=None, anthropic=False) -> list[dict]:
    headers = {"x-api-key": gateway.key} if anthropic else {"Authorization": f"Bearer {gateway.key}"}
    with httpx.stream("POST", f"{base or gateway.base_url()}{path}", json={**body, "stream": True}, headers=headers,
                      timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def streamed_text(protocol: str, stream: list[dict]) -> str:
    if protocol == "chat":
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in stream if c["choices"])
    if protocol == "responses":
        return "".join(e["delta"] for e in stream if e["type"] == "response.output_text.delta")
    return "".join(e["delta"]["text"] for e in stream if e["type"] == "content_block_delta" and "text" in e["delta"])


def test_the_official_sdks_parse_every_reply_and_stream_event(serve, chat, tmp_path):
    """Validated in the SDKs' own venvs against their pydantic models, over a policy that streams token by token."""
    gateway = serve(StepwisePolicy(chat, policies.calculator))
    env = {"OPENAI_BASE_URL": gateway.base_url(), "OPENAI_API_KEY": gateway.key, "PATH": "/usr/bin:/bin",
           "ANTHROPIC_BASE_URL": gateway.anthropic_base_url(), "ANTHROPIC_API_KEY": gateway.key}  # fmt: skip
    for venv, program, kinds in [
        ("openai", "check_openai_types.py", ["response.function_call_arguments.delta", "response.output_text.delta",
                                              "chat.completion.chunk", "error"]),
        ("anthropic", "check_anthropic_types.py", ["content_block_delta", "message_delta", "count_tokens", "error"]),
    ]:  # fmt: skip
        done = subprocess.run([client_python(venv), str(PROGRAMS / program)], env=env, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        checked = dict(line.split(": ") for line in done.stdout.strip().splitlines())
        assert all(int(checked.get(kind, 0)) > 0 for kind in kinds), checked


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_forced_call_follows_the_offered_schema_on_a_real_model(serve, hf, protocol):
    """A random tiny model, forced: the turn is a call of the named tool with arguments valid under its schema."""
    gateway = serve(hf)
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    other = {"type": "object", "properties": {"q": {"type": "string"}}}
    if protocol == "chat":
        tools = [
            {"type": "function", "function": {"name": n, "parameters": p}}
            for n, p in [("search", other), ("weather", WEATHER)]
        ]
        body = {"messages": question, "tools": tools, "max_tokens": 96, "temperature": 1.0,
                "tool_choice": {"type": "function", "function": {"name": "weather"}}}  # fmt: skip
        message = post(gateway, "/chat/completions", body).json()["choices"][0]["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
    elif protocol == "responses":
        tools = [{"type": "function", "name": n, "parameters": p} for n, p in [("search", other), ("weather", WEATHER)]]
        body = {
            "input": question,
            "tools": tools,
            "max_output_tokens": 96,
            "tool_choice": {"type": "function", "name": "weather"},
        }
        output = post(gateway, "/responses", body).json()["output"]
        calls = [(i["name"], json.loads(i["arguments"])) for i in output if i["type"] == "function_call"]
    else:
        tools = [{"name": n, "input_schema": p} for n, p in [("search", other), ("weather", WEATHER)]]
        body = {
            "messages": question,
            "tools": tools,
            "max_tokens": 96,
            "tool_choice": {"type": "tool", "name": "weather"},
        }
        reply = post(gateway, "/messages", body, anthropic=True).json()
        assert reply["stop_reason"] == "tool_use"
        calls = [(b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]
    assert [name for name, _ in calls] == ["weather"]
    jsonschema.validate(calls[0][1], WEATHER)


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_structured_reply_validates_against_its_schema_on_a_real_model(serve, hf, protocol):
    gateway = serve(hf)
    question = [{"role": "user", "content": "What is 2 + 2? Reply in JSON."}]
    if protocol == "chat":
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        body = {"messages": question, "response_format": fmt, "max_tokens": 64}
        text = post(gateway, "/chat/completions", body).json()["choices"][0]["message"]["content"]
    elif protocol == "responses":
        body = {"input": question, "max_output_tokens": 64,
                "text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}}  # fmt: skip
        text = post(gateway, "/responses", body).json()["output"][0]["content"][0]["text"]
    else:
        body = {
            "messages": question,
            "max_tokens": 64,
            "output_config": {"format": {"type": "json_schema", "schema": ANSWER}},
        }
        text = post(gateway, "/messages", body, anthropic=True).json()["content"][0]["text"]
    jsonschema.validate(json.loads(text), ANSWER)


def test_json_object_asks_for_any_object(serve, chat):
    policy = RulePolicy(chat, lambda context, params: '{"a": 1}')
    gateway = serve(policy)
    body = {"messages": [{"role": "user", "content": "JSON?"}], "response_format": {"type": "json_object"}}
    assert post(gateway, "/chat/completions", body).json()["choices"][0]["message"]["content"] == '{"a": 1}'
    assert '"type": "object"' in policy.seen[-1][2].grammar


def stop_request(protocol: str, stop: str, stream: bool = False) -> tuple[str, dict, dict]:
    question = [{"role": "user", "content": "Tell me a story."}]
    if protocol == "chat":
        return "/chat/completions", {"messages": question, "stop": [stop], "max_tokens": 40, "temperature": 0}, {}
    if protocol == "responses":  # the Responses API has no stop strings: the one protocol without
        raise AssertionError
    body = {"messages": question, "stop_sequences": [stop], "max_tokens": 40, "temperature": 0}
    return "/messages", body, {"anthropic": True}


def reply_text(protocol: str, reply: dict) -> str:
    if protocol == "chat":
        return reply["choices"][0]["message"]["content"]
    return "".join(b["text"] for b in reply["content"] if b["type"] == "text")


@pytest.mark.parametrize("protocol", ["chat", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_turn_and_nothing_after_it_is_sent_or_captured(serve, hf, tokenizer, protocol, stream):
    """On the hf engine (it stops there itself): the reply is the greedy reply cut before the stop string (which
    no delta ever shows), and the captured turn ends with the token that completed it."""
    gateway = serve(hf)
    sample = gateway.open_sample(Task("t", "story", "", {}))
    base = gateway.base_url(sample)
    path, body, how = stop_request(protocol, "x")
    free = {**body, "stop": None, "stop_sequences": None}
    full = reply_text(protocol, post(gateway, path, {k: v for k, v in free.items() if v is not None}, base=base,
                                     **how).json())  # fmt: skip
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    path, body, how = stop_request(protocol, stop)
    if stream:
        stream_events = events(gateway, path, body, base=base, **how)
        text = streamed_text(protocol, stream_events)
        assert not any(stop in streamed_text(protocol, [e]) for e in stream_events)  # no delta shows it
    else:
        reply = post(gateway, path, body, base=base, **how).json()
        text = reply_text(protocol, reply)
        if protocol == "messages":
            assert reply["stop_reason"] == "stop_sequence" and reply["stop_sequence"] == stop
        else:
            assert reply["choices"][0]["finish_reason"] == "stop"
    assert text == full[: full.index(stop)]
    record = gateway.close_sample(sample.id)
    first, second = record.segments[0].traj, record.segments[1].traj  # the free turn, the stopped one
    (a, b), (c, d) = first.model_spans()[0], second.model_spans()[0]
    cut = cut_at_stop(tokenizer, first.token_ids[a:b], [stop])
    assert second.token_ids[c:d] == first.token_ids[a : a + cut.tokens]  # up to the completing token, no further


def test_an_engine_that_samples_past_a_stop_string_is_cut_and_what_follows_is_not_captured(serve, chat):
    """A policy that does not stop at strings (a served model, a test double): its turn is cut at the token that
    completes the stop string; the tokens after it are neither sent nor recorded (no token the client did not
    receive enters the loss), and the segment continues from the cut."""
    policy = RulePolicy(chat, lambda context, params: "Thought: add them.\nObservation: 4\nFinal: 4")
    gateway = serve(policy)
    sample = gateway.open_sample(Task("t", "q", "4", {}))
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    reply = post(gateway, "/chat/completions", {"messages": messages, "stop": ["Observation:"]},
                 base=gateway.base_url(sample)).json()  # fmt: skip
    assert reply["choices"][0]["message"]["content"] == "Thought: add them.\n"
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "Observation: 4"}]
    post(gateway, "/chat/completions", {"messages": messages, "stop": ["Observation:"]}, base=gateway.base_url(sample))
    record = gateway.close_sample(sample.id)
    (segment,) = record.segments
    a, b = segment.traj.model_spans()[0]
    assert chat.tokenizer.decode(segment.traj.token_ids[a:b]) == "Thought: add them.\nObservation:"
    assert not segment.ended or record.continued == 1
    assert segment.traj.loss_mask[a:b] == [1] * (b - a) and policies.drift(policy, segment) == 0


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_the_first_delta_of_a_64_token_answer_arrives_before_its_last_token_is_sampled(serve, chat, protocol):
    answer = "".join(f"{i % 10}" for i in range(63))  # one token a character: 63 tokens and the end of turn
    policy = StepwisePolicy(chat, lambda context, params: answer, delay=0.01)
    gateway = serve(policy)
    question = [{"role": "user", "content": "Count."}]
    path, body, how = {
        "chat": ("/chat/completions", {"messages": question}, {}),
        "responses": ("/responses", {"input": question}, {}),
        "messages": ("/messages", {"messages": question, "max_tokens": 100}, {"anthropic": True}),
    }[protocol]
    base = None
    headers = {"x-api-key": gateway.key} if how else {"Authorization": f"Bearer {gateway.key}"}
    arrivals, text = [], ""
    with httpx.stream("POST", f"{base or gateway.base_url()}{path}", json={**body, "stream": True}, headers=headers,
                      timeout=60) as response:  # fmt: skip
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                piece = streamed_text(protocol, [json.loads(line[6:])])
                if piece:
                    arrivals.append(time.monotonic())
                    text += piece
    assert text == answer and len(arrivals) > 30
    assert arrivals[0] < policy.told_last - 0.3  # the first delta came ~0.6 s before the last token


def test_responses_are_kept_per_sample_bounded_and_only_with_store(serve, chat):
    gateway = serve(RulePolicy(chat, policies.calculator), max_stored_responses=2)
    tools = [{"type": "function", "name": "calculator", "parameters": {"type": "object"}}]
    one, two = gateway.open_sample(Task("a", "q", "", {})), gateway.open_sample(Task("b", "q", "", {}))
    first = post(gateway, "/responses", {"input": "2 + 2?", "tools": tools}, base=gateway.base_url(one)).json()
    assert first["store"] is True and first["output"][0]["type"] == "function_call"
    got = httpx.get(
        f"{gateway.base_url(one)}/responses/{first['id']}", headers={"Authorization": f"Bearer {gateway.key}"}
    )
    assert got.json()["id"] == first["id"]
    elsewhere = post(
        gateway, "/responses", {"input": "x", "previous_response_id": first["id"]}, base=gateway.base_url(two)
    )
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["param"] == "previous_response_id"
    unstored = post(gateway, "/responses", {"input": "2 + 2?", "store": False}, base=gateway.base_url(one)).json()
    gone = post(
        gateway, "/responses", {"input": "x", "previous_response_id": unstored["id"]}, base=gateway.base_url(one)
    )
    assert gone.status_code == 404 and "no stored response" in gone.json()["error"]["message"]
    for _ in range(2):  # two more stored: the first is dropped (the bound is 2)
        post(gateway, "/responses", {"input": "2 + 2?"}, base=gateway.base_url(one))
    late = post(gateway, "/responses", {"input": "x", "previous_response_id": first["id"]}, base=gateway.base_url(one))
    assert late.status_code == 404
    gateway.close_sample(one.id)
    assert not gateway.responses.kept  # a closed sample's responses go with it


def test_an_item_reference_is_the_item_the_gateway_issued_and_continues_its_segment(serve, chat):
    """Issue 72: the Vercel AI SDK's default `openai(model)` sends its earlier turns back as item_reference (store
    on) and failed on its third request with a 400. The ids the gateway issued resolve (same sample); others are a
    one-line 404; the tool loop stays one captured segment."""
    gateway = serve(RulePolicy(chat, policies.calculator))
    tools = [{"type": "function", "name": "calculator", "parameters": {"type": "object"}}]
    one, two = gateway.open_sample(Task("a", "q", "", {})), gateway.open_sample(Task("b", "q", "", {}))
    question = {"role": "user", "content": "2 + 2?"}
    first = post(gateway, "/responses", {"input": [question], "tools": tools}, base=gateway.base_url(one)).json()
    (call,) = first["output"]
    assert call["type"] == "function_call" and call["id"].startswith("fc_")
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "4"}
    ask = {"input": [question, {"type": "item_reference", "id": call["id"]}, answer], "tools": tools}
    second = post(gateway, "/responses", ask, base=gateway.base_url(one))
    assert second.status_code == 200, second.text
    assert "4" in second.json()["output"][0]["content"][0]["text"]
    assert len(one.segments) == 1 and one.segments[0].traj.num_turns == 2  # the call, then the answer: one sequence
    for base, ref in ((gateway.base_url(two), call["id"]), (gateway.base_url(one), "fc_never_issued")):
        refused = post(gateway, "/responses", {**ask, "input": [question, {"type": "item_reference", "id": ref}]},
                       base=base)  # fmt: skip
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "input[1]"
        assert "was issued to this agent" in refused.json()["error"]["message"]


def test_messages_are_served_at_the_anthropic_base_url_with_and_without_v1(serve, chat):
    """Issue 72: ANTHROPIC_BASE_URL is printed without /v1; @ai-sdk/anthropic appends only /messages to it (and got
    a 404, in serve and in training). Both forms are served, plain and per sample."""
    gateway = serve(RulePolicy(chat, policies.calculator))
    sample = gateway.open_sample(Task("a", "q", "", {}))
    body = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": gateway.key}
    for base in (gateway.anthropic_base_url(), gateway.anthropic_base_url(sample)):
        for path in ("/messages", "/v1/messages"):
            reply = httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30)
            assert reply.status_code == 200 and reply.json()["type"] == "message", (base, path, reply.text)
        counted = httpx.post(f"{base}/messages/count_tokens", json=body, headers=headers, timeout=30)
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    assert sample.protocols["messages"] == 2
    plain = httpx.post(f"{gateway.anthropic_base_url()}/chat/completions", json=body, headers=headers)
    assert plain.status_code == 404  # only the Anthropic paths are served without /v1


def test_the_response_store_is_bounded_in_bytes_and_metadata_by_the_api_s_limits(serve, chat):
    """Issue 72: echoed metadata and hosted tools were kept whole (75 x 6 MiB held 474 MB)."""
    gateway = serve(RulePolicy(chat, policies.calculator))
    gateway.responses.max_bytes = 60_000
    hosted = [{"type": "web_search", "filler": "x" * 20_000}]  # left out, but echoed in the response kept
    for _ in range(5):
        assert post(gateway, "/responses", {"input": "2 + 2?", "tools": hosted}).status_code == 200
    store = gateway.responses
    assert store.bytes <= 60_000 and len(store.kept) == 2 and store.dropped == 3
    assert store.bytes == sum(store.sizes.values())
    gateway.responses.max_bytes = 10_000
    assert post(gateway, "/responses", {"input": "2 + 2?", "tools": hosted}).status_code == 200
    assert store.dropped == 4 and len(store.kept) == 2  # one alone past the bound: answered, not kept
    for metadata, said in (
        ({f"k{i}": "v" for i in range(17)}, "at most 16"),
        ({"k" * 65: "v"}, "keys of at most"),
        ({"k": "v" * 513}, "values strings"),
        ({"k": 5}, "values strings"),
        ("x", "at most 16"),
    ):
        refused = post(gateway, "/responses", {"input": "hi", "metadata": metadata})
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], metadata
        assert refused.json()["error"]["param"] == "metadata"
    kept = post(gateway, "/responses", {"input": "hi", "metadata": {"run": "7"}}).json()
    assert kept["metadata"] == {"run": "7"}


def test_what_the_gateway_does_not_do_is_refused_in_one_line_or_left_out_and_told(serve, chat):
    gateway = serve(RulePolicy(chat, policies.calculator))
    image = {"type": "input_image", "image_url": "file:///etc/shadow"}
    refused = post(gateway, "/responses", {"input": [{"role": "user", "content": [image]}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[0].content[0]"
    assert post(gateway, "/responses", {"input": "x", "background": True}).json()["error"]["param"] == "background"
    reference = post(gateway, "/responses", {"input": [{"type": "item_reference", "id": "msg_1"}]}).json()["error"]
    assert "no item 'msg_1' was issued to this agent" in reference["message"]  # one it did not issue
    base = gateway.base_url()
    picture = {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}
    error = post(gateway, "/messages", {"messages": [picture], "max_tokens": 8}, base=base, anthropic=True).json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "image is not supported" in error["error"]["message"]
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    assert "prefill" in post(gateway, "/messages", {"messages": prefill}, base=base, anthropic=True).text
    wrong = post(gateway, "/messages", {"messages": prefill[:1]}, base=base, anthropic=False)  # bearer works as well
    assert wrong.status_code == 200
    bad_key = httpx.post(f"{base}/v1/messages", json={"messages": prefill[:1]}, headers={"x-api-key": "nope"})
    assert bad_key.status_code == 401 and bad_key.json()["error"]["type"] == "authentication_error"
    hosted = [{"type": "web_search"}, {"type": "function", "name": "calculator", "parameters": {"type": "object"}}]
    served = post(gateway, "/responses", {"input": "2 + 2?", "tools": hosted})
    assert served.status_code == 200 and "web_search" in served.headers["x-toolrl-ignored"]
    assert gateway.stats["ignored/tools[0] web_search (a hosted tool the gateway does not run)"] == 1
    reasoning = [{"type": "reasoning", "summary": []}, {"role": "user", "content": "2 + 2?"}]
    assert "reasoning" in post(gateway, "/responses", {"input": reasoning}).headers["x-toolrl-ignored"]
    unknown = post(gateway, "/embeddings", {"input": "x"})
    assert unknown.status_code == 404 and "no such endpoint: POST /v1/embeddings" in unknown.json()["error"]["message"]


def test_a_namespaced_tool_is_offered_by_its_full_name_and_comes_back_with_its_namespace(serve, chat):
    """Codex groups tools in namespaces: the model sees `namespace.name`; the call comes back as name + namespace,
    and sent back so, continues the segment."""
    policy = RulePolicy(chat, lambda c, p: "Done." if policies.answered(c) else policies.call("agents.spawn", task="x"))
    gateway = serve(policy)
    sample = gateway.open_sample(Task("t", "q", "", {}))
    tools = [{"type": "namespace", "name": "agents", "description": "Sub-agents.",
              "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}]}]  # fmt: skip
    first = post(gateway, "/responses", {"input": "go", "tools": tools, "store": False}, base=gateway.base_url(sample))
    (item,) = first.json()["output"]
    assert (item["name"], item["namespace"]) == ("spawn", "agents")
    replay = [{"role": "user", "content": "go"}, item, {"type": "function_call_output", "call_id": item["call_id"],
                                                        "output": "spawned"}]  # fmt: skip
    second = post(gateway, "/responses", {"input": replay, "tools": tools}, base=gateway.base_url(sample)).json()
    assert second["output"][0]["content"][0]["text"] == "Done."
    record = gateway.close_sample(sample.id)
    assert record.continued == 1 and len(record.segments) == 1


def test_a_prompt_past_the_context_is_refused_naming_both_lengths_in_each_shape(serve, chat):
    gateway = serve(RulePolicy(chat, policies.calculator), context_length=64)
    long = [{"role": "user", "content": "word " * 200}]
    chat_error = post(gateway, "/chat/completions", {"messages": long}).json()["error"]
    assert chat_error["code"] == "context_length_exceeded" and "the model's context 64" in chat_error["message"]
    error = post(gateway, "/messages", {"messages": long}, anthropic=True).json()
    assert error["error"]["message"].startswith("prompt is too long: the prompt is ")  # the words harnesses look for
    count = post(gateway, "/messages/count_tokens", {"messages": long}, anthropic=True)
    assert count.json()["input_tokens"] > 200


def test_a_stream_that_fails_after_its_first_event_ends_with_the_protocols_error_event(serve, chat):
    class Failing(StepwisePolicy):
        async def generate_stream(self, seq, tokens, params, on_tokens):
            on_tokens(self.chat.encode("Hel"))
            raise RuntimeError("the engine broke")

    gateway = serve(Failing(chat, policies.calculator))
    question = [{"role": "user", "content": "hi"}]
    last = events(gateway, "/chat/completions", {"messages": question})[-1]
    assert "the engine broke" in last["error"]["message"]
    assert events(gateway, "/responses", {"input": question})[-1]["type"] == "response.failed"
    last = events(gateway, "/messages", {"messages": question}, anthropic=True)[-1]
    assert last["type"] == "error" and "the engine broke" in last["error"]["message"]
    assert gateway.stats["errors"] == 3


def test_concurrent_streams_of_many_samples_each_land_in_their_own_segment(serve, chat):
    gateway = serve(StepwisePolicy(chat, policies.calculator, delay=0.001))
    samples = [gateway.open_sample(Task(str(i), "q", "", {})) for i in range(6)]
    failures: list[BaseException] = []

    def run(sample):
        try:
            messages = [{"role": "user", "content": f"Sum {sample.task.id} + 2?"}]
            tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
            chunks = events(gateway, "/chat/completions", {"messages": messages, "tools": tools},
                            base=gateway.base_url(sample))  # fmt: skip
            calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"] and
                     "tool_calls" in c["choices"][0]["delta"]]  # fmt: skip
            call = {
                "id": calls[0]["id"],
                "type": "function",
                "function": {"name": "calculator", "arguments": "".join(c["function"]["arguments"] for c in calls)},
            }
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "4"}]  # fmt: skip
            events(gateway, "/chat/completions", {"messages": messages, "tools": tools}, base=gateway.base_url(sample))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in samples]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    for sample in samples:
        record = gateway.close_sample(sample.id)
        assert len(record.segments) == 1 and record.continued == 1 and record.segments[0].traj.num_turns == 2


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
    "</think>\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def test_reasoning_in_a_history_is_passed_through_where_the_template_shows_it(serve, tokenizer):
    """A Responses reasoning item and an Anthropic thinking block reach the prompt as the turn's reasoning_content
    with a template that renders it (a Qwen3-like one); with one that does not (SmolLM2's) they are left out and
    told (test_what_the_gateway_does_not_do_...)."""
    import copy

    from toolrl.chat import ChatFormat

    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    chat = ChatFormat(thinking)
    assert chat.template_shows_reasoning and not ChatFormat(tokenizer).template_shows_reasoning
    policy = RulePolicy(chat, lambda context, params: "ok")
    gateway = Gateway(policy, chat, get_parser("hermes"), "tiny").start()
    try:
        items = [{"role": "user", "content": "2 + 2?"},
                 {"type": "reasoning", "summary": [{"type": "summary_text", "text": "add two and two"}]},
                 {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3 + 3?"}]  # fmt: skip
        reply = post(gateway, "/responses", {"input": items})
        assert reply.status_code == 200 and "x-toolrl-ignored" not in reply.headers
        assert "<think>add two and two</think>\n4" in tokenizer.decode(policy.seen[-1][1])
        blocks = [{"type": "thinking", "thinking": "three and three", "signature": "s"}, {"type": "text", "text": "6"}]
        history = [{"role": "user", "content": "3 + 3?"}, {"role": "assistant", "content": blocks},
                   {"role": "user", "content": "thanks"}]  # fmt: skip
        assert post(gateway, "/messages", {"messages": history}, anthropic=True).status_code == 200
        assert "<think>three and three</think>\n6" in tokenizer.decode(policy.seen[-1][1])
    finally:
        gateway.stop()


def test_a_parser_and_a_protocol_of_ones_own_serve_forced_calls_and_requests(serve, hf, chat, tokenizer):
    """From outside the package: a call syntax registered with its grammar and framing forces and streams calls in
    its own markup; a wire protocol registered beside the built-in ones is served at its path."""
    from toolrl.gateway import Protocol, register_protocol
    from toolrl.gateway.turns import TurnRequest
    from toolrl.parsers import ParseResult, register_parser
    from toolrl.parsers.base import CallFraming, call_from_object, json_calls_grammar

    def parse(text, known_tools=None):
        result = ParseResult()
        for body in text.split("<call>")[1:]:
            call, error = call_from_object(
                json.loads(body.split("</call>")[0]), known_tools, "write <call>{...}</call>"
            )
            result.calls.append(call) if call else result.errors.append(error)
        return result

    register_parser("xml-calls", lambda calls: "", "Write <call>{...}</call>",
                    grammar=json_calls_grammar("xml", "<call>", "</call>", "", "arguments"),
                    framing=CallFraming("<call>", "</call>"))(parse)  # fmt: skip

    class Echo(Protocol):  # one user message in, the turn's text out
        name, path = "echo", "/echo"

        def parse(self, body, gateway, sample):
            return TurnRequest([{"role": "user", "content": str(body["say"])}], max_tokens=8)

        def reply(self, gateway, work, turns):
            return {"said": turns[0].text}

        async def stream(self, gateway, work, events):
            yield ""

        def error(self, error):
            return {"oops": str(error)}

    register_protocol(Echo(), replace=True)
    gateway = Gateway(hf, chat, get_parser("xml-calls"), "tiny").start()
    try:
        tools = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
        body = {"messages": [{"role": "user", "content": "Oslo?"}], "tools": tools, "tool_choice": "required",
                "parallel_tool_calls": False, "max_tokens": 96}  # fmt: skip
        (call,) = post(gateway, "/chat/completions", body).json()["choices"][0]["message"]["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
        streamed = events(gateway, "/chat/completions", body)
        pieces = [c["choices"][0]["delta"]["tool_calls"][0] for c in streamed if c["choices"] and
                  "tool_calls" in c["choices"][0]["delta"]]  # fmt: skip
        assert len(pieces) > 2 and pieces[0]["function"]["name"] == "weather"  # announced, then argument pieces
        jsonschema.validate(json.loads("".join(p["function"]["arguments"] for p in pieces)), WEATHER)
        assert isinstance(post(gateway, "/echo", {"say": "hello"}).json()["said"], str)
        broken = post(gateway, "/echo", {"nothing": 1})  # the protocol's own bug: a 500 in its shape, one line
        assert broken.status_code == 500 and broken.json() == {"oops": "the gateway failed: 'say'"}
    finally:
        gateway.stop()
        dict.__delitem__(PROTOCOLS, "echo")


def test_two_requests_at_once_that_would_continue_one_segment_each_get_a_segment_of_their_own(serve, chat):
    """An agent that sends two follow-ups of one turn at once: the first continues the segment, the second (while the
    first is sampled) starts its own; neither corrupts the other."""
    gateway = serve(StepwisePolicy(chat, policies.calculator, delay=0.01))
    sample = gateway.open_sample(Task("t", "q", "4", {}))
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "2 + 2?"}]
    first = post(gateway, "/chat/completions", {"messages": messages, "tools": tools}, base=gateway.base_url(sample))
    message = first.json()["choices"][0]["message"]
    follow = [*messages, message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "4"}]
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(post(gateway, "/chat/completions", {
        "messages": follow, "tools": tools}, base=gateway.base_url(sample)))) for _ in range(2)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.status_code for r in replies] == [200, 200]
    record = gateway.close_sample(sample.id)
    assert record.continued == 1 and len(record.segments) == 2
    assert sorted(s.traj.num_turns for s in record.segments) == [1, 2]


def test_hostile_bodies_are_refused_in_one_line_and_the_gateway_goes_on(serve, chat):
    """A body nested past what a parser reads, a tool type that would split the reply's headers, a schema that is
    no schema, a call forced with no tools: each one line in the protocol's shape; the next request is served."""
    gateway = serve(RulePolicy(chat, policies.calculator))
    headers = {"Authorization": f"Bearer {gateway.key}", "Content-Type": "application/json"}
    deep = b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    nested = httpx.post(f"{gateway.base_url()}/responses", content=deep, headers=headers)
    assert nested.status_code == 400 and "nests deeper than 64 levels" in nested.json()["error"]["message"]
    split = [{"type": "web_search\r\nSet-Cookie: stolen=1"}]
    served = post(gateway, "/responses", {"input": "2 + 2?", "tools": split})
    assert served.status_code == 200 and "set-cookie" not in served.headers
    assert "\r" not in served.headers["x-toolrl-ignored"] and "\n" not in served.headers["x-toolrl-ignored"]
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no such type"}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": bad_schema}
    error = post(gateway, "/chat/completions", body).json()["error"]
    assert error["param"] == "response_format" and "the schema cannot be followed" in error["message"]
    forced = post(gateway, "/chat/completions", {"messages": body["messages"], "tool_choice": "required"}).json()
    assert forced["error"]["param"] == "tool_choice" and "no function tools are offered" in forced["error"]["message"]
    assert post(gateway, "/chat/completions", {"messages": body["messages"]}).status_code == 200
