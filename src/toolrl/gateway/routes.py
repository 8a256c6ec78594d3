"""The gateway's HTTP routes: each wire protocol (protocols.py) at its path under `/v1`, plain and under
`/s/SAMPLE/` (one agent run's base URL), with `/v1/completions` and `/v1/models`. Every request is checked the same
way: the key (`Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`), the sample, the body bounded and
parsed; refusals in the protocol's own error shape, each counted (per sample too: a failing agent's cause)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from typing import Any

from pydantic import ValidationError

from toolrl.gateway.completions import complete, completion_events
from toolrl.gateway.protocols import PROTOCOLS, Protocol, validation_error
from toolrl.gateway.turns import GatewayError, TurnDone, off_loop
from toolrl.text import clip, first_line

log = logging.getLogger("toolrl.gateway.server")
requests_log = logging.getLogger("toolrl.gateway.requests")
"""One line per request (`toolrl serve` shows them): method, path, protocol, status, tokens in and out, ms; never
the key, a body or the sample's id."""

MAX_DEPTH = 64
"""The deepest nesting of a request body's JSON (a tool's schema nests a few levels)."""
CLOSING = (401, 408, 413)
"""Refusals after which the connection is closed: no key, or a body that is not read to its end."""


def parse_body(raw: bytes) -> Any:
    """A request body as JSON, refused in one line when it is not, or nests deeper than MAX_DEPTH."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise GatewayError(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        raise GatewayError("the body is not JSON") from None
    stack = [(data, 1)] if isinstance(data, dict | list) else []
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise GatewayError(f"the body nests deeper than {MAX_DEPTH} levels")
        inner = value.values() if isinstance(value, dict) else value
        stack += [(v, depth + 1) for v in inner if isinstance(v, dict | list)]
    return data


def make_app(gateway):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    chat = PROTOCOLS["chat"]
    served = ", ".join(f"POST /v1{PROTOCOLS[name].path}" for name in PROTOCOLS)

    def authorised(request: Request) -> bool:
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(given.encode(), gateway.key.encode())

    def failed(protocol: Protocol, error: GatewayError, request: Request, sample=None) -> JSONResponse:
        told(request, protocol.name, error.status)
        gateway.stats["refused"] += 1
        if sample is not None:
            sample.refused(error.status, f"HTTP {error.status} {request.method} {_path(request)}: {error}")
        headers = {"connection": "close"} if error.status in CLOSING else None
        return JSONResponse(protocol.error(error), status_code=error.status, headers=headers)

    def fault(exc: Exception) -> GatewayError:
        log.exception("gateway: a request failed")
        gateway.stats["errors"] += 1
        return GatewayError(f"the gateway failed: {first_line(exc)}", 500, kind="server_error")

    def check(request: Request):
        """The request's sample (None: plain paths) once its key and sample are good; else the GatewayError."""
        request.state.started = time.perf_counter()
        sid = request.path_params.get("sample")
        with gateway.lock:
            sample = gateway.samples.get(sid) if sid else None
        if not authorised(request):
            return sample, GatewayError("a valid API key is required (Authorization: Bearer KEY, or x-api-key)", 401,
                                        kind="authentication_error")  # fmt: skip
        gateway.guard.keyed(request.client)
        if sid and sample is None:
            return None, GatewayError(f"no open sample {clip(sid, 40)!r}: its agent run has ended", 404,
                                      kind="not_found_error")  # fmt: skip
        return sample, None

    async def body_of(request: Request) -> Any:
        """The body, counted as it arrives (chunked or not) and refused past the gateway's max_body_bytes or
        body_timeout_s, then parsed (a large one in a worker thread); its size in request.state.body_size."""
        limit, timeout = gateway.max_body_bytes, gateway.body_timeout_s
        too_large = GatewayError(f"the body is over {limit:,} bytes", 413, kind="request_too_large")
        declared = request.headers.get("content-length") or "0"
        if not declared.isdigit() or int(declared) > limit:
            raise too_large
        chunks: list[bytes] = []

        async def read() -> None:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            raise GatewayError(f"the body took more than {timeout:g} s to arrive", 408) from None
        data = b"".join(chunks)
        request.state.body_size = len(data)
        return await off_loop(len(data), parse_body, data)

    def endpoint(protocol: Protocol):
        async def handle(request: Request):
            sample, refusal = check(request)
            if refusal is not None:
                return failed(protocol, refusal, request, sample)
            try:
                body = await body_of(request)
                req = await off_loop(request.state.body_size, protocol.parse, body, gateway, sample)
                work = await gateway.prepare(req, sample)
            except ValidationError as exc:
                return failed(protocol, validation_error(exc), request, sample)
            except GatewayError as exc:
                return failed(protocol, exc, request, sample)
            except Exception as exc:  # a fault of ours (or of a protocol's adapter): one line, the gateway goes on
                return failed(protocol, fault(exc), request, sample)
            gateway.stats["requests"] += 1
            gateway.stats[f"requests/{protocol.name}"] += 1
            gateway.stats["unbound" if sample is None else "bound"] += 1
            if sample is not None:
                sample.protocols[protocol.name] += 1
            headers = _ignored(gateway, req.ignored)
            if req.stream:
                gateway.stats["streams"] += 1
                events = protocol.stream(gateway, work, counted(request, protocol.name, work, gateway.events(work)))
                return StreamingResponse(events, media_type="text/event-stream", headers=headers)
            try:
                turns = await (gateway.run(work) if sample is not None else unless_gone(request, gateway.run(work)))
            except ClientGone:
                return gone(request, protocol.name, work.prompt_tokens)
            except GatewayError as exc:
                return failed(protocol, exc, request, sample)
            except Exception as exc:  # a fault of ours: the agent is told in one line, the gateway goes on
                return failed(protocol, fault(exc), request, sample)
            told(request, protocol.name, 200, work.prompt_tokens, sum(t.completion_tokens for t in turns))
            return JSONResponse(protocol.reply(gateway, work, turns), headers=headers)

        return handle

    def extra(protocol: Protocol, handler):
        async def handle(request: Request):
            sample, refusal = check(request)
            if refusal is not None:
                return failed(protocol, refusal, request, sample)
            try:
                body = await body_of(request) if request.method == "POST" else None
                answer = await handler(gateway, body, sample, request.path_params)
                told(request, protocol.name, 200)
                return JSONResponse(answer)
            except ValidationError as exc:
                return failed(protocol, validation_error(exc), request, sample)
            except GatewayError as exc:
                return failed(protocol, exc, request, sample)

        return handle

    async def completions_route(request: Request):
        sample, refusal = check(request)
        if refusal is not None:
            return failed(chat, refusal, request, sample)
        try:
            completing = complete(gateway, await body_of(request), sample)
            req, reply = await (completing if sample is not None else unless_gone(request, completing))
        except ClientGone:
            return gone(request, "completions")
        except ValidationError as exc:
            return failed(chat, validation_error(exc), request, sample)
        except GatewayError as exc:
            return failed(chat, exc, request, sample)
        gateway.stats["requests"] += 1
        told(request, "completions", 200, reply["usage"]["prompt_tokens"], reply["usage"]["completion_tokens"])
        if sample is not None:
            sample.protocols["completions"] += 1
        if req.stream:
            return StreamingResponse(iter(completion_events(reply)), media_type="text/event-stream")
        return JSONResponse(reply)

    def gone(request: Request, protocol: str, tokens_in: int = 0) -> Response:
        """A served client hung up while its turn was sampled (stopped within POLL_S): counted, logged, and an
        answer no one reads."""
        gateway.stats["client_gone"] += 1
        told(request, protocol, 499, tokens_in)
        return Response(status_code=499)

    async def models(gateway_, body, sample, params):
        card = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "toolrl"}
        return {"object": "list", "data": [card]}

    async def unknown(request: Request):
        sample, refusal = check(request)
        if refusal is None:
            asked = f"{request.method} {clip(_path(request), 80)}"
            refusal = GatewayError(f"no such endpoint: {asked}; the gateway serves {served}, POST /v1/completions "
                                   "and GET /v1/models", 404, kind="not_found_error")  # fmt: skip
        protocol = PROTOCOLS["messages"] if "/messages" in request.url.path else chat
        return failed(protocol, refusal, request, sample)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        gateway.loop = asyncio.get_running_loop()  # the engine's loop: every generate runs on it
        yield

    routes = []
    for prefix in ("", "/s/{sample}"):
        for name in PROTOCOLS:
            protocol = PROTOCOLS[name]
            for base in (f"{prefix}/v1", prefix) if protocol.without_v1 else (f"{prefix}/v1",):
                routes.append(Route(f"{base}{protocol.path}", endpoint(protocol), methods=["POST"]))
                routes += [Route(f"{base}{path}", extra(protocol, handler), methods=[method])
                           for method, path, handler in protocol.endpoints()]  # fmt: skip
        routes += [
            Route(f"{prefix}/v1/completions", completions_route, methods=["POST"]),
            Route(f"{prefix}/v1/models", extra(chat, models), methods=["GET"]),
        ]
    # last: what no route above serves (the per-sample paths first), refused like any request without its key
    # (Claude Code's connectivity check, HEAD / without one, gets a 401 and goes on)
    for prefix in ("/s/{sample}", ""):
        routes.append(Route(f"{prefix}/{{rest:path}}", unknown, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]))

    async def unmatched(request: Request, exc: Exception):  # a path no route's pattern reads (a line break in it)
        return await unknown(request)

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: unmatched})


