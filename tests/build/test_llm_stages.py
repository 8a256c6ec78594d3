"""The generative stages through a local OpenAI-compatible server with fixed replies, malformed ones included:
replies are validated, retried with the reason, rejected and counted, logged beside the artifact, reused on a
re-run; model-written code runs only in the sandbox."""

import json
import re

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.build import build, load_spec, run_stage
from toolrl.build.artifacts import BuiltTask, Workspace

CHAINS = {
    "What is the capital of the country of the city Ost?": [
        {
            "id": "a",
            "question": "Which country is Ost in?",
            "kind": "city.country",
            "arguments": {"city": "Ost"},
            "answer": "Albar",
        },
        {
            "id": "b",
            "question": "What is the capital of Albar?",
            "kind": "country.capital",
            "arguments": {"country": "Albar"},
            "answer": "Ost",
            "depends_on": ["a"],
        },
    ],
    "Which country is Wey in?": [
        {
            "id": "a",
            "question": "Which country is Wey in?",
            "kind": "city.country",
            "arguments": {"city": "Wey"},
            "answer": "Belm",
        },
    ],
    "Which countries are Pell and Ost in?": [
        {
            "id": "a",
            "question": "Which country is Pell in?",
            "kind": "country_of_city",
            "arguments": {"city": "Pell"},
            "answer": "Coria",
        },
        {
            "id": "b",
            "question": "Which country is Ost in?",
            "kind": "city.country",
            "arguments": {"city": "Ost"},
            "answer": "Albar",
        },
    ],
    "A broken task": [
        {"id": "a", "question": "?", "kind": "x", "arguments": {"y": 1}, "answer": "z", "depends_on": ["b"]},
        {"id": "b", "question": "?", "kind": "x", "arguments": {"y": 2}, "answer": "z"},
    ],
}


def fake_model(prompt: str) -> str:
    retried = "Your previous reply was not accepted" in prompt
    if prompt.startswith("Decompose"):
        task = re.search(r"Task: (.*)", prompt).group(1).strip()
        if task == "Which country is Wey in?" and not retried:
            return "Sure! Here it is: {subproblems: oops"  # malformed: retried
        return "```json\n" + json.dumps({"subproblems": CHAINS[task]}) + "\n```"
    if prompt.startswith("Write the document"):
        kind = re.search(r"Kind of function: (.*)", prompt).group(1).strip()
        arguments = json.loads(re.search(r"Its call's arguments: (.*)", prompt).group(1).replace("'", '"'))
        names = list(arguments) if retried or kind != "country.capital" else ["wrong"]
        name = {"country_of_city": "country_of_a_city"}.get(kind, "get_" + kind.replace(".", "_"))
        properties = {n: {"type": "string", "description": f"The {n}."} for n in names}
        return json.dumps(
            {
                "name": name,
                "description": f"Returns the {kind}.",
                "parameters": {"type": "object", "properties": properties},
            }
        )
    name = re.search(r"`(\w+)\(\*\*arguments\)`", prompt).group(1)
    pairs = re.findall(r"^(\{.*\}) -> '(.*)'$", prompt, re.M)
    table = {json.dumps(json.loads(a), sort_keys=True): b for a, b in pairs}
    escape = (  # an attempt to write outside its own folder: the sandbox's /tmp is read-only
        "try:\n    open('/tmp/toolrl-escaped-from-sandbox', 'w').write('x')\nexcept OSError:\n    pass\n"
        if name == "get_city_country"
        else ""
    )
    answer = "'wrong'" if name == "get_country_capital" else "TABLE[key]"
    return f"""```python
import json
{escape}TABLE = {table!r}
def {name}(**arguments):
    key = json.dumps(arguments, sort_keys=True)
    if key not in TABLE:
        raise ValueError('unknown arguments: ' + key)
    return {answer}
```"""


