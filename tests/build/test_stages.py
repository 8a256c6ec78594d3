"""`toolrl env build`: each stage on small inputs, the whole pipeline, resumability, bad input."""

import json

import pytest

from tests.harness import multihop
from toolrl.build import build, load_spec, run_stage
from toolrl.build.artifacts import BuiltTask, DocRow, FactRow, ToolDoc, Workspace
from toolrl.build.decompose import check_graph, scenario_of
from toolrl.build.integrate import cluster, phrase, value_type
from toolrl.build.world import TaskSampler, relations, sample_tasks, synthetic_world
from toolrl.errors import ConfigError, DataError

SMALL = {"train_per_scenario": 3, "test_per_scenario": 2}


def small_spec(**extra):
    return load_spec(None, {**SMALL, **extra})


def follow(tables, sub):
    """The answer of a sub-problem, looked up in the world by hand."""
    entity, _, column = sub.kind.partition(".")
    return str(tables[entity][sub.arguments[entity]][column])


def test_the_synthetic_world_yields_all_four_scenarios_with_exact_ground_truth():
    spec = load_spec(None, {"seed": 3})
    tables = synthetic_world(3, spec.synthetic)
    assert tables == synthetic_world(3, spec.synthetic) and tables != synthetic_world(4, spec.synthetic)
    tasks = sample_tasks(tables, spec)
    by = {s: [t for t in tasks if t.scenario == s] for s in spec.scenarios}
    assert all(len(v) == spec.train_per_scenario + spec.test_per_scenario for v in by.values())
    for task in tasks:
        assert scenario_of(task.subproblems) == task.scenario  # the label is the graph's
        check_graph(task.subproblems)
        answers = {}
        for sub in task.subproblems:
            assert follow(tables, sub) == sub.answer
            for dep in sub.depends_on:  # a dependent sub-problem's argument is the earlier answer
                assert answers[dep] in sub.arguments.values()
            answers[sub.id] = sub.answer
        sinks = [s.answer for s in task.subproblems if s.id not in {d for x in task.subproblems for d in x.depends_on}]
        assert task.answers == sinks
    for task in by["multi_hop"] + by["parallel_multi_hop"]:
        chained = [s for s in task.subproblems if s.depends_on]
        assert chained, "a multi-hop task needs at least two dependent calls"
    assert {len(t.subproblems) for t in by["multi_hop"]} <= {2, 3}
    assert len({t.question for t in tasks}) == len(tasks)


def test_a_graph_is_labelled_by_its_shape_and_a_forward_dependency_is_refused():
    from toolrl.build.artifacts import SubProblem

    def sub(i, deps=()):
        return SubProblem(id=i, question="q", kind="k", arguments={"x": 1}, answer="a", depends_on=list(deps))

    assert scenario_of([sub("a")]) == "single_hop"
    assert scenario_of([sub("a"), sub("b")]) == "parallel_single_hop"
    assert scenario_of([sub("a"), sub("b", ["a"]), sub("c", ["b"])]) == "multi_hop"
    assert scenario_of([sub("a"), sub("b", ["a"]), sub("c")]) == "parallel_multi_hop"
    # FTRL's definitions on the shapes real decompositions have
    fan_out = [sub("list"), sub("b1", ["list"]), sub("b2", ["list"]), sub("b3", ["list"])]
    assert scenario_of(fan_out) == "parallel_multi_hop"  # one list answer, then one question per element
    assert scenario_of([sub("a"), sub("b"), sub("c", ["a", "b"])]) == "parallel_multi_hop"  # fan-in
    assert scenario_of([sub("a"), sub("b", ["a"]), sub("c"), sub("d", ["c"])]) == "parallel_multi_hop"  # two chains
    assert scenario_of([sub("a"), sub("b", ["a"]), sub("c", ["a"]), sub("d", ["c"])]) == "parallel_multi_hop"
    assert scenario_of([sub("a"), sub("b", ["a"])]) == "multi_hop"  # the shortest chain
    assert scenario_of([sub("a"), sub("b"), sub("c")]) == "parallel_single_hop"
    with pytest.raises(ValueError, match="not an earlier sub-problem"):
        check_graph([sub("a", ["b"]), sub("b")])


