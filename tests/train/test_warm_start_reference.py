"""After a warm start (`train.warm_start`), the run's reference is the policy RL starts from: the KL term's model
and dense turn credit's scorer (`train.turn_credit.model: reference`) are the warm-started policy, not the model
before the warm start (they had been frozen copies made before it, so the KL pulled the policy back to the model
the warm start had moved away from, and the credit was scored by a model that had never seen the environment's
format). A resumed run scores with the same (RUN/warm_start)."""

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.train.test_sft import sft_config as warm_config
from toolrl.errors import ConfigError
from toolrl.runs.rundir import RunDir
from toolrl.train import Trainer, Workbench


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def warm_started(config):
    """A trainer whose warm start ran (and no RL step), with the policy's weights before it."""
    bench = Workbench.load(config)
    trainer = Trainer(bench, RunDir.create(config))
    before = weights(trainer.model)
    trainer.train()
    return bench, trainer, before


def test_the_kl_reference_after_a_warm_start_is_the_warm_started_policy(tmp_path, tiny_model_dir):
    config = warm_config(tmp_path, tiny_model_dir, "train.kl.coef=0.1")
    bench, trainer, before = warm_started(config)
    try:
        tuned = weights(trainer.model)
        assert not same(tuned, before)  # the warm start moved the policy
        assert same(weights(trainer.reference), tuned)
        assert trainer.scorer.reference is trainer.reference  # what the update's KL term reads
        assert not any(p.requires_grad for p in trainer.reference.parameters())
        assert (tmp_path / "sft" / "warm_start" / "trainable.safetensors").is_file()
    finally:
        bench.close()


def test_dense_turn_credit_after_a_warm_start_scores_with_the_warm_started_policy(tmp_path, tiny_model_dir):
    """No KL term: the credit's own frozen copy is remade from the warm-started policy."""
    config = warm_config(tmp_path, tiny_model_dir, "train.turn_credit.model=reference",
                         "train.turn_credit.measure=prob")  # fmt: skip
    bench, trainer, before = warm_started(config)
    try:
        assert trainer.reference is None
        scorer = trainer.credit.model
        assert same(weights(scorer), weights(trainer.model)) and not same(weights(scorer), before)
        assert trainer.credit.measure == "prob" and trainer.credit.context is None
    finally:
        bench.close()


def test_a_lora_policy_s_reference_after_a_warm_start_has_its_adapters_merged(tmp_path, tiny_model_dir):
    """With LoRA the reference had been the policy with its adapters off, the base model: after a warm start the
    adapters hold what it learned, so the reference is a frozen copy with them merged in (same logits as the
    policy, not the base's), for the KL term and the credit alike."""
    config = warm_config(tmp_path, tiny_model_dir, "train.lora.r=4", "train.kl.coef=0.1", "sft.lr=1e-2",
                         "train.turn_credit.model=reference")  # fmt: skip
    bench, trainer, _ = warm_started(config)
    try:
        ids = torch.tensor([bench.tokenizer.encode("What is 12 * 7? Use the calculator.")])
        policy = logits(trainer.model, ids)
        with trainer.model.disable_adapter():
            base = logits(trainer.model, ids)
        assert (policy - base).abs().max() > 1e-3  # the adapters learned something
        torch.testing.assert_close(logits(trainer.reference, ids), policy, atol=1e-4, rtol=1e-4)
        assert trainer.credit.model is trainer.reference and trainer.credit.context is None
    finally:
        bench.close()


