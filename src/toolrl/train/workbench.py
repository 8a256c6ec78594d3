"""The workbench: what a run works with (model, tokenizer, chat format, environment, tools, engines), and the
rollouts and evaluations made with it. Training (trainer.py), `toolrl eval` and the benchmarks share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolrl import seeds
from toolrl.chat import ChatFormat
from toolrl.config import RunConfig
from toolrl.config.resolve import resolved
from toolrl.config.schema import SamplingConfig
from toolrl.envs import Environment, make_env
from toolrl.errors import ConfigError
from toolrl.models import load_model, load_tokenizer, pick_device
from toolrl.rollout import Engine, Rollout, RolloutLimits, SamplingParams, Trajectory, get_engine_factory
from toolrl.rollout.engine import ENGINES
from toolrl.tools import ToolExecutor
from toolrl.tools.toolset import Toolset, run_executor
from toolrl.train.evaluate import run_tasks, summarize


def chat_format(config: RunConfig, name: str, tokenizer, model, env: Environment) -> ChatFormat:
    """The policy's chat format: with images for a vision-language model. An environment whose tasks show
    images refuses a text-only model, in one line."""
    from toolrl.models.vision import image_processor_for, is_vision_config

    if is_vision_config(model.config):
        from toolrl.chat.vision import VisionChatFormat
        from toolrl.models import resolve_model

        return VisionChatFormat(tokenizer, image_processor_for(resolve_model(name), tokenizer, model.config))
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

    @classmethod
    def load(cls, config: RunConfig, model_name: str | None = None, log_dir: Path | None = None) -> Workbench:
        """`log_dir`: where tool servers and workers write their stderr (a run's tools/ folder; by default
        $TOOLRL_HOME/logs/tools)."""
        config = resolved(config)  # a config built in Python: its code imported, its names checked, here once
        from toolrl import distributed

        device = distributed.device_for(distributed.from_env(), pick_device(config.device))
        name = model_name or config.model.name
        tokenizer = load_tokenizer(name)
        env = make_env(config.env, name, config.rollout.parser)
        model = load_model(name, device, config.model.dtype)
        chat = chat_format(config, name, tokenizer, model, env)
        bench = cls(config, device, tokenizer, model, chat, env, None, None)  # type: ignore[arg-type]
        bench.check_engine()
        bench.executor, bench.toolset = run_executor(env.tools(), config.tools, log_dir)
        return bench

    def check_engine(self) -> None:
        """The engine can serve this policy: a vision-language model needs one that takes images."""
        if self.chat.supports_images and not ENGINES.capability(self.engine_name, "supports_images"):
            raise ConfigError(
                f"rollout.engine: {self.engine_name} cannot take images, and model.name {self.config.model.name} "
                "is a vision-language model; use rollout.engine: hf (its vision engine) or an engine registered "
                "with supports_images=True"
            )

    def close(self) -> None:
        """End the engines, the tools' sessions and worker threads."""
        for engine in self.distinct_engines():
            engine.close()
        self.executor.close()
        if self.toolset is not None:
            self.toolset.close()

    @property
    def engine_name(self) -> str:
        """rollout.engine; for a vision-language policy the default `hf` means its own engine, hf-vision."""
        name = self.config.rollout.engine
        return "hf-vision" if name == "hf" and self.chat.supports_images else name

    @property
    def context_length(self) -> int:
        """The policy's context in tokens (its language model's position embeddings)."""
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(getattr(text, "max_position_embeddings", None) or 2**31)

    def distinct_engines(self) -> list[Engine]:
        """The engines made so far, each once (an engine that loads weights serves several purposes)."""
        return list({id(e): e for e in self.engines.values()}.values())

    def engine(self, purpose: str, seed: int) -> Engine:
        """One engine per purpose (train, eval), made on first use and kept for the run (it frees its cache
        between rollouts). An engine that loads the trainer's weights (vLLM) is one instance for every purpose."""
        name = self.engine_name
        if purpose not in self.engines and ENGINES.capability(name, "loads_weights") and self.engines:
            self.engines[purpose] = next(iter(self.engines.values()))
        if purpose not in self.engines:
            factory = get_engine_factory(name)
            self.engines[purpose] = factory(
                model=self.model, chat=self.chat, device=self.device, seed=seed, config=self.config
            )
        return self.engines[purpose]

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
        )
        engine = self.engine(purpose, seed)
        parser = self.env.syntax  # rollout.parser, else the environment's own, else hermes (make_env)
        return Rollout(self.env, engine, self.chat, parser, self.executor, limits, r.schedule)

    def evaluate(self, num_tasks: int | None = None, temperature: float | None = None) -> dict[str, float]:
        """Means over the test split (see evaluation for the trajectories themselves)."""
        return summarize(self.evaluation(num_tasks, temperature), self.env.rubric.success)

    def evaluation(self, num_tasks: int | None = None, temperature: float | None = None) -> list[Trajectory]:
        """The test split's trajectories (the first `num_tasks`, at `temperature`; eval.* by default)."""
        e = self.config.eval
        tasks = self.env.tasks("test")[: num_tasks or e.num_tasks]
        sampling = e.sampling if temperature is None else e.sampling.model_copy(update={"temperature": temperature})
        rollout = self.rollout(sampling, seed=seeds.engine(self.config.seed, "eval"), purpose="eval")
        rollout.refuse_long_prompts(tasks, self.context_length)
        return run_tasks(rollout, tasks, e.batch_size, seed=seeds.evaluation(self.config.seed))
