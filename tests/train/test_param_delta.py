"""`toolrl report RUN --param-delta`: the relative weight change per layer and module between two models."""

import json
import shutil

import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from toolrl.cli import app
from toolrl.config import config_to_yaml, load_config
from toolrl.train.param_delta import by_layer_and_module, relative_changes, where


def test_relative_change_is_the_norm_of_the_difference_over_the_norm_before():
    before = {"model.layers.0.self_attn.q_proj.weight": torch.tensor([[3.0, 4.0]]), "lm_head.weight": torch.ones(2)}
    after = {"model.layers.0.self_attn.q_proj.weight": torch.tensor([[3.0, 4.5]]), "lm_head.weight": torch.ones(2)}
    changes = relative_changes(before, after)
    assert changes["model.layers.0.self_attn.q_proj.weight"] == 0.5 / 5.0 and changes["lm_head.weight"] == 0.0
    assert where("model.layers.11.mlp.down_proj.weight") == ("11", "down_proj")
    assert where("model.norm.weight") == ("-", "norm")
    table = by_layer_and_module(changes)
    assert table == {"0": {"q_proj": 0.1}, "-": {"lm_head": 0.0}}


def test_report_param_delta_finds_the_one_module_that_changed(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(load_config(overrides=[f"model.name={tiny_model_dir}"])))
    shutil.copytree(tiny_model_dir, run / "final")
    weights = load_file(str(run / "final" / "model.safetensors"))
    name = next(n for n in weights if ".layers.1." in n and "v_proj" in n)
    weights[name] = weights[name] * 1.25
    save_file(weights, str(run / "final" / "model.safetensors"), metadata={"format": "pt"})
    result = CliRunner().invoke(app, ["report", str(run), "--param-delta"])
    assert result.exit_code == 0, result.output
    table = json.loads((run / "param_delta.json").read_text())["layers"]
    assert abs(table["1"]["v_proj"] - 0.25) < 1e-5
    assert all(v == 0 for layer, row in table.items() for m, v in row.items() if (layer, m) != ("1", "v_proj"))
    assert (run / "param_delta.png").stat().st_size > 1000 and "v_proj" in result.output
