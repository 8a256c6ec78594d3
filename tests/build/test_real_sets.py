"""The builder on a real multi-hop set (FanOutQA's dev set, which the `fanoutqa` package ships: 310 questions,
2,142 sub-problems): read in the set's own format, every task kept, facts that differ only in form one fact and
true conflicts listed with both values and kept per task, functional tools by the kind of subject and never past
`scale.max_fields`, limits read off the references, the prompt counted with the tools a task offers, env check
100% / 0%; integration measured on labeled relation pairs; success that needs evidence; hand edits kept."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from toolrl.build import build, load_spec, run_stage
from toolrl.build.artifacts import FactRow, Impl, ScaledTool, ToolDoc, Workspace
from toolrl.build.formats import fanoutqa_dev
from toolrl.build.pairs import load_pairs, pair_scores
from toolrl.build.scale import functional
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.envs.base import Task
from toolrl.envs.built.scoring import correct
from toolrl.errors import ConfigError, DataError
from toolrl.rollout import RolloutLimits
from toolrl.tools.call import ToolCall, ToolResult

ROOT = Path(__file__).parents[2]
PAIRS = ROOT / "bench" / "data" / "relation_pairs.jsonl"


def fanout_spec(path, **extra):
    return load_spec(None, {"source": "decompositions", "tasks": {"path": str(path), "format": "fanoutqa"}, **extra})


@pytest.fixture(scope="module")
def fanout_dir(tmp_path_factory):
    assert fanoutqa_dev() is not None, "the fanoutqa package ships the data set: make install-test installs it"
    folder = tmp_path_factory.mktemp("fanout")
    build(load_spec(ROOT / "recipes" / "build" / "fanoutqa.yaml"), Workspace(folder))  # tasks.path: fanoutqa-dev
    return folder


def built_env(path, *overrides):
    config = load_config(overrides=["env.name=built", f"env.options.path={path}", *overrides])
    return make_env(config.env), config


def test_questions_in_fanoutqas_format_read_as_decompositions(tmp_path):
    path = tmp_path / "dev.json"
    page = {"pageid": 1, "revid": 1, "title": "Crash (2004 film)", "url": "u"}
    path.write_text(json.dumps([
        {"id": "q1", "question": "Who directed the top two films?",
         "answer": {"Crash": "Paul Haggis", "Up": "Pete Docter"},
         "decomposition": [
             {"id": "s1", "question": "What are the top two films?", "answer": ["Crash", "Up"], "depends_on": [],
              "decomposition": [
                  {"id": "s1a", "question": "What is the top film?", "answer": "Crash", "depends_on": [],
                   "decomposition": [], "evidence": page},
                  {"id": "s1b", "question": "What is the second film?", "answer": "Up", "depends_on": [],
                   "decomposition": [], "evidence": page}]},
             {"id": "s2", "question": "Who directed Crash?", "answer": "Paul Haggis", "depends_on": ["s1"],
              "decomposition": [], "evidence": page},
             {"id": "s3", "question": "Who directed Up?", "answer": "Pete Docter", "depends_on": ["s1"],
              "decomposition": [], "evidence": {**page, "title": "Up (2009 film)"}}]},
        {"id": "q2", "question": "Is Crash in colour?", "answer": True,
         "decomposition": [{"id": "t1", "question": "Is Crash in colour?", "answer": True, "depends_on": [],
                            "decomposition": [], "evidence": page}]},
    ]))  # fmt: skip
    build(fanout_spec(path), Workspace(tmp_path / "out"))
    tasks = {t["id"]: t for t in map(json.loads, (tmp_path / "out" / "1_scenarios.jsonl").read_text().splitlines())}
    subs = {s["id"]: s for s in tasks["q1"]["subproblems"]}
    assert list(subs) == ["s1a", "s1b", "s2", "s3"]  # a sub-question with its own decomposition: its leaves
    assert subs["s2"]["depends_on"] == ["s1a", "s1b"] and subs["s2"]["arguments"] == {"entity": "Crash"}
    assert subs["s2"]["kind"] == subs["s3"]["kind"] == "who_directed"  # the entity came off the earlier answer
    assert tasks["q1"]["answers"] == ["Paul Haggis", "Pete Docter"] and tasks["q2"]["answers"] == ["yes"]
    with pytest.raises(DataError, match=r"dev\.json: a FanOutQA file is a JSON list"):
        path.write_text("{}")
        build(fanout_spec(path), Workspace(tmp_path / "again"))
    with pytest.raises(ConfigError, match=r"tasks\.format: unknown format 'hotpot'"):
        load_spec(None, {"source": "decompositions", "tasks": {"path": str(path), "format": "hotpot"}})


def test_the_real_set_keeps_every_task_and_checks(fanout_dir, chat):
    manifest = json.loads((fanout_dir / "build.json").read_text())
    assert manifest["decompose"]["tasks"] == 310 and manifest["deploy"]["tasks"] == 310
    assert manifest["deploy"]["tools_dropped"] == 0 and manifest["deploy"]["tools_validated"] >= 250
    conflicts = manifest["decompose"]["conflicts"]  # only true conflicts, each with both values and sources
    assert 0 < len(conflicts) < 10 and all(len(c["values"]) == 2 for c in conflicts)
    assert not any(v["answer"] == "8,848.86 m" for c in conflicts for v in c["values"])  # one fact, two forms
    tasks = [json.loads(line) for line in (fanout_dir / "deploy" / "tasks.jsonl").read_text().splitlines()]
    assert any(t["overrides"] for t in tasks)  # a task keeps its own fact where the data disagree
    tools = [json.loads(line) for line in (fanout_dir / "4_tools.jsonl").read_text().splitlines()]
    fields = [len(t["impl"]["fields"]) for t in tools if t["impl"]["field"]]
    assert fields and max(fields) <= 12
    env, config = built_env(fanout_dir)
    needs = manifest["deploy"]["needs"]
    assert needs["max_calls_per_turn"] >= 40 and config.rollout.max_calls_per_turn == needs["max_calls_per_turn"]
    assert config.rollout.max_new_tokens == needs["max_new_tokens"]  # limits from the data, no --set needed
    from toolrl.rollout import Rollout
    from toolrl.tools import ToolExecutor

    rollout = Rollout(env, None, chat, env.syntax, ToolExecutor(env.tools()), RolloutLimits(4, 64, 64, 64))
    everything = sum(len(json.dumps(t.to_openai())) for t in env.tools())
    assert everything > 4 * 8192  # all 250+ schemas would not fit the default model's context ...
    rollout.refuse_long_prompts(env.tasks("test") + env.tasks("train"), 8192)  # ... the tools each task offers do
    limits = RolloutLimits(needs["max_turns"], needs["max_new_tokens"], needs["max_response_tokens"], 64)
    small = min(env.tasks("test"), key=lambda t: len(t.meta["subproblems"]))
    own = env.limits_for(small, limits)  # a task's budget follows its reference: a few hundred tokens, not 3,000
    assert own.max_response_tokens < limits.max_response_tokens / 3 and own.max_turns <= limits.max_turns


def test_env_check_on_the_real_set(fanout_dir):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "toolrl", "env", "check", "--set", "env.name=built",
         "--set", f"env.options.path={fanout_dir}", "--min-reference", "1.0", "--max-idle", "0.0"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]  # reference 100%, idle 0%: exit 0
    rows = [line for line in out.stdout.splitlines() if line.startswith(("│ reference", "│ idle"))]
    assert len(rows) == 2 and "100.0%" in rows[0] and "0.0%" in rows[1]


def test_integration_on_labeled_real_relation_pairs():
    rows = load_pairs(PAIRS)
    assert len(rows) >= 100 and 40 <= sum(r["same"] for r in rows) <= 60
    name = pair_scores(rows, "name", 0.8)
    assert name["precision"] >= 0.95 and name["recall"] >= 0.8, name["wrong"]
    # a judge (the LLM path) decides the pairs the words leave open; a judge saying "same" to everything shows
    # that facts and question words still keep pairs apart, and one saying "no" that the wording rules still merge
    assert pair_scores(rows, "llm", 0.8, judge=lambda a, b: False)["precision"] == 1.0
    yes = pair_scores(rows, "llm", 0.8, judge=lambda a, b: True)
    assert yes["recall"] > name["recall"] and yes["precision"] < 0.95


def tool(name, key, kinds):
    schema = {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}
    return ScaledTool(doc=ToolDoc(name=name, description="d", parameters=schema), impl=Impl(kinds=kinds, key=key))


def test_functional_tools_are_over_one_kind_of_subject_and_never_too_wide():
    import random

    # 40 relations keyed by one parameter name (`topic`) over four kinds of subject that share no entity: never one
    # tool of 40 fields (the 288), but tools over the subjects they share, each at most max_fields wide
    tools, facts = {}, {}
    for i in range(40):
        group = i % 4
        tools[f"t{i}"] = tool(f"t{i}", "topic", [f"rel{i}"])
        facts[f"rel{i}"] = [FactRow(arguments={"topic": f"e{group}-{j}"}, answer=str(j)) for j in range(5)]
    merged, _ = functional(dict(tools), 1.0, random.Random(0), facts, max_fields=6)
    wide = [t for t in merged.values() if t.impl.field]
    assert wide and all(len(t.impl.fields) <= 6 for t in wide)
    for t in wide:  # each serves relations of one kind of subject only
        assert len({int(k[3:]) % 4 for k in t.impl.kinds}) == 1
    typed = {"p1": tool("p1", "name", ["person.birthplace"]), "p2": tool("p2", "name", ["person.mother"]),
             "c1": tool("c1", "name", ["city.country"])}  # fmt: skip
    merged, _ = functional(typed, 1.0, random.Random(0), {}, max_fields=12)
    assert sorted(t.impl.kinds for t in merged.values()) == [["city.country"], ["person.birthplace", "person.mother"]]


def trajectory(calls, reply):
    results = [ToolResult(ToolCall(name, args), "x") for name, args in calls]
    return SimpleNamespace(results=results, final_text=reply, episode=None)


def test_success_needs_the_calls_that_find_the_answer():
    subs = [{"name": "pop", "arguments": {"city": c}} for c in ("Ost", "Wey")]
    task = Task("t", "q", "1; 2", {"answers": ["1,000", "2"], "subproblems": subs})
    both = [("pop", {"city": "Ost"}), ("pop", {"city": "Wey"})]
    assert correct(trajectory(both, "<answer>1000 and 2</answer>"), task) == 1.0
    assert correct(trajectory([], "<answer>1000 and 2</answer>"), task) == 0.0  # the answer alone: no evidence
    assert correct(trajectory(both[:1], "<answer>1000 and 2</answer>"), task) == 0.0  # half the calls
    failed = [ToolResult(ToolCall("pop", {"city": "Wey"}), "error", "tool_error")]
    half = trajectory(both[:1], "<answer>1000; 2</answer>")
    half.results += failed
    assert correct(half, task) == 0.0  # a failed call is no evidence


def test_a_hand_edited_facts_file_is_kept_or_set_aside(tmp_path):
    ws, spec = Workspace(tmp_path), load_spec(None, {"train_per_scenario": 2, "test_per_scenario": 1})
    build(spec, ws)
    facts = ws.path("facts.json")
    mine = json.loads(facts.read_text())
    kind = next(iter(mine))
    mine[kind][0]["answer"] = "edited by hand"
    facts.write_text(json.dumps(mine))
    manifest = build(spec, ws)  # --all: the edit is the user's, the later stages are built on it
    assert manifest["decompose"]["kept"] == "by hand" and manifest["decompose"]["edited"] == ["facts.json"]
    assert json.loads(facts.read_text())[kind][0]["answer"] == "edited by hand"
    assert "edited by hand" in "".join(p.read_text() for p in (tmp_path / "deploy" / "tools").glob("*.py"))
    run_stage(spec, ws, "decompose")  # by name: the stage writes its own, the user's is set aside, not lost
    assert json.loads(ws.path("facts.by-hand.json").read_text())[kind][0]["answer"] == "edited by hand"
    assert "edited by hand" not in facts.read_text()
    assert not ws.path("1_scenarios.by-hand.jsonl").exists()  # only what was edited is set aside
    build(spec, ws)
    tool = sorted((tmp_path / "deploy" / "tools").glob("*.py"))[0]
    tool.write_text(tool.read_text() + "\n# checked by hand\n")  # a deployed tool edited by hand
    assert build(spec, ws)["deploy"]["edited"] == [tool.relative_to(tmp_path).as_posix()]
    assert tool.read_text().endswith("# checked by hand\n")  # --all keeps it
    run_stage(spec, ws, "deploy")
    assert tool.with_name(f"{tool.stem}.by-hand.py").read_text().endswith("# checked by hand\n")
    assert not tool.read_text().endswith("# checked by hand\n")


def test_the_llm_judge_decides_the_pairs_the_words_leave_open(tmp_path):
    """integrate.method llm: each open pair asked once, the reply validated, the verdicts cached for a re-run."""
    rows = [
        {"id": f"q{i}", "question": f"Who made {film}?", "subproblems": [
            {"id": "a", "question": f"Who made {film}?", "kind": kind, "arguments": {"film": film}, "answer": who}]}
        for i, (film, kind, who) in enumerate([("Up", "who_directed", "Pete Docter"),
                                               ("Cars", "film_helmer", "John Lasseter"),
                                               ("Coco", "who_scored_music", "Michael Giacchino")])
    ]  # fmt: skip
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked = []

    def model(prompt: str) -> str:
        asked.append(prompt)
        same = "helmer" in prompt and "directed" in prompt  # a judge that knows a helmer directs
        return "Sure. " + json.dumps({"same": same, "why": "director" if same else "different roles"})

    spec = load_spec(None, {"source": "decompositions", "tasks": {"path": str(path)},
                            "integrate": {"method": "llm", "judge_floor": 0.0},
                            "llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}})  # fmt: skip
    ws = Workspace(tmp_path / "out")
    run_stage(spec, ws, "decompose")
    run_stage(spec, ws, "documents")
    report = run_stage(spec, ws, "integrate", ask=model)
    assert report["tools"] == 2 and report["llm"]["asked"] == len(asked) == 3
    mapping = {r["task"]: r["tool"] for r in map(json.loads, ws.path("3_mapping.jsonl").read_text().splitlines())}
    assert mapping["q0"] == mapping["q1"] != mapping["q2"]
    assert (ws.root / "llm" / "integrate.jsonl").is_file()
    again = run_stage(spec, ws, "integrate", ask=model)
    assert again["llm"]["cached"] == 3 and len(asked) == 3  # the verdicts are reused, nothing asked again
    with pytest.raises(ConfigError, match=r"integrate\.method llm needs llm"):
        load_spec(None, {"integrate": {"method": "llm"}})


def test_a_format_of_your_own_reads_your_data_set_from_the_command_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "my_format.py").write_text(
        "import csv\n"
        "from toolrl.build.formats import FORMATS\n\n\n"
        "@FORMATS.register('capitals-csv')\n"
        "def read(path):\n"
        "    with open(path, newline='') as f:\n"
        "        for number, row in enumerate(csv.DictReader(f), 1):\n"
        "            question = f\"What is the capital of {row['country']}?\"\n"
        "            yield number, {'question': question, 'subproblems': [{'id': 'a', 'question': question,\n"
        "                'kind': 'country.capital', 'arguments': {'country': row['country']},\n"
        "                'answer': row['capital']}]}\n"
    )
    countries = [("Albar", "Ost"), ("Belm", "Wey"), ("Cora", "Pell"), ("Dun", "Rask"), ("Eld", "Tarn")] * 4
    rows = [(f"{c}{i}", f"{t}{i}") for i, (c, t) in enumerate(countries)]
    (tmp_path / "capitals.csv").write_text("country,capital\n" + "".join(f"{c},{t}\n" for c, t in rows))
    (tmp_path / "spec.yaml").write_text(
        "plugins: [my_format]\nsource: decompositions\ntasks: {path: capitals.csv, format: capitals-csv}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "build", "spec.yaml", "--all", "--out", "out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "build.json").read_text())
    assert manifest["deploy"]["tasks"] == 20 and manifest["deploy"]["tools_validated"] == 1
    (tmp_path / "spec.yaml").write_text("source: decompositions\ntasks: {path: capitals.csv, format: capitals-csv}\n")
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "build", "spec.yaml", "--all", "--out", "again"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0 and "tasks.format: unknown format 'capitals-csv'" in done.stderr + done.stdout
