import math

import pytest
import torch

from toolrl.algos import ADVANTAGES, AdvantageInputs, group_advantages, informative_groups
from toolrl.algos.correction_options import GDPOOptions


def test_grpo_advantages_match_hand_computed_values():
    # group 1: [1, 0, 0, 1] mean 0.5, unbiased std sqrt(1/3) = 0.57735
    # group 2: [2, 2, 2, 2] all equal -> zero advantages
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, group_size=4, eps=0.0)
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_unscaled_advantages_are_mean_centred_only():
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0]), group_size=3, scale=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_eps_keeps_near_equal_groups_finite():
    adv = group_advantages(torch.tensor([1.0, 1.0 + 1e-9]), group_size=2, eps=1e-4)
    assert torch.isfinite(adv).all() and adv.abs().max() < 1e-3


def test_estimators_broadcast_the_sequence_advantage_to_its_tokens():
    # two groups of 2: rewards [1, 0 | 3, 3]; tokens per trajectory [2, 1, 1, 2]
    x = AdvantageInputs(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, [2, 1, 1, 2], eps=0.0)
    # GRPO: group 1 mean 0.5, std sqrt(0.5) = 0.7071 -> +-0.7071; group 2 all equal -> 0
    a = 0.5 / math.sqrt(0.5)
    assert ADVANTAGES["grpo"](x).advantages.tolist() == pytest.approx([a, a, -a, 0, 0, 0])
    assert ADVANTAGES["dr_grpo"](x).advantages.tolist() == pytest.approx([0.5, 0.5, -0.5, 0, 0, 0])
    # RLOO: reward minus the mean of the others: 1 - 0 = 1, 0 - 1 = -1
    assert ADVANTAGES["rloo"](x).advantages.tolist() == pytest.approx([1, 1, -1, 0, 0, 0])


def test_rloo_leave_one_out_by_hand_for_a_group_of_three():
    x = AdvantageInputs(torch.tensor([3.0, 0.0, 0.0]), 3, [1, 1, 1])
    # 3 - mean(0, 0) = 3; 0 - mean(3, 0) = -1.5
    assert ADVANTAGES["rloo"](x).advantages.tolist() == pytest.approx([3.0, -1.5, -1.5])


def test_per_token_rewards_enter_the_sequence_score():
    # a KL penalty as reward: trajectory 0 pays 0.25 + 0.25 -> scores [0.5, 0]
    x = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [2, 1], token_rewards=torch.tensor([-0.25, -0.25, 0.0]))
    assert ADVANTAGES["dr_grpo"](x).advantages.tolist() == pytest.approx([0.25, 0.25, -0.25])


def test_reinforce_pp_returns_to_go_whitened_over_the_step():
    # baseline: rewards [2, 0] minus group mean 1 -> [1, -1]; token rewards [0, -1 | 0.5]
    # returns to go: traj 0: [1 + (0 - 1), 1 + (-1)] = [0, 0]; traj 1: [-1 + 0.5] = [-0.5]
    x = AdvantageInputs(torch.tensor([2.0, 0.0]), 2, [2, 1], token_rewards=torch.tensor([0.0, -1.0, 0.5]), eps=0.0)
    returns = torch.tensor([0.0, 0.0, -0.5])
    expect = (returns - returns.mean()) / returns.std()
    assert torch.allclose(ADVANTAGES["reinforce_pp"](x).advantages, expect, atol=1e-6)


def test_reinforce_pp_with_gamma_0_credits_each_token_with_its_own_reward_only():
    """On-policy distillation's per-token reverse KL: with gamma 0 a token's return is its own KL, so a long
    sample is not charged at its first token for every later token (gamma 1 is the undiscounted sum)."""
    kl = torch.tensor([-1.0, -1.0, -1.0, -1.0, -0.5])  # a 4-token sample, then a 1-token one
    x = AdvantageInputs(torch.zeros(2), 2, [4, 1], token_rewards=kl, eps=0.0, gamma=0.0)
    assert torch.allclose(ADVANTAGES["reinforce_pp"](x).advantages, (kl - kl.mean()) / kl.std(), atol=1e-6)
    summed = torch.tensor([-4.0, -3.0, -2.0, -1.0, -0.5])  # gamma 1: returns to go
    x1 = AdvantageInputs(torch.zeros(2), 2, [4, 1], token_rewards=kl, eps=0.0, gamma=1.0)
    assert torch.allclose(ADVANTAGES["reinforce_pp"](x1).advantages, (summed - summed.mean()) / summed.std(), atol=1e-6)
    half = torch.tensor([-1.875, -1.75, -1.5, -1.0, -0.5])  # gamma 0.5
    x5 = AdvantageInputs(torch.zeros(2), 2, [4, 1], token_rewards=kl, eps=0.0, gamma=0.5)
    assert torch.allclose(ADVANTAGES["reinforce_pp"](x5).advantages, (half - half.mean()) / half.std(), atol=1e-6)


