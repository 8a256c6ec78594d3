"""Where the clients and harnesses the tests drive are installed (each in a venv or node folder of its own, so
that their pins never touch toolrl's): `make clients` builds .venv-clients/NAME from tests/clients/requirements,
`make harnesses` installs tests/clients/harnesses and the JavaScript SDKs of tests/clients/js. `make test` builds
both and sets TOOLRL_CLIENT_TESTS=required (and TOOLRL_HARNESS_TESTS=required where node is installed), so that a
missing one fails there instead of skipping."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PROGRAMS = ROOT / "tests" / "clients"
VENVS = Path(os.environ.get("TOOLRL_CLIENT_VENVS", ROOT / ".venv-clients"))
HARNESSES = PROGRAMS / "harnesses" / "node_modules" / ".bin"


def _missing(what: str, how: str, setting: str) -> None:
    if os.environ.get(setting) == "required":
        pytest.fail(f"{what} is not installed; {how}")
    pytest.skip(f"{what} is not installed ({how})")


def client_python(venv: str) -> str:
    python = VENVS / venv / "bin" / "python"
    if not python.exists():
        _missing(f"the {venv} client venv ({python})", "run make clients", "TOOLRL_CLIENT_TESTS")
    return str(python)


def harness(name: str) -> str:
    if shutil.which("node") is None:
        _missing("node", "install Node.js 20 or later to test the harness programs", "TOOLRL_HARNESS_TESTS")
    program = HARNESSES / name
    if not program.exists():
        _missing(f"the {name} harness ({program})", "run make harnesses", "TOOLRL_HARNESS_TESTS")
    return str(program)


def node_client(script: str) -> list[str]:
    """`node SCRIPT` for a program of tests/clients/js, once node and the SDKs it imports are installed."""
    node = shutil.which("node")
    if node is None:
        _missing("node", "install Node.js 20 or later to test the JavaScript clients", "TOOLRL_HARNESS_TESTS")
    if not (PROGRAMS / "js" / "node_modules" / "ai").exists():
        _missing("the JavaScript SDKs (tests/clients/js/node_modules)", "run make harnesses", "TOOLRL_HARNESS_TESTS")
    return [node, str(PROGRAMS / "js" / script)]
