"""`toolrl ui`: a local web app over run directories (live curves, trajectories token by token), a tool config
(call tools by hand) and runs started from the page. See server.py and docs/ui.md."""

from toolrl.ui.server import build_app

__all__ = ["build_app"]