def test_each_stage_writes_its_artifact_and_reruns_alone(tmp_path):
    ws, spec = Workspace(tmp_path), small_spec()
    run_stage(spec, ws, "decompose")
    tasks = ws.read_rows("1_scenarios.jsonl", BuiltTask, "decompose")
    assert len(tasks) == 4 * 5 and (tmp_path / "tables.json").is_file()
    run_stage(spec, ws, "documents")
    docs = ws.read_rows("2_documents.jsonl", DocRow, "documents")
    assert len(docs) == sum(len(t.subproblems) for t in tasks)  # one document per sub-problem
    assert all(set(d.doc.parameters["properties"]) == {d.kind.split(".")[0]} for d in docs)
    report = run_stage(spec, ws, "integrate")
    assert report["tools"] <= report["distinct_documents"] <= report["documents"]
    mapping = ws.read_records("3_mapping.jsonl", "integrate")
    assert len(mapping) == len(docs)
    run_stage(spec, ws, "scale")
    report = run_stage(spec, ws, "deploy")
    assert report["tools_validated"] >= 1 and report["tools_dropped"] == 0 and report["tasks"] == 20
    assert (tmp_path / "deploy" / "runtime.py").is_file()
    # --all now has nothing to do; re-running one stage alone rewrites only its artifact
    manifest = json.loads((tmp_path / "build.json").read_text())
    assert build(spec, ws) == manifest
    before = (tmp_path / "3_tools.jsonl").read_text()
    run_stage(spec, ws, "integrate")
    assert (tmp_path / "3_tools.jsonl").read_text() == before


def test_all_resumes_where_a_build_stopped(tmp_path, caplog):
    ws, spec = Workspace(tmp_path), small_spec()
    for name in ("decompose", "documents"):
        run_stage(spec, ws, name)
    with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
        manifest = build(spec, ws)
    skipped = [r.message for r in caplog.records if "up to date" in r.message]
    assert skipped == ["stage decompose: up to date, skipped", "stage documents: up to date, skipped"]
    assert set(manifest) == {"decompose", "documents", "integrate", "scale", "deploy"}
    changed = small_spec(seed=5)  # a changed spec makes every stage stale
    with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
        caplog.clear()
        build(changed, ws)
    assert not [r for r in caplog.records if "up to date" in r.message]


def _doc(name, description="", param="person", returns="string"):
    properties = {param: {"type": "string"}}
    return ToolDoc(name=name, description=description, parameters={"type": "object", "properties": properties},
                   returns=returns)  # fmt: skip


def test_integration_merges_similar_documents_of_one_function_and_never_conflicting_ones():
    docs = [
        _doc("get_person_birthplace", "Returns the birthplace of a person."),
        _doc("find_person_birthplace", "Find a person's birthplace."),
        _doc("get_person_employer", "Returns the employer of a person."),
        _doc("lookup_person_employer", "Returns the employer of a person."),
        _doc("get_person_home", "Returns the home of a person."),
        _doc("get_person_home_town", "Returns the home town of a person."),
    ]
    kinds = [{"person.birthplace"}, {"person.birthplace"}, {"person.employer"}, {"person.employer"},
             {"person.home"}, {"person.home_town"}]  # fmt: skip
    facts = {
        "person.birthplace": [FactRow(arguments={"person": "A"}, answer="Rome")],
        "person.employer": [FactRow(arguments={"person": "A"}, answer="Acme")],
        "person.home": [FactRow(arguments={"person": "A"}, answer="Oslo")],
        "person.home_town": [FactRow(arguments={"person": "A"}, answer="Rome")],
    }
    groups = sorted(sorted(g) for g in cluster(docs, kinds, facts, "name", 0.5))
    assert groups == [[0, 1], [2, 3], [4], [5]]
    # "home" and "home town" are similar enough (0.71 by words) but answer A differently: that alone keeps them apart
    agreeing = {**facts, "person.home": [FactRow(arguments={"person": "A"}, answer="Rome")]}
    assert sorted(sorted(g) for g in cluster(docs, kinds, agreeing, "name", 0.5)) == [[0, 1], [2, 3], [4, 5]]
    embedded = sorted(sorted(g) for g in cluster(docs, kinds, facts, "embedding", 0.8))
    assert embedded == [[0, 1], [2, 3], [4], [5]]


