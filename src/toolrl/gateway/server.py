"""The gateway: an OpenAI-compatible HTTP server in front of the policy, so agent programs written for any
OpenAI client run unchanged while their turns are recorded token-exactly for training.

`/v1/chat/completions` (tools, tool_choice, n, stream: token by token without tools), `/v1/completions` and
`/v1/models`, served by the run's engine (the one rollouts use: it batches the concurrent requests of every
agent), its chat format and its call syntax (`rollout.parser`): tool calls the model writes come back as OpenAI
`tool_calls`; a malformed one comes back as the text the model wrote, and is counted. Every request needs the
gateway's key (`Authorization: Bearer KEY`); it listens on 127.0.0.1. `/s/SAMPLE/v1/...` (the base URL
`open_sample` gives one agent run) ties requests to one sample, whose segments capture.py records; plain
`/v1/...` serves without recording (`toolrl serve`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from toolrl.chat.format import ChatFormat
from toolrl.envs.base import Task
from toolrl.gateway.capture import (
    Sample,
    Segment,
    branch,
    continuation_ids,
    find_segment,
    normal,
    template_messages,
    tools_key,
)
from toolrl.gateway.protocol import (
    ChatRequest,
    Chunks,
    CompletionRequest,
    GatewayError,
    chat_response,
    tool_calls_json,
)
from toolrl.parsers.base import CallSyntax
from toolrl.rollout.engine import Engine
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory
from toolrl.text import first_line
from toolrl.tools.call import ToolResult

log = logging.getLogger(__name__)

UNBOUND = Task("unbound", "", "", {})
"""The task of a request made outside any sample (served, not recorded)."""


@dataclass
class ChatWork:
    """A chat request made ready to sample: its segments (one per choice) and their sampling."""

    req: ChatRequest
    sample: Sample | None
    segments: list[Segment]
    params: list[SamplingParams]
    schemas: list[dict[str, Any]]
    rid: str


class Gateway:
    """The policy behind an OpenAI-compatible endpoint. `start()` serves it from a thread of its own, whose event
    loop runs the engine; `open_sample(task)` gives an agent run its base URL; `close_sample` its segments."""

    def __init__(
        self,
        engine: Engine,
        chat: ChatFormat,
        syntax: CallSyntax,
        model_name: str = "policy",
        *,
        key: str | None = None,
        max_new_tokens: int = 512,
        max_response_tokens: int = 2**31,
        context_length: int = 2**31,
        sampling: SamplingParams | None = None,
        max_calls_per_turn: int = 16,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.engine, self.chat, self.syntax, self.model_name = engine, chat, syntax, model_name
        self.key = key or secrets.token_urlsafe(24)
        self.max_new_tokens, self.context_length = max_new_tokens, context_length
        self.max_response_tokens = max_response_tokens
        """Per segment after its prompt (sampled, tool and user tokens): a runaway agent's sequence stops here."""
        self.sampling = sampling or SamplingParams()
        self.max_calls_per_turn = max_calls_per_turn
        self.host, self.port = host, port
        self.samples: dict[str, Sample] = {}
        self.stats: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    # ---- samples ------------------------------------------------------------------------------------------

    def open_sample(self, task: Task) -> Sample:
        sample = Sample(uuid.uuid4().hex, task)
        with self.lock:
            self.samples[sample.id] = sample
        return sample

    def close_sample(self, sample_id: str) -> Sample:
        """The sample's record; its sequences are released in the engine and later requests to it refused."""
        with self.lock:
            sample = self.samples.pop(sample_id)
        self._release([s.seq for s in sample.segments])
        return sample

    def base_url(self, sample: Sample | str | None = None) -> str:
        sid = sample.id if isinstance(sample, Sample) else sample
        return f"http://{self.host}:{self.port}" + (f"/s/{sid}" if sid else "") + "/v1"

    def _release(self, seqs: list[object]) -> None:
        if self.loop is None or not seqs:
            return
        self.loop.call_soon_threadsafe(lambda: [self.engine.release(seq) for seq in seqs])

    # ---- requests -----------------------------------------------------------------------------------------

    def _params(self, req, n_index: int = 0, prompt_len: int = 0, response_len: int = 0) -> SamplingParams:
        wanted = req.max_completion_tokens or req.max_tokens or self.max_new_tokens
        budget = min(wanted, self.max_new_tokens, self.context_length - prompt_len)
        if budget < 1:
            raise GatewayError(
                f"the prompt is {prompt_len:,} tokens, the model's context {self.context_length:,}: nothing can be "
                "generated; send a shorter conversation",
                param="messages",
            )
        room = self.max_response_tokens - response_len
        if room < 1:
            raise GatewayError(
                f"this conversation has {response_len:,} tokens after its first prompt, "
                f"rollout.max_response_tokens is {self.max_response_tokens:,}: start a new one",
                param="messages",
            )
        budget = min(budget, room)
        s = self.sampling
        seed = None if req.seed is None else req.seed + n_index
        temperature = s.temperature if req.temperature is None else req.temperature
        return SamplingParams(temperature, s.top_p if req.top_p is None else req.top_p, s.top_k, budget, seed)

    def _segment(self, sample: Sample | None, req: ChatRequest, schemas: list[dict]) -> Segment:
        """The segment this request continues (only its new messages tokenized), or a new one."""
        key = tools_key(schemas)
        if sample is not None and (segment := find_segment(sample, req.messages, key)) is not None:
            added = req.messages[len(segment.messages) :]
            ids = continuation_ids(self.chat, added, segment.ended)
            self._results(segment, added)
            if any(m["role"] == "user" for m in added):
                segment.traj.add_user_message(ids, "\n".join(str(m.get("content") or "") for m in added))
            else:
                segment.traj.add_observation(ids)
            segment.messages += [normal(m) for m in added]
            sample.continued += 1
            return segment
        messages = template_messages(req.messages, self.syntax)
        prompt = self.chat.prompt_ids(messages, schemas, self.syntax.instructions)
        segment = Segment(Trajectory.start(sample.task if sample else UNBOUND, prompt), [], key)
        segment.messages = [normal(m) for m in req.messages]
        if sample is not None:
            sample.segments.append(segment)
        return segment

    @staticmethod
    def _results(segment: Segment, added: list[dict[str, Any]]) -> None:
        """Tool messages answering calls of this segment: recorded as the calls' results (for rewards)."""
        for m in added:
            call = segment.calls.get(m.get("tool_call_id")) if m.get("role") == "tool" else None
            if call is not None:
                segment.traj.results.append(ToolResult(call, str(m.get("content") or "")))

    def _turn(self, segment: Segment, sampled, schemas: list[dict], prefix: str) -> dict[str, Any]:
        """Record a sampled turn in its segment; the OpenAI message and finish reason for it."""
        traj = segment.traj
        text = self.chat.tokenizer.decode(sampled.ids, skip_special_tokens=True)
        traj.add_model_turn(sampled.ids, sampled.logprobs, text)
        segment.ended = sampled.ended
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "stop" if sampled.ended else "length"
        if schemas:
            known = {t["function"]["name"]: list(t["function"].get("parameters", {}).get("properties", {}))
                     for t in schemas}  # fmt: skip
            parsed = self.syntax(text, known).within(self.max_calls_per_turn)
            traj.num_format_errors += parsed.not_run
            self.stats["format_errors"] += parsed.not_run
            if parsed.calls:
                calls = tool_calls_json(parsed.calls, prefix)
                segment.calls.update({c["id"]: call for c, call in zip(calls, parsed.calls, strict=True)})
                traj.num_tool_calls += len(calls)
                message["tool_calls"] = calls
                if not parsed.errors:  # every call well formed: the text is the calls
                    message["content"] = None
                    finish = "tool_calls"
        segment.messages.append(normal(message))
        return {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}

    def prepare_chat(self, req: ChatRequest, sample: Sample | None) -> ChatWork:
        """The segments a chat request continues or starts and how each choice samples (refusals raise here,
        before any reply is sent)."""
        schemas = req.schemas()
        first = self._segment(sample, req, schemas)
        segments = [first] + [branch(first) for _ in range(req.n - 1)]
        if sample is not None:
            sample.requests += 1
            sample.segments += segments[1:]
        prompt_len = len(first.traj.token_ids)
        params = [self._params(req, i, prompt_len, first.traj.response_length) for i in range(req.n)]
        return ChatWork(req, sample, segments, params, schemas, f"chatcmpl-{uuid.uuid4().hex[:24]}")

    async def chat_completion(self, req: ChatRequest, sample: Sample | None) -> dict[str, Any]:
        return await self._run_chat(self.prepare_chat(req, sample))

    async def _run_chat(self, work: ChatWork, on_tokens: Callable[[int, list[int]], None] | None = None) -> dict:
        """Sample every choice (telling `on_tokens(choice, ids)` the ids as they come), record the turns."""
        pairs = list(zip(work.segments, work.params, strict=True))
        if on_tokens is None:
            runs = [self.engine.generate(s.seq, s.traj.token_ids, p) for s, p in pairs]
        else:
            runs = [self.engine.generate_stream(s.seq, s.traj.token_ids, p, functools.partial(on_tokens, i))
                    for i, (s, p) in enumerate(pairs)]  # fmt: skip
        prompt_len = len(work.segments[0].traj.token_ids)
        sampled = await asyncio.gather(*runs)
        choices = []
        for i, (segment, result) in enumerate(zip(work.segments, sampled, strict=True)):
            choice = self._turn(segment, result, work.schemas, f"{work.rid[-8:]}_{i}")
            choices.append({**choice, "index": i})
        if work.sample is None:
            self._release([s.seq for s in work.segments])
        completion = sum(len(r.ids) for r in sampled)
        return chat_response(work.rid, work.req.model or self.model_name, choices, prompt_len, completion)

    async def token_stream(self, work: ChatWork) -> AsyncIterator[str]:
        """A turn without tools streamed as it is sampled: each choice's text grows by the characters its new
        tokens complete (a character split across tokens waits for its last one); the finish and usage follow
        the recorded turn. (A turn that may call tools comes whole: stream_chunks.)"""
        queue: asyncio.Queue = asyncio.Queue()
        job = asyncio.ensure_future(self._run_chat(work, lambda i, ids: queue.put_nowait((i, ids))))
        job.add_done_callback(lambda _: queue.put_nowait(None))
        chunks = Chunks(work.rid, work.req.model or self.model_name)
        ids: list[list[int]] = [[] for _ in work.segments]
        sent = [""] * len(work.segments)
        for i in range(len(work.segments)):
            yield chunks.opening(i)
        while (item := await queue.get()) is not None:
            i, new = item
            ids[i] += new
            text = self.chat.tokenizer.decode(ids[i], skip_special_tokens=True)
            if text.endswith("\ufffd") or len(text) <= len(sent[i]) or not text.startswith(sent[i]):
                continue
            yield chunks.delta(i, {"content": text[len(sent[i]) :]})
            sent[i] = text
        try:
            response = job.result()
        except Exception as exc:  # after the headers: the error is the stream's last event
            log.exception("gateway: a streamed request failed")
            self.stats["errors"] += 1
            error = exc if isinstance(exc, GatewayError) else GatewayError(f"the gateway failed: {first_line(exc)}")
            yield f"data: {json.dumps(error.body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        for choice in response["choices"]:
            for event in chunks.ending(choice, sent[choice["index"]]):
                yield event
        for event in chunks.closing(response["usage"]):
            yield event

    async def completion(self, req: CompletionRequest, sample: Sample | None) -> dict[str, Any]:
        ids = self.chat.encode(req.prompt) if isinstance(req.prompt, str) else list(req.prompt)
        if req.stop_token_ids and not set(req.stop_token_ids) <= set(self.chat.stop_ids):
            raise GatewayError("stop_token_ids: only the policy's own end-of-turn ids "
                               f"{sorted(self.chat.stop_ids)} end a turn here", param="stop_token_ids")  # fmt: skip
        segments = [Segment(Trajectory.start(sample.task if sample else UNBOUND, ids), [], "raw")
                    for _ in range(req.n)]  # fmt: skip
        params = [self._params(req, i, len(ids)) for i in range(req.n)]
        sampled = await asyncio.gather(
            *(self.engine.generate(s.seq, s.traj.token_ids, p) for s, p in zip(segments, params, strict=True))
        )
        choices = []
        for i, (segment, result) in enumerate(zip(segments, sampled, strict=True)):
            text = self.chat.tokenizer.decode(result.ids, skip_special_tokens=req.skip_special_tokens)
            segment.traj.add_model_turn(result.ids, result.logprobs, text)
            choices.append({"index": i, "text": text, "logprobs": self._token_logprobs(req, result),
                            "finish_reason": "stop" if result.ended else "length"})  # fmt: skip
        if sample is not None:
            sample.requests += 1
            sample.segments += segments
        else:
            self._release([s.seq for s in segments])
        completion = sum(len(r.ids) for r in sampled)
        usage = {"prompt_tokens": len(ids), "completion_tokens": completion, "total_tokens": len(ids) + completion}
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": req.model or self.model_name, "choices": choices, "usage": usage}  # fmt: skip

    def _token_logprobs(self, req: CompletionRequest, result) -> dict[str, Any] | None:
        """The sampled tokens' log-probs when asked (`logprobs`), each token as `token_id:N` with vLLM's
        `return_tokens_as_token_ids` (toolrl's own OpenAI engine asks so: a run can learn from a served one)."""
        if req.logprobs is None:
            return None
        if req.return_tokens_as_token_ids:
            tokens = [f"token_id:{i}" for i in result.ids]
        else:
            tokens = [self.chat.tokenizer.decode([i]) for i in result.ids]
        return {"tokens": tokens, "token_logprobs": list(result.logprobs)}

    # ---- HTTP ---------------------------------------------------------------------------------------------

    def app(self):
        """The HTTP routes (routes.py) over this gateway."""
        from toolrl.gateway.routes import make_app

        return make_app(self)

    def start(self, timeout: float = 30.0) -> Gateway:
        """Serve from a thread of its own; returns once it listens (self.port is then the port it got)."""
        import uvicorn

        config = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="warning", lifespan="on")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, name="toolrl-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = server.servers[0].sockets[0].getsockname()[1]
        log.info("gateway: serving %s at %s", self.model_name, self.base_url())
        return self

    def wait(self) -> None:
        """Block while it serves (until stop(), or its server ends)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_coroutine(self, coro, timeout: float | None = None):
        """Run `coro` on the gateway's loop (where the engine lives) from another thread."""
        assert self.loop is not None, "start() the gateway first"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
