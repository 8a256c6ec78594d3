"""The rubric (weights, weight 0 = logged only, batched criteria) and the model judge (parsing, caching,
failures and garbage becoming a counted fallback; an OpenAI-compatible endpoint; a local model)."""

import asyncio

import pytest

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.config.schema import EnvConfig, JudgeConfig
from toolrl.envs import Task, make_env
from toolrl.errors import ConfigError
from toolrl.rewards.judge import ModelJudge, make_judge, parse_score
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rollout.trajectory import Trajectory


def traj(answer: str, question: str = "What is 2 + 2?", gold: str = "4") -> Trajectory:
    t = Trajectory.start(Task("t", question, gold), [1])
    t.add_model_turn([2], [0.0], f"<answer>{answer}</answer>")
    return t


class Doubler:
    """A batched criterion that records its batches."""

    def __init__(self):
        self.batches = []

    async def score_batch(self, trajs):
        self.batches.append(len(trajs))
        return [2.0 * len(t.final_text) for t in trajs]


def test_weights_zero_weight_is_logged_only_and_batched_criteria():
    doubler = Doubler()
    rubric = Rubric([Criterion("len", lambda t, task: len(t.final_text), 0.5), Criterion("big", doubler, 0.0)])
    trajs = [traj("4"), traj("five")]
    asyncio.run(rubric.score_all(trajs))
    assert doubler.batches == [2]  # one call for the whole batch
    assert trajs[0].rewards == {"len": 18.0, "big": 36.0} and trajs[0].reward == 9.0  # "<answer>4</answer>"
    reweighted = rubric.with_weights({"big": 1.0})
    asyncio.run(reweighted.score_all(trajs))
    assert trajs[1].reward == pytest.approx(0.5 * 21 + 42)
    with pytest.raises(ConfigError, match=r"env\.reward_weights: no criterion named 'nope'"):
        rubric.with_weights({"nope": 1.0})


def test_env_reward_weights_from_config():
    env = make_env(
        EnvConfig(reward_weights={"tool_calls": -0.1, "format": 0.0}, options={"num_train": 1, "num_test": 1})
    )
    weights = {c.name: c.weight for c in env.rubric.criteria}
    assert weights == {"correct": 1.0, "format": 0.0, "tool_calls": -0.1, "tool_errors": 0.0}


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Score: 7", 0.7),
        ("reasoning... score = 10", 1.0),
        ("8", 0.8),
        ("I give 3 of 10", None),
        ("Score: 11", None),
        ("", None),
    ],
)
def test_parse_score(reply, score):
    assert parse_score(reply, 10) == (pytest.approx(score) if score is not None else None)


def test_judge_caches_and_falls_back_on_failures_and_garbage():
    asked = []

    def ask(prompt):
        asked.append(prompt)
        if "boom" in prompt:
            raise ConnectionError("judge down")
        reply = prompt.split("Assistant's final reply: ")[1].splitlines()[0]
        return "Score: 9" if reply == "4" else "hmm"

    judge = ModelJudge(ask=ask, fallback=0.25)
    trajs = [traj("4"), traj("4"), traj("boom"), traj("7")]
    assert asyncio.run(judge.score_batch(trajs)) == [pytest.approx(0.9), pytest.approx(0.9), 0.25, 0.25]
    assert len(asked) == 3  # the same prompt is asked once
    assert asyncio.run(judge.score_batch([traj("4")])) == [pytest.approx(0.9)]
    assert len(asked) == 3  # cached
    assert judge.stats["failures"] == 1 and judge.stats["unparsed"] == 1 and judge.stats["fallbacks"] == 2
    asyncio.run(judge.score_batch([traj("boom")]))
    assert len(asked) == 4  # a failure is asked again, not cached


def test_judge_through_an_openai_compatible_endpoint_and_in_the_rubric():
    with LocalHTTPServer() as server:
        # the test server's chat endpoint answers with the prompt upper-cased: "SCORE: 6"
        config = JudgeConfig(weight=1.0, base_url=server.url + "/v1", model="judge", template="Score: 6 for {response}")
        env = make_env(EnvConfig(judge=config, options={"num_train": 1, "num_test": 1}))
        t = traj("4")
        asyncio.run(env.rubric.score_all([t]))
        assert t.rewards["judge"] == pytest.approx(0.6)
        assert t.reward == pytest.approx(1.0 + 0.1 + 0.6)  # correct + format + judge
        assert env.rubric.stats()["judge/asked"] == 1
    broken = make_judge(JudgeConfig(base_url="http://127.0.0.1:9/v1", fallback=0.1, timeout_s=2), "m")
    assert asyncio.run(broken.score_batch([traj("4")])) == [0.1]  # nothing listening: the fallback, no crash


def test_local_hf_judge_batches_and_never_crashes_on_garbage(tiny_model_dir):
    judge = make_judge(JudgeConfig(max_new_tokens=4, fallback=-1.0), str(tiny_model_dir))
    scores = asyncio.run(judge.score_batch([traj("4"), traj("5"), traj("6")]))
    assert len(scores) == 3 and all(s == -1.0 or 0.0 <= s <= 1.0 for s in scores)
    assert judge.stats["asked"] == 3 and judge.stats["failures"] == 0


def test_a_judge_template_with_an_unknown_field_is_a_config_error():
    with pytest.raises(ConfigError, match=r"env.judge.template: cannot fill it \(KeyError: 'reply'\)"):
        make_judge(JudgeConfig(template="Rate {reply}"), "m")
