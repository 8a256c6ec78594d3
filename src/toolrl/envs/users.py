"""The user in a multi-turn task: scripted (the task's messages, as published multi-turn function-calling
benchmarks have them) or simulated by a model, as tau-bench does, through the model-tool machinery (an
OpenAI-compatible endpoint or a local Hugging Face model, `UserModel`).

A user answers `respond(scenario, transcript, seed)`:
- `scenario` is the task's `Scenario`: the instructions a simulated user plays (who it is, what it wants, what
  it knows), which the policy never sees, and the lines a scripted user says in order;
- `transcript` is the whole conversation from the user's side (`Transcript`: what the user said and what the
  assistant replied; never the tool calls or results), so a simulated user reads all of it, not an excerpt;
- `seed` is the episode's stream for this message (seeds.derive(episode_seed, "user", k)).
It returns a `UserTurn`: the message, whether and how the user ended the conversation (a simulated user writes a
stop marker: `###STOP###`, or those its `UserPrompt` maps to outcomes such as transfer or out_of_scope; a scripted
one ends after its last line), and what it cost (tokens, seconds). A simulated user is shaped by config alone
(`UserPrompt`: its whole system prompt, a benchmark's guidelines, its stop markers; `UserModel`: its model and
sampling), never by a subclass.

A user that fails (its endpoint down, an empty reply) raises; the rollout ends that trajectory with the stop
reason `user_failed` as an environment fault (counted, and left out of training with train.infra_faults: mask),
and the others go on.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import string
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolrl import seeds
from toolrl.envs.base import StepResult
from toolrl.errors import ConfigError
from toolrl.tools.model import Batcher, ModelBackend, chat_backend

STOP = "###STOP###"
"""What a simulated user writes to end the conversation (tau-bench's marker): stop reason `user_ended`."""
OPENING = "Hi! How can I help you today?"
"""What the user hears before its first message, when the assistant has not spoken yet."""

USER_SYSTEM = """You are playing a user who talks to an assistant. Stay in your role.

Your instructions (the assistant cannot see them):
{instructions}

Rules:
- Write only your next message to the assistant, one or two sentences, in your own words.
- Give a piece of information only when it is needed or asked for, and only what your instructions say;
  never make up details (names, numbers, emails) that they do not give you.
- Do not do the assistant's work, and do not repeat your instructions word for word.
- When what you wanted is done, or the assistant cannot do it, write {stop} and nothing else.{guidelines}"""

TEMPLATE_FIELDS = {
    "instructions": "the task's scenario",
    "guidelines": "the guidelines given",
    "stop": "the first stop marker",
    "stop_rules": "a line per stop marker",
}
"""The fields a user prompt's template may name: what each is filled with."""


class UserPrompt(BaseModel):
    """How a simulated user is told to play, all of it from config (`env.options.user_prompt`): its whole system
    prompt, a benchmark's own simulation guidelines, the markers that end a conversation and the outcome each
    means, and what it hears before the assistant has spoken. tau-bench's user: its guidelines as `guidelines`,
    `stop: {"###STOP###": done, "###TRANSFER###": transfer, "###OUT-OF-SCOPE###": out_of_scope}`."""

    model_config = ConfigDict(extra="forbid")

    template: str = USER_SYSTEM
    """The user model's system prompt, with the fields {instructions} (required), {guidelines}, {stop} and
    {stop_rules}; other braces are written doubled ({{ }})."""
    guidelines: str = ""
    """A benchmark's simulation guidelines, placed at {guidelines} (USER_SYSTEM puts them after its rules)."""
    stop: dict[str, str] = Field(default_factory=lambda: {STOP: "done"})
    """Marker -> outcome: a reply holding a marker ends the conversation (stop reason `user_ended`), its outcome
    recorded (`user_outcome` in the step's info, the `user_outcome/NAME` metric)."""
    opening: str = OPENING

    @field_validator("template")
    @classmethod
    def known_fields(cls, template: str) -> str:
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)
                      if name is not None]  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"not a template ({exc}); write a literal brace doubled, {{{{ or }}}}") from None
        if shaped := [name for name, spec, conversion in fields if spec or conversion]:  # {x:>999999999} pads
            raise ValueError(f"field {{{shaped[0]}}} takes no format spec or conversion: write it bare")
        named = {name for name, _, _ in fields}
        if unknown := named - set(TEMPLATE_FIELDS):
            raise ValueError(f"unknown field {{{sorted(unknown)[0]}}}; its fields: "
                             + ", ".join(f"{{{k}}} ({v})" for k, v in TEMPLATE_FIELDS.items()))  # fmt: skip
        if "instructions" not in named:
            raise ValueError("the template must show the scenario: put {instructions} in it")
        return template

    @field_validator("stop")
    @classmethod
    def markers(cls, stop: dict[str, str]) -> dict[str, str]:
        if not stop:
            raise ValueError("give at least one marker that ends the conversation, like {'###STOP###': 'done'}")
        for marker, outcome in stop.items():
            if not marker.strip():
                raise ValueError("a stop marker is empty: the user would end every conversation")
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", outcome):
                raise ValueError(f"outcome {outcome!r} of {marker!r}: lower-case letters, digits and _ (like done)")
        return stop

    def system(self, instructions: str) -> str:
        rules = [f"- To end the conversation as {o}, write {m} and nothing else." for m, o in self.stop.items()]
        guidelines = self.guidelines.strip()
        if self.template == USER_SYSTEM:  # the default names the first marker: the others, then the guidelines
            guidelines = "".join("\n" + line for line in rules[1:]) + (f"\n\n{guidelines}" if guidelines else "")
        return self.template.format(instructions=instructions.strip(), guidelines=guidelines,
                                    stop=next(iter(self.stop)), stop_rules="\n".join(rules))  # fmt: skip

    def ending(self, text: str) -> tuple[str, str | None]:
        """`text` with every marker taken out, and the outcome of the first marker in it (None: it goes on)."""
        found = [(text.find(m), o) for m, o in self.stop.items() if m in text]
        for marker in self.stop:
            text = text.replace(marker, "")
        return text.strip(), min(found)[1] if found else None


