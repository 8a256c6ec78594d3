"""A trajectory: token ids as the source of truth, with the loss mask and sampling log-probs beside them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolrl.envs.base import Task
from toolrl.text import clip
from toolrl.tools.call import ToolResult

PROMPT, MODEL, OBSERVATION, USER = "prompt", "model", "observation", "user"
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
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent waiting for generation (generate_s) and for tool calls (tools_s)."""
    seed: int | None = None
    """Its own sampling seed (see SamplingParams.seed), or None for the engine's generator."""
    extra: list[Trajectory] = field(default_factory=list, repr=False)
    """Other sequences of the same sample (an agent's sub-agent or retry, recorded by the gateway): trained with
    this trajectory's advantage by estimators that give one per trajectory (sequence_level), else counted."""
    images: list[Any] = field(default_factory=list)
    """The images in token_ids (models.vision.VisionImage: patches, grid, position of its pads), in order:
    what a vision-language policy was given with the ids, and what training gives it again."""

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

    @property
    def trained_logprobs(self) -> list[float]:
        """Sampling log-probs of the tokens trained on, in order."""
        return [lp for lp, m in zip(self.logprobs, self.loss_mask, strict=True) if m]

    @property
    def final_text(self) -> str:
        return self.texts[-1] if self.texts else ""

    def _append(self, kind: str, ids: list[int], logprobs: list[float] | None) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if kind == MODEL else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.spans.append((kind, start, len(self.token_ids)))

    def add_model_turn(self, ids: list[int], logprobs: list[float], text: str) -> None:
        self._append(MODEL, ids, logprobs)
        self.texts.append(text)

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
        """(start, end) of each model turn over token_ids."""
        return [(a, b) for kind, a, b in self.spans if kind == MODEL]

    def to_record(self, tokenizer, success: str | None = None, update: UpdateValues | None = None) -> dict[str, Any]:
        """A JSON-ready view with the mask visible: the prompt's text, then each span's text and whether it is
        trained on; a model turn token by token (ids, tokens, sampling log-probs, and with `update` the
        trainer's log-probs and the advantages the update gave it), and every tool call. `success`: the rubric's
        success criterion, whose value is copied to "success"."""
        a, b = self.spans[0][1], self.spans[0][2]
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
            "prompt": tokenizer.decode(self.token_ids[a:b]),
            "prompt_tokens": b,
            "segments": [self._segment(tokenizer, kind, a, b, trained) for kind, a, b in self.spans if kind != PROMPT],
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
        return record

    def _update_values(self, update: UpdateValues) -> dict[int, dict[str, list[float]]]:
        """Model span start -> its share of the update's per-token values (advantages, trainer log-probs) that
        are known; a model span is trained throughout, so spans take the trained tokens' values in order."""
        known = {
            key: values
            for key, values in (("advantages", update.advantages), ("trainer_logprobs", update.trainer_logprobs))
            if values is not None and len(values) == sum(self.loss_mask)
        }
        out: dict[int, dict[str, list[float]]] = {}
        offset = 0
        for start, end in self.model_spans():
            out[start] = {key: [round(float(v), 5) for v in values[offset : offset + end - start]]
                          for key, values in known.items()}  # fmt: skip
            offset += end - start
        return out

    def _segment(self, tokenizer, kind: str, start: int, end: int, trained: dict[int, dict[str, list[float]]]) -> dict:
        """A span's text; a model turn also token by token, with each sampled token's log-prob, so that a
        viewer can show what was trained and how likely each token was without running anything."""
        segment: dict[str, Any] = {
            "kind": kind,
            "loss": kind == MODEL,
            "text": tokenizer.decode(self.token_ids[start:end]),
            "start": start,
            "end": end,
        }
        if kind == MODEL:
            ids = self.token_ids[start:end]
            segment["ids"] = ids
            segment["tokens"] = tokenizer.convert_ids_to_tokens(ids)
            segment["logprobs"] = [round(lp, 5) for lp in self.logprobs[start:end]]
            segment |= trained.get(start, {})
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
