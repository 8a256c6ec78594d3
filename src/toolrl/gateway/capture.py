"""Token-exact capture of an agent's requests: what the policy was given and sampled, as it was, per sample.

An agent talks to the gateway in messages; training needs token ids. Re-rendering the whole conversation at
each request and tokenizing it again would not give back the ids the model sampled (a model's tokens do not
survive decode -> encode: "ab" sampled as "a" + "b" comes back as one token; templates strip or rewrite
assistant turns), so the loss would be computed on tokens the policy never produced. Here each sample keeps
segments: a segment's token ids are the prompt, then each model turn exactly as sampled (with its log-probs,
trained on), then the messages the agent added (tool results, user turns) tokenized alone in the template's
framing (masked out of the loss). A request whose messages extend a segment's (the same messages, then the
assistant turn as the gateway returned it, then only tool or user messages) continues that segment; any other
request (a sub-agent, a retry, a summarised history) starts a new one. Each segment is one Trajectory.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.chat.format import ChatFormat
from toolrl.envs.base import Task
from toolrl.parsers.base import CallSyntax
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools.call import ToolCall

CONTINUING_ROLES = ("tool", "user")
"""What an agent may add after the assistant turn for its request to continue the segment."""


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def normal(message: dict[str, Any]) -> tuple:
    """What a message is, for matching a request to a segment: role, text, and its calls (name and arguments,
    not their ids, which clients make up or drop)."""
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = tuple(
        (
            c.get("function", {}).get("name"),
            json.dumps(_arguments(c.get("function", {}).get("arguments")), sort_keys=True),
        )
        for c in message.get("tool_calls") or []
    )
    return (message.get("role"), (content or "").strip(), calls)


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def template_messages(messages: Sequence[dict[str, Any]], syntax: CallSyntax) -> list[dict[str, str]]:
    """OpenAI messages as the chat template takes them: an assistant turn's calls written in the run's call
    syntax after its text (how the model would have written them), every content as text."""
    out = []
    for m in messages:
        text = text_of(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                ToolCall(c["function"]["name"], _arguments(c["function"].get("arguments")) or {})
                for c in m["tool_calls"]
            ]
            text = (text + "\n" if text else "") + syntax.render(calls)
        out.append({"role": str(m.get("role")), "content": text})
    return out


@dataclass
class Segment:
    """One continuous token sequence of a sample: its trajectory, and the messages it stands for."""

    traj: Trajectory
    messages: list[tuple]
    """The normalised messages so far, the assistant turns as the gateway returned them."""
    tools_key: str
    ended: bool = True
    """Whether the last model turn emitted its end-of-turn token."""
    seq: object = field(default_factory=object)
    """The engine's key for this sequence."""
    calls: dict[str, ToolCall] = field(default_factory=dict)
    """The calls of its model turns by the id the gateway gave them (a tool message names the one it answers)."""


@dataclass
class Sample:
    """What one agent run sent through its base URL: segments, in the order they began."""

    id: str
    task: Task
    segments: list[Segment] = field(default_factory=list)
    requests: int = 0
    continued: int = 0
    """Requests that extended a segment (only the new messages tokenized)."""
    format_errors: int = 0
    tool_calls: int = 0

    def trajectories(self) -> list[Trajectory]:
        return [s.traj for s in self.segments if s.traj.num_turns]


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    return json.dumps(list(tools or []), sort_keys=True)


def find_segment(sample: Sample, messages: Sequence[dict[str, Any]], tools: str) -> Segment | None:
    """The segment these messages extend, the longest first; None: a new segment."""
    wanted = [normal(m) for m in messages]
    for segment in sorted(sample.segments, key=lambda s: -len(s.messages)):
        known = segment.messages
        if segment.tools_key != tools or len(wanted) <= len(known) or wanted[: len(known)] != known:
            continue
        if known[-1][0] == "assistant" and all(m[0] in CONTINUING_ROLES for m in wanted[len(known) :]):
            return segment
    return None


def continuation_ids(chat: ChatFormat, added: Sequence[dict[str, Any]], ended: bool) -> list[int]:
    """Ids of the messages an agent added after the model's turn: tool results in the template's tool framing,
    user turns as user messages, up to the next assistant header."""
    framed: list[dict[str, str]] = []
    for m in added:
        if m.get("role") == "tool":
            framed += chat.tool_messages([text_of(m)])
        else:
            framed.append({"role": "user", "content": text_of(m)})
    return chat.continuation_ids(framed, ended)


def branch(segment: Segment) -> Segment:
    """A copy to sample another choice from (n > 1): the same tokens so far, its own sequence."""
    traj = copy.copy(segment.traj)
    for name in ("token_ids", "loss_mask", "logprobs", "spans", "texts", "results", "turn_rewards", "infos"):
        setattr(traj, name, list(getattr(traj, name)))
    return Segment(traj, list(segment.messages), segment.tools_key, segment.ended, calls=dict(segment.calls))
