"""`toolrl ui`: the web app over run directories, tools and launches (toolrl.ui)."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Annotated

import typer

from toolrl.cli.app import app, console
from toolrl.errors import ConfigError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "TOOLRL_UI_TOKEN"
MAX_TOKEN_CHARS = 512


def read_token_file(path: Path) -> str:
    """The token in `path`'s first line; one-line errors for a missing, unreadable, empty or odd file."""
    if path.exists() and not path.is_file():  # a FIFO would wait for a writer forever
        raise ConfigError(f"--token-file {path}: not a regular file")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TOKEN_CHARS + 2)
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot read it ({exc.strerror})") from None
    token = data.decode("utf-8", errors="replace").splitlines()[0].strip() if data.strip() else ""
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isprintable():
        raise ConfigError(f"--token-file {path}: its first line must be a token of 1 to {MAX_TOKEN_CHARS} printable "
                          "characters")  # fmt: skip
    return token


@app.command()
def ui(
    runs_dir: Annotated[Path, typer.Argument(help="Folder of run directories (output_dir).")] = Path("runs"),
    host: Annotated[str, typer.Option(help="Interface to bind (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 7860,
    token: Annotated[
        str | None,
        typer.Option(
            envvar=TOKEN_ENV,
            show_envvar=True,
            help=f"Access token every request needs (a random one is made when omitted). On the command line it "
            f"shows in `ps`: prefer {TOKEN_ENV} or --token-file.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="A file whose first line is the access token (kept out of `ps`).")
    ] = None,
    no_token: Annotated[
        bool,
        typer.Option(
            "--no-token",
            help="Serve without a token: any process or user of this machine can then read your runs, call your "
            "tools and start commands as you. Only with --host 127.0.0.1, on a machine you alone use.",
        ),
    ] = False,
    recipes: Annotated[
        list[Path] | None, typer.Option("--recipes", help="Folders of recipe YAML files for the launch tab.")
    ] = None,
) -> None:
    """Serve a web page to watch runs (live curves, overlaid), read trajectories token by token, call tools
    by hand and launch, stop and resume runs. Everything it shows is in the run directories as plain files."""
    import uvicorn

    from toolrl.cli.app import _quiet_libraries
    from toolrl.ui import build_app

    if port < 0 or port > 65535:
        raise ConfigError(f"--port {port}: give a port between 0 and 65535")
    runs_dir.mkdir(parents=True, exist_ok=True)
    loopback = host in LOOPBACK
    if token_file is not None:
        if token:
            raise ConfigError(f"--token-file and --token (or {TOKEN_ENV}): give one of them")
        token = read_token_file(token_file)
    if token is not None and not token.strip():
        raise ConfigError("--token: an empty token; give one or leave it out (a random one is made)")
    if no_token and token:
        raise ConfigError("--no-token and --token: give one of them")
    if no_token and not loopback:
        raise ConfigError(f"--no-token --host {host}: without a token, serve only on 127.0.0.1")
    if not no_token and not token:
        token = secrets.token_urlsafe(24)
    folders = recipes if recipes is not None else [p for p in (Path("recipes"),) if p.is_dir()]
    _quiet_libraries()
    application = build_app(runs_dir.resolve(), [f.resolve() for f in folders], token=token, loopback_only=loopback)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # connections wait in the backlog from now on: the URL printed below already answers
    except OSError as exc:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); try --port 0") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else ("localhost" if loopback else host)
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    console.print(f"toolrl ui: [bold]{url}[/]  (runs: {runs_dir.resolve()}; Ctrl-C stops it)", highlight=False)
    if no_token:
        console.print("[yellow]no access token: any process on this machine can use this UI as you[/]")
    config = uvicorn.Config(application, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
