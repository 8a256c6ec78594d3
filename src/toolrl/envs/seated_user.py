"""A user played by the policy: the simulated user of a multi-turn environment as a trajectory of its own, in the
role `user`, trained beside the agent it talks to (role `agent`).

Two episodes of one rollout are seated at one `Conversation`: the agent's episode asks it for the user's messages
as it asks any `User` (`hear(conversation, ...)`); the user's episode (`UserSeat`) is shown the user's system
prompt (the scenario the agent never sees, `UserPrompt.system`) and the agent's replies as the messages it hears,
roles turned as a simulated user's model sees them, and its own turns are the user's messages. A user turn with a
stop marker ends the conversation with its outcome; an empty one ends it as `empty`; a seat that stops otherwise
(out of turns, the length limit) ends it as `user_left`; an agent that stops ends the user's trajectory
(stop reason `agent_ended`). Each side
waits for the other's turn, so both must play in one rollout under `rollout.schedule: async`; a wait past
`wait_s` is a one-line error that says so.
"""

from __future__ import annotations

import asyncio

from toolrl.envs.base import Episode, StepResult, Task
from toolrl.envs.users import Scenario, Transcript, User, UserPrompt, UserTurn
from toolrl.errors import ConfigError

LEFT = "user_left"
"""The outcome of a conversation whose user seat stopped without ending it (out of turns, the length limit)."""
EMPTY = "empty"
"""The outcome of a conversation whose user seat wrote an empty message."""


class Conversation(User):
    """One agent and one user seat: the user seat's messages go to the agent, the agent's replies to the seat."""

    def __init__(self, scenario: Scenario, prompt: UserPrompt, wait_s: float, where: str):
        self.scenario, self.prompt, self.wait_s, self.where = scenario, prompt, wait_s, where
        self._to_agent: asyncio.Queue[UserTurn] = asyncio.Queue()
        self._to_user: asyncio.Queue[str | None] = asyncio.Queue()
        self.said: list[str] = []
        """The user seat's messages, stop markers taken out."""
        self.outcome: str | None = None
        """How the user ended the conversation (None: it has not)."""
        self.agent: Episode | None = None
        self.seated = False
        """Whether a user seat took its place (else the agent hears a fallback user)."""

    async def respond(self, scenario: Scenario, transcript: Transcript, seed: int | None = None) -> UserTurn:
        if transcript.turns and transcript.turns[-1][0] == "assistant":
            self._to_user.put_nowait(transcript.turns[-1][1])
        return await self._wait(self._to_agent.get())

    async def _wait(self, waiting):
        try:
            return await asyncio.wait_for(waiting, self.wait_s)
        except TimeoutError:
            raise ConfigError(
                f"{self.where}: a seat waited {self.wait_s:g} s for the other side of its conversation (agent and "
                "user played by the policy need rollout.schedule: async and both seats in one rollout)"
            ) from None

    def user_says(self, text: str) -> str | None:
        """A user seat's message: passed on, or the outcome that ends the conversation."""
        text, outcome = self.prompt.ending(text)
        if text:
            self.said.append(text)
        if outcome is None and not text:
            outcome = EMPTY
        if outcome is not None:
            self.end(outcome)
        else:
            self._to_agent.put_nowait(UserTurn(text))
        return outcome

    def end(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._to_agent.put_nowait(UserTurn("", ended=True, outcome=outcome))

    def agent_stopped(self) -> None:
        self._to_user.put_nowait(None)

    async def agent_says(self) -> str | None:
        """The agent's next reply (None: the agent's trajectory stopped)."""
        return await self._wait(self._to_user.get())


class UserSeat(Episode):
    """The user's side of a `Conversation`: no tools; its turns are the user's messages."""

    def __init__(self, task: Task, conversation: Conversation):
        system = conversation.prompt.system(conversation.scenario.instructions)
        super().__init__(task, [{"role": "system", "content": system}], offered=[])
        self.conversation, self.role = conversation, "user"
        conversation.seated = True

    async def open(self) -> StepResult:
        return StepResult(user_message=self.conversation.prompt.opening)

    async def reply(self, text: str) -> StepResult:
        conversation = self.conversation
        if (outcome := conversation.user_says(text)) is not None:
            return StepResult(done=True, stop_reason="user_ended", info={"user_outcome": outcome})
        answer = await conversation.agent_says()
        if answer is None:
            return StepResult(done=True, stop_reason="agent_ended")
        return StepResult(user_message=answer)

    def finish(self, stop_reason: str) -> None:
        self.conversation.end(LEFT)  # no-op once the user ended it