def test_gae_by_hand():
    # one trajectory of 3 tokens, reward 1 at the end, values [0.5, 0.2, 0.4], gamma 1, lam 0.5
    # deltas: t0: 0 + 0.2 - 0.5 = -0.3; t1: 0 + 0.4 - 0.2 = 0.2; t2: 1 + 0 - 0.4 = 0.6
    # A2 = 0.6; A1 = 0.2 + 0.5 * 0.6 = 0.5; A0 = -0.3 + 0.5 * 0.5 = -0.05
    x = AdvantageInputs(torch.tensor([1.0]), 1, [3], values=torch.tensor([0.5, 0.2, 0.4]), lam=0.5, eps=0.0)
    out = ADVANTAGES["gae"](x)
    raw = torch.tensor([-0.05, 0.5, 0.6])
    assert out.returns.tolist() == pytest.approx((raw + torch.tensor([0.5, 0.2, 0.4])).tolist())
    assert torch.allclose(out.advantages, (raw - raw.mean()) / raw.std(), atol=1e-6)


def test_gae_does_not_bootstrap_across_trajectories():
    x = AdvantageInputs(
        torch.tensor([1.0, 0.0]), 1, [1, 1], values=torch.tensor([0.0, 5.0]), gamma=1.0, lam=1.0, eps=0.0
    )
    assert ADVANTAGES["gae"](x).returns.tolist() == pytest.approx([1.0, 0.0])  # not 1 + 5


def test_informative_groups_drops_groups_with_equal_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert informative_groups(rewards, 2).tolist() == [False, False, True, True, False, False]


def test_invalid_trajectories_are_left_out_of_their_groups_statistics():
    # group [1, 0, 0, x]: x was hit by a tool crash (its reward 0 says nothing about the model).
    # Over the valid three: mean 1/3, unbiased std sqrt(1/3) = 0.57735
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    valid = torch.tensor([True, True, True, False])
    mean, std = 1 / 3, math.sqrt(1 / 3)
    expected = [(1 - mean) / std, -mean / std, -mean / std, 0.0]
    assert group_advantages(rewards, 4, eps=0.0, valid=valid).tolist() == pytest.approx(expected, abs=1e-6)
    x = AdvantageInputs(rewards, 4, [1, 2, 1, 1], eps=0.0, valid=valid)
    assert ADVANTAGES["grpo"](x).advantages.tolist() == pytest.approx(
        [expected[0], expected[1], expected[1], expected[2], 0.0], abs=1e-6
    )
    # RLOO over the valid three: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    assert ADVANTAGES["rloo"](x).advantages.tolist() == pytest.approx([1.0, -0.5, -0.5, -0.5, 0.0])
    assert ADVANTAGES["dr_grpo"](x).advantages.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1 / 3, 0.0])
    # all valid: the same as no mask at all
    full = AdvantageInputs(rewards, 4, [1, 2, 1, 1], eps=0.0, valid=torch.ones(4, dtype=torch.bool))
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        plain = AdvantageInputs(rewards, 4, [1, 2, 1, 1], eps=0.0)
        assert torch.allclose(ADVANTAGES[name](full).advantages, ADVANTAGES[name](plain).advantages, atol=1e-6)


def test_a_group_with_one_valid_member_learns_nothing_and_whitening_skips_invalid_tokens():
    valid = torch.tensor([True, False])
    x = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [2, 1], eps=0.0, valid=valid)
    assert ADVANTAGES["grpo"](x).advantages.tolist() == [0.0, 0.0, 0.0]
    assert ADVANTAGES["rloo"](x).advantages.tolist() == [0.0, 0.0, 0.0]
    y = AdvantageInputs(torch.tensor([2.0, 0.0, 1.0, 5.0]), 2, [1, 1, 1, 1], eps=0.0, valid=valid.repeat(2))
    out = ADVANTAGES["reinforce_pp"](y).advantages
    assert out[1] == 0 and out[3] == 0  # invalid tokens: 0, and outside the whitening statistics


