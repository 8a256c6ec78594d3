"""The docs cannot drift: every code block of README.md and docs/*.md runs here, page by page, in a folder
of its own, on the tiny model.

- ```python blocks whose first line is `# file: NAME` are written to NAME and imported; the others run as
  scripts;
- ```bash blocks run line by line (`toolrl ...` as `python -m toolrl ...`); train and eval get the tiny
  model and one short step appended as `--set` overrides (a key the line sets itself keeps its value), and so
  do configs loaded in Python (`resolve_config`, `load_config`);
- ```yaml blocks are validated: a tool config file (`mcpServers`), a build spec (`source`), else a run
  config (or a fragment of one);
- ```text blocks are output or layouts, shown, not run.
The only commands not run are the README's two set-up commands, `make demo` and `make test`: CI runs
`make test` itself on a fresh clone, and `make demo` is `make install`, `toolrl model fetch`, `toolrl train
recipes/calculator-zero.yaml` (tests/envs/test_recipes.py trains every recipe a step on the tiny model).
"""

import contextlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)
NOT_RUN = {"make demo", "make test"}
LANGUAGES = {"python", "bash", "yaml", "text"}


def tiny_overrides(tiny: Path, out: Path) -> list[str]:
    return [
        f"model.name={tiny}",
        "device=cpu",
        "train.steps=1",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "rollout.max_new_tokens=8",
        "eval.num_tasks=2",
        "eval.batch_size=2",
        "eval.at_start=false",
        "eval.at_end=false",
    ]


def blocks(page: Path) -> list[tuple[str, str]]:
    found = []
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        indent, language, body = match.groups()
        body = "\n".join(line[len(indent) :] for line in body.splitlines())
        found.append((language, body))
    return found


PATCH = """
import toolrl.config as _config
import toolrl.config.resolve as _resolve
_original = _resolve.resolve_config
def _tiny(path=None, overrides=None):
    return _original(path, [*(overrides or []), *{overrides!r}])
_config.load_config = _config.resolve_config = _resolve.resolve_config = _tiny
"""


def run(command: list[str], cwd: Path, what: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(cwd)])}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{what}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"


def check_yaml(text: str, cwd: Path) -> None:
    from toolrl.build import load_spec
    from toolrl.config import load_config
    from toolrl.tools.toolset import ToolsFile

    data = yaml.safe_load(text)
    if "mcpServers" in data:
        ToolsFile.model_validate(data)
    elif "source" in data:
        path = cwd / "spec.yaml"
        path.write_text(text)
        load_spec(path)
    else:
        path = cwd / "config.yaml"
        path.write_text(text)
        with in_folder(cwd):  # as a user resolves it: from the page's folder, where its modules are
            load_config(path)


@contextlib.contextmanager
def in_folder(folder: Path):
    before, path = os.getcwd(), list(sys.path)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
        sys.path[:] = path


def test_every_page_has_only_known_block_kinds():
    for page in PAGES:
        for language, body in blocks(page):
            assert language in LANGUAGES, f"{page.name}: a ```{language or '(no language)'} block: {body[:80]!r}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_code_of_each_page_runs(page, tmp_path, tiny_model_dir):
    overrides = tiny_overrides(tiny_model_dir, tmp_path)
    for language, body in blocks(page):
        if language == "python" and body.startswith("# file: "):
            name = body.splitlines()[0].removeprefix("# file: ").strip()
            (tmp_path / name).write_text(body, encoding="utf-8")
            if name.endswith(".py"):  # it imports: every name it uses exists
                run([sys.executable, "-c", f"import {name[:-3]}"], tmp_path, f"{page.name}: import {name}")
        elif language == "python":
            run(
                [sys.executable, "-c", PATCH.format(overrides=overrides) + body], tmp_path, f"{page.name}: {body[:200]}"
            )
        elif language == "bash":
            for line in body.splitlines():
                line = line.split("  #")[0].strip()
                if not line or line.startswith("#") or line in NOT_RUN:
                    continue
                argv = shlex.split(line)
                if argv[0] == "torchrun":  # torchrun ... -m toolrl ARGS: the same launcher, as a module
                    launcher = [sys.executable, "-m", "torch.distributed.run", *argv[1 : argv.index("toolrl") - 1]]
                    argv = argv[argv.index("toolrl") :]
                else:
                    launcher = []
                assert argv[0] == "toolrl", f"{page.name}: only toolrl commands run in docs: {line}"
                own = {argv[i + 1].split("=")[0] for i, a in enumerate(argv[:-1]) if a == "--set"}  # the page's win
                tiny = [o for o in overrides if o.split("=")[0] not in own]
                extra = [a for o in tiny for a in ("--set", o)] if argv[1] in ("train", "eval") else []
                command = [*launcher] + (["-m", "toolrl"] if launcher else [sys.executable, "-m", "toolrl"])
                run([*command, *argv[1:], *extra], tmp_path, f"{page.name}: {line}")
        elif language == "yaml":
            check_yaml(body, tmp_path)


def test_make_demo_runs_again_into_a_run_folder_of_its_own(tmp_path, tiny_model_dir):
    """`make demo` a second time had stopped at once ("runs/calculator-zero already holds a run", make's Error 2):
    its train command, as make runs it (with the tiny model and one step), twice, makes two runs."""
    import time

    lines = subprocess.run(["make", "-n", "demo"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    (train,) = [line for line in lines.splitlines() if " train " in line]
    quick = (f" --set model.name={tiny_model_dir} --set output_dir={tmp_path} --set train.steps=1 --set device=cpu"
             " --set train.warm_start=false --set eval.at_start=false --set eval.at_end=false --quiet")  # fmt: skip
    for _ in range(2):
        done = subprocess.run(["bash", "-c", train + quick], capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        time.sleep(1.1)  # the run's name has the time to the second
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert len(runs) == 2 and all(name.startswith("calculator-zero-") for name in runs)
