"""The gateway's HTTP routes: `/v1/chat/completions`, `/v1/completions` and `/v1/models`, plain and under
`/s/SAMPLE/` (one agent run's base URL): the key checked, the body bounded and validated into the wire types,
refusals as OpenAI error bodies, streams as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from typing import Any

from pydantic import ValidationError

from toolrl.gateway.protocol import ChatRequest, CompletionRequest, GatewayError, stream_chunks
from toolrl.text import first_line

log = logging.getLogger("toolrl.gateway.server")

MAX_BODY_BYTES = 32 << 20


def make_app(gateway):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {gateway.key}".encode())

    def failed(error: GatewayError) -> JSONResponse:
        gateway.stats["refused"] += 1
        return JSONResponse(error.body(), status_code=error.status)

    async def handle(request: Request, model, run) -> Any:
        if not authorised(request):
            return failed(GatewayError("a valid API key is required (Authorization: Bearer KEY)", 401,
                                       kind="authentication_error"))  # fmt: skip
        sid = request.path_params.get("sample")
        with gateway.lock:
            sample = gateway.samples.get(sid) if sid else None
        if sid and sample is None:
            return failed(GatewayError(f"no open sample {sid[:40]!r}: its agent run has ended", 404))
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            return failed(GatewayError(f"the body is over {MAX_BODY_BYTES >> 20} MiB", 413))
        try:
            body = await request.json()
            req = model.model_validate(body)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "(body)"
            return failed(GatewayError(f"{where}: {error['msg']}", param=where))
        except ValueError:
            return failed(GatewayError("the body is not JSON"))
        if unknown := req.unsupported():
            return failed(GatewayError(f"{unknown[0]}: not supported by this gateway", param=unknown[0]))
        gateway.stats["requests"] += 1
        gateway.stats["unbound" if sample is None else "bound"] += 1
        if req.stream and isinstance(req, ChatRequest) and not req.schemas():
            try:
                work = gateway.prepare_chat(req, sample)
            except GatewayError as exc:
                return failed(exc)
            gateway.stats["token_streams"] += 1
            return StreamingResponse(gateway.token_stream(work), media_type="text/event-stream")
        try:
            response = await run(req, sample)
        except GatewayError as exc:
            return failed(exc)
        except Exception as exc:  # a fault of ours: the agent is told in one line, the gateway goes on
            log.exception("gateway: a request failed")
            gateway.stats["errors"] += 1
            return failed(GatewayError(f"the gateway failed: {first_line(exc)}", 500, kind="server_error"))
        if req.stream:
            chunks = stream_chunks(response) if "message" in response["choices"][0] else _completion_chunks(response)
            return StreamingResponse(iter(chunks), media_type="text/event-stream")
        return JSONResponse(response)

    async def chat(request: Request):
        return await handle(request, ChatRequest, gateway.chat_completion)

    async def complete(request: Request):
        return await handle(request, CompletionRequest, gateway.completion)

    async def models(request: Request):
        if not authorised(request):
            return failed(GatewayError("a valid API key is required (Authorization: Bearer KEY)", 401,
                                       kind="authentication_error"))  # fmt: skip
        card = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "toolrl"}
        return JSONResponse({"object": "list", "data": [card]})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        gateway.loop = asyncio.get_running_loop()  # the engine's loop: every generate runs on it
        yield

    routes = []
    for prefix in ("", "/s/{sample}"):
        routes += [
            Route(f"{prefix}/v1/chat/completions", chat, methods=["POST"]),
            Route(f"{prefix}/v1/completions", complete, methods=["POST"]),
            Route(f"{prefix}/v1/models", models, methods=["GET"]),
        ]
    return Starlette(routes=routes, lifespan=lifespan)


def _completion_chunks(response: dict[str, Any]) -> list[str]:
    chunk = {**response, "object": "text_completion"}
    return [f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n", "data: [DONE]\n\n"]
