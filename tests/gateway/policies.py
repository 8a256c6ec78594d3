"""Policies for driving real clients through the gateway in tests: each reply is what a rule says for the context
(a call in Hermes syntax, or an answer), written one token per character (decode -> encode would merge them, so
any re-tokenisation of a turn would show as drift), with made-up log-probs; every context it was fed is kept."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from toolrl.rollout.engine import Engine, Sampled
from toolrl.rollout.sampling import SamplingParams


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def last_message(context: str) -> tuple[str, str]:
    """(role, text) of the message before the assistant header the context ends with (SmolLM2's ChatML)."""
    blocks = context.split("<|im_start|>")
    role, _, text = blocks[-2].partition("\n") if len(blocks) > 1 else ("", "", "")
    return role, text.removesuffix("<|im_end|>\n").removesuffix("<|im_end|>")


def answered(context: str) -> bool:
    """Whether the turn to write follows a tool's result (a tool message, or a user message that reports one)."""
    role, text = last_message(context)
    return role == "tool" or "<tool_response>" in text or text.startswith("Observation:")


def calculator(context: str, params: SamplingParams) -> str:
    """Call the calculator, then answer."""
    return "The answer is 4." if answered(context) else call("calculator", expression="2 + 2")


def calculator_said(context: str, params: SamplingParams) -> str:
    """Say what it will do and call the calculator (a turn of text and a call: a Responses client that stores its
    replies sends the text back as an `item_reference`), then answer."""
    if answered(context):
        return "The answer is 4."
    return "I will add them with the calculator.\n" + call("calculator", expression="2 + 2")


def smolagents(context: str, params: SamplingParams) -> str:
    """Call the calculator, then smolagents' final_answer tool (how its agents end)."""
    return call("final_answer", answer="4") if answered(context) else call("calculator", expression="2 + 2")


def dspy_fields(**fields: str) -> str:
    """Output fields as DSPy's chat adapter asks for them (`[[ ## name ## ]]` headers, then `completed`)."""
    return "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in fields.items()) + "[[ ## completed ## ]]"


def dspy_react(context: str, params: SamplingParams) -> str:
    """DSPy's ReAct: each step is a prompt of its own (the trajectory so far in the user message; the step's output
    fields named in the system message): call the calculator, then `finish`, then the extract step's answer."""
    system = context.split("<|im_start|>")[1] if "<|im_start|>" in context else ""
    if "`next_tool_name`" not in system:  # ReAct's extract step: reasoning, answer
        return dspy_fields(reasoning="The calculator gave 4.", answer="4")
    if "observation_0" not in last_message(context)[1]:
        return dspy_fields(next_thought="I will add them with the calculator.", next_tool_name="calculator",
                           next_tool_args=json.dumps({"expression": "2 + 2"}))  # fmt: skip
    return dspy_fields(next_thought="The calculator gave 4.", next_tool_name="finish", next_tool_args="{}")


def bash(name: str, key: str, done: str | None = None) -> Callable[[str, SamplingParams], str]:
    """Run `echo $((2+2))` with the shell tool `name` (its command under `key`), then answer (or run `done`)."""

    def rule(context: str, params: SamplingParams) -> str:
        if params.grammar and '"title"' in params.grammar:  # a harness naming its session: a JSON title
            return json.dumps({"title": "Adding two numbers"})
        if not answered(context):
            return call(name, **{key: "echo $((2+2))"})
        return call(name, **{key: done}) if done else "The answer is 4."

    return rule


class RulePolicy(Engine):
    """Replies as `rule(context text, params)` says. It claims to follow grammars: its rules write what a forced
    call or a title schema asks (these tests check the protocols and the capture; the grammars are checked with a
    real model elsewhere)."""

    follows_grammars = True

    def __init__(self, chat, rule: Callable[[str, SamplingParams], str]):
        self.chat, self.rule = chat, rule
        self.seen: list[tuple[object, list[int], SamplingParams]] = []

    async def generate(self, seq, tokens, params):
        self.seen.append((seq, list(tokens), params))
        text = self.rule(self.chat.tokenizer.decode(tokens), params)
        ids = [i for ch in text for i in self.chat.encode(ch)] + [self.chat.end_of_turn_id]
        if len(ids) > params.max_new_tokens:  # as an engine does: cut at the turn's budget, not ended
            return Sampled(ids[: params.max_new_tokens], [-0.5] * params.max_new_tokens, False)
        return Sampled(ids, [-0.5] * len(ids), True)


class StepwisePolicy(RulePolicy):
    """A RulePolicy that tells its tokens one by one, `delay` seconds apart, as the hf engine does after each
    decoding step; `told_last` is when it told its last token."""

    def __init__(self, chat, rule, delay: float = 0.0):
        super().__init__(chat, rule)
        self.delay, self.told_last = delay, 0.0

    async def generate_stream(self, seq, tokens, params, on_tokens):
        import asyncio
        import time

        sampled = await self.generate(seq, tokens, params)
        for token in sampled.ids:
            await asyncio.sleep(self.delay)
            on_tokens([token])
        self.told_last = time.monotonic()
        return sampled


def drift(engine: RulePolicy, segment) -> int:
    """Tokens the engine was fed for the segment's requests that differ from the segment's captured ids."""
    ids = segment.traj.token_ids
    fed = [tokens for seq, tokens, _ in engine.seen if seq is segment.seq]
    return sum(
        sum(a != b for a, b in zip(tokens, ids, strict=False)) + max(0, len(tokens) - len(ids)) for tokens in fed
    )


def loop_segment(sample):
    """The segment holding the agent's tool loop: the one with the most model turns."""
    return max(sample.segments, key=lambda s: s.traj.num_turns)


NUMBER = re.compile(r"\b4\b")
