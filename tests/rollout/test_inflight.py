"""Partial rollouts in the hf engine: weights a trainer posts while sequences are being sampled are taken at the next
step boundary; each token is tagged with the version that sampled it; `continue` keeps the cached keys and values,
`cut` computes every sequence's context again with the new weights (rollout/inflight.py)."""

import asyncio
import copy

import pytest
import torch

from tests.rollout.test_engine import expected_logprobs
from toolrl.rollout import HFEngine, SamplingParams
from toolrl.rollout.inflight import WeightInbox

CONTEXTS = [[5, 9, 11, 3, 7, 21, 8], [5, 9, 11, 3, 40, 2]]
SWAP_AFTER = 3
NEW = 12


def policies(tiny_model):
    """The generation copy (version 0) and the trainer's weights after an update (version 1), far apart."""
    generator, trained = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    return generator, trained


def sample(engine, inbox, post_after: int | None):
    """Both contexts at once, 12 tokens each; the trainer posts version 1 once the first has `post_after` tokens."""
    told = {0: 0}

    def heard(ids):
        told[0] += len(ids)
        if post_after is not None and told[0] >= post_after:
            inbox.post(1)

    async def both():
        params = SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=3)
        first = engine.generate_stream("a", CONTEXTS[0], params, heard)
        return await asyncio.gather(first, engine.generate("b", CONTEXTS[1], params))

    return engine.run(both())


def engine_with(generator, trained, mode):
    inbox = WeightInbox(mode, generator, trained.state_dict)
    engine = HFEngine(generator, [], 0, torch.device("cpu"), seed=1)  # no stop id: every sequence runs 12 tokens
    engine.inbox = inbox
    return engine, inbox


@pytest.mark.parametrize("mode", ["continue", "cut"])
def test_weights_posted_mid_turn_are_taken_between_steps_and_tag_each_token(tiny_model, mode):
    generator, trained = policies(tiny_model)
    engine, inbox = engine_with(generator, trained, mode)
    a, b = sample(engine, inbox, SWAP_AFTER)
    assert a.versions == [0] * SWAP_AFTER + [1] * (NEW - SWAP_AFTER)
    assert b.versions == a.versions  # the other sequence in flight took them at the same step
    assert engine.weights_version == 1 and inbox.taken == 1 and inbox.swaps_in_flight == 1
    assert engine.stats["weight_swaps"] == 1
    assert all(torch.equal(p, q) for p, q in zip(generator.parameters(), trained.parameters(), strict=True))
    old = expected_logprobs(tiny_model, CONTEXTS[0], a.ids, 1.0)
    new = expected_logprobs(trained, CONTEXTS[0], a.ids, 1.0)
    assert a.logprobs[:SWAP_AFTER] == pytest.approx(old[:SWAP_AFTER], abs=1e-4)  # sampled by version 0
    after = a.logprobs[SWAP_AFTER:]
    assert all(abs(x - y) > 1e-3 for x, y in zip(after, old[SWAP_AFTER:], strict=True))  # not the old weights'
    if mode == "cut":  # the whole context computed again by the new weights: a full pass of them, token for token
        assert after == pytest.approx(new[SWAP_AFTER:], abs=1e-4)
    else:  # the earlier positions' keys and values are the old weights': not a full pass of the new ones
        assert any(abs(x - y) > 1e-4 for x, y in zip(after, new[SWAP_AFTER:], strict=True))


def test_without_partial_rollouts_a_turn_is_sampled_to_its_end_by_the_weights_it_began_with(tiny_model):
    generator, trained = policies(tiny_model)
    engine, inbox = engine_with(generator, trained, "off")
    a, _ = sample(engine, inbox, SWAP_AFTER)
    assert a.versions == [0] * NEW and inbox.taken == 0 and engine.stats["weight_swaps"] == 0
    assert a.logprobs == pytest.approx(expected_logprobs(tiny_model, CONTEXTS[0], a.ids, 1.0), abs=1e-4)


def test_a_half_written_update_is_never_read(tiny_model):
    """The trainer holds the inbox's lock while its optimizer writes: a take waits for the whole step."""
    import threading

    generator, trained = policies(tiny_model)
    inbox = WeightInbox("continue", generator, trained.state_dict)
    inbox.post(1)
    taken = []
    with inbox.writing():
        worker = threading.Thread(target=lambda: taken.append(inbox.take()))
        worker.start()
        worker.join(0.2)
        assert worker.is_alive() and not taken  # waiting for the step to end
        with torch.no_grad():
            next(trained.parameters()).add_(1.0)
    worker.join(5)
    assert taken == [1]
    assert torch.equal(next(generator.parameters()), next(trained.parameters()))


def test_an_unknown_mode_is_refused_in_one_line(tiny_model):
    with pytest.raises(ValueError, match="unknown mode 'later'; one of off, continue, cut"):
        WeightInbox("later", tiny_model, tiny_model.state_dict)
