"""The workbench: what a run works with (model, tokenizer, chat format, environment, tools, engines), and the
rollouts and evaluations made with it. Training (trainer.py), `toolrl eval` and the benchmarks share it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolrl import seeds
from toolrl.chat import ChatFormat
from toolrl.config import RunConfig
from toolrl.config.resolve import resolved
from toolrl.config.schema import SamplingConfig
from toolrl.envs import Environment, Task, make_env
from toolrl.envs.sample import spread_sample
from toolrl.errors import ConfigError
from toolrl.memory import keep_blocks
from toolrl.models import load_config, load_model, load_tokenizer, pick_device
from toolrl.models.fused import use_fused_blocks
from toolrl.progress import Heartbeat, Tally
from toolrl.rollout import Engine, Rollout, RolloutLimits, SamplingParams, Trajectory, get_engine_factory
from toolrl.rollout.engine import ENGINES
from toolrl.rollout.scripted import MODEL, POLICIES, playable, scripted_engine
from toolrl.tools import ToolExecutor
from toolrl.tools.toolset import Toolset, run_executor
from toolrl.train.evaluate import run_tasks, summarize

log = logging.getLogger(__name__)


def chat_format(config: RunConfig, name: str, tokenizer, model_config, env: Environment) -> ChatFormat:
    """The policy's chat format: with images for a vision-language model (`model_config`: its transformers
    config). An environment whose tasks show images refuses a text-only model, in one line."""
    from toolrl.models.vision import image_processor_for, is_vision_config

    if is_vision_config(model_config):
        from toolrl.chat.vision import VisionChatFormat
        from toolrl.models import resolve_model

        return VisionChatFormat(tokenizer, image_processor_for(resolve_model(name), tokenizer, model_config))
    if env.needs_vision:
        raise ConfigError(
            f"env {env.name} shows images, but model.name {name} reads text only; use a vision-language model "
            "(a Qwen2-VL-family folder: docs/vision.md)"
        )
    return ChatFormat(tokenizer)


@dataclass
class Workbench:
    """What a run works with: model, tokenizer, chat format, environment and tools."""

    config: RunConfig
    device: torch.device
    tokenizer: Any
    model: Any
    chat: ChatFormat
    env: Environment
    executor: ToolExecutor
    toolset: Toolset | None = None
    engines: dict[str, Engine] = field(default_factory=dict)
    policy: str = MODEL
    """Who plays the turns: the model, or a policy played without one (rollout/scripted.py: reference, idle)."""
    model_config: Any = None
    """The policy's transformers config (the model's own; read without weights for a scripted policy)."""
    gateways: dict[int, Any] = field(default_factory=dict)
    """An agent environment's gateway per engine (toolrl/gateway), started on first use."""
    side_engines: dict[str, Engine] = field(default_factory=dict)
    """Engines of other models that play no rollout (a teacher behind an endpoint scoring tokens): closed with
    the workbench, never given the policy's weights."""
    taken: dict[tuple[str, int | None], list[Task]] = field(default_factory=dict)
    """(split, N) -> the tasks sample() took (the same ones at every evaluation)."""
    note: Callable[[str], None] = field(default=lambda text: log.info("%s", text))
    """Where a line for the person running it goes (the trainer's progress, the CLI's console)."""

    @classmethod
    def load(
        cls, config: RunConfig, model_name: str | None = None, log_dir: Path | None = None, policy: str = MODEL
    ) -> Workbench:
        """`log_dir`: where tool servers and workers write their stderr (a run's tools/ folder; by default
        $TOOLRL_HOME/logs/tools). `policy`: a scripted policy's name loads the tokenizer and the model's config,
        not its weights (`model` is then None)."""
        config = resolved(config)  # a config built in Python: its code imported, its names checked, here once
        if policy != MODEL:
            POLICIES.lookup(policy)  # an unknown name fails before anything loads (after the plug-ins register)
        from toolrl import distributed

        device = distributed.device_for(distributed.from_env(), pick_device(config.device))
        keep_blocks(config.model.cpu_block_cache_mb)  # process-wide, as the allocator is (toolrl/memory.py)
        name = model_name or config.model.name
        tokenizer = load_tokenizer(name)
        env = make_env(config.env, name, config.rollout.parser)
        model = load_model(name, device, config.model.dtype, config.model.cpu_linear) if policy == MODEL else None
        if model is not None and config.model.fused_blocks:
            use_fused_blocks(model)
        model_config = model.config if model else load_config(name)
        chat = chat_format(config, name, tokenizer, model_config, env)
        bench = cls(config, device, tokenizer, model, chat, env, None, None, policy=policy)  # type: ignore[arg-type]
        bench.model_config = model_config
        bench.check_engine()
        bench.executor, bench.toolset = run_executor(env.tools(), config.tools, log_dir)
        return bench

    def play_as(self, policy: str) -> None:
        """From now on `policy` plays (a scripted one, as load(policy=) gives): the engines made for the last
        one are closed; the environment, its tools and the tokenizer stay loaded."""
        if self.model is None and policy == MODEL:
            raise ConfigError("this workbench was loaded without the model's weights; load it with policy=model")
        if policy != MODEL:
            POLICIES.lookup(policy)  # an unknown name is a one-line error naming the known ones
        for engine in self.distinct_engines():
            engine.close()
        self.engines.clear()
        self.policy = policy

    def check_engine(self) -> None:
        """The engine can serve this policy: a vision-language model needs one that takes images."""
        if self.policy != MODEL:
            return
        if self.chat.supports_images and not ENGINES.capability(self.engine_name, "supports_images"):
            raise ConfigError(
                f"rollout.engine: {self.engine_name} cannot take images, and model.name {self.config.model.name} "
                "is a vision-language model; use rollout.engine: hf (its vision engine) or an engine registered "
                "with supports_images=True"
            )

    def close(self) -> None:
        """End the engines, the tools' sessions and worker threads."""
        for gateway in self.gateways.values():
            gateway.stop()
        for engine in [*self.distinct_engines(), *self.side_engines.values()]:
            engine.close()
        self.side_engines.clear()
        self.executor.close()
        if self.toolset is not None:
            self.toolset.close()
        self.env.close()

    @property
    def engine_name(self) -> str:
        """rollout.engine; for a vision-language policy the default `hf` means its own engine, hf-vision."""
        name = self.config.rollout.engine
        return "hf-vision" if name == "hf" and self.chat.supports_images else name

    @property
    def context_length(self) -> int:
        """The policy's context in tokens (its language model's position embeddings)."""
        config = self.model.config if self.model is not None else self.model_config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(getattr(text, "max_position_embeddings", None) or 2**31)

    def distinct_engines(self) -> list[Engine]:
        """The engines made so far, each once (an engine that loads weights serves several purposes)."""
        return list({id(e): e for e in self.engines.values()}.values())

    def engine(self, purpose: str, seed: int) -> Engine:
        """One engine per purpose (train, eval), made on first use and kept for the run (it frees its cache
        between rollouts). An engine that loads the trainer's weights (vLLM) is one instance for every purpose."""
        if self.policy != MODEL:
            if purpose not in self.engines:  # made once: a scripted engine and its strategy are not free to build
                self.engines[purpose] = self.scripted(self.policy)
            return self.engines[purpose]
        name = self.engine_name
        if purpose not in self.engines and ENGINES.capability(name, "loads_weights") and self.engines:
            self.engines[purpose] = next(iter(self.engines.values()))
        if purpose not in self.engines:
            factory = get_engine_factory(name)
            self.engines[purpose] = factory(
                model=self.model, chat=self.chat, device=self.device, seed=seed, config=self.config
            )
        return self.engines[purpose]

    def scripted(self, policy: str) -> Engine:
        """An engine that plays the scripted `policy` (rollout/scripted.py) under the run's context strategy."""
        context = self.context()
        return scripted_engine(policy, self.chat, self.env.syntax, self.env, None if context is None else context())

    def rollout(self, sampling: SamplingConfig, seed: int, purpose: str = "train") -> Rollout:
        r = self.config.rollout
        params = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k)
        limits = RolloutLimits(
            r.max_turns,
            r.max_new_tokens,
            r.max_response_tokens,
            r.max_observation_tokens,
            params,
            r.stop_on_tool_error,
            r.last_turn_tools,
            r.max_images,
            r.max_image_tokens,
            r.max_calls_per_turn,
            r.max_context_tokens,
        )
        engine = self.engine(purpose, seed)
        parser = self.env.syntax  # rollout.parser, else the environment's own, else hermes (make_env)
        if getattr(self.env, "drives_itself", False):  # an agent environment: its agents ask the gateway
            from toolrl.rollout.agent import AgentRollout

            return AgentRollout(self.env, self.gateway(engine, params), self.executor, self.chat)
        return Rollout(self.env, engine, self.chat, parser, self.executor, limits, r.schedule, self.context())

    def context(self) -> Callable[[], Any] | None:
        """What makes a trajectory's context strategy (rollout.context), or None where it never compacts (none)."""
        from toolrl.config.resolve import plugin_options
        from toolrl.context import CONTEXTS

        name = self.config.rollout.context.name
        if CONTEXTS.capability(name, "passive"):
            return None
        strategy, options = CONTEXTS.lookup(name), plugin_options(self.config)["context"]
        return lambda: strategy(options)

    def gateway(self, engine: Engine, sampling: SamplingParams):
        """The gateway serving `engine` (started on first use), sampling as this rollout asks by default."""
        from toolrl.gateway import Gateway
        from toolrl.gateway.budget import KVBudget  # a run's rollout settings bound its agents' memory, measured

        if id(engine) not in self.gateways:
            r = self.config.rollout
            ceiling = getattr(self.env.options, "max_new_tokens", None) or r.max_new_tokens
            log.info("gateway: an agent's reply has at most %d tokens (env.options.max_new_tokens)", ceiling)
            self.gateways[id(engine)] = Gateway(
                engine, self.chat, self.env.syntax, self.config.model.name, max_new_tokens=ceiling,
                max_response_tokens=r.max_response_tokens, context_length=self.context_length,
                max_calls_per_turn=r.max_calls_per_turn, context=self.context(),
                max_context_tokens=r.max_context_tokens, budget=KVBudget(None),
            ).start()  # fmt: skip
        gateway = self.gateways[id(engine)]
        gateway.sampling = sampling
        return gateway

    def evaluate(self, num_tasks: int | None = None, temperature: float | None = None) -> dict[str, float]:
        """Means over the test split (see evaluation for the trajectories themselves)."""
        return summarize(self.evaluation(num_tasks, temperature), self.env.rubric.success)

    def sample(self, split: str, n: int | None, what: str) -> list[Task]:
        """`n` tasks of the split (all where None), a seeded sample spread over their categories (envs/sample.py);
        what was taken is logged the first time, as `what`."""
        if (split, n) not in self.taken:
            taken = spread_sample(self.env.tasks(split), n, self.config.env.seed)
            self.note(taken.line(f"{what} ({split} split)"))
            self.taken[(split, n)] = taken.tasks
        return self.taken[(split, n)]

    def eval_tasks(self, num_tasks: int | None = None, split: str = "test") -> tuple[list[Task], list[Task]]:
        """`num_tasks` of the split (eval.num_tasks; sample()): (those the policy plays, those it cannot: tasks
        without a reference under the reference policy), so that what is left out is counted."""
        return playable(self.env, self.sample(split, num_tasks or self.config.eval.num_tasks, "eval"), self.policy)

    def evaluation(
        self,
        num_tasks: int | None = None,
        temperature: float | None = None,
        tasks: Sequence[Task] | None = None,
        progress: Callable[[str], None] | None = None,
        what: str = "eval",
    ) -> list[Trajectory]:
        """The test split's trajectories (the first `num_tasks`, or `tasks`; at `temperature`, eval.* by
        default). A task the policy cannot play is left out, with a warning that counts them. `progress` is
        told a line (done/total, rate, ETA; progress.Tally) as tasks finish, at most every 10 s."""
        e = self.config.eval
        if tasks is None:
            tasks, left = self.eval_tasks(num_tasks)
            if left:
                log.warning("%d of %d tasks have no reference to play: left out", len(left), len(tasks) + len(left))
        sampling = e.sampling if temperature is None else e.sampling.model_copy(update={"temperature": temperature})
        tasks = [task for task in tasks for _ in range(e.trials)]  # each trial its own seed (run_tasks)
        rollout = self.rollout(sampling, seed=seeds.engine(self.config.seed, "eval"), purpose="eval")
        rollout.refuse_long_prompts(tasks, self.context_length)
        if progress is None:
            return run_tasks(rollout, tasks, e.batch_size, seed=seeds.evaluation(self.config.seed))
        tally = Tally(what, len(tasks), progress, batch=e.batch_size)
        with Heartbeat(tally):  # a line at least every 10 s, even while a batch runs
            return run_tasks(
                rollout, tasks, e.batch_size, seed=seeds.evaluation(self.config.seed), on_finished=tally.advance
            )
