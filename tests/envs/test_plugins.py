"""Environments from outside the package, as a user makes them: `toolrl env new`, `env.module` from the command
line, options validated by the environment's own model, and prompts written in the run's call syntax."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolrl.config import load_config
from toolrl.errors import ConfigError

ROOT = Path(__file__).parents[2]


def toolrl(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.slow
def test_env_new_writes_a_package_whose_tests_pass_and_that_trains_from_the_command_line(tmp_path, tiny_model_dir):
    made = toolrl("env", "new", "word_env", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert {p.name for p in (tmp_path / "word_env").iterdir()} >= {
        "__init__.py",
        "env.py",
        "test_env.py",
        "config.yaml",
    }
    printed = dict(line.split(":", 1) for line in made.stdout.splitlines()[1:])
    assert set(printed) == {"test it", "check it", "train on it"}

    # the README's install brings no pytest (issue 73: the printed `pytest NAME` did not run): the printed test
    # command runs where importing pytest fails
    (tmp_path / "no_pytest").mkdir()
    (tmp_path / "no_pytest" / "pytest.py").write_text("raise ImportError('pytest is not installed here')\n")

    def run_printed(what, *extra):  # as printed, from another folder
        command = printed[what].strip() + " " + " ".join(extra)
        env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'no_pytest'}:{ROOT}",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
        return subprocess.run(command, shell=True, capture_output=True, text=True, cwd="/", env=env, timeout=600)

    tested = run_printed("test it")
    assert tested.returncode == 0 and tested.stdout.count("passed: ") == 2, tested.stdout + tested.stderr
    # the limits the environment needs are its rollout_defaults, which the written config does not override
    assert "rollout" not in (tmp_path / "word_env" / "config.yaml").read_text()
    shown = toolrl("config", "show", "word_env/config.yaml", cwd=tmp_path)
    assert shown.returncode == 0 and "max_turns: 3" in shown.stdout, shown.stderr
    checked = run_printed("check it", f"--set model.name={tiny_model_dir}")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
    trained = run_printed(
        "train on it", f"--set model.name={tiny_model_dir} --set device=cpu --set train.steps=1",
        f"--set eval.num_tasks=2 --set rollout.max_new_tokens=8 --set output_dir={tmp_path / 'runs'}",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "runs" / "word_env" / "final" / "model.safetensors").is_file()
    again = toolrl("env", "new", "word_env", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_env_new_refuses_a_name_that_shadows_an_installed_module(tmp_path):
    """A user named a first environment after the library being ported: the package hid it (or was hidden)."""
    for name, where in (("json", "the standard library"), ("torch", "site-packages")):
        made = toolrl("env", "new", name, cwd=tmp_path)
        assert made.returncode == 2 and f"'{name}' is the name of an installed module" in made.stderr, made.stderr
        assert where in made.stderr and f"e.g. {name}_env" in made.stderr and len(made.stderr.splitlines()) == 1
        assert not (tmp_path / name).exists()


def test_env_module_and_options_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^env\.module: cannot import 'no_such_env_module' \(ModuleNotFoundError"):
        load_config(overrides=["env.module=no_such_env_module"])
    with pytest.raises(ConfigError, match=r"unknown environment 'shelf'.*set env\.module to the module"):
        load_config(overrides=["env.name=shelf"])
    with pytest.raises(ConfigError, match=r"env\.options\.num_test must be greater than or equal to 1, got 0"):
        load_config(overrides=["env.options.num_test=0"])
    with pytest.raises(ConfigError, match=r"unknown key 'env\.options\.database'; nearest keys here: "):
        load_config(overrides=["env.options.database=x.db"])
    with pytest.raises(ConfigError, match=r"unknown key 'env\.num_test'.*environment settings go under env\.options"):
        load_config(overrides=["env.num_test=5"])
    config = load_config(overrides=["env.name=nl2sql", "env.options.max_rows=3"])
    assert config.env.options == {"database": None, "max_rows": 3, "timeout_s": 2.0}  # filled in, as run dirs keep it


def test_prompts_are_written_in_the_syntax_the_run_parses(tiny_model_dir, tokenizer):
    from toolrl.train import Workbench

    bench = Workbench.load(
        load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", "rollout.parser=pythonic"])
    )
    try:
        rollout = bench.rollout(bench.config.rollout.sampling, seed=0)
        prompt = tokenizer.decode(rollout.prompt_ids(bench.env.tasks("test")[0]))
        assert "[calculator(expression='23 * 41 + 7')]" in prompt and "<tool_call>" not in prompt
        assert "reply with a Python list of calls" in prompt and rollout.parser.name == "pythonic"
    finally:
        bench.close()
    search = load_config(overrides=["env.name=search"])
    assert search.rollout.parser is None  # unset: the environment's own (search-r1)
    from toolrl.envs.base import parser_name

    assert parser_name(search.env) == "search-r1" and parser_name(search.env, "hermes") == "hermes"


def test_an_installed_package_lists_its_environment_in_the_entry_point_group(tmp_path, monkeypatch):
    """A package installed with [project.entry-points."toolrl.environments"] needs no env.module."""
    (tmp_path / "listed_env.py").write_text(
        "from toolrl.envs import Environment, register_env\n"
        "from toolrl.rewards import Rubric\n\n"
        "@register_env('listed')\n"
        "class Listed(Environment):\n"
        "    name = 'listed'\n"
        "    def __init__(self, config, options):\n"
        "        super().__init__(config, options)\n"
        "        self.rubric = Rubric([])\n"
        "    def tools(self): return []\n"
        "    def tasks(self, split): return []\n"
        "    def messages(self, task): return []\n"
    )
    dist = tmp_path / "listed_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: listed-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[toolrl.environments]\nlisted = listed_env\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(overrides=["env.name=listed"])
    from toolrl.envs import make_env

    assert make_env(config.env).name == "listed"


def test_an_environment_whose_tools_are_not_tools_is_one_line_naming_it():
    from toolrl.config.schema import EnvConfig
    from toolrl.envs import Environment, make_env, register_env
    from toolrl.envs.base import ENVIRONMENTS
    from toolrl.rewards import Rubric

    @register_env("bad-tools")
    class BadTools(Environment):
        name = "bad-tools"

        def __init__(self, config, options):
            super().__init__(config, options)
            self.rubric = Rubric([])

        def tools(self):
            return [{"name": "search"}]

        def tasks(self, split):
            return []

        def messages(self, task):
            return []

    try:
        with pytest.raises(ConfigError, match=r"^env bad-tools: tools\(\) returned a dict, not a Tool"):
            make_env(EnvConfig(name="bad-tools"))
    finally:
        ENVIRONMENTS.pop("bad-tools")


LONG_TASK_ENV = """
from toolrl.envs import Environment, Task, register_env
from toolrl.rewards import Criterion, Rubric


