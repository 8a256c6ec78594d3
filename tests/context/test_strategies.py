"""Context management during rollout, on the key-chain environment (12 dependent calls under a 1,536-token cap that
the whole episode does not fit): `none` stops at the cap, `sliding_window` and `summarize` finish it, `fold` folds
each branch back; every compaction ends a segment whose ids are as they were fed (nothing re-tokenized), and every
trained token is in exactly one segment. A strategy of one's own registers from outside the package."""

import itertools

import pytest

from tests.fixtures import context_plugins  # noqa: F401  (registers keep-last and the folding policy)
from toolrl.config import load_config
from toolrl.context import CONTEXTS
from toolrl.errors import ConfigError
from toolrl.rollout.trajectory import CONTEXT, MODEL, PROMPT, SUMMARY
from toolrl.train import Workbench


def play(model_dir, policy, *sets, tasks=3):
    config = load_config(overrides=[f"model.name={model_dir}", "env.name=chain", "device=cpu", *sets])
    bench = Workbench.load(config, policy=policy)
    try:
        return bench, bench.evaluation(num_tasks=tasks)
    finally:
        bench.close()


def check_linked(traj, limit, header):
    """Each segment within the cap, starting with the whole prompt (less the assistant's header where a strategy wrote
    a message after the task); its carried parts are the closing segment's ids as they were; trained tokens are the
    model's turns and summaries only, each in one segment."""
    segments = traj.sequences()
    whole = segments[0].prompt_length
    assert all(s.prompt_length in (whole, whole - len(header)) for s in segments)
    for before, after in itertools.pairwise(segments):
        start = next((a for kind, a, _ in after.spans if kind not in (PROMPT, CONTEXT)), len(after.token_ids))
        assert before.ended_by and before.carried + before.written == start  # what the next one started from
        p = after.prompt_length
        assert p <= before.prompt_length and after.token_ids[:p] == before.token_ids[:p]  # the prompt, as it was
        assert not any(after.loss_mask[: after.spans[1][2] if len(after.spans) > 1 else p])  # carried: not trained
    for segment in segments:
        assert len(segment.token_ids) <= limit
        for kind, a, b in segment.spans:
            assert all(m == (kind in (MODEL, SUMMARY)) for m in segment.loss_mask[a:b]), kind
    assert traj.trained_count == sum(b - a for s in segments for kind, a, b in s.spans if kind in (MODEL, SUMMARY))


def test_without_context_management_the_reference_stops_at_the_cap(tiny_model_dir):
    _, trajs = play(tiny_model_dir, "reference", "rollout.context.name=none")
    assert all(t.reward == 0 and t.stop_reason == "length" and len(t.sequences()) == 1 for t in trajs)
    assert all(len(t.token_ids) <= 1536 and t.num_tool_calls < 12 for t in trajs)


def test_a_sliding_window_keeps_the_prompt_and_the_last_turns_and_finishes_the_chain(tiny_model_dir):
    bench, trajs = play(tiny_model_dir, "reference")  # the environment's own strategy: sliding_window, 2 turns
    assert all(t.rewards["correct"] == 1.0 and t.num_tool_calls == 12 for t in trajs)
    for traj in trajs:
        segments = traj.sequences()
        assert len(segments) >= 3 and all(s.ended_by == "sliding_window" for s in segments[:-1])
        check_linked(traj, 1536, bench.chat.generation_header)
        for before, after in itertools.pairwise(segments):
            kept = after.token_ids[after.prompt_length : after.spans[1][2]]  # the two last rounds, carried
            starts = [a for kind, a, _ in before.spans if kind == MODEL]
            assert kept == before.token_ids[starts[-2] :]
            assert before.carried == before.prompt_length + len(kept) and before.written == 0
    record = trajs[0].to_record(bench.tokenizer, "correct")
    assert [s["strategy"] for s in record["segments"] if s["kind"] == "compaction"] == ["sliding_window"] * (
        len(trajs[0].sequences()) - 1
    )
    assert len(record["sequences"]) == len(trajs[0].sequences())


def test_running_notes_say_what_each_dropped_turn_called(tiny_model_dir):
    bench, trajs = play(tiny_model_dir, "reference", "rollout.context.options.notes=true",
                        "rollout.context.options.keep_turns=1", tasks=1)  # fmt: skip
    traj = trajs[0]
    assert traj.rewards["correct"] == 1.0
    last = traj.sequences()[-1]
    text = bench.tokenizer.decode(last.token_ids[last.prompt_length - 10 : last.spans[1][2]])
    assert "Notes on your earlier turns" in text
    keys = traj.task.meta["keys"]
    assert f'next_key({{"key": "{keys[0]}"}}) -> Report for {keys[0]}:' in text  # the first dropped call
    check_linked(traj, 1536, bench.chat.generation_header)
    segments = traj.sequences()
    prompt, header = segments[0].prompt_length, bench.chat.generation_header
    assert len(segments) >= 3 and all(s.prompt_length == prompt - len(header) for s in segments[1:])  # task kept whole
    for before, later in itertools.pairwise(segments):  # a line for every round dropped so far: all but the kept one
        notes = bench.tokenizer.decode(later.token_ids[later.prompt_length : later.spans[1][2]])
        assert notes.count("\nturn ") == before.turns - 1


