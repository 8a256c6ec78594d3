"""The continuous-batching engine against a plain full forward pass of the same model."""

import asyncio

import torch

from toolrl.rollout import HFEngine, SamplingParams
from toolrl.rollout.engine import common_prefix_length


def full_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    return torch.log_softmax(logits, -1)


def expected_logprobs(model, context, generated, temperature):
    lp = full_logprobs(model, context + generated, temperature)
    return [float(lp[len(context) + i - 1, t]) for i, t in enumerate(generated)]


def make_engine(model, tokenizer, **kwargs):
    return HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), **kwargs)


def test_common_prefix_length_leaves_a_token_per_row():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix_length([[7], [7, 8]]) == 0


def test_interleaved_multi_turn_requests_match_a_full_forward(tiny_model, tokenizer):
    """Sequences join and leave at different times (one comes back from a 'tool' while others decode); every
    log-prob equals the full forward's, so slots, positions and masks are exact."""
    prefix = tokenizer("<|im_start|>system\nshared system prompt and tool schemas, long enough<|im_end|>\n")
    prefix = prefix["input_ids"] + list(range(1000, 1020))
    prompts = [prefix + [100, 101, 102], prefix + [200], prefix + [300, 301], list(range(500, 530))]
    engine = make_engine(tiny_model, tokenizer)
    observation = {0: [400, 401, 402, 403], 2: [600]}

    async def trajectory(i, turns, delays, temperature):
        context, outs = list(prompts[i]), []
        for turn in range(turns):
            params = SamplingParams(temperature=temperature, max_new_tokens=[5, 7, 3, 4][i] + turn)
            out = await engine.generate(i, context, params)
            outs.append((list(context), out))
            context += out.ids + observation.get(i, [700])
            await asyncio.sleep(delays[turn])
        engine.release(i)
        return outs

    async def main():
        return await asyncio.gather(
            trajectory(0, 2, [0.05, 0], 1.0),
            trajectory(1, 1, [0], 1.0),
            trajectory(2, 3, [0, 0.02, 0], 0.7),
            trajectory(3, 2, [0.01, 0], 1.3),
        )

    results = asyncio.run(main())
    temperatures = [1.0, 1.0, 0.7, 1.3]
    for i, outs in enumerate(results):
        for context, out in outs:
            expect = expected_logprobs(tiny_model, context, out.ids, temperatures[i])
            assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4), i
    assert [len(o.ids) for _, o in results[2]] == [3, 4, 5]  # a random model does not stop early
    assert engine.stats["cascade_forwards"] > 0  # some steps read the shared prefix once (cascade.py)
    asyncio.run(engine.generate("next", prompts[3], SamplingParams(max_new_tokens=1)))
    assert list(engine.slots) == ["next"] and engine.slots["next"].index == 0  # released slots are reused


def test_greedy_is_argmax_and_rows_with_one_prompt_agree(tiny_model, tokenizer):
    prompt = tokenizer("<|im_start|>user\nhello there, this prompt is shared<|im_end|>\n<|im_start|>assistant\n")
    prompt = prompt["input_ids"]
    engine = make_engine(tiny_model, tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)

    async def main():
        return await asyncio.gather(*(engine.generate(i, prompt, greedy) for i in range(3)))

    outs = asyncio.run(main())
    seq = list(prompt)
    for token in outs[0].ids:
        assert token == int(full_logprobs(tiny_model, seq)[-1].argmax())
        seq.append(token)
    assert outs[0].ids == outs[1].ids == outs[2].ids


def test_a_slot_whose_context_diverged_starts_over(tiny_model, tokenizer):
    engine = make_engine(tiny_model, tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=3)
    asyncio.run(engine.generate("s", list(range(100, 140)), greedy))
    other = list(range(200, 230))
    second = asyncio.run(engine.generate("s", other, greedy))
    expect = expected_logprobs(tiny_model, other, second.ids, 1.0)
    assert torch.allclose(torch.tensor(second.logprobs), torch.tensor(expect), atol=1e-4)


