"""Customer service, tau-bench style (shop.py: the database, its tools, the users' errands).

The agent reads the shop's policy (the system prompt), talks with a user and works the database with tools; a
task ends when the user ends the conversation (`###STOP###` from a simulated user, a scripted one after the
agent's answer) or at rollout.max_turns. Reward, as tau-bench's: `correct` is 1 when the final database equals
the one the reference actions leave (`db`) and every output the user had to hear (a refund, a total) is in
the agent's replies (`outputs`); both are logged.

With `user: simulated` a model plays the user from its scenario (who it is, what it wants, what it knows), which
the agent never sees, and writes the opening message itself (Episode.open); `user: scripted` opens with the
task's question and ends after the agent's first answer.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

from pydantic import Field

from toolrl.envs.base import Environment, Episode, StepResult, Task, register_env
from toolrl.envs.reference import ReferenceRequest
from toolrl.envs.support.desk import HANDBOOK, Desk
from toolrl.envs.support.shop import Shop, canonical, draw_case, make_database
from toolrl.envs.tasks import GeneratedTasks, TaskSplits, unique_seeded_tasks
from toolrl.envs.users import Scenario, Transcript, User, UserModel, UserPrompt, hear, make_user
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
    user: Literal["scripted", "simulated"] = "scripted"
    """scripted: the task's opening message, then the conversation ends after the agent answers; simulated: a
    model plays the user from the task's scenario (user_model)."""
    user_model: UserModel | None = None
    """The simulated user's model and sampling (base_url + model, or path; temperature, max_tokens)."""
    user_prompt: UserPrompt = Field(default_factory=lambda: SUPPORT_USER)
    """How the simulated user plays (users.UserPrompt): a customer's guidelines, and three ways to end: done,
    transfer (to a human agent), out_of_scope (the scenario does not say what to answer). Any of it from config."""
    handbook: bool = False
    """The help desk at a real benchmark's size: the policy as a full handbook (handbook.md) and thirteen tools
    described as a published benchmark describes its own (desk.py): ~5k tokens of prompt before the customer's
    first word, where the short policy and five tools are ~0.8k."""


def _said(trajectory) -> str:
    return " ".join(trajectory.texts)


def database_matches(trajectory, task: Task) -> float:
    """The final database equals the one the reference actions leave (tau-bench's state check)."""
    return float(canonical(trajectory.episode.shop.db) == task.meta["final_db"])


def outputs_said(trajectory, task: Task) -> float:
    """The share of what the user had to hear (amounts) that the agent's turns said."""
    outputs = task.meta["outputs"]
    return sum(o in _said(trajectory) for o in outputs) / len(outputs) if outputs else 1.0


def correct(trajectory, task: Task) -> float:
    return float(database_matches(trajectory, task) == 1.0 and outputs_said(trajectory, task) == 1.0)


class SupportEpisode(Episode):
    def __init__(self, task: Task, messages, shop: Shop, user: User, seed: int | None):
        super().__init__(task, messages, shop.tools(), ordered=True)
        self.shop, self.user, self.seed = shop, user, seed
        self.scenario = Scenario(task.meta["instructions"])
        self.transcript = Transcript()
        self.simulated = messages[-1]["role"] != "user"

    async def open(self) -> StepResult | None:
        if not self.simulated:
            self.transcript.user(self.task.question)
            return None
        opening = await hear(self.user, self.scenario, self.transcript, self.seed)
        if opening.user_message is None:
            raise RuntimeError("the simulated user ended the conversation before saying anything")
        return opening

    async def reply(self, text: str) -> StepResult:
        self.transcript.assistant(text)
        return await hear(self.user, self.scenario, self.transcript, self.seed)


@register_env("support")
class SupportEnv(Environment):
    name = "support"
    rollout_defaults: ClassVar[dict[str, Any]] = {"max_turns": 6, "max_new_tokens": 96, "max_response_tokens": 768}
    """Its reference's turns and calls fit these (toolrl env check)."""
    Options = SupportOptions

    def __init__(self, config, options: SupportOptions):
        super().__init__(config, options)
        self.db = make_database(config.seed, options.customers)
        self.user = make_user(options.user, options.user_model, options.user_prompt)
        self.splits = TaskSplits(config, self._tasks())
        self.rubric = Rubric(
            [
                Criterion("correct", correct, 1.0),
                Criterion("db", database_matches, 0.0),
                Criterion("outputs", outputs_said, 0.0),
            ],
            success="correct",
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
        if self.options.user == "simulated":  # the user writes its opening itself (SupportEpisode.open)
            return [system]
        return [system, {"role": "user", "content": task.question}]

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """Identify the customer, then the errand's action; then tell the user what they had to hear."""
        rounds = tuple((ToolCall(c["name"], c["arguments"]),) for c in task.meta["calls"])
        outputs = " ".join(task.meta["outputs"])
        return [ReferenceRequest(rounds, f"Done. {outputs}".strip())]

    def reset(self, task: Task, seed: int | None = None) -> SupportEpisode:
        return SupportEpisode(task, self.messages(task), self._shop(), self.user, seed)
