"""`toolrl env build`: each stage on small inputs, the whole pipeline, resumability, bad input."""

import json

import pytest

from toolrl.build import build, load_spec, run_stage
from toolrl.build.artifacts import BuiltTask, DocRow, FactRow, ToolDoc, Workspace
from toolrl.build.decompose import check_graph, scenario_of
from toolrl.build.integrate import cluster
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


def test_integration_merges_similar_documents_of_one_function_and_never_conflicting_ones():
    def doc(name, description):
        return ToolDoc(
            name=name,
            description=description,
            parameters={"type": "object", "properties": {"person": {"type": "string"}}},
        )

    docs = [
        doc("get_person_birthplace", "Returns the birthplace of a person."),
        doc("find_person_birthplace", "Find a person's birthplace."),
        doc("get_person_employer", "Returns the employer of a person."),
        doc("lookup_person_employer", "Returns the employer of a person."),
    ]
    kinds = [{"person.birthplace"}, {"person.birthplace"}, {"person.employer"}, {"person.employer"}]
    facts = {
        "person.birthplace": [FactRow(arguments={"person": "A"}, answer="Rome")],
        "person.employer": [FactRow(arguments={"person": "A"}, answer="Acme")],
    }
    groups = sorted(sorted(g) for g in cluster(docs, kinds, facts, "name", 0.3))
    assert groups == [[0, 1], [2, 3]]
    # everything similar enough (threshold tiny), yet birthplace and employer disagree on A: never merged
    assert sorted(sorted(g) for g in cluster(docs, kinds, facts, "name", 0.01)) == [[0, 1], [2, 3]]
    embedded = sorted(sorted(g) for g in cluster(docs, kinds, facts, "embedding", 0.8))
    assert embedded == [[0, 1], [2, 3]]


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
        assert validate(tool, template_source(tool, facts), cases, limits) is None, shape
    thousands = [({"name": "pop", "arguments": {"city": "C", "unit": "thousands"}}, "3")]
    assert validate(tool, template_source(tool, facts), thousands, limits) is None
    wrong = ScaledTool(
        doc=ToolDoc(name="pop", description="d", parameters=schema), impl=Impl(kinds=["city.population"], key="city")
    )
    reason = validate(
        wrong, template_source(wrong, facts), [({"name": "pop", "arguments": {"city": "B"}}, "7")], limits
    )
    assert reason == "{'city': 'B'} gave '2000'; expected '7'"


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


def test_a_number_in_another_unit_is_written_in_full_and_seed_3_loses_no_task(tmp_path):
    from toolrl.build.runtime import _in_unit

    spec = {"unit": {"units": 1.0, "thousands": 1000.0}}
    assert _in_unit(spec, "2725000", "units") == "2725000"  # the table's own text, whatever its size
    assert _in_unit(spec, "2725000", "thousands") == "2725" and _in_unit(spec, "2725500", "thousands") == "2725.5"
    assert _in_unit(spec, "12345678901", "thousands") == "12345678.901"
    manifest = build(load_spec(None, {"seed": 3, **SMALL}), Workspace(tmp_path))  # 2.725e+06 dropped 85 tasks
    assert manifest["deploy"]["tasks_dropped"] == 0 and manifest["deploy"]["tools_dropped"] == 0


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
