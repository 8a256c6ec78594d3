"""Every input the CLI reads gives a bounded one-line error, whatever an attacker or a typo puts there: over a
thousand hostile configs, `--set` values, task files and tool files (huge numbers in every numeric field, lone
surrogates, control characters, deep nesting, wrong types), `toolrl train` answers each with one line on stderr,
exit 2, and no run folder. They run in this process through the CLI's own entry point (`toolrl.cli.main`);
reaching the model load would mean a hostile input was taken, and fails the test."""

import json
import random
import sys
import types
import typing

import pytest
from pydantic import BaseModel

from toolrl.cli import main
from toolrl.config.schema import RunConfig
from toolrl.tools.toolset import PolicyEntry, ServerEntry

HUGE = [10**30, -(10**30), 2**64, 1e300, -1e300, int("f" * 5000, 16)]
NOT_TEXT = ["\ud800", "a\udfffb", "x\x00y", "\x1b[31mred", "\x7f"]


def numeric_and_text_keys(model: type[BaseModel], prefix: str = "") -> tuple[list[str], list[str]]:
    """Dotted keys of `model`'s int/float fields and of its str fields, nested sections included."""
    numbers, texts = [], []
    for name, field in model.model_fields.items():
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        if isinstance(field.annotation, types.UnionType):
            kinds = field.annotation.__args__
        key = f"{prefix}{name}"
        sections = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if sections:
            more = numeric_and_text_keys(sections[0], f"{key}.")
            numbers += more[0]
            texts += more[1]
        elif any(k in (int, float) for k in kinds):
            numbers.append(key)
        elif str in kinds:
            texts.append(key)
    return numbers, texts


def dump(value) -> str:
    """A value as YAML/JSON text (json is YAML), big integers in hex where decimal would pass Python's limit."""
    if isinstance(value, int) and value.bit_length() > 4000:
        return hex(value)
    return json.dumps(value)


def nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def hostile_sets() -> list[list[str]]:
    numbers, texts = numeric_and_text_keys(RunConfig)
    cases = [[f"{key}={dump(v)}"] for key in numbers for v in HUGE]
    cases += [[f"{key}={json.dumps(t)}"] for key in texts if key != "output_dir" for t in NOT_TEXT]
    cases += [[f"{key}={json.dumps(nested(80))}"] for key in numbers[:40]]
    cases += [[f"{key}=[1, [2, [3]]]"] for key in numbers[:40]]  # wrong types
    for env in ("calculator", "code", "nl2sql", "search", "files", "support"):
        cases += [[f"env.name={env}", f"env.options.{k}={dump(v)}"] for k in ("num_train", "num_test", "seed")
                  for v in HUGE]  # fmt: skip
        cases += [[f"env.name={env}", f"env.options.nope_{i}=1"] for i in range(3)]
    cases += [[f"train.stpes{i}=1"] for i in range(5)]
    return cases


def hostile_configs() -> list[str]:
    numbers, _ = numeric_and_text_keys(RunConfig)
    rng = random.Random(0)
    texts = ["just a string", "[1, 2, 3]", "train: 5", "env: [1]", json.dumps(nested(200)), "a: &x [*x]"]
    texts += ["\x00", "train:\n  steps: \ud800" , "{" * 5000, "model:\n  name: " + "\x1b" * 3]  # fmt: skip
    for key in rng.sample(numbers, 60):
        section, _, leaf = key.rpartition(".")
        body = {leaf: rng.choice([10**40, -1e308, "ten", [1], {"x": 1}, "\ud801"])}
        for part in reversed(section.split(".") if section else []):
            body = {part: body}
        texts.append(json.dumps(body))
    return texts


def hostile_task_rows() -> list[str]:
    rows = ['{"question": "\\ud800 two", "answer": "2"}', '{"question": "a\\u0000b", "answer": "1"}',
            '{"question": {"x": 1}, "answer": "1"}', '{"question": "q"}', '{"answer": "1"}', "[1, 2]", "7",
            '{"question": "q", "answer": ' + "1" * 5000 + "}", "[" * 10000 + "]" * 10000, "{not json",
            '{"question": "q", "answer": "1", "id": "\\u001b"}', '{"question": "q", "answer": []}']  # fmt: skip
    return rows * 3


def hostile_tool_files() -> list[dict]:
    files = []
    numbers = [k for k, f in ServerEntry.model_fields.items() if f.annotation in (int, float, float | None, int | None)]
    policy = [
        k for k, f in PolicyEntry.model_fields.items() if "int" in str(f.annotation) or "float" in str(f.annotation)
    ]
    for key in numbers:
        files += [{"s": {"command": "true", key: v}} for v in HUGE[:5]]
    for key in policy:
        files += [{"s": {"command": "true", "policy": {key: v}}} for v in HUGE[:5]]
    files += [{"s": {"command": t}} for t in NOT_TEXT] + [{t: {"command": "x"}} for t in NOT_TEXT]
    files += [{"s": {"command": "x", "args": [nested(100)]}}, {"s": {"comand": "x"}}, {"s": []}, {"s": {"command": 5}}]
    return files


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """toolrl train through the CLI's entry point: (exit code, stderr); the model load is never reached."""
    import toolrl.train

    def reached(*args, **kwargs):
        raise AssertionError(f"a hostile input reached the model load: {sys.argv[2:-2]!r:.300}")

    monkeypatch.setattr(toolrl.train.Workbench, "load", reached)
    runs = tmp_path / "runs"
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["toolrl", "train", *argv, "--set", f"output_dir={runs}"])
        with pytest.raises(SystemExit) as ended:
            main()
        err = capsys.readouterr().err
        assert not runs.exists() or not any(runs.iterdir()), f"a run folder was made for {argv!r:.200}"
        return ended.value.code, err

    return run


def check(code: int, err: str, what) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (what, code, err[-600:])
    assert len(lines[0]) <= 1200, (what, len(lines[0]))


def test_over_a_thousand_hostile_inputs_each_get_one_line_and_exit_2(cli, tmp_path):
    tried = 0
    for sets in hostile_sets():
        check(*cli(*[arg for s in sets for arg in ("--set", s)]), sets)
        tried += 1
    for i, text in enumerate(hostile_configs()):
        path = tmp_path / f"config-{i}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        check(*cli(str(path)), text[:200])
        tried += 1
    for i, row in enumerate(hostile_task_rows()):
        path = tmp_path / f"tasks-{i}.jsonl"
        path.write_text(row + "\n", encoding="utf-8", errors="surrogatepass")
        check(*cli("--set", "env.name=calculator", "--set", f"env.train_file={path}"), row[:200])
        tried += 1
    for i, servers in enumerate(hostile_tool_files()):
        path = tmp_path / f"tools-{i}.json"
        path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
        check(*cli("--set", f"tools.file={path}"), str(servers)[:200])
        tried += 1
    assert tried >= 1000, tried


def test_an_unknown_key_lists_at_most_five_nearest_keys(cli):
    code, err = cli("--set", "train.stpes=1")
    assert code == 2 and "did you mean 'steps'" in err and "nearest keys here: steps," in err
    listed = err.split("nearest keys here: ")[1].split(" (")[0].split(", ")
    assert len(listed) == 5 and len(err) < 300, err