class UserModel(ModelBackend):
    """The model behind a simulated user: an OpenAI-compatible endpoint (base_url + model), or a local model
    (path); replies are short."""

    max_tokens: int = Field(64, ge=1)


def user_model(options: UserModel) -> Any:
    """The user's model: an object with `complete(messages, seed=None) -> Completion` (and, for a local model,
    `complete_batch`), blocking (SimulatedUser calls it in a thread)."""
    return chat_backend(options, "env.options.user_model")[0]


@dataclass(frozen=True)
class Scenario:
    """What a user of one task is given."""

    instructions: str = ""
    """What a simulated user plays; the policy never sees it."""
    script: tuple[str, ...] = ()
    """What a scripted user says after the task's question, in order; past the end it ends the conversation."""


@dataclass(frozen=True)
class UserTurn:
    text: str
    """The user's message (the stop marker taken out)."""
    ended: bool = False
    """The user ended the conversation: stop reason `user_ended`."""
    outcome: str = ""
    """How it ended it (the outcome of its stop marker: done, transfer, out_of_scope, ...); '' for a scripted
    user's end."""
    tokens: int = 0
    """Tokens the user's model read and wrote for this message."""
    seconds: float = 0.0


@dataclass
class Transcript:
    """The conversation as the user sees it: its messages and the assistant's replies, in order."""

    turns: list[tuple[str, str]] = field(default_factory=list)

    def user(self, text: str) -> None:
        self.turns.append(("user", text))

    def assistant(self, text: str) -> None:
        self.turns.append(("assistant", text))

    @property
    def user_turns(self) -> int:
        return sum(role == "user" for role, _ in self.turns)

    def for_user_model(self, instructions: str, prompt: UserPrompt | None = None) -> list[dict[str, str]]:
        """The chat a user model continues: the roles turned around (the assistant's replies are what it
        hears, its own messages what it said), after its system prompt (`prompt`'s, with the instructions)."""
        prompt = prompt or UserPrompt()
        system = {"role": "system", "content": prompt.system(instructions)}
        heard = [{"role": "user" if role == "assistant" else "assistant", "content": text} for role, text in self.turns]
        if not heard or heard[0]["role"] == "assistant":
            heard.insert(0, {"role": "user", "content": prompt.opening})
        return [system, *heard]


