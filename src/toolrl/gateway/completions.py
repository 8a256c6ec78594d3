"""OpenAI's legacy completions (`POST /v1/completions`): a prompt (text or token ids) continued by the policy, with
the sampled tokens' log-probs and vLLM's `return_tokens_as_token_ids`, so that a model behind `toolrl serve` is a
token-exact teacher for another run (toolrl's own OpenAI engine asks so)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from pydantic import Field

from toolrl.gateway.capture import UNBOUND, Sample, Segment
from toolrl.gateway.chat import IGNORED, Sampling, usage
from toolrl.gateway.limits import check_stop
from toolrl.gateway.protocols import sse, unsupported
from toolrl.gateway.turns import GatewayError, TurnRequest, off_loop
from toolrl.rollout.engine import Sampled
from toolrl.rollout.guidance import cut_at_stop
from toolrl.rollout.trajectory import Trajectory


class CompletionRequest(Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    """The sampled token's log-prob comes back (top alternatives are not given)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's extension: each token as `token_id:N`, exact."""
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True


async def complete(gateway, body: Any, sample: Sample | None) -> tuple[CompletionRequest, dict[str, Any]]:
    req = CompletionRequest.model_validate(body)
    unsupported(req.model_extra, tuple(f for f in IGNORED if f != "logprobs"))
    chat = gateway.chat
    if isinstance(req.prompt, str):
        if len(req.prompt) > gateway.context_length * chat.max_token_chars:
            raise GatewayError(f"prompt: {len(req.prompt):,} characters, more than the model's context of "
                               f"{gateway.context_length:,} tokens can hold", param="prompt",
                               code="context_length_exceeded")  # fmt: skip
        ids = await off_loop(len(req.prompt), chat.encode, req.prompt)
    else:
        ids, vocabulary = list(req.prompt), len(chat.tokenizer)
        if bad := next(((k, t) for k, t in enumerate(ids) if not 0 <= t < vocabulary), None):
            raise GatewayError(f"prompt[{bad[0]}]: token id {bad[1]} is not in the vocabulary (0 to {vocabulary - 1})",
                               param=f"prompt[{bad[0]}]")  # fmt: skip
    if req.stop_token_ids and not set(req.stop_token_ids) <= set(chat.stop_ids):
        raise GatewayError("stop_token_ids: only the policy's own end-of-turn ids "
                           f"{sorted(chat.stop_ids)} end a turn here", param="stop_token_ids")  # fmt: skip
    turn = TurnRequest([], stop=req.stops(), max_tokens=req.max_tokens, temperature=req.temperature,
                       top_p=req.top_p, seed=req.seed)  # fmt: skip
    check_stop(turn.stop)
    segments = [Segment(Trajectory.start(sample.task if sample else UNBOUND, ids), [], "raw") for _ in range(req.n)]
    params = [gateway._params(turn, i, len(ids), 0, None) for i in range(req.n)]
    rid = uuid.uuid4().hex[:24]
    await gateway.budget.admit(rid, req.n, len(ids) + max(p.max_new_tokens for p in params))
    try:
        sampled = await asyncio.gather(
            *(gateway.engine.generate(s.seq, s.traj.token_ids, p) for s, p in zip(segments, params, strict=True))
        )
    finally:
        gateway.request_over(rid)
    choices = []
    for i, (segment, result) in enumerate(zip(segments, sampled, strict=True)):
        text = chat.tokenizer.decode(result.ids, skip_special_tokens=req.skip_special_tokens)
        ended = result.ended
        if req.stop and (cut := cut_at_stop(chat.tokenizer, result.ids, req.stops())) is not None:
            result = Sampled(result.ids[: cut.tokens], result.logprobs[: cut.tokens], False)
            text, ended = cut.text, True  # what was sampled after the stop string is neither sent nor recorded
        segment.traj.add_model_turn(result.ids, result.logprobs, text, sampled[i].versions[: len(result.ids)])
        choices.append({"index": i, "text": text, "logprobs": _token_logprobs(chat, req, result),
                        "finish_reason": "stop" if ended else "length"})  # fmt: skip
    if sample is not None:
        sample.requests += 1
        sample.segments += segments
    else:
        gateway._release([s.seq for s in segments])
    completion = sum(len(r.ids) for r in sampled)
    reply = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
             "model": req.model or gateway.model_name, "choices": choices,
             "usage": usage(len(ids), completion)}  # fmt: skip
    return req, reply


def _token_logprobs(chat, req: CompletionRequest, result) -> dict[str, Any] | None:
    """The sampled tokens' log-probs when asked (`logprobs`), each token as `token_id:N` with vLLM's
    `return_tokens_as_token_ids` (toolrl's own OpenAI engine asks so: a run can learn from a served one)."""
    if req.logprobs is None:
        return None
    if req.return_tokens_as_token_ids:
        tokens = [f"token_id:{i}" for i in result.ids]
    else:
        tokens = [chat.tokenizer.decode([i]) for i in result.ids]
    return {"tokens": tokens, "token_logprobs": list(result.logprobs)}


def completion_events(reply: dict[str, Any]) -> list[str]:
    """A finished completion as a stream: the whole reply in one event, then [DONE]."""
    return [sse({**reply, "object": "text_completion"}), sse("[DONE]")]