POLL_S = 0.2
"""How often a served request that is being sampled checks that its client is still there."""


class ClientGone(Exception):
    """The client of a request being sampled hung up."""


async def unless_gone(request, coro):
    """`coro`'s result, or ClientGone (its work cancelled: the engine drops the sequence after its step under way)
    once the client of `request` has hung up (checked every POLL_S)."""
    task = asyncio.ensure_future(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise ClientGone


def told(request, protocol: str, status: int, tokens_in: int = 0, tokens_out: int = 0) -> None:
    """The request's line in the requests log (the time since its headers arrived: request.state.started)."""
    if not requests_log.isEnabledFor(logging.INFO):
        return
    started = getattr(request.state, "started", None)
    ms = (time.perf_counter() - started) * 1000 if started is not None else 0.0
    path = re.sub(r"[\x00-\x1f\x7f]", "?", clip(_path(request), 80))  # a path may hold encoded line breaks
    requests_log.info("%s %s %s %d in %d out %d %.0f ms", request.method, path, protocol, status, tokens_in,
                      tokens_out, ms)  # fmt: skip


async def counted(request, protocol: str, work, events):
    """A stream's events, passed on; its line in the requests log once the stream ends (or its client left)."""
    out = 0
    try:
        async for event in events:
            if isinstance(event, TurnDone):
                out += event.turn.completion_tokens
            yield event
    finally:
        told(request, protocol, 200, work.prompt_tokens, out)


def _path(request) -> str:
    """The path a client asked for, without the per-sample prefix (what the agent itself named)."""
    path = request.url.path
    sid = request.path_params.get("sample")
    return path.removeprefix(f"/s/{sid}") if sid else path


def _ignored(gateway, ignored: list[str]) -> dict[str, str]:
    if not ignored:
        return {}
    for what in ignored:
        gateway.stats["ignored"] += 1
        if gateway.stats[f"ignored/{what}"] == 0:
            log.warning("gateway: %s (the first time; counted in the gateway's stats, told in x-toolrl-ignored)", what)
        gateway.stats[f"ignored/{what}"] += 1
    told = re.sub(r"[\x00-\x1f\x7f]", " ", clip("; ".join(dict.fromkeys(ignored)), 500))  # a header holds no lines
    return {"x-toolrl-ignored": told.encode("ascii", "backslashreplace").decode()}
