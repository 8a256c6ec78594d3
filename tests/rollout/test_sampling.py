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