def test_a_resumed_run_scores_with_the_warm_started_policy(tmp_path, tiny_model_dir, caplog):
    """Stopped after its first RL step and resumed: the reference is the policy as the warm start left it (kept
    in RUN/warm_start), not the model the run was started from, nor the policy at the checkpoint. A run of an
    earlier version (no RUN/warm_start) resumes with the initial model as its reference, and a warning says so."""
    config = warm_config(tmp_path, tiny_model_dir, "train.kl.coef=0.1", "train.steps=2", "train.prompts_per_step=1",
                         "train.group_size=2")  # fmt: skip
    run = RunDir.create(config)
    bench = Workbench.load(config)
    try:
        trainer = Trainer(bench, run)

        def stop_after_first(metrics):
            if metrics["step"] == 1:
                (run.path / "STOP").touch()

        assert trainer.train(stop_after_first)["stopped"] == 1
        tuned = weights(trainer.reference)
    finally:
        bench.close()
    bench = Workbench.load(config)
    try:
        resumed = Trainer(bench, run)
        initial = weights(resumed.reference)
        assert not same(initial, tuned)
        assert resumed.resume() == 1
        assert same(weights(resumed.reference), tuned)
        assert resumed.scorer.reference is resumed.reference
    finally:
        bench.close()
    shutil.rmtree(run.path / "warm_start")
    bench = Workbench.load(config)
    try:
        older = Trainer(bench, run)
        with caplog.at_level(logging.WARNING, logger="toolrl.train.reference"):
            assert older.resume() == 1
        assert same(weights(older.reference), initial)
        said = [r.getMessage() for r in caplog.records if "warm_start/" in r.getMessage()]
        assert len(said) == 1 and "the reference stays the model before the warm start" in said[0]
    finally:
        bench.close()


@pytest.mark.parametrize("more", [["train.kl.coef=0.0"], ["train.kl.coef=0.1", "train.kl.teacher=TEACHER"]])
def test_nothing_is_copied_or_kept_where_no_model_is_a_copy_of_the_initial_policy(tmp_path, tiny_model_dir, more):
    """No KL term and no credit, or a KL term to a teacher: the warm start remakes nothing and keeps no weights."""
    more = [m.replace("TEACHER", str(tiny_model_dir)) for m in more]
    bench, trainer, _ = warm_started(warm_config(tmp_path, tiny_model_dir, *more))
    try:
        teacher = trainer.reference
        assert not (tmp_path / "sft" / "warm_start").exists()
        if teacher is not None:  # the teacher as loaded: not the warm-started policy
            assert not same(weights(teacher), weights(trainer.model))
    finally:
        bench.close()


def narrowed(tensor: torch.Tensor) -> torch.Tensor:
    return tensor[..., :1].contiguous() if tensor.dim() else tensor


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (lambda path: path.write_bytes(b"not safetensors at all"), "not a readable safetensors file"),
        (lambda path: path.write_bytes(path.read_bytes()[:200]), "not a readable safetensors file"),
        (lambda path: save_file({**load_file(str(path)), "lm_head.extra": torch.zeros(2)}, str(path)),
         "weights this model does not train"),
        (lambda path: save_file({k: narrowed(v) for k, v in load_file(str(path)).items()}, str(path)),
         "weights of another shape"),
    ],
)  # fmt: skip
def test_a_tampered_warm_start_file_is_one_line_that_names_it(tmp_path, tiny_model_dir, tamper, said):
    """RUN/warm_start/trainable.safetensors is a file in a run directory: garbage, a truncated file, a weight the
    model does not have or one of another shape is refused with one line naming the file, before anything loads."""
    config = warm_config(tmp_path, tiny_model_dir, "train.kl.coef=0.1", "train.steps=1", "train.prompts_per_step=1",
                         "train.group_size=2")  # fmt: skip
    run = RunDir.create(config)
    bench = Workbench.load(config)
    try:
        Trainer(bench, run).train()
    finally:
        bench.close()
    kept = run.path / "warm_start" / "trainable.safetensors"
    tamper(kept)
    bench = Workbench.load(config)
    try:
        with pytest.raises(ConfigError) as refused:
            Trainer(bench, run).resume()
    finally:
        bench.close()
    assert str(kept) in str(refused.value) and said in str(refused.value) and "\n" not in str(refused.value)
