"""train.async_steps N: rollouts run up to N steps ahead of the trainer, no trajectory is trained with a staleness above
N, every token carries the version of the weights that sampled it, and with partial rollouts an episode in flight
takes an update's weights as it samples (train/collect.py, train/generation.py, rollout/inflight.py)."""

import json
import threading

import pytest

from tests.train.test_features import tiny_config
from toolrl.errors import ConfigError
from toolrl.train import RunDir, Trainer, Workbench
from toolrl.train.generation import Generation
from toolrl.train.staleness import offpolicy_metrics, staleness


def samples(run) -> list[dict]:
    return [json.loads(line) for line in (run.path / "samples.jsonl").read_text().splitlines() if line.strip()]


def test_rollouts_run_up_to_n_steps_ahead_and_none_is_trained_staler_than_n(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=6", "train.async_steps=3")
    trainer = Trainer(Workbench.load(config), RunDir.create(config))
    ahead, for_step = [], trainer.collector.for_step

    def traced(step, last):  # generation as far ahead as it may go: the rollouts ahead end before the update
        part = for_step(step, last)  # (how far it gets on its own is the machine's speed: 1 on a loaded CI machine)
        trainer.collector.settle()
        ahead.append(sorted(trainer.collector.pending))
        return part

    trainer.collector.for_step = traced
    metrics = []
    trainer.train(metrics.append)
    assert ahead[:3] == [[2, 3, 4], [3, 4, 5], [4, 5, 6]]  # started when the step before them was taken
    stale = [m["offpolicy/staleness"] for m in metrics]
    assert stale == [0, 1, 2, 3, 3, 3]  # steps 2-4 sampled before the first update; then each N updates old
    assert all(m["offpolicy/too_stale"] == 0 and m["trained_trajectories"] > 0 for m in metrics)
    for record in samples(trainer.run):  # each trained token's version, in the run's files
        for span in (s for s in record["segments"] if s["loss"]):
            assert len(span["versions"]) == len(span["ids"]) and all(0 <= v <= 5 for v in span["versions"])


def test_a_trajectory_staler_than_the_bound_is_left_out_of_the_loss_and_counted(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "train.async_steps=1")
    trainer = Trainer(Workbench.load(config))
    trainer.step(1)
    trainer.state.step = 3  # the trainer moved on: step 2's rollout (sampled by version 0) is 3 updates old
    metrics = trainer.step(2)
    assert metrics["offpolicy/staleness"] == 3 and metrics["offpolicy/too_stale"] == metrics["trajectories"] == 8
    assert metrics["trained_trajectories"] == 0 and metrics["fault_masked"] == 0


def test_staleness_is_counted_token_by_token(tiny_model_dir, tmp_path):
    from toolrl.envs import Task
    from toolrl.rollout import Trajectory

    def traj(versions):
        t = Trajectory.start(Task("t", "q", "a"), [1, 2])
        t.add_model_turn([3] * len(versions), [0.0] * len(versions), "x", versions)
        return t

    trajs = [traj([4, 4, 5]), traj([5, 5]), traj([])]
    assert staleness(trajs, 6, fallback=4) == [2, 1, 0]
    metrics = offpolicy_metrics(trajs, 6, fallback=4, bound=1)
    assert metrics == {"offpolicy/staleness": 2, "offpolicy/staleness_mean": pytest.approx(7 / 5),
                       "offpolicy/partial_fraction": pytest.approx(1 / 3), "offpolicy/too_stale": 1}  # fmt: skip
    untagged = Trajectory.start(Task("t", "q", "a"), [1, 2])
    untagged.add_model_turn([3, 3], [0.0, 0.0], "x")  # made elsewhere (a gateway's client): its rollout's version
    assert staleness([untagged], 6, fallback=4) == [2]


@pytest.mark.parametrize("mode", ["continue", "cut"])
def test_an_episode_in_flight_takes_the_update_s_weights_and_its_tokens_say_so(tiny_model_dir, tmp_path, mode):
    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "train.async_steps=1",
                         f"train.partial_rollouts={mode}", "rollout.max_new_tokens=12")  # fmt: skip
    trainer = Trainer(Workbench.load(config), RunDir.create(config))
    engine, inbox = trainer.rollout.engine, trainer.generation.inbox
    assert engine.inbox is inbox and trainer.collector.loop is not None
    step, gate = engine._step, {"first": None}

    def gated(batch):  # step 2's rollout (started ahead) waits mid-turn for update 1's weights, once
        if trainer.collector.pending and gate["first"] is not False:
            gate["first"] = engine.stats["decode_steps"] if gate["first"] is None else gate["first"]
            if engine.stats["decode_steps"] >= gate["first"] + 3:
                for _ in range(600):
                    if inbox.newer():
                        break
                    threading.Event().wait(0.05)
                gate["first"] = False
        return step(batch)

    engine._step = gated
    metrics = []
    trainer.train(metrics.append)
    assert metrics[1]["offpolicy/partial_fraction"] == 1.0 and metrics[1]["offpolicy/staleness"] == 1
    assert engine.stats["weight_swaps"] >= 1 and inbox.swaps_in_flight >= 1
    step_two = [r for r in samples(trainer.run) if r["step"] == 2]
    assert len(step_two) == 8
    for record in step_two:
        versions = [v for s in record["segments"] if s["loss"] for v in s["versions"]]
        assert versions[:3] == [0, 0, 0] and versions[-1] == 1 and versions == sorted(versions)