@register_env("long_question")
class LongQuestion(Environment):
    name = "long_question"

    def __init__(self, config, options):
        super().__init__(config, options)
        self.splits = {
            "train": [Task("fine-1", "What is 2 + 2?", "4"), Task("huge-7", "Why? " * 2_000_000, "no")],
            "test": [Task("fine-2", "What is 3 + 3?", "6"), Task("huge-8", "word " * 40_000, "no")],
        }
        self.rubric = Rubric([Criterion("correct", lambda trajectory, task: 0.0, 1.0)], success="correct")

    def tools(self):
        return []

    def tasks(self, split):
        return self.splits[split]

    def messages(self, task):
        return [{"role": "user", "content": task.question}]
"""


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_prompt_longer_than_the_context_is_refused_before_the_run_naming_the_task(tmp_path, tiny_model_dir, command):
    """A 10 MB question (train) and a 200 KB one (test) in an environment from outside the package: refused in
    one line naming the task before anything is generated, not after 40 minutes and 8.8 GB."""
    (tmp_path / "long_question.py").write_text(LONG_TASK_ENV)
    started = time.monotonic()
    done = toolrl(
        command, "--set", "env.module=long_question", "--set", "env.name=long_question",
        "--set", f"model.name={tiny_model_dir}",
        "--set", "device=cpu", "--set", f"output_dir={tmp_path / 'runs'}", "--set", "train.steps=1",
        cwd=tmp_path,
    )  # fmt: skip
    last = done.stderr.strip().splitlines()[-1]
    task = "huge-7" if command == "train" else "huge-8"
    assert done.returncode != 0 and f"env long_question, task {task}: its prompt is" in last, done.stderr[-2000:]
    assert "the model's context 8,192" in last and len(last) < 300
    assert time.monotonic() - started < 120


def test_an_environment_registered_by_a_plugin_is_named_in_the_config_from_the_command_line(tiny_model_dir):
    """`plugins:` is imported before the config's names are checked (it once was after: unknown environment)."""
    sets = ["plugins=[tests.fixtures.plugin_env]", "env.name=plugin-shelf", "env.options.shelves=3"]
    shown = toolrl("config", "show", *(a for s in sets for a in ("--set", s)), cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert "name: plugin-shelf" in shown.stdout and "shelves: 3" in shown.stdout
    bad = toolrl("config", "show", *(a for s in [*sets[:2], "env.options.shelves=0"] for a in ("--set", s)), cwd=ROOT)
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == "error: env.options of plugin-shelf: env.options.shelves must be greater than or equal to 1, got 0"
    )
    sets += [f"model.name={tiny_model_dir}", "rollout.max_new_tokens=4", "rollout.max_turns=1"]
    evaluated = toolrl("eval", "--num-tasks", "3", *(a for s in sets for a in ("--set", s)), cwd=ROOT)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "plugin-shelf test split, 3 tasks" in evaluated.stdout