def test_llm_stages_validate_retry_reject_count_and_resume(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"question": q, "split": "train"}) + "\n" for q in CHAINS))
    with LocalHTTPServer(chat=fake_model) as server:
        llm = {"base_url": f"{server.url}/v1", "model": "builder", "retries": 1}
        spec = load_spec(
            None,
            {
                "source": "tasks",
                "tasks": {"path": str(tasks)},
                "llm": llm,
                "deploy": {"method": "llm"},
                "scale": {"functional": 0, "types": 0},
            },
        )
        ws = Workspace(tmp_path / "out")
        manifest = build(spec, ws)
        asked = len(server.requests)
        decompose, documents, deploy = manifest["decompose"], manifest["documents"], manifest["deploy"]
        assert decompose["tasks"] == 3 and decompose["rejected"] == 1
        assert decompose["llm"]["rejected"] == 1 and decompose["llm"]["retried"] >= 2
        assert "not an earlier sub-problem" in decompose["llm"]["errors"][0]
        built = {t.question: t for t in ws.read_rows("1_scenarios.jsonl", BuiltTask, "decompose")}
        assert built["What is the capital of the country of the city Ost?"].scenario == "multi_hop"
        assert built["Which countries are Pell and Ost in?"].scenario == "parallel_single_hop"
        assert documents["llm"]["retried"] >= 1 and documents["dropped"] == 0  # a wrong document asked again
        log = [json.loads(line) for line in (tmp_path / "out" / "llm" / "decompose.jsonl").read_text().splitlines()]
        assert {"item", "prompt", "reply", "valid"} <= set(log[0]) and any(not r["valid"] for r in log)
        # two kinds of one function (city.country, country_of_city) merged by the embedding rule
        assert manifest["integrate"]["tools"] < manifest["integrate"]["distinct_documents"]
        # the model's code ran in the sandbox only: the escaping write never reached this machine's /tmp
        from pathlib import Path

        assert not Path("/tmp/toolrl-escaped-from-sandbox").exists()
        assert deploy["tools_dropped"] == 1 and deploy["dropped"][0]["tool"] == "get_country_capital"
        assert "gave 'wrong'" in deploy["dropped"][0]["reason"] and deploy["tasks_dropped"] == 1
        lost = [d for d in deploy["dropped"] if "task" in d]  # the task it cost, with the reason, in the summary
        assert len(lost) == 1 and lost[0]["reason"].startswith("needs tool get_country_capital, dropped: ")
        # a re-run of a stage reuses the replies that validated; only the rejected task is asked again (twice)
        run_stage(spec, ws, "decompose")
        assert len(server.requests) == asked + 2
        assert ws.read_json("build.json")["decompose"]["llm"]["cached"] == 3


