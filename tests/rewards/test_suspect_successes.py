"""Reward hacking is watched: a success that a rule-based check of the task rejects (by default, the answer
stated without the tool calls the task's reference makes) is marked on the trajectory and counted as the share
`suspect_successes` beside success, in training steps and evaluations."""

from toolrl.config import load_config
from toolrl.rollout.scripted import POLICIES, register_policy
from toolrl.train import Workbench


def test_an_answer_without_the_calls_the_task_needs_is_a_suspect_success(tiny_model_dir):
    @register_policy("answer-only", replace=True)
    def answer_only(env, task):  # knows the answer, calls nothing: the rubric alone would pay it
        return [f"<answer>{task.answer}</answer>"]

    config = load_config(overrides=["env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu"])
    try:
        for policy, suspects in [("answer-only", 1.0), ("reference", 0.0)]:
            bench = Workbench.load(config, policy=policy)
            try:
                trajs = bench.evaluation(num_tasks=4)
                stats = bench.evaluate(num_tasks=4)
            finally:
                bench.close()
            assert stats["success"] == 1.0 and stats["suspect_successes"] == suspects, (policy, stats)
            reasons = {t.suspect for t in trajs}
            assert reasons == ({"answered without calling calculator"} if suspects else {None})
            assert all(t.to_record(bench.tokenizer)["suspect"] == t.suspect for t in trajs[:1])
    finally:
        POLICIES.pop("answer-only", None)