def test_a_late_sequence_copies_a_cached_prefix_instead_of_computing_it(tiny_model, tokenizer):
    engine = make_engine(tiny_model, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    shared = list(range(300, 350))
    asyncio.run(engine.generate("a", shared + [1, 2], params))
    fed = engine.stats["prefill_tokens"]
    late = shared + [7, 8, 9]
    out = asyncio.run(engine.generate("b", late, params))
    assert engine.stats["prefill_tokens"] - fed == 3 and engine.stats["reused_prefix_tokens"] == 50
    expect = expected_logprobs(tiny_model, late, out.ids, 1.0)
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4)


def test_a_groups_samples_prefill_their_task_once(tiny_model, tokenizer):
    """Two groups of three samples after one system prompt: the prompt is computed once, each group's task once
    (its samples' slots get copies), and every sample's log-probs are the full forward's."""
    system = list(range(300, 340))
    tasks = {"a": [1, 2, 3, 4, 5, 6], "b": [7, 8, 9]}
    engine = make_engine(tiny_model, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)

    async def main():
        seqs = [(task, i) for i in range(3) for task in tasks]
        outs = await asyncio.gather(*(engine.generate(seq, system + tasks[seq[0]], params) for seq in seqs))
        return dict(zip(seqs, outs, strict=True))

    outs = asyncio.run(main())
    assert engine.stats["prefill_tokens"] == len(system) + 6 + 3
    assert engine.stats["reused_prefix_tokens"] == 5 * len(system) + 2 * (6 + 3)
    for (task, _), out in outs.items():
        expect = expected_logprobs(tiny_model, system + tasks[task], out.ids, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4)
    assert len({tuple(o.ids) for o in outs.values()}) > 2  # the copies sample on their own


