"""The command line's help as a user types the command, fast because nothing heavy is imported for it, and value
errors in our own words (issue 50, item 9)."""

import json
import subprocess
import sys

import pytest

from toolrl.cli import command

ROOT = __import__("pathlib").Path(__file__).parents[1]


def commands(group, path=()):
    yield path
    for name, sub in getattr(group, "commands", {}).items():
        yield from commands(sub, (*path, name))


ALL = list(commands(command()))


def test_every_help_page_names_values_as_they_are_typed():
    """No Python type names (typer prints `<bool>`, `<list[str]>`, `<path>` by default): --set KEY=VALUE, a path
    PATH, a count N, flags with nothing after them."""
    script = (
        "import io, sys, json, contextlib\nfrom toolrl.cli import main\npages = {}\n"
        f"for path in {[list(p) for p in ALL]!r}:\n"
        "    sys.argv = ['toolrl', *path, '--help']\n    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n        try:\n            main()\n"
        "        except SystemExit:\n            pass\n    pages[' '.join(path)] = out.getvalue()\n"
        "print(json.dumps({'pages': pages, 'heavy': sorted(m for m in ('torch', 'transformers', 'numpy', 'datasets')"
        " if m in sys.modules)}))\n"
    )
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=env)  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    pages = result["pages"]
    assert len(pages) == len(ALL) >= 20 and all(pages.values()), done.stderr[-2000:]
    for path, page in pages.items():
        assert "<" not in page.replace("<answer>", ""), (path, page)  # no <bool>, <str>, <list[str]>
    assert "--set" in pages["train"] and "KEY=VALUE" in pages["train"]
    assert "--num-tasks" in pages["eval"] and " N " in pages["eval"]
    json_line = next(line for line in pages["train"].splitlines() if "--json" in line)
    assert json_line.split("--json")[1].split()[0] == "One"  # a flag: its help follows, no value
    assert result["heavy"] == []  # help for every command imports neither torch nor transformers


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["eval", "--temperature", "hot"], "--temperature: 'hot' is not a number (for example 0.7)"),
        (["eval", "--num-tasks", "-3"], "--num-tasks: '-3' is below 1, its least value"),
        (["eval", "--num-tasks", "ten"], "--num-tasks: 'ten' is not a whole number (for example 10)"),
        (["env", "check", "--max-idle", "2"], "--max-idle: '2' is above 1.0, its greatest value"),
        (["ui", "--port", "99999"], "--port: '99999' is above 65535, its greatest value"),
    ],
)
def test_a_bad_value_is_one_line_in_our_words(args, expected, monkeypatch, capsys):
    from toolrl.cli import main

    monkeypatch.setattr(sys, "argv", ["toolrl", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and line.startswith(f"error: {expected}") and "Input should" not in line, line


def toolrl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)  # fmt: skip


def test_results_for_scripts_json_quiet_and_whole_tables_in_a_pipe():
    """--json prints one JSON object and nothing else; --quiet drops the progress lines; a table written into a
    pipe keeps its names whole (rich cut 'reference' to 'referen…' at 80 columns); the wall time printed is the
    command's own, loading included."""
    checked = toolrl("env", "check", "--num-tasks", "3", "--json")
    result = json.loads(checked.stdout)
    assert checked.returncode == 0 and result["ok"] is True
    assert [p["policy"] for p in result["policies"]] == ["reference", "idle"]
    assert result["policies"][0]["success"] == 1.0 and result["policies"][1]["success"] == 0.0
    table = toolrl("env", "check", "--num-tasks", "3", "--quiet", env={**__import__("os").environ, "COLUMNS": "40"})
    assert "reference" in table.stdout and "format errors" in table.stdout and "…" not in table.stdout

    started = __import__("time").monotonic()
    evaluated = toolrl("eval", "--policy", "reference", "--num-tasks", "3", "--json")
    elapsed = __import__("time").monotonic() - started
    (line,) = evaluated.stdout.strip().splitlines()
    summary = json.loads(line)
    assert summary["success"] == 1.0 and summary["tasks"] == 3
    # the clock's, from the command's start: loading included, it is most of the time the process ran (a fixed
    # margin for the interpreter's start did not hold on a loaded machine, where that start takes longer too)
    assert 0.5 * elapsed < summary["wall_s"] <= elapsed

    listed = json.loads(toolrl("list", "parser", "--json").stdout)
    assert {"hermes", "pythonic", "llama3-json", "search-r1"} <= set(listed["parser"]["entries"])
