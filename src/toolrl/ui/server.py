"""`toolrl ui`: a Starlette app serving one static page (ui/static) and a JSON API over the run directories,
a tool config, and runs started from the page. Every view reads the plain files a run writes (metrics.jsonl,
samples.jsonl, evals.jsonl, status.json, console.log): the UI adds nothing a terminal cannot read.

Access, as Jupyter does it: every `toolrl ui` start makes a random token, printed in the URL; every request
but the static files needs it (`?token=` once sets a cookie for this port; scripts send `Authorization:
Bearer TOKEN`), loopback included, since any local process or user could otherwise start commands as the UI's
user. Bound to 127.0.0.1 (the default), only requests naming a loopback host are served (a page of another
site cannot reach it by DNS rebinding); a request with an Origin header must come from the UI's own origin;
requests that change something (POST) must carry the header X-Toolrl: 1, which a page of another origin
cannot send without a preflight this server never answers. `toolrl ui --no-token` turns the token off."""

from __future__ import annotations

import hmac
import logging
import math
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.responses import JSONResponse as StrictJSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from toolrl.errors import ToolRLError
from toolrl.runs.files import read_run_file, run_file_problem
from toolrl.text import clip
from toolrl.ui.compare import FINAL_METRICS, differing, read_config, read_meta, write_meta
from toolrl.ui.launch import Launcher, find_recipes, validate
from toolrl.ui.runs import (
    MAX_CONFIG_BYTES,
    RECORD_FILES,
    RecordIndex,
    find_runs,
    last_step,
    list_runs,
    metrics_problems,
    read_metrics,
    read_pass_rates,
    resolve_run,
    summarize_run,
)
from toolrl.ui.search import Query, search
from toolrl.ui.tools import ToolBench, find_tool_files