def test_a_stop_token_ends_the_turn_and_is_the_last_id(tiny_model, tokenizer):
    prompt = tokenizer("<|im_start|>user\nstop here<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    first = int(full_logprobs(tiny_model, prompt)[-1].argmax())
    engine = HFEngine(tiny_model, [first], tokenizer.pad_token_id, torch.device("cpu"))
    out = asyncio.run(engine.generate("s", prompt, SamplingParams(temperature=0.0, max_new_tokens=5)))
    assert out.ids == [first] and out.ended


def test_cascade_and_per_slot_attention_sample_the_same(tiny_model, tokenizer):
    """Reading the shared prefix once per step gives the same tokens and log-probs as reading it per slot."""
    prefix = list(range(1000, 1040))
    prompts = [prefix + [100 + i] * (i + 1) for i in range(4)]

    def run(cascade):
        engine = make_engine(tiny_model, tokenizer, cascade=cascade, seed=3)

        async def trajectory(i):
            context = list(prompts[i])
            outs = []
            for _ in range(2):
                out = await engine.generate(i, context, SamplingParams(temperature=1.0, max_new_tokens=4 + i))
                outs.append(out)
                context += out.ids + [400 + i] * (i + 2)
            return outs

        async def main():
            return await asyncio.gather(*(trajectory(i) for i in range(4)))

        return asyncio.run(main()), engine.stats

    (with_cascade, stats), (without, plain_stats) = run(True), run(False)
    assert stats["cascade_forwards"] == stats["forwards"] > stats["decode_steps"]  # decodes and prefills
    assert plain_stats["cascade_forwards"] == 0
    for a, b in zip(with_cascade, without, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.ids == y.ids
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_a_seeded_sequence_samples_the_same_alone_or_batched(tiny_model, tokenizer):
    prompt = list(range(300, 330))
    seeded = SamplingParams(temperature=1.0, max_new_tokens=8, seed=42)

    async def batched():
        engine = make_engine(tiny_model, tokenizer, seed=5)
        others = [engine.generate(i, list(range(400 + i, 420 + i)), SamplingParams(max_new_tokens=8)) for i in range(3)]
        outs = await asyncio.gather(engine.generate("s", prompt, seeded), *others)
        return outs[0]

    alone = asyncio.run(make_engine(tiny_model, tokenizer, seed=9).generate("s", prompt, seeded))
    assert asyncio.run(batched()).ids == alone.ids


def test_slots_hold_only_what_follows_the_shared_prefix_and_get_it_written_when_read_without_it(tiny_model, tokenizer):
    """A group's prefix is held once, not per slot; every later case that needs it in a slot still gives the
    full forward's log-probs: a late sequence sharing part of it, a decode step beside a sequence that does not
    share it (the prefix is written into the slots), and a newer shared prefix taking its place."""
    engine = make_engine(tiny_model, tokenizer)
    prefix = list(range(1000, 1300))
    contexts = {i: prefix + [2000 + i] * (i + 1) for i in range(4)}

    async def turn(seqs, max_new_tokens=3):
        params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
        outs = await asyncio.gather(*(engine.generate(s, contexts[s], params) for s in seqs))
        for seq, out in zip(seqs, outs, strict=True):
            expect = expected_logprobs(tiny_model, contexts[seq], out.ids, 1.0)
            assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4), seq
            contexts[seq] = contexts[seq] + out.ids + [3000, 3001]  # a tool's observation

    asyncio.run(turn([0, 1, 2, 3]))
    assert all(engine.slots[i].shared for i in range(4)) and len(engine.shared) >= len(prefix)
    assert engine.cache.capacity < len(prefix)  # 4 slots, none holding the 300 shared positions
    contexts["part"] = prefix[:100] + [5, 6, 7]  # shares only part of it: copied from the shared keys
    asyncio.run(turn(["part"]))
    assert not engine.slots["part"].shared and engine.stats["prefix_writes"] == 0
    contexts["other"] = list(range(4000, 4040))  # shares nothing: decoded beside 0 and 1, which get it written
    asyncio.run(turn([0, 1, "other"]))
    assert engine.stats["prefix_writes"] == 2 and engine.slots[2].shared and not engine.slots[0].shared
    contexts |= {"new0": list(range(6000, 6050)) + [1], "new1": list(range(6000, 6050)) + [2]}
    asyncio.run(turn(["new0", "new1"]))  # a newer shared prefix: 2 and 3 get the old one written first
    assert engine.stats["prefix_writes"] == 4 and engine.slots["new0"].shared and not engine.slots[3].shared
    asyncio.run(turn([0, 1, 2, 3, "part", "other", "new0", "new1"]))


def test_a_later_group_reads_the_prefix_computed_before_until_the_weights_change(tiny_model_dir, tokenizer):
    """The shared prefix outlives the sequences that read it: the next group starting with it is not prefilled
    again; after an in-place weight change (an optimizer step) it is computed again, from the new weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    engine = make_engine(model, tokenizer)
    prefix = list(range(1000, 1200))

    def group(tag):
        prompts = {(tag, i): prefix + [2000 + i] * (i + 1) for i in range(3)}
        params = SamplingParams(temperature=1.0, max_new_tokens=3)

        async def run():
            return await asyncio.gather(*(engine.generate(s, p, params) for s, p in prompts.items()))

        fed = engine.stats["prefill_tokens"]
        for (seq, prompt), out in zip(prompts.items(), asyncio.run(run()), strict=True):
            expect = expected_logprobs(model, prompt, out.ids, 1.0)
            assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4), seq
            engine.release(seq)
        return engine.stats["prefill_tokens"] - fed

    assert group("a") == len(prefix) + 1 + 2 + 3  # the prefix once, then each row's own tokens
    assert group("b") == 1 + 2 + 3  # the prefix is read, not computed again
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    assert group("c") == len(prefix) + 1 + 2 + 3
    engine.free_memory()
    assert engine.shared is None
