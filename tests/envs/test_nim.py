"""Nim, the self-play environment: the game's rules by hand; two seats of one task played by the policy in one
rollout, each a trajectory with its role and the other seat's moves in its observations; a seat that stops gives
the game up and never leaves the other waiting; an unpaired episode, a model opponent, and lock-step scheduling
(which cannot play a seat against another) said in one line."""

from __future__ import annotations

import re

import pytest

from tests.gateway.policies import RulePolicy, call, last_message
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.nim.game import Table, best_move, move_error, winnable
from toolrl.errors import ConfigError
from toolrl.parsers import get_parser
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.tools import ToolExecutor


def test_the_rules_by_hand():
    assert [best_move(p, 3) for p in (5, 6, 7, 8, 9)] == [1, 2, 3, 1, 1]  # 8: lost, take one and hope
    assert [winnable(p, 3, 0) for p in (4, 5, 8, 9)] == [False, True, False, True]
    assert [winnable(p, 3, 1) for p in (4, 5, 8, 9)] == [True, False, True, False]
    assert move_error(2, 3, 3) == "you may take 1 to 2 stones (2 left), not 3"
    assert move_error(9, 3, True) and move_error(9, 3, "2") and move_error(9, 3, 0) and not move_error(9, 3, 3)
    table = Table(5, 3)
    table.move(0, 1)
    table.move(1, 3)
    table.forfeit(1)
    assert (table.pile, table.winner, table.how, table.moves) == (1, 0, "forfeit", [(0, 1), (1, 3)])
    table.forfeit(0)  # over already: nothing changes
    assert table.winner == 0


def perfect(context: str, params) -> str:
    """Perfect play on what the last message says is left."""
    piles = re.findall(r"(\d+) stones(?:\. You move| are left)|leaving (\d+)", last_message(context)[1])
    left = int(next(p for p in piles[-1] if p))
    return call("take", n=best_move(left, 3))


def rollout(chat, rule, schedule="async", max_turns=12, **options):
    env = make_env(EnvConfig(name="nim", options={"min_stones": 7, "max_stones": 8, **options}))
    limits = RolloutLimits(max_turns, 64, 2000, 200)
    parser = get_parser("hermes")
    return env, Rollout(env, RulePolicy(chat, rule), chat, parser, ToolExecutor([]), limits, schedule)


def test_two_seats_of_a_task_play_each_other_each_its_own_trajectory(chat):
    env, roll = rollout(chat, perfect)
    seven = env.tasks("train")[0]
    trajs = roll.run([seven] * 4, seed=3)
    assert [t.role for t in trajs] == ["first", "second"] * 2
    assert [t.rewards for t in trajs] == [{"win": 1.0, "played": 1.0}, {"win": 0.0, "played": 1.0}] * 2
    assert [t.num_tool_calls for t in trajs] == [2, 1] * 2  # 7: take 3; 4: take 1; 3: take 3
    first, second = trajs[:2]
    prompt = chat.tokenizer.decode(second.token_ids[: second.prompt_length])
    opening = "New game: 7 stones. You move second. Your opponent took 3, leaving 4. Your move."
    assert prompt.endswith(opening + "<|im_end|>\n<|im_start|>assistant\n")
    told = chat.tokenizer.decode(first.token_ids[first.prompt_length :])
    assert "You took 3, leaving 4. Your opponent took 1, leaving 3. Your move." in told
    assert "You took 3, leaving 0. The last stone was taken: you win." in told
    assert all(t.stop_reason == "env_done" for t in trajs)


def test_a_seat_that_stops_gives_the_game_up_and_the_other_is_not_left_waiting(chat):
    def words_first(context: str, params) -> str:  # the first seat answers in words: it gives the game up
        return (
            "I think I will win." if "You move first" in context.split("New game: 7")[-1] else perfect(context, params)
        )

    env, roll = rollout(chat, words_first)  # reminded twice (nudges: 2), then the game is given up
    first, second = roll.run([env.tasks("train")[0]] * 2, seed=1)
    assert (first.stop_reason, first.num_turns, first.rewards) == ("no_tool_call", 3, {"win": 0.0, "played": 0.0})
    assert chat.tokenizer.decode(first.token_ids).count("Your move: 7 stones are left; take 1 to 3.") == 2
    assert (second.stop_reason, second.rewards, second.num_turns) == ("env_done", {"win": 1.0, "played": 1.0}, 0)

    def words_once(context: str, params) -> str:  # a reminder, and the first seat plays (and wins) after all
        reminded = "Your move: 7 stones are left" in context.split("New game: 7")[-1]
        return perfect(context, params) if reminded or "You move second" in context else "Let me think."

    env, roll = rollout(chat, words_once)
    first, second = roll.run([env.tasks("train")[0]] * 2, seed=1)
    assert (first.rewards, second.rewards) == ({"win": 1.0, "played": 1.0}, {"win": 0.0, "played": 1.0})

    def illegal_second(context: str, params) -> str:  # the second seat takes too many until its turns run out
        return call("take", n=9) if "You move second" in context else perfect(context, params)

    env, roll = rollout(chat, illegal_second, max_turns=3)
    first, second = roll.run([env.tasks("train")[0]] * 2, seed=1)
    assert (second.stop_reason, second.num_turns, second.num_tool_calls) == ("max_turns", 3, 2)  # the last not run
    assert (first.rewards, second.rewards) == ({"win": 1.0, "played": 1.0}, {"win": 0.0, "played": 0.0})
    assert "A player gave up: you win." in chat.tokenizer.decode(first.token_ids)


