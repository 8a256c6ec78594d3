"""Sharded checkpoints (torch.distributed.checkpoint) in one process: a save and load round trip of weights and
optimizer state, and a checkpoint whose metadata would run code is refused without running it."""

import os
import pickle

import pytest
import torch

from toolrl.errors import ConfigError
from toolrl.runs import sharded


def small_model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    model[0].bias.requires_grad_(False)  # frozen: not in the checkpoint
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return model, optimizer


def test_round_trip_of_trainable_weights_and_optimizer_state(tmp_path):
    model, optimizer = small_model(0)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    sharded.save(tmp_path, model, None, optimizer)
    assert sharded.is_sharded(tmp_path)

    other, other_optimizer = small_model(1)
    frozen = other[0].bias.detach().clone()
    sharded.load(tmp_path, other, None, other_optimizer)
    for (name, a), b in zip(model.named_parameters(), other.parameters(), strict=True):
        if a.requires_grad:
            assert torch.equal(a, b), name
    assert torch.equal(other[0].bias, frozen)  # frozen weights are the model's own
    saved, loaded = optimizer.state_dict()["state"], other_optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for i in saved:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(saved[i][key], loaded[i][key])


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-code",))


def test_metadata_that_would_run_code_is_refused(tmp_path, monkeypatch):
    model, optimizer = small_model(0)
    sharded.save(tmp_path, model, None, optimizer)
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"cannot load the sharded checkpoint: .*refused.*posix.system"):
        sharded.load(tmp_path, model, None, optimizer)
    assert not (tmp_path / "ran-code").exists()