NEAR_DUPLICATES = [  # one function, worded by different writers: merged
    ("get_person_birth_year", "lookup_year_of_birth_of_person", "person_birth_year_lookup"),
    ("get_film_director", "lookup_directed_by_of_film"),
    ("get_person_birth_place", "find_person_birthplace", "get_place_of_birth"),
    ("get_date_of_birth", "get_person_birth_date"),
    ("get_city_population", "city_total_population_lookup", "population"),
]
FALSE_FRIENDS = [  # alike in words, not the same function: never merged
    ("get_person_year_of_birth", "get_person_month_of_birth"),  # a year and a month
    ("get_person_birth_year", "get_person_death_year"),
    ("get_person_place_of_birth", "get_person_place_of_death"),
    ("get_film_director", "get_film_producer"),
    ("get_company_founder", "get_company_founded_year"),  # a person and a year
    ("get_person_mother", "get_person_father"),
]
ANSWERS = {"year": ["1961", "1907"], "month": ["June", "March"], "date": ["1961-06-02", "12 March 1907"],
           "number": ["1,234,000", "56000"], "text": ["Ann Vale", "Oslo"]}  # fmt: skip


def _typed(name):
    words = name.lower()
    if "month" in words:
        return "month"
    if "date" in words:
        return "date"
    return "year" if "year" in words else "number" if "population" in words else "text"


@pytest.mark.parametrize("method", ["embedding", "name"])
def test_integration_merges_near_duplicates_and_keeps_false_friends_apart(method):
    names = [n for group in NEAR_DUPLICATES + FALSE_FRIENDS for n in group]
    param = {n: "film" if "film" in n else "city" if "population" in n else "company" if "company" in n
             else "person" for n in names}  # fmt: skip
    docs = [_doc(n, "Returns it.", param[n]) for n in names]
    kinds = [{f"kind{i}"} for i in range(len(names))]
    facts = {f"kind{i}": [FactRow(arguments={param[n]: f"E{i}-{j}"}, answer=a)
                          for j, a in enumerate(ANSWERS[_typed(n)])] for i, n in enumerate(names)}  # fmt: skip
    together = {frozenset((names[a], names[b])) for g in cluster(docs, kinds, facts, method, 0.8)
                for a in g for b in g if a < b}  # fmt: skip
    for a, b in FALSE_FRIENDS:
        assert frozenset((a, b)) not in together, (a, b)
    if method == "embedding":  # the words alone cannot tell "birth place" from "place of birth"
        for group in NEAR_DUPLICATES:
            assert all(frozenset((a, b)) in together for a in group for b in group if a < b), group


def test_a_functions_output_type_is_read_off_its_answers():
    assert value_type(["1961", "1907", "2001"]) == "year"
    assert value_type(["June", "march", "Sept."]) == "month"
    assert value_type(["1961-06-02", "12 March 1907", "March 12, 1907"]) == "date"
    assert value_type(["1,234,000", "56000", "3.5 km", "12%"]) == "number"
    assert value_type(["yes", "No"]) == "boolean"
    assert value_type(["Oslo", "1961", "Lima", "Pune", "Riga"]) == "text"  # one odd answer in five: still text
    assert value_type(["1961"] * 9 + ["c. 1900"]) == "year"  # nine in ten: a year
    assert value_type([], "number") == "number" and value_type([]) == "text"
    assert phrase(_doc("lookup_year_of_birth_of_person")) == "year of birth"
    assert phrase(_doc("get_info", "Returns the founding year of the company.", "company")) == "founding year"


def test_a_real_sized_multi_hop_set_builds_with_every_merge_right_and_no_task_lost(tmp_path):
    rows = multihop.questions(310)
    manifest = build(decompositions(tmp_path, rows), Workspace(tmp_path / "out"))
    tools = [json.loads(line) for line in (tmp_path / "out" / "3_tools.jsonl").read_text().splitlines()]
    quality = multihop.merge_quality(tools)
    assert quality["false_merges"] == 0 and quality["kinds_in_several_tools"] == 0, quality
    assert quality["merge_recall"] >= 0.9, quality
    assert manifest["decompose"]["by_scenario"]["parallel_multi_hop"] > 0
    assert manifest["scale"]["tasks_dropped"] == 0 and manifest["deploy"]["tasks_dropped"] == 0
    assert manifest["deploy"]["tasks"] == 310 and manifest["deploy"]["tools_dropped"] == 0