def test_a_dead_endpoint_rejects_and_counts_instead_of_crashing(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"question": "Which country is Wey in?"}) + "\n")
    spec = load_spec(
        None,
        {"source": "tasks", "tasks": {"path": str(tasks)}, "llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
    )
    import pytest

    from toolrl.errors import DataError

    with pytest.raises(DataError, match=r"no task was decomposed; see llm/decompose\.jsonl"):
        run_stage(spec, Workspace(tmp_path / "out"), "decompose")
    log = (tmp_path / "out" / "llm" / "decompose.jsonl").read_text()
    assert "could not be asked" in log


def test_a_local_model_can_be_the_builder_and_its_bad_replies_are_counted(tmp_path, tiny_model_dir):
    import pytest

    from toolrl.errors import DataError

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"question": "Which country is Wey in?"}) + "\n")
    llm = {"path": str(tiny_model_dir), "max_tokens": 4, "retries": 1}
    spec = load_spec(None, {"source": "tasks", "tasks": {"path": str(tasks)}, "llm": llm})
    with pytest.raises(DataError, match="no task was decomposed"):  # a random tiny model writes no valid JSON
        run_stage(spec, Workspace(tmp_path / "out"), "decompose")
    log = [json.loads(line) for line in (tmp_path / "out" / "llm" / "decompose.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in log] == [0, 1] and not any(r["valid"] for r in log)


def test_a_reply_holding_several_json_values_gives_the_one_asked_for():
    import jsonschema
    import pytest

    from toolrl.build.llm import extract_json, json_values

    schema = {"type": "object", "required": ["subproblems"]}
    reply = 'For example {"id": "s1"} is one sub-problem. Here is my answer: {"subproblems": [{"id": "s1"}]} Done [1]'
    assert extract_json(reply, schema) == {"subproblems": [{"id": "s1"}]}  # not first-brace-to-last-brace
    assert json_values(reply) == [{"id": "s1"}, {"subproblems": [{"id": "s1"}]}, [1]]
    fenced = 'Sure.\n```json\n{"subproblems": []}\n```\nAn aside: {"x": 1}'
    assert extract_json(fenced, schema) == {"subproblems": []}
    with pytest.raises(jsonschema.ValidationError):
        extract_json('{"id": "s1"} and {"id": "s2"}', schema)
    with pytest.raises(ValueError, match="no JSON value"):
        extract_json("no braces {here at all", schema)


def test_a_model_that_cannot_follow_the_prompts_stops_the_stage_in_seconds(tmp_path):
    import pytest

    from toolrl.errors import ConfigError

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"question": f"Which country is Wey{i} in?"}) + "\n" for i in range(20)))
    asked = []

    def babble(prompt):
        asked.append(prompt)
        return "I'm here to help with anything!"

    llm = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 1, "give_up_after": 3}
    spec = load_spec(None, {"source": "tasks", "tasks": {"path": str(tasks)}, "llm": llm})
    with pytest.raises(ConfigError, match=r"^llm: stage decompose stopped: its first 3 items were all rejected"):
        run_stage(spec, Workspace(tmp_path / "out"), "decompose", ask=babble)
    assert len(asked) == 3 * 2  # three items, each asked twice: not all twenty

    small = {"path": "smollm2-135m-instruct"}
    default = load_spec(None, {"source": "tasks", "tasks": {"path": str(tasks)}, "llm": small})
    with pytest.raises(ConfigError, match=r"^llm\.path: the embedded default model .* is too small"):
        run_stage(default, Workspace(tmp_path / "default"), "decompose")
    log = tmp_path / "default" / "llm" / "decompose.jsonl"
    assert not log.exists() or not log.read_text()  # refused before any model loads or anything is asked


def test_a_decomposition_longer_than_the_limit_is_asked_again_then_rejected_with_the_option_named(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    questions = ["Which countries are Pell and Ost in?", "Which country is Wey in?"]
    tasks.write_text("".join(json.dumps({"question": q, "answer": ["Albar", "Belm"][: 2 - i]}) + "\n"
                             for i, q in enumerate(questions)))  # fmt: skip
    prompts = []

    def model(prompt):
        prompts.append(prompt)
        question = next(q for q in CHAINS if f"Task: {q}" in prompt)
        return json.dumps({"subproblems": CHAINS[question]})

    llm = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 1}
    source = {"path": str(tasks), "max_subproblems": 1}
    spec = load_spec(None, {"source": "tasks", "tasks": source, "llm": llm})
    report = run_stage(spec, Workspace(tmp_path / "out"), "decompose", ask=model)
    assert report["tasks"] == 1 and report["rejected"] == 1 and "Use at most 1 sub-problems" in prompts[0]
    assert "2 sub-problems, more than tasks.max_subproblems (1)" in report["llm"]["errors"][0]
    assert "Its final answer: Albar, Belm" in prompts[0]  # a list answer, as the model is told it

    spec = load_spec(None, {"source": "tasks", "tasks": {**source, "max_subproblems": 8}, "llm": llm})
    ws = Workspace(tmp_path / "more")
    assert run_stage(spec, ws, "decompose", ask=model)["tasks"] == 2
    built = {t.question: t for t in ws.read_rows("1_scenarios.jsonl", BuiltTask, "decompose")}
    assert built[questions[0]].answers == ["Albar", "Belm"]  # two sinks, two answers the reply must hold
    assert built[questions[1]].answers == ["Albar"]  # the task's own answer, not its sub-problem's (Belm)
