"""Customer service, tau-bench style (shop.py: the database, its tools, the users' errands).

The agent reads the shop's policy (the system prompt), talks with a user and works the database with tools; a
task ends when the user ends the conversation (`###STOP###` from a simulated user, a scripted one after the
agent's answer) or at rollout.max_turns. Reward, as tau-bench's: `correct` is 1 when the final database equals
the one the reference actions leave (`db`) and every output the user had to hear (a refund, a total) is in
the agent's replies (`outputs`); both are logged.

With `user: simulated` a model plays the user from its scenario (who it is, what it wants, what it knows), which
the agent never sees, and writes the opening message itself (Episode.open); `user: scripted` opens with the
task's question and ends after the agent's first answer. With `user: policy` the policy plays the user too: a
task's samples are seated in pairs as they are reset (the first an agent, role `agent`; the second its user, role
`user`: envs/seated_user.py), the user trained for agreement with its scenario (`correct` of a user seat: the
errand it was given was done, nothing else, it heard what it wanted to know, and it said nothing its scenario does
not give: `faithful`; and, weighted 0.5, `told`: the share of its scenario's ids and email the agent needs that it
said, 0 if it made one up).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar, Literal

from pydantic import Field

from toolrl.envs.base import Environment, Episode, StepResult, Task, register_env
from toolrl.envs.reference import ReferenceRequest
from toolrl.envs.seated_user import Conversation, UserSeat
from toolrl.envs.support.desk import HANDBOOK, Desk
from toolrl.envs.support.shop import Shop, canonical, draw_case, make_database
from toolrl.envs.tasks import GeneratedTasks, TaskSplits, unique_seeded_tasks
from toolrl.envs.users import Scenario, ScriptedUser, Transcript, User, UserModel, UserPrompt, hear, make_user
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.tools.call import ToolCall
from toolrl.tools.function import Tool

POLICY = """You are the customer-service agent of Harbor Goods, an online shop. Follow this policy:
1. Before looking up or changing anything, identify the customer with find_customer(email, zip).
2. Act only on that customer's own orders, and only as they ask.
3. A pending order can be cancelled (its total is refunded) or sent to another address; a delivered one cannot.
4. Items of a delivered order can be returned; their prices are refunded.
5. Tell the customer the result, with the amount when money is refunded or asked about.
Use the tools for every lookup and change; never guess an order's contents."""


SUPPORT_USER = UserPrompt(
    guidelines="""Guidelines:
- You are a customer of the shop; the assistant is its support agent. Say one message at a time.
- Do not give all of your instructions at once: say what is needed for the step the agent is at.
- Never make up information your instructions do not give; if you are asked for it, say you do not know.
- If what you wanted is done, write ###STOP###.
- If the agent says it will transfer you to a human agent, write ###TRANSFER###.
- If the agent asks something your instructions cannot answer, write ###OUT-OF-SCOPE###.""",
    stop={"###STOP###": "done", "###TRANSFER###": "transfer", "###OUT-OF-SCOPE###": "out_of_scope"},
)
"""The support environment's simulated customer: tau-bench's three ways to end a conversation."""


class SupportOptions(GeneratedTasks):
    num_train: int = Field(200, ge=1)
    num_test: int = Field(40, ge=1)
    customers: int = Field(24, ge=2)
    user: Literal["scripted", "simulated", "policy"] = "scripted"
    """scripted: the task's opening message, then the conversation ends after the agent answers; simulated: a
    model plays the user from the task's scenario (user_model); policy: the policy plays it, a trajectory of its
    own in the role `user` (a task's odd sample out talks with the scripted user, counted: support/unpaired)."""
    user_model: UserModel | None = None
    """The simulated user's model and sampling (base_url + model, or path; temperature, max_tokens)."""
    user_prompt: UserPrompt = Field(default_factory=lambda: SUPPORT_USER)
    """How the simulated user plays (users.UserPrompt): a customer's guidelines, and three ways to end: done,
    transfer (to a human agent), out_of_scope (the scenario does not say what to answer). Any of it from config."""
    wait_s: float = Field(600.0, gt=0)
    """With user: policy, how long one side of a conversation waits for the other's turn before the run stops."""
    handbook: bool = False
    """The help desk at a real benchmark's size: the policy as a full handbook (handbook.md) and thirteen tools
    described as a published benchmark describes its own (desk.py): ~5k tokens of prompt before the customer's
    first word, where the short policy and five tools are ~0.8k."""