def test_task_files_given_to_an_environment_that_never_reads_them_are_refused(tmp_path):
    from toolrl.envs import make_env

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "q", "answer": "a"}\n')
    shelf = load_config(overrides=["plugins=[tests.fixtures.plugin_env]", "env.name=plugin-shelf"])
    shelf.env.test_file = str(tasks)
    with pytest.raises(
        ConfigError, match=r"^env\.test_file: environment plugin-shelf takes no task files .*TaskSplits"
    ):
        make_env(shelf.env)
    reads = load_config(overrides=["env.name=calculator", f"env.test_file={tasks}"])
    assert [t.question for t in make_env(reads.env).tasks("test")] == ["q"]  # one that reads them gets them


def test_env_list_shows_every_environment_with_real_defaults_and_a_plugins_own(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per environment
    listed = toolrl("env", "list", "--module", "tests.fixtures.plugin_env", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.startswith("│")}
    assert {"calculator", "files", "support", "built", "plugin-shelf"} <= set(rows)
    assert "PydanticUndefined" not in listed.stdout
    assert "path (required)" in rows["built"] and "user ('scripted')" in rows["support"]
    assert "shelves (2)" in rows["plugin-shelf"] and "kinds (['rotated', 'small'])" in rows["images"]


def test_an_environment_sets_the_rollout_limits_its_tasks_need_where_the_config_sets_none():
    from toolrl.config import resolve_config
    from toolrl.envs.base import Environment, register_env

    @register_env("long-talks")
    class LongTalks(Environment):
        name = "long-talks"
        rollout_defaults = {"max_turns": 9, "max_new_tokens": 200}  # noqa: RUF012

        def tasks(self, split):
            return []

        def messages(self, task):
            return []

    config = resolve_config(overrides=["env.name=long-talks"])
    assert (config.rollout.max_turns, config.rollout.max_new_tokens) == (9, 200)
    mine = resolve_config(overrides=["env.name=long-talks", "rollout.max_turns=2"])
    assert (mine.rollout.max_turns, mine.rollout.max_new_tokens) == (2, 200)  # what the config sets wins
    plain = resolve_config(overrides=["env.name=calculator"])
    assert plain.rollout.max_turns == 3  # toolrl's own default
    built = resolve_config(overrides=["env.name=built", "env.options.path=anywhere"])
    assert built.rollout.max_turns == 6 and built.rollout.max_new_tokens == 96
