"""Runs compared by their configs (issue 50, item 3): the keys that differ between the ticked runs with their
final metrics, and tags and a note per run saved in its folder, with hostile folders and values refused."""

import json
import os

import pytest

from tests.ui.test_api import POST, make_run, ui_client


def configured(root, name, lr, extra=""):
    run = make_run(root, name, steps=2, status={"state": "finished", "step": 2, "steps": 2})
    (run / "config.yaml").write_text(f"env:\n  name: calculator\nmodel:\n  name: tiny\ntrain:\n  steps: 2\n"
                                     f"  lr: {lr}\n{extra}")  # fmt: skip
    return run


def test_the_keys_that_differ_between_runs_with_their_final_metrics(tmp_path):
    root = tmp_path / "runs"
    configured(root, "a", "1.0e-05")
    configured(root, "b", "2.0e-05", "seed: 3\n")
    configured(root, "c", "1.0e-05")
    with ui_client(root) as client:
        got = client.get("/api/compare", params=[("run", "a"), ("run", "b"), ("run", "c")]).json()
    assert got["runs"] == ["a", "b", "c"]
    assert got["keys"] == [{"key": "seed", "values": {"a": None, "b": 3, "c": None}},
                           {"key": "train.lr", "values": {"a": 1e-5, "b": 2e-5, "c": 1e-5}}]  # fmt: skip
    assert got["final"]["a"] == {"reward": 0.2, "success": 0.1}  # the last training step's (make_run: step 2)
    assert got["meta"]["a"] == {"tags": [], "note": ""}


def test_tags_and_a_note_are_kept_in_the_run_folder_and_bad_ones_refused(tmp_path):
    root = tmp_path / "runs"
    run = configured(root, "a", "1.0e-05")
    with ui_client(root) as client:
        body = {"run": "a", "tags": ["baseline", "lr-1e-5", "baseline"], "note": "first try"}
        saved = client.post("/api/run/meta", headers=POST, json=body)
        assert saved.status_code == 200 and saved.json() == {"tags": ["baseline", "lr-1e-5"], "note": "first try"}
        assert json.loads((run / "ui.json").read_text())["note"] == "first try"
        listed = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}["a"]
        assert listed["tags"] == ["baseline", "lr-1e-5"] and listed["user_note"] == "first try"
        for body, field in (({"tags": ["<script>"]}, "tags"), ({"tags": ["x"] * 21}, "tags"),
                            ({"tags": "x"}, "tags"), ({"tags": [], "note": "n" * 2001}, "note"),
                            ({"tags": [], "note": 5}, "note")):  # fmt: skip
            refused = client.post("/api/run/meta", headers=POST, json={"run": "a", **body})
            assert refused.status_code == 400 and refused.json()["error"].startswith(f"{field}:"), body
        assert client.post("/api/run/meta", headers=POST, json={"run": "../a", "tags": []}).status_code in (400, 404)
        assert json.loads((run / "ui.json").read_text())["tags"] == ["baseline", "lr-1e-5"]  # nothing lost


@pytest.mark.parametrize("planted", [".ui.json.tmp", "ui.json"])
def test_a_link_planted_in_a_run_folder_is_never_written_through(tmp_path, planted):
    root = tmp_path / "runs"
    run = configured(root, "a", "1.0e-05")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, run / planted)
    with ui_client(root) as client:
        assert (
            client.post("/api/run/meta", headers=POST, json={"run": "a", "tags": ["t"], "note": ""}).status_code == 200
        )
        assert {r["name"]: r for r in client.get("/api/runs").json()["runs"]}["a"]["tags"] == ["t"]
    assert victim.read_text() == "keep" and not (run / "ui.json").is_symlink()
