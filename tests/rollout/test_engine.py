"""The cached batched sampler against a plain full forward pass of the same model."""

import torch

from toolrl.rollout.engine import HFEngine, common_prefix_length


def full_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    return torch.log_softmax(logits, -1)


def test_common_prefix_length_leaves_a_token_per_row():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix_length([[7], [7, 8]]) == 0


def test_multi_turn_sampling_matches_a_full_forward(tiny_model, tokenizer):
    prefix = tokenizer("<|im_start|>system\nshared system prompt and tools<|im_end|>\n")["input_ids"]
    prompts = [prefix + [100, 101, 102], prefix + [200], prefix + [300, 301]]
    engine = HFEngine(
        tiny_model, stop_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, device=torch.device("cpu")
    )
    session = engine.start(prompts)
    first = session.sample([0, 1, 2], [5, 7, 3], temperature=1.0)
    observations = {0: [400, 401, 402, 403], 2: [500]}
    session.keep([0, 2])
    session.extend(observations)
    second = session.sample([0, 2], [4, 6], temperature=0.7)

    for row in (0, 2):
        seq = prompts[row] + first[row].ids + observations[row] + second[row].ids
        a, b = len(prompts[row]), len(prompts[row]) + len(first[row].ids) + len(observations[row])
        lp1 = full_logprobs(tiny_model, seq, 1.0)
        lp2 = full_logprobs(tiny_model, seq, 0.7)
        expect1 = [float(lp1[p - 1, seq[p]]) for p in range(a, a + len(first[row].ids))]
        expect2 = [float(lp2[p - 1, seq[p]]) for p in range(b, b + len(second[row].ids))]
        assert torch.allclose(torch.tensor(first[row].logprobs), torch.tensor(expect1), atol=1e-4)
        assert torch.allclose(torch.tensor(second[row].logprobs), torch.tensor(expect2), atol=1e-4)
    assert [len(first[r].ids) for r in (0, 1, 2)] == [5, 7, 3]  # a random model does not stop early


def test_greedy_is_argmax_of_the_full_forward(tiny_model, tokenizer):
    prompt = tokenizer("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    engine = HFEngine(
        tiny_model, stop_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, device=torch.device("cpu")
    )
    out = engine.start([prompt, prompt]).sample([0, 1], [6, 6], temperature=0.0)
    seq = list(prompt)
    for token in out[0].ids:
        assert token == int(full_logprobs(tiny_model, seq)[-1].argmax())
        seq.append(token)
    assert out[0].ids == out[1].ids