def _said(trajectory) -> str:
    return " ".join(trajectory.texts)


TOLD_WEIGHT = 0.5
"""With user: policy, the weight of a user seat's `told` (env.reward_weights sets another): without it a user
seat is paid only when its agent gets the errand done, which an untrained agent and user never do together."""
IDS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\bO\d{4}(?:-\d+)?\b|\b\d{5}\b")
"""What a customer could make up: an email, an order or item id, a zip code."""


def _shop_of(trajectory) -> Shop:
    """The database the conversation worked on (a user seat's: its agent's)."""
    episode = trajectory.episode
    return episode.conversation.agent.shop if isinstance(episode, UserSeat) else episode.shop


def database_matches(trajectory, task: Task) -> float:
    """The final database equals the one the reference actions leave (tau-bench's state check)."""
    return float(canonical(_shop_of(trajectory).db) == task.meta["final_db"])


def outputs_said(trajectory, task: Task) -> float:
    """The share of what the user had to hear (amounts) that the agent's turns said (a user seat: that it heard)."""
    outputs = task.meta["outputs"]
    if not outputs:
        return 1.0
    said = " ".join(trajectory.user_messages) if isinstance(trajectory.episode, UserSeat) else _said(trajectory)
    return sum(o in said for o in outputs) / len(outputs)


def faithful(trajectory, task: Task) -> float:
    """The conversation's user said no email, id or zip code its scenario does not give: a user seat, in its own
    messages; an agent, the user it talked with (a model or the policy playing it; a scripted user says the task's
    own lines)."""
    episode = trajectory.episode
    if isinstance(episode, UserSeat):
        said = episode.conversation.said
    else:
        said = [text for role, text in episode.transcript.turns if role == "user"]
    return float(not made_up(" ".join(said), task.meta["instructions"]))


def made_up(text: str, instructions: str) -> bool:
    """Whether `text` gives an email, id or zip code that the scenario's `instructions` do not."""
    return any(found not in instructions for found in IDS.findall(text))


def told(said: list[str], instructions: str) -> float:
    """A user's agreement with its scenario in what it said: the share of the facts the agent needs that the
    scenario gives (its email, zip code, order and item ids) that it said; 0 where it said one its scenario does
    not give (made up)."""
    text = " ".join(said)
    if made_up(text, instructions):
        return 0.0
    facts = set(IDS.findall(instructions))
    return sum(fact in text for fact in facts) / len(facts) if facts else 1.0


def user_told(trajectory, task: Task) -> float:
    """A user seat: `told` of its messages (a dense part of its agreement, paid before any errand is done); an
    agent: 0, so that its reward is its own."""
    episode = trajectory.episode
    return told(episode.conversation.said, task.meta["instructions"]) if isinstance(episode, UserSeat) else 0.0


def correct(trajectory, task: Task) -> float:
    """An agent: the database and the outputs are right. A user seat, its agreement with the scenario: the errand
    it was given was done (the database is the scenario's, and it heard what it wanted to know), and it made
    nothing up."""
    done = database_matches(trajectory, task) == 1.0 and outputs_said(trajectory, task) == 1.0
    return float(done and (not isinstance(trajectory.episode, UserSeat) or faithful(trajectory, task) == 1.0))


class SupportEpisode(Episode):
    def __init__(self, task: Task, messages, shop: Shop, user: User, seed: int | None):
        super().__init__(task, messages, shop.tools(), ordered=True)
        self.shop, self.user, self.seed = shop, user, seed
        self.scenario = Scenario(task.meta["instructions"])
        self.transcript = Transcript()
        self.simulated = messages[-1]["role"] != "user"
        if isinstance(user, Conversation):
            self.role, user.agent = "agent", self

    async def open(self) -> StepResult | None:
        if isinstance(self.user, Conversation) and not self.user.seated:  # no user seat came: the scripted user
            waiting, counts = self.seating
            waiting.pop(self.task.id, None)
            counts["unpaired"] += 1
            self.user = ScriptedUser()
            self.transcript.user(self.task.question)
            return StepResult(user_message=self.task.question)
        if not self.simulated:
            self.transcript.user(self.task.question)
            return None
        opening = await hear(self.user, self.scenario, self.transcript, self.seed)
        if opening.user_message is None and isinstance(self.user, Conversation):
            return opening  # the policy's user seat ended it at once (its trajectory pays): no turn of the agent
        if opening.user_message is None:
            raise RuntimeError("the simulated user ended the conversation before saying anything")
        return opening

    async def reply(self, text: str) -> StepResult:
        self.transcript.assistant(text)
        return await hear(self.user, self.scenario, self.transcript, self.seed)

    def finish(self, stop_reason: str) -> None:
        if isinstance(self.user, Conversation):
            self.user.agent_stopped()  # its user seat, waiting for a reply, ends


