"""The rollout's section of the run config: engine, limits, sampling, context management."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr

from toolrl.config.section import Section


class ContextConfig(Section):
    name: str = "none"
    """none (a full context stops the trajectory), sliding_window, summarize, fold, or one registered
    (`toolrl.context.register_context`)."""
    options: dict[str, Any] = {}
    """The strategy's own settings, validated by its options model (`toolrl list context` shows them)."""


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0)
    """0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Sample from the smallest set of tokens whose probability reaches top_p; 1 turns it off."""
    top_k: int = Field(0, ge=0)
    """Sample from the k most likely tokens; 0 turns it off."""


class OpenAIConfig(Section):
    base_url: str | list[str] = "http://127.0.0.1:8000/v1"
    """One server, or a list: sequences are spread over them, a failing one is left out for a while."""
    model: str = ""
    """The served model's name; empty means the run's model.name."""
    api_key_env: str | None = None
    """Environment variable holding the API key, if the server needs one."""
    timeout_s: float = Field(600.0, gt=0)
    max_concurrency: int = Field(64, ge=1)
    weights_dir: str | None = None
    """rollout.engine vllm-server: the folder the trainer writes its weights to and every server reloads them
    from (a shared file system across machines); default: a new folder in /dev/shm (servers on this machine)."""


class RolloutConfig(Section):
    engine: str = "hf"
    """hf (in-process transformers, continuous batching), vllm (in-process vLLM), vllm-server (vLLM servers,
    `rollout.openai.base_url`, started with VLLM_SERVER_DEV_MODE=1; the three train) or openai (one or more
    OpenAI-compatible servers; evaluation and judges)."""
    schedule: Literal["async", "lockstep"] = "async"
    """async: each trajectory goes back to generation as soon as its tools return; lockstep: turn by turn."""
    parser: str | None = None
    """hermes, llama3-json, pythonic, search-r1, or one registered; unset: the environment's own, else hermes."""
    max_turns: int = Field(3, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    """Most tokens the model may generate in one turn."""
    max_response_tokens: int = Field(384, ge=1)
    """Token budget of one trajectory after its prompt: generated plus observation tokens."""
    max_observation_tokens: int = Field(128, ge=1)
    max_calls_per_turn: int = Field(16, ge=1)
    """Tool calls run from one model turn; the calls past it are not run, and the model is told how many (one
    format error per call not run, in the `format_errors` metric)."""
    max_images: int = Field(16, ge=0)
    """Images per trajectory a vision-language policy is shown (task's and tools'); later ones are named in text."""
    max_image_tokens: int = Field(8192, ge=0)
    """Image tokens per trajectory (what images cost in the sequence, hence in memory): a tool's image past
    it is named in the observation's text instead; a task whose own images exceed it fails in one line."""
    stop_on_tool_error: bool = False
    """End a trajectory when a tool call fails (stop reason tool_error) instead of showing the model the error."""
    last_turn_tools: bool = False
    """Also run the tool calls of the last allowed turn; their results end the trajectory (no loss on them)."""
    max_context_tokens: int | None = Field(None, ge=2)
    """The most tokens one segment of a trajectory holds, its prompt included: past it the context strategy
    compacts (`context`), and under `none` the trajectory stops (stop reason length). None: no bound besides
    max_response_tokens (and the model's context, which a prompt must fit)."""
    context: ContextConfig = ContextConfig()
    """Context management when a trajectory's context fills up (toolrl/context, docs/context.md)."""
    _from_environment: set[str] = PrivateAttr(default_factory=set)
    """The keys the environment's rollout_defaults filled (the config set none): `toolrl env check` says where
    each limit came from."""
    openai: OpenAIConfig = OpenAIConfig()
    sampling: SamplingConfig = SamplingConfig()

    def source(self, key: str) -> str:
        """Where the value of `key` came from: config, environment (its rollout_defaults) or default."""
        if key in self._from_environment:
            return "environment"
        return "config" if key in self.model_fields_set else "default"