def test_an_unpaired_episode_plays_the_unpaired_opponent(chat):
    env, roll = rollout(chat, perfect, unpaired="best")
    trajs = roll.run([env.tasks("train")[0]] * 3, seed=0)
    assert [t.role for t in trajs] == ["first", "second", "first"] and env.counts["unpaired"] == 1
    assert [t.reward for t in trajs] == [1.25, 0.25, 1.25]  # 7 stones: the first seat wins by perfect play
    assert env.waiting == {}


def test_a_model_opponent_that_gives_no_legal_move_gives_the_game_up(chat, tiny_model_dir):
    """The tiny random model writes no take call: each of its games is the policy's after `tries` samples."""
    opponent = {"path": str(tiny_model_dir), "tries": 2, "max_tokens": 8}
    env, roll = rollout(chat, perfect, opponent=opponent)
    tasks = [t for t in env.tasks("train") if t.meta["seat"] == 1][:2]  # the opponent moves first
    trajs = roll.run(tasks, seed=0)
    assert [(t.role, t.reward, t.num_turns, t.stop_reason) for t in trajs] == [("second", 1.25, 0, "env_done")] * 2


def test_lockstep_cannot_seat_two_trajectories_and_says_so(chat):
    env, roll = rollout(chat, perfect, schedule="lockstep", wait_s=0.2)
    with pytest.raises(ConfigError, match=r"env.options.wait_s \(0.2 s\).*rollout.schedule: async"):
        roll.run([env.tasks("train")[0]] * 2, seed=0)


def test_the_test_split_covers_both_seats_and_its_reference_wins():
    env = make_env(EnvConfig(name="nim", options={"num_test": 22}))
    tests = env.tasks("test")
    assert sorted((t.meta["pile"], t.meta["seat"]) for t in tests) == [(p, s) for p in range(5, 16) for s in (0, 1)]
    with_reference = [t for t in tests if env.reference(t) is not None]
    assert all(winnable(t.meta["pile"], 3, t.meta["seat"]) for t in with_reference) and len(with_reference) == 11


def test_roles_of_an_environment_of_ones_own_train_on_their_own_baselines(chat, tiny_model_dir, tmp_path):
    """tests/fixtures/solver_judge.py (outside toolrl): the judges open on their solvers' answers; a solver that is
    right twice of three times gets [1/3, 1/3, -2/3] (dr_grpo within its role), and so do the judges that always
    say right."""
    from toolrl.config import load_config
    from toolrl.train import Trainer, Workbench

    config = load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", "env.name=solver-judge",
                                    "env.module=tests.fixtures.solver_judge", "train.advantage=dr_grpo",
                                    f"output_dir={tmp_path}"])  # fmt: skip
    bench = Workbench.load(config)
    answers = iter(["It is 6.", "6", "It is 7."])

    def solve_or_judge(context: str, params) -> str:
        return call("verdict", right=True) if "The solver answered" in context else next(answers)

    try:
        env = bench.env
        roll = Rollout(env, RulePolicy(chat, solve_or_judge), chat, get_parser("hermes"), ToolExecutor([]),
                       RolloutLimits(3, 128, 400, 200))  # fmt: skip
        trajs = roll.run([env.tasks("train")[0]] * 6, seed=0)
        assert [t.role for t in trajs] == ["solver", "judge"] * 3
        assert [t.reward for t in trajs] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
        assert "The solver answered: 'It is 7.'" in chat.tokenizer.decode(trajs[5].token_ids)
        values = Trainer(bench).update(trajs).values
        first = [v.advantages[0] if v is not None else 0.0 for v in values]
        assert first == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3, -2 / 3])
    finally:
        bench.close()


def test_self_play_runs_from_the_command_line(tmp_path, tiny_model_dir):
    """`toolrl train` of nim: a step's seats are paired (roles first and second, half each), and each role's
    metrics are written; the tiny model gives its games up, so the second seats win them."""
    from tests.harness.cli_train import train_steps

    steps = train_steps(tmp_path, tiny_model_dir, "env.name=nim", "train.prompts_per_step=2", "train.group_size=4",
                        "rollout.max_new_tokens=8")  # fmt: skip
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["role/first/share"] == s["role/second/share"] == 0.5
        assert s["role/second/success"] >= s["role/first/success"]
