"""An engine of one's own that samples from weights of its own (as vLLM does) registers with
`loads_weights=True`, from outside the package: the trainer hands it the new weights after every optimizer
step, so it keeps sampling from the policy being trained, and the logged mismatch shows it."""

import copy

import torch

from tests.train.test_features import tiny_config
from toolrl.rollout import HFEngine
from toolrl.rollout.engine import register_engine
from toolrl.train import Trainer, Workbench

LOADS = []


class OwnWeights(HFEngine):
    """The HF engine on a private copy of the model, updated only through load_weights."""

    def load_weights(self, weights):
        LOADS.append({k: v.clone() for k, v in weights.items()})
        self.model.load_state_dict(weights)


@register_engine("own-weights", can_train=True, loads_weights=True)
def own_weights(model, chat, device, seed=0, **_):
    return OwnWeights(copy.deepcopy(model), chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed)


@register_engine("own-weights-unsynced", can_train=True)  # the same without loads_weights: never synced
def own_weights_unsynced(model, chat, device, seed=0, **_):
    return OwnWeights(copy.deepcopy(model), chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed)


def run(tiny_model_dir, tmp_path, engine):
    config = tiny_config(tiny_model_dir, tmp_path, f"rollout.engine={engine}", "train.steps=3")
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    metrics = []
    trainer.train(metrics.append)
    return trainer, [m for m in metrics if "mismatch/abs_logprob_diff" in m and m["step"] > 1]


def test_an_engine_that_loads_weights_gets_them_after_every_step(tiny_model_dir, tmp_path):
    LOADS.clear()
    trainer, synced = run(tiny_model_dir, tmp_path, "own-weights")
    assert len(LOADS) == 3  # one per optimizer step
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(LOADS[-1][name], tensor), name
    LOADS.clear()
    _, unsynced = run(tiny_model_dir, tmp_path / "b", "own-weights-unsynced")
    assert not LOADS and synced and unsynced
    assert max(m["mismatch/abs_logprob_diff"] for m in synced) < 1e-4
    assert min(m["mismatch/abs_logprob_diff"] for m in unsynced) > 1e-3  # stale weights show in the mismatch