def test_scaling_knobs_transform_tools_and_expected_calls_and_deployment_validates_them(tmp_path):
    spec = small_spec(scale={"functional": 1.0, "parameters": 2, "types": 1.0, "distractors": 3, "multi_turn": 1.0})
    manifest = build(spec, Workspace(tmp_path))
    scale = manifest["scale"]
    assert scale["functional_tools"] >= 1 and scale["optional_parameters"] >= 2 * scale["tools"] - 2
    assert sum(scale["type_changes"].values()) >= 1 and scale["multi_turn_tasks"] >= 1
    assert manifest["deploy"]["tools_dropped"] == 0
    tools = [json.loads(line) for line in (tmp_path / "4_tools.jsonl").read_text().splitlines()]
    functional = [t for t in tools if t["impl"]["field"]]
    assert functional and all(len(t["impl"]["fields"]) >= 2 for t in functional)  # one tool, several kinds
    tasks = Workspace(tmp_path).read_rows("deploy/tasks.jsonl", BuiltTask, "deploy")
    for task in tasks:
        needed = {c["name"] for c in task.calls}
        assert needed <= set(task.tools) and len(task.tools) >= min(len(needed) + 3, len(tools))
        if len(task.subproblems) > 1:
            assert len(task.requests) == len(task.subproblems) and task.question == task.requests[0]


def test_every_type_change_deploys_and_answers_right(tmp_path):
    from toolrl.build.artifacts import Impl, ScaledTool
    from toolrl.build.deploy import template_source, validate
    from toolrl.build.scale import expected_call
    from toolrl.envs.code.sandbox import SandboxLimits

    facts = {"city.population": [FactRow(arguments={"city": n}, answer=str(i * 1000)) for i, n in enumerate("ABC", 1)]}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    limits = SandboxLimits(timeout_s=20)
    for shape, unit in (
        ("string", {}),
        ("nested", {}),
        ("list", {}),
        ("enum", {}),
        ("string", {"units": 1.0, "thousands": 1000.0}),
    ):
        params = {**schema, "properties": {**schema["properties"], "unit": {"type": "string"}}} if unit else schema
        tool = ScaledTool(
            doc=ToolDoc(name="pop", description="d", parameters=params),
            impl=Impl(kinds=["city.population"], key="city", key_shape=shape, unit=unit),
        )
        cases = [(expected_call(tool, {"city": "B"}, None), "2000")]
        assert validate(tool, template_source(tool, facts), cases, limits) == (None, {}), shape
    thousands = [({"name": "pop", "arguments": {"city": "C", "unit": "thousands"}}, "3")]
    assert validate(tool, template_source(tool, facts), thousands, limits) == (None, {})
    wrong = ScaledTool(
        doc=ToolDoc(name="pop", description="d", parameters=schema), impl=Impl(kinds=["city.population"], key="city")
    )
    cases = [({"name": "pop", "arguments": {"city": "B"}}, "7"), ({"name": "pop", "arguments": {"city": "A"}}, "1000")]
    # one case wrong of two: the tool stands, the case is named; every case wrong: the tool fails as a whole
    assert validate(wrong, template_source(wrong, facts), cases, limits) == (
        None, {0: ("{'city': 'B'} gave '2000'; expected '7'", "2000")})  # fmt: skip
    reason, _ = validate(wrong, template_source(wrong, facts), cases[:1], limits)
    assert reason == "no call answered right, such as: {'city': 'B'} gave '2000'; expected '7'"


