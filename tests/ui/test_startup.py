"""`toolrl ui` is ready in well under 2 s because what it imports is light: the CLI, the config, the run files
and the web app, never torch or transformers (4-17 s on this machine). Measured as the import set, not a time."""

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from pathlib import Path
import toolrl.cli  # every command registered, as `toolrl ui` starts
from toolrl.cli.app import _quiet_libraries
from toolrl.ui import build_app
_quiet_libraries()
build_app(Path(sys.argv[1]).resolve(), [], token="t", loopback_only=True)
heavy = ("torch", "transformers", "peft", "safetensors.torch", "datasets")
print(json.dumps({name: name in sys.modules for name in heavy}))
"""


def test_the_ui_starts_without_importing_torch_or_transformers(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert not any(imported.values()), imported