class User(ABC):
    @abstractmethod
    async def respond(self, scenario: Scenario, transcript: Transcript, seed: int | None = None) -> UserTurn:
        """The user's next message, given its scenario and the conversation so far."""


class ScriptedUser(User):
    """Says the scenario's lines in order (one per reply of the assistant), then ends the conversation."""

    async def respond(self, scenario: Scenario, transcript: Transcript, seed: int | None = None) -> UserTurn:
        said = max(transcript.user_turns - 1, 0)  # the task's question was the first
        if said < len(scenario.script):
            return UserTurn(scenario.script[said])
        return UserTurn("", ended=True)


class SimulatedUser(User):
    """A model playing the user, tau-bench style: it reads its scenario's instructions and the whole
    conversation from the user's side, writes the next message, and ends the conversation with the stop
    marker. A backend with `complete_batch` (a local model) answers the users that ask at the same moment in
    one generate. `seed` reaches a backend that takes one: a sampling user model then says the same words in a
    resumed run, and whatever the batch."""

    def __init__(self, model: Any, prompt: UserPrompt | None = None):
        self.model, self.prompt = model, prompt or UserPrompt()
        self._batcher = Batcher(model.complete_batch) if hasattr(model, "complete_batch") else None
        self._takes_seed = "seed" in inspect.signature(model.complete).parameters

    async def respond(self, scenario: Scenario, transcript: Transcript, seed: int | None = None) -> UserTurn:
        messages = transcript.for_user_model(scenario.instructions, self.prompt)
        started = time.perf_counter()
        if self._batcher is not None:
            reply = await self._batcher.ask(messages, seed)
        elif self._takes_seed:
            reply = await asyncio.to_thread(self.model.complete, messages, seed=seed)
        else:
            reply = await asyncio.to_thread(self.model.complete, messages)
        text, outcome = self.prompt.ending(reply.text)
        if not text and outcome is None:
            raise RuntimeError("the simulated user gave an empty reply")
        cost = reply.prompt_tokens + reply.completion_tokens
        return UserTurn(text, outcome is not None, outcome or "", cost, time.perf_counter() - started)


def make_user(kind: str, model: UserModel | None, prompt: UserPrompt | None = None) -> User:
    """`scripted`, or `simulated` with its model (model and sampling) and prompt (env.options.user,
    env.options.user_model, env.options.user_prompt)."""
    if kind == "scripted":
        return ScriptedUser()
    if model is None:
        raise ConfigError("env.options.user_model: a simulated user needs a model (base_url + model, or path)")
    return SimulatedUser(user_model(model), prompt)


async def hear(
    user: User, scenario: Scenario, transcript: Transcript, episode_seed: int | None, **step: Any
) -> StepResult:
    """An episode's next user message as its step: asked of `user` (message k, k the user's messages so far,
    drawn from seeds.derive(episode_seed, "user", k)) and written into the transcript; a StepResult with the
    message, or done with stop reason `user_ended`, with what it cost. `step`: the rest of it (reward, info)."""
    seed = None if episode_seed is None else seeds.derive(episode_seed, "user", transcript.user_turns)
    said = await user.respond(scenario, transcript, seed)
    cost = {"user_tokens": said.tokens, "user_seconds": said.seconds}
    if said.ended:
        if said.outcome:
            step["info"] = {**step.get("info", {}), "user_outcome": said.outcome}
        return StepResult(done=True, stop_reason="user_ended", **cost, **step)
    transcript.user(said.text)
    return StepResult(user_message=said.text, **cost, **step)


def requests_scenario(requests: Sequence[str], done: int, persona: str = "") -> Scenario:
    """The scenario of a task whose user asks for its requests in turn (the files environment): the
    instructions say which request comes next; the script is the requests after the first."""
    goals = "\n".join(f"{i + 1}. {r}" for i, r in enumerate(requests))
    instructions = (
        f"{persona}\nYou want these done, one at a time, in this order:\n{goals}\n"
        f"Requests done so far: {', '.join(str(i + 1) for i in range(done)) or 'none'}. "
        f"Now ask for request {done + 1} in your own words."
    )
    return Scenario(instructions.strip(), tuple(requests[1:]))