def test_informative_groups_judge_only_valid_members():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    valid = torch.tensor([True, False, True, True])
    assert informative_groups(rewards, 2, valid).tolist() == [False, False, False, False]
    assert informative_groups(rewards, 2).tolist() == [True, True, False, False]


def test_gigpo_adds_turn_advantages_from_anchor_state_groups_by_hand():
    """Two trajectories of one group. Trajectory-level: rewards [1, 0] -> +-0.7071. Turn returns (gamma 1, the
    trajectory's reward at its last turn): t0 [1.5, 1.5], t1 [0, 0, 0]. Anchor groups: state s0 {1.5, 0} and
    state A {1.5, 0} -> +-0.7071 each; state B has one member -> 0."""
    from toolrl.algos import TurnInput

    turns = [
        [TurnInput(2, 0.0, "s0"), TurnInput(1, 0.5, "A")],
        [TurnInput(1, 0.0, "s0"), TurnInput(2, 0.0, "A"), TurnInput(1, 0.0, "B")],
    ]
    x = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 4], eps=0.0, gamma=1.0, turns=turns)
    a = math.sqrt(0.5)
    expected = [2 * a] * 3 + [-2 * a] * 3 + [-a]
    assert ADVANTAGES["gigpo"](x).advantages.tolist() == pytest.approx(expected, abs=1e-6)
    # omega 0: the trajectory-level advantage alone (GRPO); no turn inputs: GRPO too
    plain = ADVANTAGES["grpo"](AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 4], eps=0.0)).advantages
    x0 = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 4], eps=0.0, gamma=1.0, turns=turns, step_weight=0.0)
    assert torch.allclose(ADVANTAGES["gigpo"](x0).advantages, plain)
    none = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 4], eps=0.0)
    assert torch.allclose(ADVANTAGES["gigpo"](none).advantages, plain)


def test_igpo_standardizes_a_groups_turn_rewards_together_and_sums_them_to_go_by_hand():
    """IGPO: trajectory 0 has two turns, credits 0.2 and 0.5, outcome 1: its last turn's credit gives way to the
    outcome, rewards [0.2, 1.0]; trajectory 1 has one turn (credit 0.3), outcome 0: [0.0]. The group's turn
    rewards [0.2, 1.0, 0.0]: mean 0.4, unbiased std sqrt(0.28); standardized [-0.2, 0.6, -0.4] / sqrt(0.28).
    gamma 1: trajectory 0's first turn gets (-0.2 + 0.6) / sqrt(0.28), its second 0.6 / sqrt(0.28)."""
    from toolrl.algos import TurnInput

    turns = [[TurnInput(2, 0.2, "s0", credit=0.2), TurnInput(1, 0.5, "a", credit=0.5)],
             [TurnInput(3, 0.3, "s0", credit=0.3)]]  # fmt: skip
    x = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 3], eps=0.0, gamma=1.0, turns=turns)
    s = math.sqrt(0.28)
    expected = [0.4 / s] * 2 + [0.6 / s] + [-0.4 / s] * 3
    assert ADVANTAGES["igpo"](x).advantages.tolist() == pytest.approx(expected, abs=1e-6)
    # gamma 0.5: the first turn gets -0.2 / s + 0.5 * 0.6 / s
    half = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [3, 3], eps=0.0, gamma=0.5, turns=turns)
    assert ADVANTAGES["igpo"](half).advantages[0].item() == pytest.approx(0.1 / s, abs=1e-6)


