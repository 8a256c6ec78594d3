"""Temperature, top-k and top-p per row, with the log-prob the trainer recomputes."""

import math

import torch

from toolrl.rollout.sampling import SamplingParams, sample_tokens

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def draws(params, n=4000, seed=0):
    logits = PROBS.log().repeat(n, 1)
    generator = torch.Generator().manual_seed(seed)
    tokens, logprobs = sample_tokens(logits, [params] * n, generator)
    return torch.bincount(tokens, minlength=4).float() / n, tokens, logprobs


def test_plain_sampling_follows_the_distribution():
    freq, _, _ = draws(SamplingParams(temperature=1.0))
    assert torch.allclose(freq, PROBS, atol=0.03)


def test_top_k_keeps_the_k_most_likely_renormalised():
    freq, _, _ = draws(SamplingParams(top_k=2))
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], torch.tensor([0.625, 0.375]), atol=0.03)


def test_top_p_keeps_the_smallest_set_reaching_p():
    freq, _, _ = draws(SamplingParams(top_p=0.7))  # 0.5 < 0.7 <= 0.8: tokens 0 and 1
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], torch.tensor([0.625, 0.375]), atol=0.03)
    freq, _, _ = draws(SamplingParams(top_p=0.01))  # the most likely token always stays
    assert freq[0] == 1


def test_logprob_is_the_tempered_full_softmax_whatever_was_cut():
    _, tokens, logprobs = draws(SamplingParams(temperature=0.5, top_k=2), n=50)
    full = torch.log_softmax(PROBS.log() / 0.5, -1)
    assert torch.allclose(logprobs, full[tokens])


def test_greedy_and_sampled_rows_in_one_batch():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens, logprobs = sample_tokens(logits, [SamplingParams(temperature=0.0), SamplingParams(top_k=1)])
    assert tokens.tolist() == [1, 1]
    assert math.isclose(float(logprobs[0]), float(torch.log_softmax(logits[0], -1)[1]), rel_tol=1e-6)


def test_draws_across_many_blocks_follow_the_distribution_and_skip_empty_tokens():
    """The two-level inverse CDF over a vocabulary of several blocks (and a partial last one): frequencies
    match, tokens without mass (whole blocks of them, and single ones between) are never drawn."""
    vocab = 1000
    probs = torch.zeros(vocab)
    chosen = torch.tensor([3, 255, 256, 511, 700, 701, 999])
    probs[chosen] = torch.tensor([0.2, 0.1, 0.05, 0.25, 0.15, 0.05, 0.2])
    n = 20000
    logits = probs.log().repeat(n, 1)
    tokens, _ = sample_tokens(logits, [SamplingParams()] * n, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=vocab).float() / n
    assert set(tokens.unique().tolist()) <= set(chosen.tolist())
    assert torch.allclose(freq[chosen], probs[chosen], atol=0.01)


def test_seeded_rows_draw_the_same_whatever_shares_the_batch():
    from toolrl.rollout.sampling import position_uniform

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    seeded = SamplingParams(seed=7)
    alone, _ = sample_tokens(logits[1:2], [seeded], torch.Generator().manual_seed(1), positions=[12])
    together, _ = sample_tokens(
        logits[[0, 1, 2]], [SamplingParams(), seeded, SamplingParams(seed=8)], torch.Generator(), positions=[5, 12, 3]
    )
    assert together[1] == alone[0]
    assert position_uniform(7, 12) == position_uniform(7, 12) != position_uniform(7, 13)
    draws = [position_uniform(3, p) for p in range(2000)]
    assert min(draws) >= 0 and max(draws) < 1 and abs(sum(draws) / len(draws) - 0.5) < 0.03


def test_seeded_draws_survive_the_rounding_a_batch_brings():
    """Logits of a row computed in a padded batch differ from the same row alone in the last bits (the tiny
    Qwen2.5-VL's log-probs by up to 6e-6); the seeded draw must not move with them. An inverse CDF flipped
    to a neighbouring token in 15 of these 1,000 draws."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 49_152, 1000
    alone = (torch.randn(1, vocab, generator=g) * 3).repeat(n, 1)
    batched = alone + 2e-5 * torch.randn(n, vocab, generator=g)
    params, positions = [SamplingParams(seed=11)] * n, list(range(500, 500 + n))
    a, _ = sample_tokens(alone, params, positions=positions)
    b, _ = sample_tokens(batched, params, positions=positions)
    assert (a != b).sum() == 0
    assert len(set(a.tolist())) > 400  # and the draws do spread over the distribution


def test_seeded_draws_over_positions_follow_the_distribution():
    n = 4000
    tokens, _ = sample_tokens(PROBS.log().repeat(n, 1), [SamplingParams(seed=5)] * n, positions=list(range(n)))
    assert torch.allclose(torch.bincount(tokens, minlength=4).float() / n, PROBS, atol=0.03)