def finite(value: Any) -> Any:
    """`value` with NaN and infinities as None: a chart draws them as gaps, and JSON has no word for them (one
    NaN in metrics.jsonl had made every chart's request fail)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def records_json(records: list[Any], texts: list[bytes | None]) -> bytes:
    """`records` as a JSON array: each one's line as the file has it where that is JSON a browser reads (`texts`),
    else encoded again with NaN and infinities as null. (Encoding 5,000 lines of 40 metrics again had taken 180 ms
    of a 4.9 MB request's 390.)"""
    return (
        b"["
        + b",".join(text or StrictJSONResponse(finite(r)).body for r, text in zip(records, texts, strict=True))
        + b"]"
    )


class JSONResponse(StrictJSONResponse):
    def render(self, content: Any) -> bytes:
        return super().render(finite(content))


log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
MAX_IMAGE_BYTES = 32 << 20
MAX_COMPARED = 50
"""Most runs one comparison reads (each a config and the end of its metrics)."""
COOKIE = "toolrl_token"


class UIState:
    """What the API works on: the runs folder, the record index, the tool bench and the launcher."""

    def __init__(self, root: Path, recipe_dirs: list[Path]) -> None:
        self.root = root
        self.recipe_dirs = recipe_dirs
        self.index = RecordIndex()
        self.tools = ToolBench(root / ".ui" / "tools")
        self.launcher = Launcher(root)


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise ToolRLError("the request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ToolRLError("the request body must be a JSON object")
    return data


def build_app(root: Path, recipe_dirs: list[Path], *, token: str | None, loopback_only: bool = True) -> Starlette:
    """The app over the runs folder `root`. `token`: the access token every request needs (None: none, which
    lets any local process use the UI as its user: `toolrl ui --no-token`)."""
    state = UIState(root, recipe_dirs)

    async def runs(request: Request):
        return JSONResponse({"root": str(state.root), "runs": await run_in_threadpool(list_runs, state.root)})

    def detail(run: Path) -> dict[str, Any]:
        summary = summarize_run(state.root, run)
        text = read_run_file(run, run / "config.yaml", MAX_CONFIG_BYTES)
        summary["config"] = text.decode("utf-8", errors="replace")
        summary["plot"] = (run / "plot.png").exists() and run_file_problem(run, run / "plot.png") is None
        summary["pass_rates"] = read_pass_rates(run)
        return summary

    async def run_detail(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        return JSONResponse(await run_in_threadpool(detail, run))

    async def metrics(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        since = int(request.query_params.get("since", 0))
        offset = request.query_params.get("offset")  # the byte offset the last poll returned, for line `since`
        texts: list[bytes | None] = []
        records, end, since = await run_in_threadpool(
            read_metrics, run, since, None if offset is None else int(offset), texts
        )
        head = JSONResponse({"since": since, "offset": end, "problems": metrics_problems(records, since)}).body
        return Response(head[:-1] + b',"records":' + await run_in_threadpool(records_json, records, texts) + b"}",
                        media_type="application/json")  # fmt: skip

    async def steps(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        kind = _kind(request)
        found = await run_in_threadpool(state.index.steps, run, kind)
        return JSONResponse({"kind": kind, "steps": {str(k): v for k, v in sorted(found.items())},
                             "unreadable": state.index.unreadable(run, kind)})  # fmt: skip

    async def briefs(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        kind = _kind(request)
        found = await run_in_threadpool(state.index.briefs, run, kind)
        return JSONResponse({"kind": kind, "records": found.get(int(request.query_params["step"]), [])})

    async def record(request: Request):
        q = request.query_params
        run = resolve_run(state.root, q["run"])
        kind = _kind(request)
        found = await run_in_threadpool(state.index.record, run, kind, int(q["step"]), int(q["index"]))
        return JSONResponse(found)

    async def task(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        found = await run_in_threadpool(state.index.task_history, run, request.query_params["task"])
        return JSONResponse({"task": request.query_params["task"], "records": found})

    async def plot(request: Request):
        run = resolve_run(state.root, request.query_params["run"])
        try:
            data = await run_in_threadpool(read_run_file, run, run / "plot.png", MAX_IMAGE_BYTES)
        except FileNotFoundError:
            return PlainTextResponse("", 404)
        return Response(data, media_type="image/png")

    async def image(request: Request):
        """A trajectory's image file (RUN/images/*.png only, a regular file inside that folder)."""
        run = resolve_run(state.root, request.query_params["run"])
        name = request.query_params["path"]
        path = run / name
        if not name.endswith(".png") or not os.path.abspath(path).startswith(os.path.abspath(run / "images") + "/"):
            raise ToolRLError(f"{clip(name, 200)}: no image of that name in the run")
        try:
            data = await run_in_threadpool(read_run_file, run / "images", path, MAX_IMAGE_BYTES)
        except FileNotFoundError:
            raise ToolRLError(f"{clip(name, 200)}: no image of that name in the run") from None
        return Response(data, media_type="image/png")

    async def tools_get(request: Request):
        return JSONResponse({**state.tools.describe(), "suggestions": find_tool_files([Path.cwd(), state.root])})

    async def tools_load(request: Request):
        data = await _body(request)
        return JSONResponse(await run_in_threadpool(state.tools.load, str(data.get("file", ""))))

    async def tools_call(request: Request):
        data = await _body(request)
        name, arguments = str(data.get("name", "")), data.get("arguments", {})
        return JSONResponse(await run_in_threadpool(state.tools.call, name, arguments))

    async def recipes(request: Request):
        return JSONResponse({"recipes": find_recipes(state.recipe_dirs)})

    async def validate_config(request: Request):
        data = await _body(request)
        base = find_recipes(state.recipe_dirs).get(str(data.get("recipe")))
        resolved = await run_in_threadpool(validate, str(data.get("config", "")), base)
        return JSONResponse({"ok": True, "steps": resolved["train"]["steps"], "env": resolved["env"]["name"]})

    async def launch(request: Request):
        data = await _body(request)
        base = find_recipes(state.recipe_dirs).get(str(data.get("recipe")))
        started = await run_in_threadpool(state.launcher.start, str(data.get("name", "")), str(data["config"]), base)
        return JSONResponse(started)

    async def resume(request: Request):
        data = await _body(request)
        trust = data.get("trust") is True
        return JSONResponse(await run_in_threadpool(state.launcher.resume, str(data.get("run", "")), trust))

    async def stop(request: Request):
        data = await _body(request)
        return JSONResponse(state.launcher.stop(str(data.get("run", "")), now=bool(data.get("now"))))

    async def console(request: Request):
        q = request.query_params
        return JSONResponse(state.launcher.log(q["run"], int(q.get("offset", 0))))

    async def compare(request: Request):
        """The ticked runs' config keys that differ, and each run's last metrics, tags and note."""
        runs = [resolve_run(state.root, name) for name in request.query_params.getlist("run")[:MAX_COMPARED]]

        def table() -> dict[str, Any]:
            configs = {str(r.relative_to(state.root)): read_config(r, MAX_CONFIG_BYTES) for r in runs}
            last = {name: last_step(r) for name, r in zip(configs, runs, strict=True)}
            final = {name: {k: finite(m.get(k)) for k in FINAL_METRICS if k in m} for name, m in last.items()}
            meta = {name: read_meta(r) for name, r in zip(configs, runs, strict=True)}
            return {"runs": list(configs), "keys": differing(configs), "final": final, "meta": meta}

        return JSONResponse(await run_in_threadpool(table))

    async def search_samples(request: Request):
        """Records of the named runs (all runs without one) matching text, tool, outcome, reward range, stop."""
        q = request.query_params
        names = q.getlist("run")
        runs = [resolve_run(state.root, n) for n in names] if names else find_runs(state.root)
        query = Query(q.get("q", "")[:200], q.get("tool", "")[:200], q.get("outcome", ""),
                      _float(q, "rmin"), _float(q, "rmax"), q.get("stop", "")[:80])  # fmt: skip
        return JSONResponse(await run_in_threadpool(search, state.index, state.root, runs, query))

    async def run_meta(request: Request):
        data = await _body(request)
        run = resolve_run(state.root, str(data.get("run", "")))
        return JSONResponse(await run_in_threadpool(write_meta, run, data.get("tags"), data.get("note", "")))

    async def index(request: Request):
        response = FileResponse(STATIC / "index.html")
        if token and _same(request.query_params.get("token", ""), token):
            response.set_cookie(_cookie_name(request), token, httponly=True, samesite="strict")
        return response

    routes = [
        Route("/", index),
        Route("/api/runs", runs),
        Route("/api/run", run_detail),
        Route("/api/metrics", metrics),
        Route("/api/steps", steps),
        Route("/api/briefs", briefs),
        Route("/api/record", record),
        Route("/api/task", task),
        Route("/api/plot", plot),
        Route("/api/image", image),
        Route("/api/tools", tools_get),
        Route("/api/tools/load", tools_load, methods=["POST"]),
        Route("/api/tools/call", tools_call, methods=["POST"]),
        Route("/api/recipes", recipes),
        Route("/api/validate", validate_config, methods=["POST"]),
        Route("/api/launch", launch, methods=["POST"]),
        Route("/api/resume", resume, methods=["POST"]),
        Route("/api/stop", stop, methods=["POST"]),
        Route("/api/console", console),
        Route("/api/compare", compare),
        Route("/api/search", search_samples),
        Route("/api/run/meta", run_meta, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]

    def error(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    def missing(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": f"missing parameter {exc}"}, status_code=400)

    @asynccontextmanager
    async def lifespan(app):
        yield
        state.tools.close()
        state.launcher.close()

    app = Starlette(
        routes=routes,
        exception_handlers={ToolRLError: error, KeyError: missing, ValueError: error, OSError: error},
        lifespan=lifespan,
    )
    app.state.ui = state
    return _guarded(app, token, loopback_only)


def _guarded(app, token: str | None, loopback_only: bool):
    """Host check (loopback binding), Origin check, token check, and X-Toolrl on POST, before the app."""

    async def guarded(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        request = Request(scope)
        host_header = request.headers.get("host", "")
        host = _host_name(host_header)
        origin = request.headers.get("origin")
        problem = None
        if loopback_only and host not in LOOPBACK_NAMES:
            shown = clip(host_header, 80)
            problem = (403, f"host {shown!r} is not served: this UI is bound to the loopback interface")
        elif origin is not None and origin.lower() not in {
            f"http://{host_header}".lower(),
            f"https://{host_header}".lower(),
        }:
            problem = (403, "a request from another origin is refused: open the UI at the URL `toolrl ui` printed")
        elif token and not scope["path"].startswith("/static/") and not _has_token(request, token):
            problem = (401, "an access token is needed: open the URL `toolrl ui` printed (it has ?token=)")
        elif request.method not in ("GET", "HEAD") and request.headers.get("x-toolrl") != "1":
            problem = (403, "requests that change something need the header X-Toolrl: 1")
        if problem and problem[0] == 401 and scope["path"] == "/" and request.method in ("GET", "HEAD"):
            # a shared link opened without the token: a page that asks for it and keeps the link's view (#...)
            return await FileResponse(STATIC / "token.html", status_code=401)(scope, receive, send)
        if problem:
            return await JSONResponse({"error": problem[1]}, status_code=problem[0])(scope, receive, send)
        return await app(scope, receive, send)

    guarded.inner = app
    return guarded


def _float(params, key: str) -> float | None:
    """A number parameter (None when absent or empty); anything else is a one-line error naming it."""
    value = params.get(key, "")
    if value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ToolRLError(f"{key}: {clip(repr(value), 40)} is not a number") from None
    if not math.isfinite(number):
        raise ToolRLError(f"{key}: {clip(repr(value), 40)} is not a finite number")
    return number


def _kind(request: Request) -> str:
    kind = request.query_params.get("kind", "train")
    if kind not in RECORD_FILES:
        raise ToolRLError(f"kind must be one of {', '.join(RECORD_FILES)}")
    return kind


def _host_name(header: str) -> str | None:
    """The host of a Host header parsed as a URL authority, without its port ([::1]:8000 -> ::1, lowercase);
    None when it is not a plain authority: userinfo (127.0.0.1:1@evil), a path, a bad port, spaces."""
    if not header or any(c in header for c in "@/?#\\ \t") or not header.isascii():
        return None
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return None
    return parts.hostname


def _cookie_name(request: Request) -> str:
    """The token's cookie, one per port: cookies ignore ports, and two UIs on one machine have two tokens."""
    return f"{COOKIE}_{request.url.port or 80}"


def _has_token(request: Request, token: str) -> bool:
    given = request.cookies.get(_cookie_name(request)) or request.query_params.get("token") or ""
    bearer = request.headers.get("authorization", "")
    if bearer.startswith("Bearer "):
        given = bearer[len("Bearer ") :]
    return _same(given, token)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())