def test_igpo_learns_from_credits_where_outcomes_tie_but_never_pays_a_lone_turns_own_text():
    """A group whose outcomes are all 0: the turns before the last still differ by their credit (GRPO gives 0).
    A group of one-turn trajectories that all fail: each last turn's credit (the frozen model reading back what
    the policy wrote) is left out, so nothing is paid; an invalid trajectory gets 0 and is out of the stats."""
    from toolrl.algos import TurnInput

    tied = [[TurnInput(1, 0.4, "s", credit=0.4), TurnInput(1, 0.0, "a")],
            [TurnInput(1, -0.4, "s", credit=-0.4), TurnInput(1, 0.0, "b")]]  # fmt: skip
    x = AdvantageInputs(torch.tensor([0.0, 0.0]), 2, [2, 2], eps=0.0, turns=tied)
    advantages = ADVANTAGES["igpo"](x).advantages
    assert advantages[0] > 0 > advantages[2] and ADVANTAGES["grpo"](x).advantages.abs().max() == 0
    lone = [[TurnInput(2, 0.9, "s", credit=0.9)], [TurnInput(2, -0.7, "s", credit=-0.7)]]
    assert (
        ADVANTAGES["igpo"](AdvantageInputs(torch.tensor([0.0, 0.0]), 2, [2, 2], turns=lone)).advantages.abs().max() == 0
    )
    valid = torch.tensor([True, False, True, True])
    turns = [[TurnInput(1, 0.0, "s")]] * 4
    x = AdvantageInputs(torch.tensor([1.0, 5.0, 0.0, 0.0]), 2, [1, 1, 1, 1], eps=0.0, valid=valid, turns=turns)
    assert ADVANTAGES["igpo"](x).advantages.tolist() == [0.0, 0.0, 0.0, 0.0]  # a group of one valid member


def test_gigpo_discounts_later_turn_rewards():
    from toolrl.algos import TurnInput

    # one trajectory alone in its group: the trajectory level is 0; two trajectories sharing both states.
    turns = [[TurnInput(1, 1.0, "a"), TurnInput(1, 0.0, "b")], [TurnInput(1, 0.0, "a"), TurnInput(1, 1.0, "b")]]
    x = AdvantageInputs(torch.tensor([0.0, 0.0]), 2, [2, 2], eps=0.0, gamma=0.5, turns=turns)
    # returns: traj 0 [1 + 0.5 * 0, 0] = [1, 0]; traj 1 [0 + 0.5 * 1, 1] = [0.5, 1]
    # state a {1, 0.5}: +-0.7071; state b {0, 1}: -+0.7071
    a = math.sqrt(0.5)
    assert ADVANTAGES["gigpo"](x).advantages.tolist() == pytest.approx([a, -a, -a, a], abs=1e-6)


def gdpo_inputs(components, weights, group_size, **more):
    components, weights = torch.tensor(components), torch.tensor(weights)
    return AdvantageInputs(components @ weights, group_size, [1] * len(components), components=components,
                           component_weights=weights, component_names=[f"c{k}" for k in range(len(weights))],
                           **more)  # fmt: skip


def test_gdpo_normalizes_each_component_in_its_group_before_summing_by_hand():
    """Equal totals, different components: GRPO gives the first three rollouts one advantage, GDPO gives the one
    that hit the component most of the group missed more. c0 [1, 0, 0, 0]: mean 1/4, unbiased std 1/2 ->
    [1.5, -0.5, -0.5, -0.5]; c1 [0, 1, 1, 0]: mean 1/2, std sqrt(1/3) -> [-0.866, 0.866, 0.866, -0.866]."""
    x = gdpo_inputs([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [1.0, 1.0], 4,
                    options=GDPOOptions(batch_norm=False), eps=0.0)  # fmt: skip
    s = math.sqrt(1 / 3)
    expected = [1.5 - 0.5 / s, -0.5 + 0.5 / s, -0.5 + 0.5 / s, -0.5 - 0.5 / s]
    assert ADVANTAGES["gdpo"](x).advantages.tolist() == pytest.approx(expected, abs=1e-6)
    grpo = ADVANTAGES["grpo"](x).advantages.tolist()
    assert grpo[0] == pytest.approx(grpo[1]) and expected[0] != pytest.approx(expected[1])
    whitened = ADVANTAGES["gdpo"](gdpo_inputs(x.components.tolist(), [1.0, 1.0], 4, eps=0.0)).advantages
    assert float(whitened.mean()) == pytest.approx(0.0, abs=1e-6) and float(whitened.std()) == pytest.approx(1.0)
    assert whitened.tolist() == pytest.approx(((torch.tensor(expected) - 0.0) / torch.tensor(expected).std()).tolist())


def test_gdpo_weighs_components_after_normalizing_them_and_leaves_invalid_rollouts_out():
    # weights scale a component's normalized advantage (normalizing the weighted component would undo them)
    x = gdpo_inputs([[1.0, 0.0], [0.0, 1.0]], [2.0, 1.0], 2, options=GDPOOptions(batch_norm=False), eps=0.0)
    s = math.sqrt(0.5)  # a pair [1, 0]: deviations +-1/2, unbiased std sqrt(1/2)
    assert ADVANTAGES["gdpo"](x).advantages.tolist() == pytest.approx([(2 - 1) * 0.5 / s, (1 - 2) * 0.5 / s])
    masked = gdpo_inputs([[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]], [1.0, 1.0], 3, valid=torch.tensor([True, True, False]),
                         options=GDPOOptions(batch_norm=False), eps=0.0)  # fmt: skip
    out = ADVANTAGES["gdpo"](masked).advantages.tolist()
    assert out[2] == 0.0 and out[0] == pytest.approx(out[1])  # the invalid one counts in no statistic
    plain = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, [1, 1])  # no components: GRPO
    assert ADVANTAGES["gdpo"](plain).advantages.tolist() == ADVANTAGES["grpo"](plain).advantages.tolist()