def test_partial_rollouts_need_async_steps_and_an_engine_that_takes_weights_as_it_samples(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"train.partial_rollouts: continue .* set train.async_steps to 1 or more"):
        Trainer(Workbench.load(tiny_config(tiny_model_dir, tmp_path, "train.partial_rollouts=continue")))
    cut = tiny_config(tiny_model_dir, tmp_path, "train.partial_rollouts=cut", "train.async_steps=2").train
    with pytest.raises(ConfigError, match=r"train.partial_rollouts: cut needs rollout.engine hf .*, not vllm; use"):
        Generation.check(cut, "vllm")  # vLLM keeps its caches: it continues
    Generation.check(cut.model_copy(update={"partial_rollouts": "continue"}), "vllm")


def test_a_checkpoint_with_three_rollouts_ahead_resumes_on_the_same_tasks(tiny_model_dir, tmp_path):
    whole = tiny_config(tiny_model_dir, tmp_path, "train.steps=5", "train.async_steps=3", "run_name=whole")
    trainer = Trainer(Workbench.load(whole), RunDir.create(whole))
    trainer.train()
    expected = list(trainer.collector.order.order), trainer.collector.order.rng.getstate()

    cut = tiny_config(tiny_model_dir, tmp_path, "train.steps=5", "train.async_steps=3", "run_name=cut")
    first = Trainer(Workbench.load(cut), RunDir.create(cut))
    for step in (1, 2):
        first.step(step)
        first.state.step = step
    assert sorted(first.collector.pending) == [3, 4, 5]  # three steps' tasks drawn ahead when step 2's is written
    first.save_checkpoint()
    first.settle()
    first.collector.close()

    resumed = Trainer(Workbench.load(cut), RunDir.existing(first.run.path))
    assert resumed.resume() == 2
    for step in (3, 4, 5):
        resumed.step(step)
        resumed.state.step = step
    assert (resumed.collector.order.order, resumed.collector.order.rng.getstate()) == expected


@pytest.mark.parametrize("partial", ["off", "continue"])
def test_each_step_counts_its_own_rollout_s_tool_calls_once(tiny_model_dir, tmp_path, partial):
    """tools/* are the executor's counts over the step's rollout. Rollouts ahead one after another count their own;
    running at once they share the executor, and each count lands in exactly one step (that of the rollout that ended
    next): never twice, and the first step's (made before any ran ahead) in none of theirs."""
    config = tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "train.async_steps=2",
                         f"train.partial_rollouts={partial}")  # fmt: skip
    trainer = Trainer(Workbench.load(config))
    executor, arun = trainer.rollout.executor, trainer.rollout.arun

    async def counted(tasks, *args, **kwargs):  # the tiny model calls no tool: a call counted per trajectory
        executor.metrics["calls"] += len(tasks)
        return await arun(tasks, *args, **kwargs)

    trainer.rollout.arun = counted
    metrics = []
    trainer.train(metrics.append)
    calls = [m.get("tools/calls", 0) for m in metrics]
    assert calls[0] == 8 and sum(calls) == sum(m["trajectories"] for m in metrics) == 24
    if partial == "off":
        assert calls == [8, 8, 8]