def test_the_policy_summarizes_and_the_next_segment_starts_from_its_summary_as_sampled(tiny_model_dir):
    bench, trajs = play(tiny_model_dir, "reference", "rollout.context.name=summarize")
    for traj in trajs:
        assert traj.rewards["correct"] == 1.0
        segments = traj.sequences()
        assert len(segments) >= 2 and len(traj.summaries) == len(segments) - 1
        for before, after in itertools.pairwise(segments):
            (summary,) = [(a, b) for kind, a, b in before.spans if kind == SUMMARY]
            assert all(before.loss_mask[summary[0] : summary[1]])  # trained where it was written
            p = after.prompt_length
            assert after.token_ids[p : p + summary[1] - summary[0]] == before.token_ids[summary[0] : summary[1]]
        check_linked(traj, 1536, bench.chat.generation_header)
    assert "next_key with" in trajs[0].summaries[0]  # the environment's reference summary


def test_fold_branches_and_returns_and_the_segments_share_everything_before_the_branch(tiny_model_dir):
    sets = ["plugins=[tests.fixtures.context_plugins]", "rollout.context.name=fold", "rollout.max_turns=40",
            "rollout.max_context_tokens=2048"]  # fmt: skip
    bench, trajs = play(tiny_model_dir, "folding", *sets, tasks=2)
    for traj in trajs:
        assert traj.rewards["correct"] == 1.0, traj.stop_reason
        segments = traj.sequences()
        assert len(segments) == 13 and all(s.ended_by == "fold" for s in segments[:-1])
        for before, after in itertools.pairwise(segments):
            shared = before.carried
            assert after.token_ids[:shared] == before.token_ids[:shared]  # the main context up to the branch call
            assert before.spans[-1][0] == SUMMARY  # the return turn, trained as the branch's summary
            returned = bench.tokenizer.decode(after.token_ids[shared:])
            assert returned.lstrip().startswith("<|im_start|>tool\nBranch returned: the next key is"), returned
        assert len(traj.summaries) == 12 and traj.num_turns == 12 * 2 + 1
        check_linked(traj, 2048, bench.chat.generation_header)


def test_the_reference_folds_every_three_rounds_into_a_branch_that_returns_its_summary(tiny_model_dir):
    """The environment's own reference under fold (no policy of its own): the scripted policy opens a branch, makes
    three calls in it and returns the environment's reference summary; the main context keeps only the returns."""
    sets = ["rollout.context.name=fold", "rollout.max_turns=24", "rollout.max_new_tokens=64",
            "rollout.max_context_tokens=2048"]  # fmt: skip
    bench, trajs = play(tiny_model_dir, "reference", *sets, tasks=2)
    for traj in trajs:
        assert traj.rewards["correct"] == 1.0 and traj.rewards["format"] == 1.0, traj.stop_reason
        segments = traj.sequences()
        assert len(segments) == 5 and all(s.ended_by == "fold" for s in segments[:-1])
        assert traj.num_tool_calls == 12 + 2 * 4  # every next_key, branch and return is a call
        keys = traj.task.meta["keys"]
        assert [f"next_key with {keys[3 * k]}" in summary for k, summary in enumerate(traj.summaries, 1)] == [True] * 4
        main = bench.tokenizer.decode(segments[-1].token_ids)
        assert main.count("Branch returned: Summary:") == 4 and "Report for" not in main  # only the returns kept
        assert not any(r.error for r in traj.results)  # no branch ran out of context: every return closed one
        check_linked(traj, 2048, bench.chat.generation_header)


def test_a_strategy_of_ones_own_registers_from_outside_the_package(tiny_model_dir):
    assert "keep-last" in CONTEXTS
    sets = ["plugins=[tests.fixtures.context_plugins]", "rollout.context.name=keep-last",
            "rollout.context.options.marker=(cut here)", "rollout.context.options.plan=I follow the keys."]  # fmt: skip
    bench, trajs = play(tiny_model_dir, "reference", *sets, tasks=1)
    traj = trajs[0]
    assert traj.rewards["correct"] == 1.0 and all(s.ended_by == "keep-last" for s in traj.sequences()[:-1])
    assert traj.texts[0].startswith("I follow the keys.<tool_call>")  # how the reference plays under it (script)
    last = traj.sequences()[-1]
    assert "(cut here)" in bench.tokenizer.decode(last.token_ids)
    check_linked(traj, 1536, bench.chat.generation_header)


def test_a_strategys_options_are_checked_in_one_line(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"rollout\.context\.options of sliding_window: .*keep_turn"):
        load_config(overrides=[f"model.name={tiny_model_dir}", "env.name=chain", "rollout.context.options.keep_turn=1"])
    with pytest.raises(ConfigError, match=r"rollout\.context\.name: unknown context strategy 'folding'"):
        load_config(overrides=[f"model.name={tiny_model_dir}", "rollout.context.name=folding"])


def test_the_environments_strategy_is_kept_when_a_config_sets_its_options_alone(tiny_model_dir):
    chain = [f"model.name={tiny_model_dir}", "env.name=chain"]
    config = load_config(overrides=[*chain, "rollout.context.options.notes=true"])
    assert config.rollout.context.name == "sliding_window" and config.rollout.context.options["notes"] is True
    config = load_config(overrides=[*chain, "rollout.context.name=summarize"])
    assert "keep_turns" not in config.rollout.context.options  # the environment's options are for its own strategy
