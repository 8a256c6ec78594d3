"""Boxes served over HTTP on 127.0.0.1, for agent programs that run outside toolrl's process (a harness driven
through the gateway): `POST /boxes/KEY/exec` with `{"command": "...", "timeout_s": 30}` runs a bash command in that
box and answers `{"status": 0, "output": "..."}` (status null: stopped at its limit). Each box has its own key and
bearer token, given to the one program that works in it (TOOLRL_BOX_URL, TOOLRL_BOX_TOKEN); a request without the
token, for a box that is gone, or with a body that is not that object is refused with a one-line error.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from toolrl.http import ThreadServer
from toolrl.sandbox.provider import Box

log = logging.getLogger(__name__)
MAX_TIMEOUT_S = 600.0


class BoxServer:
    def __init__(self) -> None:
        self.boxes: dict[str, tuple[Box, str, asyncio.AbstractEventLoop]] = {}
        self._served: ThreadServer | None = None
        self.port = 0

    def register(self, box: Box, loop: asyncio.AbstractEventLoop) -> tuple[str, str]:
        """(the box's URL, its token); its commands run on `loop` (where the box was started)."""
        key, token = secrets.token_hex(8), secrets.token_urlsafe(24)
        self.boxes[key] = (box, token, loop)
        return f"http://127.0.0.1:{self.port}/boxes/{key}", token

    def unregister(self, url: str) -> None:
        self.boxes.pop(url.rsplit("/", 1)[-1], None)

    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def exec_(request: Request) -> JSONResponse:
            entry = self.boxes.get(request.path_params["key"])
            if entry is None:
                return JSONResponse({"error": "no such box (it was stopped)"}, status_code=404)
            box, token, loop = entry
            if request.headers.get("authorization") != f"Bearer {token}":
                return JSONResponse({"error": "this box's bearer token is needed (TOOLRL_BOX_TOKEN)"}, status_code=401)
            try:
                body: Any = await request.json()
            except ValueError:
                body = None
            command = body.get("command") if isinstance(body, dict) else None
            timeout = body.get("timeout_s", box.spec.timeout_s) if isinstance(body, dict) else None
            if not isinstance(command, str) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
                return JSONResponse({"error": 'the body is {"command": "a bash command", "timeout_s": seconds '
                                              f"(0-{MAX_TIMEOUT_S:g})}}"}, status_code=400)  # fmt: skip
            future = asyncio.run_coroutine_threadsafe(box.exec(command, timeout_s=float(timeout)), loop)
            result = await asyncio.wrap_future(future)
            return JSONResponse({"status": result.status, "output": result.output})

        return Starlette(routes=[Route("/boxes/{key}/exec", exec_, methods=["POST"])])

    def start(self, timeout: float = 30.0) -> BoxServer:
        import uvicorn

        config = uvicorn.Config(self.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self._served = ThreadServer(config, "toolrl-boxes")
        self.port = self._served.start(timeout, "the box server")
        return self

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
        self.boxes.clear()
