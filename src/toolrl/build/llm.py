"""The model behind the generative stages: asks for JSON, validates it against a schema, asks again with the
reason when it does not validate, and rejects the item (counted) after `retries`. Never raises for a bad reply.

Every exchange (prompt, reply, verdict) is appended to `DIR/llm/STAGE.jsonl` beside the stage's artifact; a
stage that is re-run reuses the replies that validated for the same prompt, so an interrupted stage resumes
without asking again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from toolrl.build.artifacts import Workspace, content_hash
from toolrl.build.spec import LLMSpec
from toolrl.errors import ConfigError
from toolrl.files import read_jsonl
from toolrl.text import clip, first_line

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```(?:json|python)?\s*\n?(.*?)```", re.DOTALL)


def json_values(reply: str) -> list[Any]:
    """Every JSON value a reply holds, in the order to try them: the whole text, its fenced blocks, then each
    `{...}` or `[...]` value from left to right (a value inside another is not taken apart)."""
    values: list[Any] = []
    for text in (reply.strip(), *(m.group(1).strip() for m in _FENCE.finditer(reply))):
        with contextlib.suppress(ValueError, RecursionError):
            values.append(json.loads(text))
    decoder, at = json.JSONDecoder(), 0
    while True:
        starts = [i for i in (reply.find("{", at), reply.find("[", at)) if i >= 0]
        if not starts:
            return values
        at = min(starts)
        try:
            value, at = decoder.raw_decode(reply, at)
        except (ValueError, RecursionError):
            at += 1
            continue
        values.append(value)


def extract_json(reply: str, schema: dict[str, Any] | None = None) -> Any:
    """The JSON value of a reply (see json_values): with `schema`, the first that validates against it, so
    that a reply holding an example or a second object gives the one asked for; a ValueError when none is JSON,
    the first one's jsonschema.ValidationError when none validates."""
    values = json_values(reply)
    if not values:
        raise ValueError("the reply holds no JSON value")
    if schema is None:
        return values[0]
    for value in values:
        if jsonschema.Draft202012Validator(schema).is_valid(value):
            return value
    jsonschema.validate(values[0], schema)
    return values[0]


@dataclass
class Asked:
    asked: int = 0
    accepted: int = 0
    retried: int = 0
    rejected: int = 0
    cached: int = 0
    errors: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "accepted": self.accepted,
            "retried": self.retried,
            "rejected": self.rejected,
            "cached": self.cached,
            "errors": self.errors[:20],
        }


class StageLLM:
    """One stage's conversation log with the model; `ask_json` is safe from several threads."""

    def __init__(self, spec: LLMSpec, workspace: Workspace, stage: str, ask=None):
        self.spec, self.stage = spec, stage
        self.log_path = workspace.path(f"llm/{stage}.jsonl")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cache = {
            r["prompt_hash"]: r["value"]
            for r in read_jsonl(self.log_path)
            if r.get("valid") and "prompt_hash" in r and "value" in r
        }
        self.stats = Asked()
        self.lock = threading.Lock()
        self._ask, self._client = (ask, None) if ask else self._backend(spec)

    @staticmethod
    def _backend(spec: LLMSpec):
        from toolrl.models.resolve import DEFAULT_MODEL
        from toolrl.tools.model import chat_backend

        if spec.path is not None and spec.path.strip().lower() == DEFAULT_MODEL:
            raise ConfigError(
                f"llm.path: the embedded default model ({DEFAULT_MODEL}, 135M parameters) is too small to write "
                "the builder's JSON; serve a larger instruction model with an OpenAI-compatible server and set "
                "llm.base_url and llm.model (docs/environments.md), or give ready-made sub-problems (source: "
                "decompositions)"
            )
        return chat_backend(spec, "llm")

    def _append(self, record: dict[str, Any]) -> None:
        with self.lock, self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def ask_json(self, item: str, prompt: str, schema: dict[str, Any], check=None, raw: bool = False) -> Any:
        """The validated value for `prompt`, or None (rejected, counted). `check(value)` may raise ValueError
        for what a schema cannot say; `raw` takes the reply's code block or text instead of JSON."""
        key = content_hash([prompt, schema])
        if key in self.cache:
            with self.lock:
                self.stats.cached += 1
            return self.cache[key]
        message = prompt
        for attempt in range(self.spec.retries + 1):
            with self.lock:
                self.stats.asked += 1
                self.stats.retried += attempt > 0
            try:
                reply = self._ask(message)
            except Exception as exc:  # the endpoint failed: count it, never crash the stage
                reply, error = "", f"the model could not be asked ({type(exc).__name__}: {first_line(exc)})"
            else:
                error = None
                try:
                    value = _code(reply) if raw else extract_json(reply, schema)
                    if check is not None:
                        check(value)
                except jsonschema.ValidationError as exc:
                    path = "/".join(str(p) for p in exc.absolute_path) or "(top)"
                    error = f"at {path}: {first_line(exc.message)}"
                except ValueError as exc:
                    error = first_line(exc)
            record = {"item": item, "attempt": attempt, "prompt": message, "reply": reply, "valid": error is None}
            if error is None:
                self._append({**record, "prompt_hash": key, "value": value})
                with self.lock:
                    self.stats.accepted += 1
                self.cache[key] = value
                return value
            self._append({**record, "error": error})
            if "could not be asked" in error:
                break
            message = (
                f"{prompt}\n\nYour previous reply was not accepted: {clip(error, 300)}. "
                "Answer again with only the JSON asked for."
            )
        with self.lock:
            self.stats.rejected += 1
            self.stats.errors.append(f"{item}: {clip(error or '', 200)}")
            hopeless = not self.stats.accepted and self.stats.rejected >= self.spec.give_up_after
        log.warning("%s: rejected %s after %d attempts: %s", self.stage, item, self.spec.retries + 1, error)
        if hopeless:
            raise ConfigError(
                f"llm: stage {self.stage} stopped: its first {self.stats.rejected} items were all rejected (the last: "
                f"{clip(error or '', 120)}); the model does not follow the builder's prompts: use a larger one "
                f"(llm.give_up_after sets how many; every reply is in {self.log_path})"
            )
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _code(reply: str) -> str:
    match = _FENCE.search(reply)
    code = (match.group(1) if match else reply).strip()
    if not code:
        raise ValueError("the reply holds no code")
    return code
