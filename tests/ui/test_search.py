"""Search across steps and runs (issue 50, item 4): text in the model's turns or the tool results, a tool's name,
the outcome, a reward range and the stop reason; each hit names what the page opens (run, kind, step, index)."""

import json

from tests.ui.test_api import make_run, ui_client
from toolrl.runs.rundir import RunDir


def record(task, reward, text, tool=None, result="", stop="answer"):
    calls = [{"name": tool, "arguments": {}, "result": result}] if tool else []
    return {"task_id": task, "reward": reward, "success": float(reward >= 1), "stop_reason": stop,
            "tool_calls": len(calls), "tool_errors": 0, "calls": calls,
            "segments": [{"kind": "model", "text": text}]}  # fmt: skip


def test_search_finds_text_tools_outcomes_and_rewards_across_runs(tmp_path):
    root = tmp_path / "runs"
    a, b = make_run(root, "a", steps=1), make_run(root, "b", steps=1)
    RunDir(a).log_samples(2, [record("t1", 1.0, "I will call the Calculator now", "calc", "42"),
                              record("t2", 0.0, "no idea", stop="max_turns")])  # fmt: skip
    RunDir(b).log_samples(2, [record("t3", 0.5, "searching", "search", "the capital is PARIS")])
    with (a / "samples.jsonl").open("a") as f:
        f.write('{"step": 3, "segments": [{"text": "calculator"\n')  # torn: never a hit
    with ui_client(root) as client:

        def hits(**params):
            found = client.get("/api/search", params=params).json()
            return sorted((h["run"], h["step"], h["index"]) for h in found["hits"])

        assert hits(q="calculator") == [("a", 2, 0)]  # case-insensitive, the model's text
        assert hits(q="paris") == [("b", 2, 0)]  # a tool's result
        assert hits(tool="search") == [("b", 2, 0)]
        assert hits(outcome="fail", stop="max_turns") == [("a", 2, 1)]
        assert hits(rmin="0.4", rmax="0.6") == [("b", 2, 0)]
        assert hits(q="calculator", run="b") == []  # one run only
        hit = client.get("/api/search", params={"q": "capital"}).json()["hits"][0]
        assert hit["snippet"] == "the capital is PARIS" and hit["task_id"] == "t3" and hit["kind"] == "train"
        bad = client.get("/api/search", params={"rmin": "lots"})
        assert bad.status_code == 400 and bad.json()["error"] == "rmin: 'lots' is not a number"
        assert client.get("/api/search", params={"run": "../etc"}).status_code in (400, 404)
        opened = client.get("/api/record", params={"run": "b", "kind": "train", "step": 2, "index": 0}).json()
        assert json.dumps(opened).count("PARIS") == 1  # what a hit opens is that record


def test_search_gives_the_newest_steps_first_and_caps_its_hits(tmp_path, monkeypatch):
    """The cap keeps the latest steps (a long run's first 200 records had been the hits)."""
    import toolrl.ui.search as search

    root = tmp_path / "runs"
    run = make_run(root, "long", steps=1)
    for step in range(1, 6):
        RunDir(run).log_samples(step, [record(f"t{step}-{i}", 1.0, "the answer is 42") for i in range(2)])
    monkeypatch.setattr(search, "MAX_HITS", 3)
    with ui_client(root) as client:
        found = client.get("/api/search", params={"q": "ANSWER"}).json()
        assert [(h["step"], h["index"]) for h in found["hits"]] == [(5, 0), (5, 1), (4, 0)] and found["capped"]
        found = client.get("/api/search", params={"outcome": "success"}).json()  # summaries only, no text
        assert [(h["step"], h["index"]) for h in found["hits"]] == [(5, 0), (5, 1), (4, 0)]
