"""A trajectory: token ids as the source of truth, with the loss mask and sampling log-probs beside them.

A trajectory whose context a strategy compacted (rollout/context) is linked segments: each compaction closes the
sequence so far as a `Segment` and starts the next from parts of it (`Carry`: ids as they were) and ids written
for it (`Written`). Its own fields are the open (last) segment's; counters, texts, calls and rewards are the whole
trajectory's. Every trained token is in exactly one segment, and the segments in order hold the trained tokens in
the order they were sampled: one reward, one advantage per trained token (`sequences`, `trained_count`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from toolrl.envs.base import Task
from toolrl.text import clip
from toolrl.tools.call import ToolResult

PROMPT, MODEL, OBSERVATION, USER = "prompt", "model", "observation", "user"
SUMMARY = "summary"
"""Text the policy wrote for a context strategy (a summary of its work, a branch's return value): trained."""
CONTEXT = "context"
"""What a compaction carried into a segment or wrote there (kept turns, notes, a summary's ids): not trained."""
TRAINED_KINDS = (MODEL, SUMMARY)
RECORD_RESULT_CHARS = 2000
"""A tool result is cut to this many characters in a written record (samples.jsonl, eval trajectories)."""


@dataclass(frozen=True)
class UpdateValues:
    """What an update computed for one trajectory, per trained token, for its written record: the advantage it
    gave it and the trainer's own log-prob (the old policy of the update); None where the update skipped it (no
    trained tokens, all-zero advantages, left out of the loss)."""

    advantages: list[float] | None = None
    trainer_logprobs: list[float] | None = None


@dataclass
class Segment:
    """One sequence of a trajectory: ids as they were fed to the model, with their loss mask, sampling log-probs,
    spans and images. The closed ones also say which compaction closed them and what the next one kept."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    spans: list[tuple[str, int, int]]
    images: list[Any] = field(default_factory=list)
    ended_by: str = ""
    """The context strategy (or "agent": an agent's own restart through the gateway) whose compaction closed it;
    "" for the open one."""
    turns: int = 0
    """The trajectory's model turns when it closed."""
    carried: int = 0
    """Tokens of it the next segment starts with (its prompt, kept turns), as they were."""
    written: int = 0
    """Tokens the compaction wrote into the next segment (notes, a request to go on)."""

    @property
    def prompt_length(self) -> int:
        return self.spans[0][2]

    def trained_spans(self) -> list[tuple[str, int, int]]:
        """(kind, start, end) of the spans trained on, in order: model turns and what the policy wrote for a
        context strategy."""
        return [(kind, a, b) for kind, a, b in self.spans if kind in TRAINED_KINDS]


@dataclass(frozen=True)
class Carry:
    """Ids [start, end) of the closing segment, as they were (context in the next: never trained twice)."""

    start: int
    end: int


@dataclass(frozen=True)
class Written:
    """Ids written for the next segment (a note, a request to go on): context, not trained."""

    ids: tuple[int, ...]


Part = Carry | Written


@dataclass
class Trajectory:
    task: Task
    token_ids: list[int]
    """Prompt, generated and observation ids, exactly as they were fed to the model."""
    loss_mask: list[int]
    """1 on model-generated tokens, 0 on prompt, observation and user tokens."""
    logprobs: list[float]
    """Sampling log-prob of each generated token; 0.0 where loss_mask is 0."""
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    """(kind, start, end) over token_ids: kind is prompt, model, observation (tool results) or user."""
    texts: list[str] = field(default_factory=list)
    """Decoded text of each model turn, for parsing and logs only (never re-encoded)."""
    results: list[ToolResult] = field(default_factory=list)
    """Every tool call the trajectory made and what came back (before clipping), in order: for rewards that
    look at the calls (FTRL's solved sub-problems, tool verification)."""
    turn_rewards: list[float] = field(default_factory=list)
    """The environment's reward for each model turn, in order (StepResult.reward of the step that followed it:
    a process reward after tool calls, a request's reward when the user spoke next); the last turn has none
    when a limit ended the trajectory. Its tokens are the turn's model span (`model_spans()[k]`)."""
    role: str | None = None
    """The role the policy played in this trajectory (solver, judge, a player), set by an environment with roles:
    its group's statistics are taken over the trajectories of the same role; None: the one role."""
    turn_credit: list[float] | None = None
    """Dense turn credit of each model turn (train.turn_credit): the change of a frozen model's log-probability of
    the gold answer over the turn; None where not scored."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    """StepResult.info of each step, in order."""
    user_messages: list[str] = field(default_factory=list)
    """The user's messages after the prompt (the requests of a multi-turn task), in order."""
    episode: Any = field(default=None, repr=False, compare=False)
    """The trajectory's episode while it is scored (rewards read its final state); None once closed."""
    num_tool_calls: int = 0
    num_format_errors: int = 0
    num_tool_errors: int = 0
    num_tool_faults: int = 0
    """Calls that failed for reasons of infrastructure (timeout, crash, transport), not the model's."""
    user_tokens: int = 0
    """Tokens a simulated user's model read and wrote for this trajectory."""
    env_fault: str | None = None
    """Why the environment failed this trajectory (its user could not answer), not the policy: one line."""
    suspect: str | None = None
    """A success a rule-based check of the task rejects, and why (Environment.check_success): reward hacking
    shows up as a rising share of these (the suspect_successes metric)."""
    stop_reason: str = ""
    truncated: bool = False
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    reward_weights: dict[str, float] = field(default_factory=dict)
    """The weight of each component of `rewards` that the reward pays (weight not 0), as the rubric that scored it
    gave it: `reward` is their weighted sum (estimators that normalize components apart read both)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent waiting for generation (generate_s) and for tool calls (tools_s)."""
    seed: int | None = None
    """Its own sampling seed (see SamplingParams.seed), or None for the engine's generator."""
    images: list[Any] = field(default_factory=list)
    """The images in token_ids (models.vision.VisionImage: patches, grid, position of its pads), in order:
    what a vision-language policy was given with the ids, and what training gives it again."""
    segments: list[Segment] = field(default_factory=list, repr=False)
    """The segments a compaction closed, in order; the open one is the trajectory's own fields (`sequences`)."""
    summaries: list[str] = field(default_factory=list)
    """Decoded text of each span the policy wrote for a context strategy (kind summary), in order; logs only."""
    versions: list[int] = field(default_factory=list)
    """The version (optimizer steps) of the weights that sampled each trained token, over every segment in order (as
    `trained_logprobs`); empty where the engine did not say (a trajectory made elsewhere: the rollout's version)."""

    @classmethod
    def start(cls, task: Task, prompt_ids: list[int], images: list[Any] | None = None) -> Trajectory:
        traj = cls(
            task, list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids), [(PROMPT, 0, len(prompt_ids))]
        )
        traj.images = list(images or [])
        return traj

    @property
    def prompt_length(self) -> int:
        return self.spans[0][2]

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    @property
    def num_turns(self) -> int:
        return len(self.texts)

    def open_segment(self) -> Segment:
        """The open (last) segment: the trajectory's own ids, mask, log-probs, spans and images (not copies)."""
        return Segment(self.token_ids, self.loss_mask, self.logprobs, self.spans, self.images)

    def sequences(self) -> list[Segment]:
        """Every segment, the open one last: what training scores, in the order their trained tokens were sampled."""
        return [*self.segments, self.open_segment()]

    @property
    def trained_count(self) -> int:
        """Tokens trained on, over every segment."""
        return sum(sum(s.loss_mask) for s in self.sequences())

    @property
    def trained_logprobs(self) -> list[float]:
        """Sampling log-probs of the tokens trained on, over every segment, in order."""
        return [lp for s in self.sequences() for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m]

    def compact(self, parts: list[Part], ended_by: str) -> Segment:
        """Close the open segment (a compaction by `ended_by`) and open the next with `parts`: ids carried from the
        closing one as they were (its prompt, kept turns; their images too) and ids written for it, all context
        (mask 0). Returns the closed segment."""
        closed = Segment(self.token_ids, self.loss_mask, self.logprobs, self.spans, self.images, ended_by,
                         self.num_turns)  # fmt: skip
        ids: list[int] = []
        spans: list[tuple[str, int, int]] = []
        images: list[Any] = []
        prompt_end = closed.prompt_length
        for part in parts:
            at = len(ids)
            if isinstance(part, Carry):
                if not 0 <= part.start < part.end <= len(closed.token_ids):
                    raise ValueError(f"a compaction carries [{part.start}, {part.end}) of a {len(closed.token_ids)}-"
                                     "token segment")  # fmt: skip
                ids += closed.token_ids[part.start : part.end]
                closed.carried += part.end - part.start
                if part.start == 0:  # the prompt stays the prompt
                    spans.append((PROMPT, at, at + min(part.end, prompt_end)))
                images += [dataclasses.replace(im, start=at + im.start - part.start) for im in closed.images
                           if part.start <= im.start and im.start + im.tokens <= part.end]  # fmt: skip
            else:
                ids += list(part.ids)
                closed.written += len(part.ids)
            start = spans[-1][2] if spans else 0
            if len(ids) > start:  # the rest of the part is context, one span with the context before it
                if spans and spans[-1][0] == CONTEXT:
                    start = spans.pop()[1]
                spans.append((CONTEXT, start, len(ids)))
        if not spans or spans[0][0] != PROMPT:
            raise ValueError("a compaction's next segment starts with the closing one's prompt (Carry(0, ...))")
        self.segments.append(closed)
        self.token_ids, self.loss_mask, self.logprobs = ids, [0] * len(ids), [0.0] * len(ids)
        self.spans, self.images = spans, images
        return closed

    @property
    def final_text(self) -> str:
        return self.texts[-1] if self.texts else ""

    def _append(self, kind: str, ids: list[int], logprobs: list[float] | None, versions: list[int] = ()) -> None:
        if versions and len(versions) == len(ids) and len(self.versions) == self.trained_count:
            self.versions.extend(versions)  # a trained span's: kept only while every trained token has one
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if kind in TRAINED_KINDS else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.spans.append((kind, start, len(self.token_ids)))

    def add_model_turn(self, ids: list[int], logprobs: list[float], text: str, versions: list[int] = ()) -> None:
        self._append(MODEL, ids, logprobs, versions)
        self.texts.append(text)

    def add_summary(self, ids: list[int], logprobs: list[float], text: str, versions: list[int] = ()) -> None:
        """What the policy wrote for a context strategy (a summary, a branch's return): trained, not a turn."""
        self._append(SUMMARY, ids, logprobs, versions)
        self.summaries.append(text)

    def drop_tail(self, n: int) -> None:
        """Take the open segment's last `n` ids back (not trained ones: the header of an assistant turn that a
        context strategy's request takes the place of)."""
        if n <= 0:
            return
        if n > len(self.token_ids) - self.prompt_length or any(self.loss_mask[-n:]):
            raise ValueError(f"cannot take back the last {n} ids of a segment: they are trained or the prompt's")
        del self.token_ids[-n:], self.loss_mask[-n:], self.logprobs[-n:]
        while self.spans[-1][1] >= len(self.token_ids):
            self.spans.pop()
        kind, start, _ = self.spans[-1]
        self.spans[-1] = (kind, start, len(self.token_ids))

    def relabel_last_turn(self) -> None:
        """The last model turn was written for a context strategy (a branch's return): a summary, not a turn."""
        kind, start, end = self.spans[-1]
        if kind != MODEL:
            raise ValueError("the open segment does not end with a model turn")
        self.spans[-1] = (SUMMARY, start, end)
        self.summaries.append(self.texts.pop())

    def add_context(self, ids: list[int]) -> None:
        """Ids a context strategy wrote into the open segment (its request for a summary): not trained."""
        self._append(CONTEXT, ids, None)

    def add_observation(self, ids: list[int], images: list[Any] | None = None) -> None:
        """Tool results (never trained), with the images their ids hold."""
        self._append(OBSERVATION, ids, None)
        self.images.extend(images or [])

    def add_user_message(self, ids: list[int], text: str) -> None:
        self._append(USER, ids, None)
        self.user_messages.append(text)

    def record_step(self, reward: float, info: dict[str, Any]) -> None:
        """The reward and info of the step that followed the last model turn."""
        self.turn_rewards.append(float(reward))
        self.infos.append(dict(info))

    def model_spans(self) -> list[tuple[int, int]]:
        """(start, end) of each model turn over token_ids (the open segment's)."""
        return [(a, b) for kind, a, b in self.spans if kind == MODEL]

    def to_record(self, tokenizer, success: str | None = None, update: UpdateValues | None = None) -> dict[str, Any]:
        """A JSON-ready view with the mask visible: the prompt's text, then each span's text and whether it is
        trained on; a model turn token by token (ids, tokens, sampling log-probs, and with `update` the
        trainer's log-probs and the advantages the update gave it), and every tool call. `success`: the rubric's
        success criterion, whose value is copied to "success". A trajectory of several segments lists each
        segment's spans in turn (each span names its `sequence`), a `compaction` entry where one closed, and the
        segments themselves under "sequences"."""
        sequences = self.sequences()
        first = sequences[0]
        a, b = first.spans[0][1], first.spans[0][2]
        record: dict[str, Any] = {
            "task_id": self.task.id,
            "question": self.task.question,
            "answer": self.task.answer,
            "reward": self.reward,
            "rewards": self.rewards,
        }
        if success is not None:
            record["success"] = self.rewards.get(success, 0.0)
        trained = self._update_values(update or UpdateValues())
        spans: list[dict[str, Any]] = []
        for index, seq in enumerate(sequences):
            for kind, start, end in seq.spans:
                if kind == PROMPT and index == 0:
                    continue
                if kind == PROMPT:  # the first segment's prompt again: not repeated
                    span = {"kind": kind, "loss": False, "text": "", "start": start, "end": end}
                else:
                    span = self._segment(tokenizer, seq, kind, start, end, trained.get((index, start), {}))
                spans.append(span | {"sequence": index} if len(sequences) > 1 else span)
            if seq.ended_by:
                spans.append({"kind": "compaction", "sequence": index, "strategy": seq.ended_by,
                              "turn": seq.turns, "tokens": len(seq.token_ids), "carried": seq.carried,
                              "written": seq.written})  # fmt: skip
        record |= {
            "stop_reason": self.stop_reason,
            "truncated": self.truncated,
            "tool_calls": self.num_tool_calls,
            "tool_errors": self.num_tool_errors,
            "tool_faults": self.num_tool_faults,
            "env_fault": self.env_fault,
            "suspect": self.suspect,
            "user_tokens": self.user_tokens,
            "format_errors": self.num_format_errors,
            "turns": self.num_turns,
            "turn_rewards": self.turn_rewards,
            "infos": self.infos,
            "prompt": tokenizer.decode(first.token_ids[a:b]),
            "prompt_tokens": b,
            "segments": spans,
            "images": [{"start": im.start, "tokens": im.tokens, "size": _size(im.source)} for im in self.images],
            "calls": [
                {
                    "name": result.call.name if result.call else None,
                    "arguments": result.call.arguments if result.call else None,
                    "outcome": result.outcome,
                    "latency_s": round(result.latency_s, 4),
                    "result": clip(result.content, RECORD_RESULT_CHARS),
                    "images": len(result.images),
                }
                for result in self.results
            ],
        }
        if len(sequences) > 1:
            record["sequences"] = [
                {"tokens": len(seq.token_ids), "trained": sum(seq.loss_mask), "ended_by": seq.ended_by or None,
                 "turns": seq.turns if seq.ended_by else self.num_turns} for seq in sequences
            ]  # fmt: skip
        return record

    def _update_values(self, update: UpdateValues) -> dict[tuple[int, int], dict[str, list[float]]]:
        """(segment, trained span start) -> its share of the update's per-token values (advantages, trainer
        log-probs) that are known, and of the sampling weights' versions; a trained span is trained throughout, so
        spans take the trained tokens' values in order, segment after segment."""
        count = self.trained_count
        known = {
            key: values
            for key, values in (("advantages", update.advantages), ("trainer_logprobs", update.trainer_logprobs))
            if values is not None and len(values) == count
        }
        versions = self.versions if len(self.versions) == count else None
        out: dict[tuple[int, int], dict[str, list[float]]] = {}
        offset = 0
        for index, seq in enumerate(self.sequences()):
            for _, start, end in seq.trained_spans():
                out[(index, start)] = {key: [round(float(v), 5) for v in values[offset : offset + end - start]]
                                       for key, values in known.items()}  # fmt: skip
                if versions is not None:  # the weights that sampled each token (partial rollouts: several)
                    out[(index, start)]["versions"] = versions[offset : offset + end - start]
                offset += end - start
        return out

    @staticmethod
    def _segment(tokenizer, seq: Segment, kind: str, start: int, end: int, trained: dict[str, list[float]]) -> dict:
        """A span's text; a trained one also token by token, with each sampled token's log-prob, so that a viewer
        can show what was trained and how likely each token was without running anything."""
        segment: dict[str, Any] = {
            "kind": kind,
            "loss": kind in TRAINED_KINDS,
            "text": tokenizer.decode(seq.token_ids[start:end]),
            "start": start,
            "end": end,
        }
        if kind in TRAINED_KINDS:
            ids = seq.token_ids[start:end]
            segment["ids"] = ids
            segment["tokens"] = tokenizer.convert_ids_to_tokens(ids)
            segment["logprobs"] = [round(lp, 5) for lp in seq.logprobs[start:end]]
            segment |= trained
        return segment


def _size(image: Any) -> list[int] | None:
    """An image's [width, height] (a ToolImage, or a PIL image)."""
    if hasattr(image, "width") and hasattr(image, "height"):
        return [int(image.width), int(image.height)]
    return None


def image_png(image: Any) -> bytes:
    """An image of a trajectory as PNG bytes (a ToolImage's own PNG, or a PIL image saved)."""
    from toolrl.tools.images import png_bytes

    if getattr(image, "mime", None) == "image/png":
        return image.data
    return png_bytes(image.pil() if hasattr(image, "pil") else image)