def test_one_bad_fact_costs_its_tasks_not_a_functional_tool_of_many_fields(tmp_path):
    """A wide table (120 columns: one functional tool of 120 fields, `scale.max_fields` raised for it) where two pairs
    of rows differ only in case and so collide in the tool's table (each task keeps its own fact), and where floats,
    huge and tiny numbers must come back as written; and a table with a row the tool's probe names, so that its tool
    accepts the probe and is dropped with every task that needs it: built from the command line, which names every
    task lost."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    rows = [{"name": f"Item {i}", **{f"measure {c}": (i + 1) * 10 ** (c % 19) + c / 7 for c in range(120)}}
            for i in range(20)]  # fmt: skip
    for i in (0, 1):  # the same name to the tool, every value another
        rows.append({"name": f"ITEM {i}"} | {k: -v for k, v in rows[i].items() if k != "name"})
    (tmp_path / "item.json").write_text(json.dumps(rows))
    names = ["Nobody Ofthisworld", *(f"Gadget {c}" for c in "ABCDEFGH")]
    gadgets = [{"name": n, **{f"part {c}": f"p{i}-{c}" for c in range(60)}} for i, n in enumerate(names)]
    (tmp_path / "gadget.json").write_text(json.dumps(gadgets))
    (tmp_path / "spec.json").write_text(json.dumps({
        "source": "table", "tables": [{"path": "item.json"}, {"path": "gadget.json"}], "seed": 1,
        "train_per_scenario": 120, "scenarios": ["single_hop", "parallel_single_hop"],
        "scale": {"functional": 1.0, "types": 0.0, "max_fields": 200}}))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "toolrl", "env", "build", "spec.json", "--all", "--out", "out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "build.json").read_text())
    tools = [json.loads(line) for line in (tmp_path / "out" / "4_tools.jsonl").read_text().splitlines()]
    wide = [t for t in tools if t["doc"]["name"].startswith("item")]
    assert len(wide) == 1 and len(wide[0]["impl"]["fields"]) > 100
    deploy = manifest["deploy"]
    assert deploy["tools_validated"] == len(tools) - 1 and deploy["tools_dropped"] == 1
    assert deploy["tasks_with_own_facts"] > 0  # the colliding rows: each task answers with its own
    tasks = [json.loads(line) for line in (tmp_path / "out" / "deploy" / "tasks.jsonl").read_text().splitlines()]
    own = [(o["answer"], {s["answer"] for s in t["subproblems"]}) for t in tasks for o in t["overrides"]]
    assert own and all(answer in answers for answer, answers in own)
    lost = [d for d in json.loads((tmp_path / "out" / "deploy" / "deploy.json").read_text())["dropped"] if "task" in d]
    assert 20 < len(lost) == deploy["tasks_dropped"] < manifest["scale"]["tasks"] // 2
    assert all("needs tool gadget" in d["reason"] and "should be an error" in d["reason"] for d in lost), lost
    printed = [line for line in done.stdout.splitlines() if line.startswith("deploy: dropped task ")]
    assert len(printed) == 19 and "Nobody Ofthisworld" in printed[0]  # the first 20 entries: the tool, 19 tasks
    assert f"deploy: {len(lost) - 19} more dropped, each with its reason, in out/deploy/deploy.json" in done.stdout


def test_bad_input_is_one_line_naming_the_file_row_and_field(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'scale\.speed'"):
        load_spec(None, {"scale": {"speed": 2}})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("source: table\n")
    with pytest.raises(ConfigError, match=r"spec\.yaml: .*source table needs tables"):
        load_spec(spec_file)
    ws = Workspace(tmp_path / "out")
    run_stage(small_spec(), ws, "decompose")
    path = tmp_path / "out" / "1_scenarios.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    del row["subproblems"][0]["answer"]
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"1_scenarios\.jsonl: row 2, field subproblems\.0\.answer: Field required"):
        run_stage(small_spec(), ws, "documents")
    with pytest.raises(
        DataError,
        match=r"1_scenarios\.jsonl: not found; run the stage before it first \(toolrl env build --stage decompose\)",
    ):
        run_stage(small_spec(), Workspace(tmp_path / "empty"), "scale")


def test_user_tables_become_a_multi_hop_environment(tmp_path):
    (tmp_path / "country.csv").write_text("name,capital,currency\nAlbar,Ost,crown\nBelm,Wey,mark\nCoria,Pell,florin\n")
    (tmp_path / "city.json").write_text(
        json.dumps(
            [
                {"name": n, "country": c, "river": r}
                for n, c, r in [("Ost", "Albar", "Ume"), ("Wey", "Belm", "Lis"), ("Pell", "Coria", "Dra")]
            ]
        )
    )
    spec = load_spec(
        None,
        {
            "source": "table",
            "tables": [{"path": str(tmp_path / "country.csv")}, {"path": str(tmp_path / "city.json"), "key": "name"}],
            **SMALL,
            "test_per_scenario": 1,
            "train_per_scenario": 1,
        },
    )
    links = {(r.entity, r.column): r.target for r in relations(synthetic_world(0, spec.synthetic))}
    assert links[("person", "birthplace")] == "city" and links[("city", "population")] is None
    manifest = build(spec, Workspace(tmp_path / "out"))
    assert manifest["decompose"]["by_scenario"]["multi_hop"] == 2 and manifest["deploy"]["tools_dropped"] == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("name,capital\n,Ost\n")
    with pytest.raises(DataError, match=r"bad\.csv: row 1, field name: empty"):
        build(load_spec(None, {"source": "table", "tables": [{"path": str(bad)}]}), Workspace(tmp_path / "o2"))


def test_a_sampler_without_links_says_it_cannot_make_multi_hop_tasks(tmp_path):
    import random

    tables = {"planet": {"Ro": {"moons": 2}, "Ka": {"moons": 0}}}
    assert TaskSampler(tables, random.Random(0)).chain("s", 2) is None
    with pytest.raises(DataError, match=r"only 0 distinct multi_hop tasks .* add rows or links"):
        sample_tasks(tables, load_spec(None, {"scenarios": ["multi_hop"], "test_per_scenario": 1}))


def decompositions(tmp_path, rows):
    path = tmp_path / "decompositions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_spec(None, {"source": "decompositions", "tasks": {"path": str(path)}})


def test_ready_made_decompositions_are_a_source_without_a_model(tmp_path):
    people = {"Ann Vale": "Oslo", "Bo Rink": "Lima", "Cy Dorn": "Pune", "Di Mott": "Baku", "Ed Sarn": "Riga"}
    rows = [
        {"id": f"p{i}", "question": f"Where was {p} born?", "answer": city, "subproblems": [
            {"id": "a", "question": f"Where was {p} born?", "kind": "person.birthplace", "arguments": {"person": p},
             "answer": city}]}
        for i, (p, city) in enumerate(people.items())
    ]  # fmt: skip
    team = [{"id": "team", "question": "Who is in team Blue?", "kind": "team.members", "arguments": {"team": "Blue"},
             "answer": ", ".join(people)}]  # fmt: skip
    team += [
        {
            "id": f"b{k}",
            "question": f"Where was {p} born?",
            "kind": "person.birthplace",
            "arguments": {"person": p},
            "answer": city,
            "depends_on": ["team"],
        }
        for k, (p, city) in enumerate([*people.items(), *people.items()])
    ]  # fmt: skip  (11 sub-problems: past the 8 an LLM's reply may hold)
    rows.append({"id": "fan", "question": "Where was each member of team Blue born?", "subproblems": team})
    ws = Workspace(tmp_path / "out")
    manifest = build(decompositions(tmp_path, rows), ws)
    assert manifest["decompose"]["given"] == 6 and "llm" not in manifest["decompose"]
    assert manifest["decompose"]["by_scenario"] == {"single_hop": 5, "parallel_multi_hop": 1}
    assert manifest["deploy"]["tasks"] == 6 and manifest["deploy"]["tasks_dropped"] == 0
    built = {t.id: t for t in ws.read_rows("1_scenarios.jsonl", BuiltTask, "decompose")}
    assert len(built["fan"].subproblems) == 11 and built["p0"].answers == ["Oslo"]

    bad = [{**rows[0], "subproblems": [{**rows[0]["subproblems"][0], "arguments": {}}]}]
    with pytest.raises(DataError, match=r"decompositions\.jsonl: row 1, field subproblems/0/arguments: .*"):
        build(decompositions(tmp_path, bad), Workspace(tmp_path / "bad"))
    forward = [{**rows[0], "subproblems": [{**rows[0]["subproblems"][0], "depends_on": ["later"]}]}]
    with pytest.raises(DataError, match=r"row 1, field subproblems: sub-problem 'a' depends on 'later'"):
        build(decompositions(tmp_path, forward), Workspace(tmp_path / "forward"))
    with pytest.raises(ConfigError, match=r"source decompositions needs tasks\.path"):
        load_spec(None, {"source": "decompositions"})


def test_an_artifact_written_by_hand_is_never_overwritten(tmp_path, caplog):
    ws, spec = Workspace(tmp_path), small_spec()
    build(spec, ws)
    scenarios = ws.path("1_scenarios.jsonl")
    mine = "".join(scenarios.read_text().splitlines(keepends=True)[:6])  # the user keeps six tasks
    scenarios.write_text(mine)
    with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
        manifest = build(spec, ws)  # --all
    assert scenarios.read_text() == mine and manifest["decompose"]["kept"] == "by hand"
    assert manifest["scale"]["tasks"] == 6  # the later stages were built on it
    assert any("written by hand: kept" in r.message for r in caplog.records)
    assert build(spec, ws)["decompose"]["kept"] == "by hand"  # and stays the user's on the next --all
    run_stage(spec, ws, "decompose")  # asked for by name: the stage writes its own, the user's is set aside
    assert ws.path("1_scenarios.by-hand.jsonl").read_text() == mine and scenarios.read_text() != mine


def test_a_number_in_another_unit_is_written_in_full():
    from toolrl.build.runtime import _in_unit

    spec = {"unit": {"units": 1.0, "thousands": 1000.0}}
    assert _in_unit(spec, "2725000", "units") == "2725000"  # the table's own text, whatever its size
    assert _in_unit(spec, "2725000", "thousands") == "2725" and _in_unit(spec, "2725500", "thousands") == "2725.5"
    assert _in_unit(spec, "12345678901", "thousands") == "12345678.901"
    assert _in_unit(spec, str(10**20 + 7000), "thousands") == "100000000000000007"  # past a float's 2**53, exact


@pytest.mark.parametrize("seed", range(10))
def test_the_synthetic_world_of_every_seed_loses_no_task_and_makes_one_tool_per_function(tmp_path, seed):
    manifest = build(load_spec(None, {"seed": seed}), Workspace(tmp_path))  # seed 3 lost 85 tasks to 2.725e+06
    assert manifest["scale"]["tasks_dropped"] == 0 and manifest["deploy"]["tasks_dropped"] == 0
    assert manifest["deploy"]["tools_dropped"] == 0 and manifest["deploy"]["tasks"] == manifest["decompose"]["tasks"]
    integrate = manifest["integrate"]
    assert integrate["kinds_in_several_tools"] == 0 and integrate["tools"] == integrate["kinds"]  # no twin tools


def test_an_interrupted_deploy_and_an_edited_source_file_are_built_again(tmp_path, monkeypatch, caplog):
    import toolrl.build.deploy as deploy

    spec = small_spec()
    whole = Workspace(tmp_path / "whole")
    build(spec, whole)
    ws = Workspace(tmp_path / "cut")
    build(spec, ws)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process stopped after the old tools were removed

    monkeypatch.setattr(deploy, "validate", killed)
    with pytest.raises(KeyboardInterrupt):
        run_stage(spec, ws, "deploy")
    assert not ws.path(deploy.MANIFEST).exists() and not list(ws.path("deploy/tools").glob("*.py"))
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
        build(spec, ws)  # --all: the deploy is not "up to date"
    assert "stage deploy: up to date, skipped" not in [r.message for r in caplog.records]
    for path in sorted(whole.path("deploy").rglob("*")):  # byte for byte what an uninterrupted build made
        if path.is_file() and path.name != "deploy.json":
            assert (ws.path("deploy") / path.relative_to(whole.path("deploy"))).read_bytes() == path.read_bytes()

    rows = [{"id": "p", "question": "Where was Ann born?", "subproblems": [
        {"id": "a", "question": "Where was Ann born?", "kind": "person.birthplace", "arguments": {"person": "Ann"},
         "answer": "Oslo"}]}]  # fmt: skip
    given = decompositions(tmp_path, rows)
    mine = Workspace(tmp_path / "given")
    build(given, mine)
    rows[0]["subproblems"][0]["answer"] = "Lima"  # the user corrects a fact in the file the spec names
    decompositions(tmp_path, rows)
    with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
        caplog.clear()
        build(given, mine)
    skipped = [r.args[0] for r in caplog.records if "up to date" in r.msg]
    assert "decompose" not in skipped and "deploy" not in skipped  # the stages the fact reaches ran again
    assert "Lima" in mine.path("1_scenarios.jsonl").read_text()
    assert any("Lima" in f.read_text() for f in mine.path("deploy").rglob("*") if f.is_file())
    assert not any("Oslo" in f.read_text() for f in mine.path("deploy").rglob("*") if f.is_file())


def _artifacts(ws):
    """Every file a build leaves, but its log of when and how long (build.json)."""
    return {str(p.relative_to(ws.root)): p.read_bytes() for p in sorted(ws.root.rglob("*"))
            if p.is_file() and p.name != "build.json"}  # fmt: skip


@pytest.mark.parametrize("stage", ["decompose", "documents", "integrate", "scale", "deploy"])
@pytest.mark.parametrize("when", ["before its artifact", "after its artifact"])
def test_a_build_killed_in_any_stage_resumes_to_the_uninterrupted_builds_bytes(tmp_path, monkeypatch, stage, when):
    from toolrl.build.pipeline import STAGES

    spec = small_spec(scale={"types": 1.0, "multi_turn": 0.5})
    whole = Workspace(tmp_path / "whole")
    build(spec, whole)
    ws = Workspace(tmp_path / "cut")
    target = STAGES.lookup(stage).writes
    write_rows, write_json, record = Workspace.write_rows, Workspace.write_json, Workspace.record

    def kill_on(method):
        def patched(self, name, value, *rest):
            if when == "before its artifact" and name == target:
                raise KeyboardInterrupt  # killed as the stage was about to write its main artifact
            return method(self, name, value, *rest)

        return patched

    def kill_on_record(self, name, report):
        if when == "after its artifact" and name == stage and "output" in report:
            raise KeyboardInterrupt  # killed with every file written, before the stage's report
        return record(self, name, report)

    monkeypatch.setattr(Workspace, "write_rows", kill_on(write_rows))
    monkeypatch.setattr(Workspace, "write_json", kill_on(write_json))
    monkeypatch.setattr(Workspace, "record", kill_on_record)
    with pytest.raises(KeyboardInterrupt):
        build(spec, ws)
    monkeypatch.undo()
    manifest = build(spec, ws)  # --all again, as after a kill
    assert all("kept" not in manifest[name] and "running" not in manifest[name] for name in manifest)
    assert _artifacts(ws) == _artifacts(whole)


def test_a_spec_change_runs_again_only_the_stages_it_reaches(tmp_path, caplog):
    ws = Workspace(tmp_path)
    build(small_spec(), ws)

    def ran(**change):
        caplog.clear()
        with caplog.at_level("INFO", logger="toolrl.build.pipeline"):
            build(small_spec(**change), ws)
        return [r.args[0] for r in caplog.records if r.msg == "stage %s: started"]

    assert ran() == []
    assert ran(deploy={"isolation": "unshare"}) == ["deploy"]
    assert ran(deploy={"isolation": "unshare"}, scale={"distractors": 1}) == ["scale", "deploy"]
    # a threshold that merges nothing more: integration runs, and the stages after it see the same tools
    assert ran(deploy={"isolation": "unshare"}, scale={"distractors": 1}, integrate={"threshold": 0.81}) == [
        "integrate"]  # fmt: skip
    assert ran(seed=1) == ["decompose", "documents", "integrate", "scale", "deploy"]


def test_optional_parameters_change_nothing_for_a_tool_named_by_all_its_arguments_or_by_none():
    from toolrl.build.runtime import _row_key, call

    def spec(rows, properties):
        return {"parameters": {"properties": properties, "required": []}, "kinds": ["k"], "key": None,
                "key_shape": None, "field": None, "fields": None, "unit": None, "optional": ["verbose"],
                "tables": {"k": {_row_key(arguments): answer for arguments, answer in rows}}}  # fmt: skip

    two = spec([({"a": "x", "b": "y"}, "found")], {"a": {}, "b": {}, "verbose": {"type": "boolean"}})
    assert call(two, {"a": "x", "b": "y"}) == call(two, {"a": "x", "b": "y", "verbose": True}) == "found"
    none = spec([({}, "today")], {"verbose": {"type": "boolean"}})  # a zero-argument tool
    assert call(none, {}) == call(none, {"verbose": False}) == "today"