@register_env("support")
class SupportEnv(Environment):
    name = "support"
    rollout_defaults: ClassVar[dict[str, Any]] = {"max_turns": 6, "max_new_tokens": 96, "max_response_tokens": 768}
    """Its reference's turns and calls fit these (toolrl env check)."""
    Options = SupportOptions

    def __init__(self, config, options: SupportOptions):
        super().__init__(config, options)
        self.db = make_database(config.seed, options.customers)
        self.user = (
            None if options.user == "policy" else make_user(options.user, options.user_model, options.user_prompt)
        )
        self.waiting: dict[str, Conversation] = {}
        """With user: policy, conversations whose agent is seated and whose user is not yet, by task id."""
        self.counts = {"unpaired": 0}
        """With user: policy, agents that found no user seat (metric support/unpaired)."""
        self.splits = TaskSplits(config, self._tasks())
        seated = [Criterion("told", user_told, TOLD_WEIGHT)] if options.user == "policy" else []
        self.rubric = Rubric(
            [
                Criterion("correct", correct, 1.0),
                Criterion("db", database_matches, 0.0),
                Criterion("outputs", outputs_said, 0.0),
                Criterion("faithful", faithful, 0.0),
                *seated,
            ],
            success="correct",
            counted={"support": self.counts},
        )

    def _tasks(self) -> dict[str, list[Task]]:
        def draw(rng: random.Random, i: int):
            case = draw_case(self.db, rng)
            shop = Shop(self.db)
            for call in case.calls:  # the reference actions, on a fresh copy: the state to reach
                getattr(shop, call["name"])(**call["arguments"])
            meta = {"instructions": case.instructions, "calls": case.calls, "outputs": case.outputs,
                    "intent": case.intent, "category": case.intent, "final_db": canonical(shop.db)}  # fmt: skip
            return case.opening, "; ".join(case.outputs) or "-", meta

        return unique_seeded_tasks(self.config.seed, self.options, draw, "support")

    def _shop(self) -> Shop:
        return (Desk if self.options.handbook else Shop)(self.db)

    def tools(self) -> list[Tool]:
        return self._shop().tools()  # the schemas the prompt shows; each episode binds its own copy

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def messages(self, task: Task) -> list[dict[str, str]]:
        system = {"role": "system", "content": HANDBOOK if self.options.handbook else POLICY}
        if self.options.user != "scripted":  # the user writes its opening itself (SupportEpisode.open)
            return [system]
        return [system, {"role": "user", "content": task.question}]

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """Identify the customer, then the errand's action; then tell the user what they had to hear."""
        rounds = tuple((ToolCall(c["name"], c["arguments"]),) for c in task.meta["calls"])
        outputs = " ".join(task.meta["outputs"])
        return [ReferenceRequest(rounds, f"Done. {outputs}".strip())]

    def reset(self, task: Task, seed: int | None = None) -> SupportEpisode | UserSeat:
        if self.options.user != "policy":
            return SupportEpisode(task, self.messages(task), self._shop(), self.user, seed)
        if (conversation := self.waiting.pop(task.id, None)) is not None:
            return UserSeat(task, conversation)
        o = self.options
        scenario = Scenario(task.meta["instructions"])
        conversation = Conversation(scenario, o.user_prompt, o.wait_s, "env support (user: policy)")
        self.waiting[task.id] = conversation
        episode = SupportEpisode(task, self.messages(task), self._shop(), conversation, seed)
        episode.seating = (self.waiting, self.counts)  # every sample of a rollout is reset before any opens
        return episode

    def close(self) -> None:
        self.waiting.clear()
