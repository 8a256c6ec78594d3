"""The gateway: an HTTP server in front of the policy that speaks the wire protocols agents are written for
(OpenAI chat completions and Responses, Anthropic Messages: routes.py and one adapter per protocol), so agent
programs and harnesses run unchanged while their turns are recorded token-exactly for training (capture.py).

This is the protocol-free core: a `TurnRequest` (turns.py) is made ready (`prepare`: the segment it continues or
starts, the tools shown, the grammar a forced call or a structured reply samples under, stop strings), sampled by
the run's engine (the one rollouts use: it batches the concurrent requests of every agent), and each choice comes
back as a `Turn`, whole (`run`) or as events while it is sampled (`events`). Tool calls are parsed in the run's
call syntax (`rollout.parser`). Every request needs the gateway's key; it listens on 127.0.0.1. `/s/SAMPLE/...`
(the base URL `open_sample` gives one agent run) ties requests to one sample; plain paths serve without
recording (`toolrl serve`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from toolrl.chat.format import ChatFormat
from toolrl.context.base import ContextStrategy
from toolrl.envs.base import Task
from toolrl.gateway.budget import KVBudget
from toolrl.gateway.capture import (
    UNBOUND,
    Sample,
    Segment,
    branch,
    continuation_ids,
    find_segment,
    normal,
    template_messages,
    tools_key,
)
from toolrl.gateway.compaction import Compaction
from toolrl.gateway.constraints import turn_grammar
from toolrl.gateway.guard import ConnectionGuard, guarded_protocol
from toolrl.gateway.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, GrammarCheck, check_request
from toolrl.gateway.store import ResponseStore
from toolrl.gateway.streaming import TurnText, reply_text
from toolrl.gateway.turns import Event, GatewayError, Turn, TurnDone, TurnRequest, off_loop
from toolrl.http import ThreadServer
from toolrl.parsers.base import CallSyntax
from toolrl.rollout.engine import Engine, Sampled
from toolrl.rollout.guidance import cut_at_stop
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.call import ToolResult

log = logging.getLogger(__name__)


@dataclass
class TurnWork:
    """A request made ready to sample: its segments (one per choice), their sampling, the tools shown."""

    req: TurnRequest
    sample: Sample | None
    segments: list[Segment]
    params: list[SamplingParams]
    schemas: list[dict[str, Any]]
    rid: str
    prompt_tokens: int
    """The context the turn continues (the conversation as a prompt): what usage calls input tokens."""
    created: int = field(default_factory=lambda: int(time.time()))


class Gateway:
    """The policy behind the agents' endpoints. `start()` serves it from a thread of its own, whose event loop runs
    the engine; `open_sample(task)` gives an agent run its base URL; `close_sample` its segments."""

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
        max_stored_responses: int = 1024,
        guard: ConnectionGuard | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        context: Callable[[], ContextStrategy] | None = None,
        max_context_tokens: int | None = None,
        budget: KVBudget | None = None,
    ):
        self.engine, self.chat, self.syntax, self.model_name = engine, chat, syntax, model_name
        self.key = key or secrets.token_urlsafe(24)
        self.max_new_tokens, self.context_length = max_new_tokens, context_length
        self.max_response_tokens = max_response_tokens
        """Per segment after its prompt (sampled, tool and user tokens): a runaway agent's sequence stops here."""
        self.compaction = Compaction(context_length, max_response_tokens, max_context_tokens, context)
        """A continuing segment past its limits: compacted by rollout.context, or refused (gateway/compaction.py)."""
        self.sampling = sampling or SamplingParams()
        self.max_calls_per_turn = max_calls_per_turn
        self.host, self.port = host, port
        self.samples: dict[str, Sample] = {}
        self.responses = ResponseStore(max_stored_responses)
        """Responses kept for `previous_response_id` (the Responses API's `store`), per sample, bounded."""
        self.guard = guard or ConnectionGuard()
        """The bounds on its connections (guard.py)."""
        self.max_body_bytes, self.body_timeout_s = MAX_BODY_BYTES, BODY_TIMEOUT_S
        """The largest request body, and how long it may take to arrive once the headers have."""
        self.budget = budget or KVBudget(engine.kv_bytes_per_token)
        """The keys and values a request, and every request in flight, may take (budget.py)."""
        self.stats: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._after_tasks: set[asyncio.Task] = set()
        self.grammars = GrammarCheck()
        """Each request's grammar compiled in a worker process within its budget (limits.py)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._served: ThreadServer | None = None

    # ---- samples ------------------------------------------------------------------------------------------

    def open_sample(self, task: Task) -> Sample:
        sample = Sample(uuid.uuid4().hex, task)
        with self.lock:
            self.samples[sample.id] = sample
        return sample

    def close_sample(self, sample_id: str) -> Sample:
        """The sample's record; its sequences are released in the engine, its stored responses dropped and later
        requests to it refused."""
        with self.lock:
            sample = self.samples.pop(sample_id)
        self.responses.drop(sample_id)
        self._release([s.seq for s in sample.segments])
        return sample

    def base_url(self, sample: Sample | str | None = None) -> str:
        """The OpenAI base URL (…/v1); an Anthropic client takes it without the /v1 (`anthropic_base_url`)."""
        return self.anthropic_base_url(sample) + "/v1"

    def anthropic_base_url(self, sample: Sample | str | None = None) -> str:
        sid = sample.id if isinstance(sample, Sample) else sample
        return f"http://{self.host}:{self.port}" + (f"/s/{sid}" if sid else "")

    def _release(self, seqs: list[object]) -> None:
        if self.loop is None or not seqs:
            return
        self.loop.call_soon_threadsafe(lambda: [self.engine.release(seq) for seq in seqs])

    # ---- a request made ready -----------------------------------------------------------------------------

    async def prepare(self, req: TurnRequest, sample: Sample | None) -> TurnWork:
        """The segments a request continues or starts and how each choice samples. Refusals raise here, before any
        reply is sent and before the sample changes (a refused request leaves no trace in the capture). What costs
        CPU (compiling a grammar, rendering and tokenizing a large conversation) runs in a worker thread: the
        event loop, and every other client, is not held up by one large request."""
        chars = check_request(req, self.context_length, self.chat.max_token_chars)
        rid = uuid.uuid4().hex[:24]
        schemas = req.shown_tools()
        grammar = None  # compiling one may take long: checked in a worker process, within its budget (limits.py)
        if req.constrained and (built := turn_grammar(req, schemas, self.syntax, self.engine)) is not None:
            grammar = await self.grammars(*built)
        key = tools_key(schemas)
        segment = find_segment(sample, req.messages, key) if sample is not None else None
        extended = False
        if segment is not None:
            segment.busy = True  # reserved while its new messages are tokenized
        try:
            ids = await off_loop(chars, self._ids, req, schemas, segment)
            if segment is None:
                first = Segment(Trajectory.start(sample.task if sample else UNBOUND, ids), [], key)
                first.messages = [normal(m) for m in req.messages]
                prompt_len, response_len = len(ids), 0
            else:
                first, need = segment, min(req.max_tokens or self.max_new_tokens, self.max_new_tokens)
                compacts = self.compaction.strategy is not None  # when due; else a turn takes the room left (>= 1)
                need = need if compacts else 1
                if compacts or len(segment.traj.token_ids) + len(ids) + need > self.compaction.limit(segment):
                    self._extend(sample, segment, req.messages[len(segment.messages) :], ids)
                    ids, extended, added = [], True, len(ids)
                    await self.compaction.fit(segment, need, added, self.engine, self.chat)  # or refuses, in one line
                prompt_len = len(segment.traj.token_ids) + len(ids)
                response_len = prompt_len - segment.traj.prompt_length
            params = [self._params(req, i, prompt_len, response_len, grammar) for i in range(req.n)]
            await self.budget.admit(rid, req.n, prompt_len + max(p.max_new_tokens for p in params))
        except BaseException:
            if segment is not None:
                segment.busy = False
            raise
        if segment is not None and not extended:
            self._extend(sample, segment, req.messages[len(segment.messages) :], ids)
        elif segment is None and sample is not None:
            sample.segments.append(first)
        segments = [first] + [branch(first) for _ in range(req.n - 1)]
        first.busy = True
        if sample is not None:
            sample.requests += 1
            sample.segments += segments[1:]
        return TurnWork(req, sample, segments, params, schemas, rid, prompt_len)

    def _ids(self, req: TurnRequest, schemas: list[dict[str, Any]], segment: Segment | None) -> list[int]:
        """The tokens a request adds: its new messages after `segment`'s, or the whole conversation as a prompt."""
        if segment is not None:
            return continuation_ids(self.chat, req.messages[len(segment.messages) :], segment.ended)
        messages = template_messages(req.messages, self.syntax)
        return self.chat.prompt_ids(messages, schemas, self.syntax.instructions)

    def _extend(self, sample: Sample, segment: Segment, added: list[dict[str, Any]], ids: list[int]) -> None:
        """The messages an agent added after the segment's last turn, and their tokens, into the segment."""
        self._results(segment, added)
        if any(m["role"] == "user" for m in added):
            segment.traj.add_user_message(ids, "\n".join(str(m.get("content") or "") for m in added))
        else:
            segment.traj.add_observation(ids)
        segment.messages += [normal(m) for m in added]
        sample.continued += 1
        self.compaction.round_ended(segment, self.chat)

    def prompt_tokens(self, req: TurnRequest) -> int:
        """How many tokens the request's conversation is as a prompt (Anthropic's count_tokens): what a turn refuses
        before its work (stop strings, tools, a conversation past the context) is refused here too."""
        check_request(req, self.context_length, self.chat.max_token_chars)
        messages = template_messages(req.messages, self.syntax)
        return len(self.chat.prompt_ids(messages, req.shown_tools(), self.syntax.instructions))

    def _params(self, req: TurnRequest, n_index: int, prompt_len: int, response_len: int, grammar: str | None):
        wanted = req.max_tokens or self.max_new_tokens
        budget = min(wanted, self.max_new_tokens, self.context_length - prompt_len)
        if self.compaction.max_context_tokens is not None:
            budget = min(budget, self.compaction.max_context_tokens - prompt_len)
        if budget < 1:
            raise GatewayError(
                f"the prompt is {prompt_len:,} tokens, the model's context {self.context_length:,}: nothing can be "
                "generated (rollout.context compacts a conversation as it grows, not its first request); send a "
                "shorter one or serve a model with a longer context (docs/agents.md)",
                param="messages",
                code="context_length_exceeded",
            )
        room = self.max_response_tokens - response_len
        if room < 1:
            raise GatewayError(
                f"this conversation has {response_len:,} tokens after its first prompt, "
                f"rollout.max_response_tokens is {self.max_response_tokens:,}: start a new one",
                param="messages",
                code="context_length_exceeded",
            )
        s = self.sampling
        seed = None if req.seed is None else req.seed + n_index
        temperature = s.temperature if req.temperature is None else req.temperature
        top_p = s.top_p if req.top_p is None else req.top_p
        top_k = s.top_k if req.top_k is None else req.top_k
        return SamplingParams(temperature, top_p, top_k, min(budget, room), seed, tuple(req.stop), grammar)

    @staticmethod
    def _results(segment: Segment, added: list[dict[str, Any]]) -> None:
        """Tool messages answering calls of this segment: recorded as the calls' results (for rewards)."""
        for m in added:
            call = segment.calls.get(m.get("tool_call_id")) if m.get("role") == "tool" else None
            if call is not None:
                segment.traj.results.append(ToolResult(call, str(m.get("content") or "")))

    # ---- sampling -----------------------------------------------------------------------------------------

    def _presenter(self, work: TurnWork, index: int, streamed: bool) -> TurnText:
        known = None
        if work.schemas:
            known = {t["function"]["name"]: list(t["function"].get("parameters", {}).get("properties", {}))
                     for t in work.schemas}  # fmt: skip
        max_calls = self.max_calls_per_turn if work.req.parallel_tool_calls else 1
        prefix = f"call_{work.rid[-8:]}_{index}"
        return TurnText(index, self.chat.tokenizer, self.syntax, known, work.req.stop, max_calls, prefix, streamed)

    def _finish(self, work: TurnWork, index: int, sampled: Sampled, presenter: TurnText) -> tuple[list[Event], Turn]:
        """Record a choice's sampled turn in its segment, cut at its first stop string (what was sampled after it
        is dropped: the client never gets it); the rest of its events and the turn."""
        segment, req = work.segments[index], work.req
        ids, logprobs, ended = sampled.ids, sampled.logprobs, sampled.ended
        cut = cut_at_stop(self.chat.tokenizer, ids, req.stop) if req.stop else None
        if cut is not None:
            ids, logprobs, ended, text = ids[: cut.tokens], logprobs[: cut.tokens], False, cut.text
        else:
            text = reply_text(self.chat.tokenizer, ids)
        events = presenter.finish(text)
        traj = segment.traj
        written = reply_text(self.chat.tokenizer, ids)
        traj.add_model_turn(list(ids), list(logprobs), written, sampled.versions[: len(ids)])
        segment.ended = ended
        if work.schemas:
            parsed = self.syntax(text, presenter.tools).within(presenter.max_calls)
            traj.num_format_errors += parsed.not_run
            traj.num_tool_calls += len(parsed.calls)
            self.stats["format_errors"] += parsed.not_run
        self.stats["calls_cut"] += presenter.cut_calls  # dropped from the reply: counted, as format errors are
        self.stats["calls_past_limit"] += presenter.calls_past_limit
        segment.calls.update({c.id: c.call for c in presenter.calls if c.call is not None})
        finish = "stop_sequence" if cut else "length" if not ended else "tool_calls" if presenter.calls else "stop"
        if finish == "length" and len(ids) >= self.max_new_tokens < (req.max_tokens or self.context_length):
            self.stats["cut_by_ceiling"] += 1  # the server's ceiling, not the client's max_tokens, ended it
            log.warning("gateway: a reply was cut at the server's ceiling of %d tokens (max_tokens: %s; toolrl "
                        "serve --max-new-tokens raises it)", self.max_new_tokens, req.max_tokens)  # fmt: skip
        turn = Turn(index, presenter.text, presenter.calls, finish, len(ids), cut.stop if cut else None)
        if turn.calls:
            segment.turn_calls[len(segment.messages)] = frozenset(c.id for c in turn.calls)
        segment.messages.append(normal(turn.chat_message()))
        return [*events, TurnDone(turn)], turn

    async def run(self, work: TurnWork) -> list[Turn]:
        """Sample every choice at once; the turns."""
        try:
            sampled = await asyncio.gather(
                *(self.engine.generate(s.seq, s.traj.token_ids, p) for s, p in zip(work.segments, work.params,
                                                                                       strict=True))
            )  # fmt: skip
            return [
                self._finish(work, i, r, self._presenter(work, i, streamed=False))[1] for i, r in enumerate(sampled)
            ]
        finally:
            self._done(work)

    async def events(self, work: TurnWork) -> AsyncIterator[Event]:
        """Sample every choice, yielding its events as its tokens come (text deltas, calls as they begin and their
        arguments), then each choice's TurnDone. Under a capture the turns are recorded whether or not the stream is
        read to its end (an agent that hangs up loses nothing from its sample); a served request whose client hung
        up is cancelled (the engine drops it after the step under way)."""
        queue: asyncio.Queue = asyncio.Queue()

        async def one(index: int) -> None:
            segment, presenter = work.segments[index], self._presenter(work, index, streamed=True)

            def heard(ids: list[int]) -> None:
                queue.put_nowait(presenter.feed(ids))

            sampled = await self.engine.generate_stream(segment.seq, segment.traj.token_ids, work.params[index], heard)
            queue.put_nowait(self._finish(work, index, sampled, presenter)[0])

        async def every() -> None:
            try:
                await asyncio.gather(*(one(i) for i in range(len(work.segments))))
            finally:
                self._done(work)

        job = asyncio.ensure_future(every())
        job.add_done_callback(lambda _: queue.put_nowait(None))
        job.add_done_callback(lambda j: j.cancelled() or j.exception())  # seen, if the client left before the end
        finished = False
        try:
            while (batch := await queue.get()) is not None:
                for event in batch:
                    yield event
            finished = True
        finally:
            if not finished and not job.done() and work.sample is None:  # a served client hung up: its sampling
                job.cancel()  # stops (a captured sample's goes on: the agent's trajectory needs its turn)
                self.stats["client_gone"] += 1
        job.result()  # a failure: raised here, for the protocol to write as its stream's error

    def _done(self, work: TurnWork) -> None:
        """A request's sampling is over (or failed): its segments can be continued, a served one's released."""
        for segment in work.segments:
            segment.busy = False
        if work.sample is None:
            self._release([s.seq for s in work.segments])
        self.request_over(work.rid)

    def request_over(self, rid: str) -> None:
        """Its room in the budget freed, the cache given back if nothing else is in flight (after the reply)."""
        task = asyncio.get_running_loop().create_task(self.budget.finished(rid, self.engine, self.stats))
        self._after_tasks.add(task)
        task.add_done_callback(self._after_tasks.discard)

    # ---- HTTP ---------------------------------------------------------------------------------------------

    def app(self):
        """The HTTP routes (routes.py) over this gateway."""
        from toolrl.gateway.routes import make_app

        return make_app(self)

    def start(self, timeout: float = 30.0) -> Gateway:
        """Serve from a thread of its own; returns once it listens (self.port is then the port it got)."""
        import uvicorn

        config = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="warning", lifespan="on",
                                http=guarded_protocol(self.guard), timeout_keep_alive=5)  # fmt: skip
        self._served = ThreadServer(config, "toolrl-gateway")
        self.port = self._served.start(timeout, f"the gateway on {self.host}:{self.port}")
        log.info("gateway: serving %s at %s", self.model_name, self.base_url())
        return self

    def wait(self) -> None:
        """Block while it serves (until stop(), or its server ends)."""
        while self._served is not None and self._served.alive:
            self._served.thread.join(timeout=0.5)

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
        self.grammars.close()

    def run_coroutine(self, coro, timeout: float | None = None):
        """Run `coro` on the gateway's loop (where the engine lives) from another thread."""
        assert self.loop is not None, "start() the gateway first"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