def test_ranks_line_their_components_up_by_name(monkeypatch):
    """Under torchrun each rank's trajectories may lack a component the other's have (a mix): the step's matrix
    joins them by name, 0 where a rank had none."""
    from toolrl import distributed

    first = gdpo_inputs([[1.0, 0.0]], [1.0, 0.5], 1)
    first.component_names = ["answer", "format"]
    second = (["answer", "search"], [[0.0, 1.0]], [1.0, 2.0])
    mine = (first.component_names, first.components.tolist(), first.component_weights.tolist())
    monkeypatch.setattr(distributed, "gather", lambda ctx, value: [mine, second])
    joined = distributed._joined_components(None, first)
    assert joined["component_names"] == ["answer", "format", "search"]
    assert joined["components"].tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    assert joined["component_weights"].tolist() == [1.0, 0.5, 2.0]


def test_roles_are_normalized_apart_within_their_group_by_hand():
    """A group of one proposed problem: a proposer's trajectory and three solvers'. The solvers' rewards [1, 1, 0]
    give [1/3, 1/3, -2/3] (dr_grpo: minus their mean, not the proposer's); the proposer alone in its role gets 0.
    Under grpo each role is divided by its own std; gigpo's turns compare within their role too."""
    rewards = torch.tensor([0.5, 1.0, 1.0, 0.0])
    roles = ["proposer", "solver", "solver", "solver"]
    x = AdvantageInputs(rewards, 4, [1, 1, 1, 1], roles=roles)
    assert ADVANTAGES["dr_grpo"](x).advantages.tolist() == pytest.approx([0.0, 1 / 3, 1 / 3, -2 / 3])
    std = math.sqrt(1 / 3)
    assert ADVANTAGES["grpo"](x).advantages.tolist() == pytest.approx(
        [0.0, (1 / 3) / (std + 1e-4), (1 / 3) / (std + 1e-4), (-2 / 3) / (std + 1e-4)]
    )
    assert ADVANTAGES["rloo"](x).advantages.tolist() == pytest.approx([0.0, 0.5, 0.5, -1.0])  # 3/2 x centred
    mixed = ADVANTAGES["dr_grpo"](AdvantageInputs(rewards, 4, [1, 1, 1, 1])).advantages.tolist()
    assert mixed == pytest.approx([-0.125, 0.375, 0.375, -0.625])  # one role: mean 0.625 with the proposer in it


def test_two_players_of_one_policy_each_learn_from_their_own_side():
    """Self-play, two groups of a game: per group, player A's two games and player B's two. A's rewards [1, 0] and
    B's [0, 1] are centred apart; an invalid trajectory is left out of its role's statistics only."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    roles = ["a", "a", "b", "b"] * 2
    valid = torch.tensor([True] * 7 + [False])
    x = AdvantageInputs(rewards, 4, [1] * 8, roles=roles, valid=valid)
    out = ADVANTAGES["dr_grpo"](x).advantages.tolist()
    assert out == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])  # group 2: b's only valid member alone
    kept = informative_groups(rewards, 4, valid, roles).tolist()
    assert kept == [True] * 4 + [False] * 4  # group 2: a's [1, 1] equal, b's one valid member: nothing to learn
