"""The typed configuration of a toolrl run: every field, its type and its default."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator

from toolrl.config.rollout import RolloutConfig, SamplingConfig
from toolrl.config.run_name import run_name_problem
from toolrl.config.section import Section


class ModelConfig(Section):
    name: str = "smollm2-135m-instruct"
    """An embedded model name, a local Hugging Face folder, or a hub id already in the local cache."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    cpu_linear: Literal["onednn", "torch"] = "onednn"
    """On CPU in float32, the kernels of the linear layers: oneDNN (PyTorch's own; 1.5-1.9x faster training and
    generation than torch's default on the AMD CPU measured, bench/kernels/linear_kernels.py) or torch's default."""
    cpu_decode_kernel: Literal["auto", "native", "onednn"] = "auto"
    """CPU fp32 generation's products of a few rows: `native` on toolrl's AVX2 kernel (models/native, built once per
    machine by the C compiler on PATH; bench/kernels/decode_kernel.py), `onednn` on oneDNN, `auto` the kernel on AVX2
    and AVX-512 CPUs where a compiler builds it, else oneDNN."""
    cpu_block_cache_mb: int = Field(512, ge=0, le=1 << 20)
    """From 2,048-token sequences, freed CPU blocks of 1 MiB+ are kept by size for reuse, up to this many MB: far
    fewer page faults (models/native/block_cache.py, built by the C++ compiler on PATH). 0: each mapped anew."""
    fused_blocks: bool = True
    """The trained model's RMSNorm and SwiGLU feed-forward as one autograd step each (models/fused.py): the same
    values, about 38% less activation memory in a training step's forward pass; false keeps transformers' own."""


class JudgeConfig(Section):
    weight: float = 0.0
    """Weight of the judge's score (0..1) in the reward; 0 logs it only (reward/judge)."""
    mode: Literal["each", "group"] = "each"
    """each: one prompt per trajectory; group: one prompt per task's group, each trajectory scored against the others
    (RULER); a group the judge does not score in full is a judge failure, left out of the loss (env_faults)."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint (http://host:port/v1); unset: a local Hugging Face model."""
    model: str = ""
    """The served model's name, or the local model (embedded name or folder); empty: the run's model.name."""
    api_key_env: str | None = None
    template: str | None = None
    """Prompt with {question}, {answer}, {response} (the final <answer>), {transcript}, {max_score}; with mode
    group: {question}, {answer}, {attempts} (each trajectory's text, numbered), {n}, {max_score}; unset: built in."""
    max_score: float = Field(10.0, gt=0)
    fallback: float = 0.0
    """Score given when the judge fails or its reply has no score (counted in judge/fallbacks)."""
    max_new_tokens: int = Field(32, ge=1)
    max_concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(60.0, gt=0)


class EnvConfig(Section):
    """What every environment has. An environment's own settings go in `options`, validated by its Options
    model (in its own folder; `toolrl config show` prints them filled in)."""

    name: str = "calculator"
    module: str | list[str] | None = None
    """Module(s) to import first, so that an environment registered outside toolrl (`@register_env`) is found;
    installed packages can list theirs in the `toolrl.environments` entry-point group instead."""
    seed: int = 1234
    train_file: str | None = None
    """Tasks to train on: JSONL, JSON, Parquet (Search-R1 / FlashRAG shapes too) or a `datasets` folder saved
    with save_to_disk; unset: the environment's own tasks."""
    test_file: str | None = None
    """Held-out tasks, same formats; unset: the environment's own test split."""
    reward_weights: dict[str, float] = {}
    """Weights by criterion name over the environment's defaults; weight 0 logs a criterion only."""
    judge: JudgeConfig | None = None
    """A model judge added to the rubric as criterion `judge`."""
    options: dict[str, Any] = {}
    """The environment's own settings (see its Options model: `toolrl config show --set env.name=NAME`)."""
    _typed: tuple[dict[str, Any], Any] | None = PrivateAttr(None)
    _files_read: bool = PrivateAttr(False)

    def task_files(self) -> dict[str, str | None]:
        """`train_file` and `test_file` by split, for an environment that reads them (TaskSplits does): an
        environment that never asks is refused them (make_env), never given them to ignore."""
        self._files_read = True
        return {"train": self.train_file, "test": self.test_file}

    def unread_task_files(self) -> list[str]:
        """The task-file keys set for an environment that never asked for them (`task_files`)."""
        given = [k for k in ("train_file", "test_file") if getattr(self, k)]
        return [] if self._files_read else given

    def modules(self) -> list[str]:
        """`module` as a list."""
        return self.module if isinstance(self.module, list) else [self.module] if self.module else []

    def keep_options(self, typed: BaseModel) -> None:
        """`options` as validated by the environment's Options model (config/resolve.py), written out in full."""
        self.options = typed.model_dump(mode="json")
        self._typed = (copy.deepcopy(self.options), typed)

    def kept_options(self) -> Any:
        """The validated options, while `options` is still what was validated (None otherwise)."""
        return self._typed[1] if self._typed is not None and self._typed[0] == self.options else None


class ToolsConfig(Section):
    file: str | None = None
    """A tool config file (mcpServers style, YAML or JSON); its tools are offered besides the environment's."""
    timeout_s: float = Field(10.0, gt=0)
    """Default deadline of a call, its retries included; a tool's policy in the file may override it."""
    import_timeout_s: float = Field(120.0, gt=0)
    """How long a worker process may take to import a Python tool's module; the call's deadline starts after."""
    max_concurrency: int = Field(64, ge=1)
    """Tool calls in flight at once, over all trajectories."""
    cache_file: str | None = None
    """sqlite file that keeps results of tools whose policy has cache: true across runs; in memory if unset."""
    image_max_pixels: int = Field(1024 * 1024, ge=64)
    """A tool's image with more pixels is scaled down to this many (aspect kept)."""
    images_per_result: int = Field(8, ge=0)
    """More images in one tool result are the tool's error."""


class TeacherConfig(Section):
    """A teacher behind an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, a hosted API)."""

    base_url: str | list[str]
    model: str = ""
    """The model name the endpoint serves (default: model.name)."""
    api_key_env: str | None = None
    """The environment variable holding its key (never the key itself in a config)."""
    timeout_s: float = Field(600.0, gt=0)
    max_concurrency: int = Field(16, ge=1)


class KLConfig(Section):
    coef: float = Field(0.0, ge=0)
    """Weight of the KL term to the initial (reference) model, after a warm start the warm-started policy; 0 turns
    the reference model off."""
    estimator: str = "k3"
    """k1 (logp - ref_logp) or k3 (low variance, never negative)."""
    mode: Literal["loss", "reward"] = "loss"
    """loss: coef * KL joins the loss (GRPO); reward: -coef * KL per token joins the rewards before the
    advantages are estimated (PPO, REINFORCE++)."""
    teacher: str | None = None
    """On-policy distillation: the KL is to this model (a name or folder, as model.name; it must share the
    policy's tokenizer) instead of the initial policy. With mode reward and estimator k1, each sampled token is
    rewarded -coef (log p_policy - log p_teacher): the reverse KL to the teacher, on the policy's own samples."""
    teacher_endpoint: TeacherConfig | None = None
    """On-policy distillation (instead of `teacher`) from a teacher behind an OpenAI-compatible endpoint returning
    prompt log-probs (vLLM, SGLang: completions with echo and logprobs), sent each trajectory's token ids; it must
    serve the policy's tokenizer (checked at start through vLLM's /tokenize) and gives log-probs at temperature 1,
    so rollout.sampling.temperature must be 1."""
    task_reward: float = Field(1.0, ge=0)
    """Scale of the environment's reward in the advantages; 0 with a teacher: distillation alone."""


class LoRAConfig(Section):
    r: int = Field(0, ge=0)
    """Rank of the LoRA adapters (peft); 0 trains every weight."""
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"


class SFTConfig(Section):
    """The supervised warm start (`toolrl sft`, or `train.warm_start` before RL): fine-tune on trajectories in
    the RL format (token ids, the model's turns in the loss), from one source."""

    source: str = "reference"
    """reference (the environment's reference policy plays the train split), teacher (a model behind an
    OpenAI-compatible endpoint plays it: sft.teacher), file (a JSONL of conversations in the OpenAI messages
    format: sft.file), self (rejection sampling: the policy's own successful samples, sft.rounds times)."""
    file: str | None = None
    """source file: one {"messages": [...], "tools": [...]} per line (tools optional: the environment's)."""
    teacher: TeacherConfig | None = None
    num_tasks: int | None = Field(None, ge=1)
    """Train-split tasks played per round (all by default): a sample spread over the tasks' categories, seeded by
    env.seed (envs/sample.py)."""
    samples_per_task: int = Field(1, ge=1)
    """Trajectories sampled per task (source self, teacher): the more, the likelier a success."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of the player (teacher, self)."""
    keep: Literal["success", "all"] = "success"
    """Which trajectories to learn from: the successful ones (the rubric's success criterion, else reward > 0)
    or every one (a file's conversations are always all kept)."""
    rounds: int = Field(1, ge=1)
    """Play, keep, fine-tune, again (rejection sampling: each round samples from the policy just tuned)."""
    epochs: int = Field(2, ge=1)
    """Passes over each round's kept trajectories."""
    batch_size: int = Field(8, ge=1)
    """Trajectories per optimizer step (micro-batched by train.micro_batch_tokens)."""
    lr: float = Field(1e-5, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)


class CurriculumConfig(Section):
    mode: Literal["shuffle", "pass_rate"] = "shuffle"
    """shuffle: every train task once per epoch, in a seeded order; pass_rate: each task drawn with weight
    4p(1-p) of its recent pass rate p (groups that all succeed or all fail carry no GRPO signal), at least
    `floor`; a task never tried weighs 1."""
    window: int = Field(8, ge=1)
    """Outcomes remembered per task (its last samples)."""
    floor: float = Field(0.05, gt=0, le=1)
    """The least weight a task keeps, so that a solved or hopeless one comes back now and then."""


class TurnCreditConfig(Section):
    model: str | None = None
    """Dense turn credit (train/turn_credit.py): the frozen model that scores log p(gold answer | context) before each
    turn and after the last, each turn credited with the change over it. None: off; reference: the run's initial
    policy (its frozen copy, or LoRA's adapters off; after train.warm_start, the warm-started policy); else a model
    name or folder with the policy's tokenizer."""
    coef: float = 1.0
    """Each credit's weight as a turn reward."""
    template: str = "<answer>{answer}</answer>"
    """How the gold answer is written where it is scored, as the environment's final answers are ({answer} once)."""
    measure: Literal["logprob", "prob"] = "logprob"
    """What a turn's credit is the change of: logprob, log p(gold) summed over its tokens (TRACE; a turn moves it by
    several nats); prob, the per-token geometric mean probability exp(mean log p) (IGPO; a credit in [-1, 1])."""
    normalize: bool = False
    """Standardize the credits of each group's turns (per role) to mean 0, std 1 before `coef` weighs them (for
    reinforce_pp, gae, gigpo; train.advantage igpo standardizes a group's turn rewards, outcome included, itself)."""


class TrainConfig(Section):
    steps: int = Field(20, ge=0)
    prompts_per_step: int = Field(4, ge=1)
    group_size: int = Field(6, ge=1)
    micro_batch_tokens: int = Field(1024, ge=1)
    """Most rows x padded suffix tokens per forward/backward pass (sorted by length; gradients accumulate over the
    step). Activations grow with it (~0.9 MB a token, default model); 1024 keeps `make demo` under 4 GB, for an
    update ~10% slower than 3072 on 2 cores (bench/memory.py --micro-batches). With memory to spare, raise it."""
    share_prompt_pass: bool = True
    """The rollout computes the shared prompt with the update's forward pass, kept for the update (held during the
    rollout too: ~1 MB a prompt token without checkpointing); false computes it twice (scoring/rollout_prefix.py)."""
    vocab_block_rows: int = Field(512, ge=0)
    """Scored tokens whose vocabulary-sized logits exist at once (scoring/vocab.py: log-probs a block at
    a time, only the softmax kept for the backward pass). 0: all of a micro-batch's at once, the plain
    log_softmax ([tokens, vocab] fp32 tensors, 0.2 MB a token each with a 49k vocabulary, three or four of them)."""
    vocab_keep_mb: float = Field(128.0, ge=0)
    """Most softmax kept between a micro-batch's forward and backward passes; blocks beyond it are recomputed in
    the backward pass (one more output-layer matmul over their tokens). 0: recompute every block."""
    advantage: str = "grpo"
    """grpo, dr_grpo, rloo, reinforce_pp, gae (PPO, with a value head), gigpo or igpo (turn-level credit)."""
    advantage_options: dict[str, Any] = {}
    """Options of the advantage estimator, validated by the options model it registered with (an estimator of
    your own: `@register_advantage("name", options=Model)`; `toolrl list advantage` shows each one's)."""
    step_weight: float = Field(1.0, ge=0)
    """gigpo: weight of the turn-level advantage beside the trajectory-level one (the paper's omega)."""
    turn_rewards: Literal["rubric", "tokens"] = "rubric"
    """The environment's per-turn rewards (StepResult.reward): rubric: they count through the rubric's
    `process` criterion when it is weighted (summed into the trajectory's reward); tokens: each is also given
    at its turn's last generated token (credited to that turn and the ones before it by reinforce_pp and gae).
    gigpo always reads them per turn."""
    turn_credit: TurnCreditConfig = TurnCreditConfig()
    """Dense turn credit from a frozen model's log-probability of the gold answer at each tool boundary (TRACE,
    IGPO); off unless `model` is set."""
    summary_weight: float = Field(1.0, ge=0)
    """Loss weight of the tokens the policy wrote for a context strategy (rollout.context: a summary, a fold's
    return), beside 1 for its turns; they take the trajectory's advantage either way. 0 leaves them out."""
    loss: str = "ppo_clip"
    """ppo_clip, gspo or vanilla_pg."""
    aggregation: str = "token_mean"
    """token_mean, seq_mean_token_sum or seq_mean_token_mean."""
    clip_low: float = Field(0.2, gt=0)
    clip_high: float = Field(0.2, gt=0)
    """Upper clip bound; DAPO's clip-higher sets it above clip_low (e.g. 0.28)."""
    kl: KLConfig = KLConfig()
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of an entropy bonus (the loss subtracts coef * entropy)."""
    dynamic_sampling: bool = False
    """Leave groups whose rewards are all equal out of the loss (DAPO's dynamic sampling, without re-sampling)."""
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    """The discount (advantage gae and reinforce_pp's per-token rewards) and GAE's lambda. On-policy
    distillation with reinforce_pp wants gamma 0: each token's reverse KL credits that token alone; summed over
    the tokens to come (gamma 1) every earlier token pays for the later ones, which rewards stopping early."""
    vf_coef: float = Field(0.1, ge=0)
    value_clip: float = Field(0.2, gt=0)
    """Weight and clip range of the value loss (advantage: gae)."""
    lr: float = Field(2e-5, gt=0)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = Field(1.0, gt=0)
    advantage_eps: float = Field(1e-4, gt=0)
    tis_cap: float | None = Field(None, gt=0)
    """Truncated importance sampling: weigh each trained token's loss by min(pi_trainer / pi_engine, cap), the
    correction for an engine that samples with other numerics or weights than the trainer computes (vLLM, a
    step-old copy); 2.0 is common. None: off (the mismatch is still logged as mismatch/*)."""
    correction: str = "none"
    """How a token sampled by another policy than the trainer's is weighed (algos/corrections.py): none,
    token_tis, seq_tis, mis (masking), icepop (a two-sided band), decoupled_ppo (a proximal policy apart from the
    behaviour policy), or one of your own (`@register_correction`); each logs correction/masked_fraction,
    mean_weight and capped_fraction. `tis_cap: X` is `correction: token_tis` with `cap: X`."""
    correction_options: dict[str, Any] = {}
    """Options of the correction (`toolrl list correction` shows each one's): cap, level, low, high."""
    async_steps: int = Field(0, ge=0, le=8)
    """N: generation runs up to N steps ahead of the trainer, on a copy of the policy: the rollouts of steps k+1..k+N
    may run while step k trains, and no trajectory is trained by weights more than N updates newer than those that
    sampled it (offpolicy/staleness). The ratio is against the behaviour log-probs unless a correction says
    otherwise (docs/scaling.md). 0: on-policy, lock-step."""
    partial_rollouts: Literal["off", "continue", "cut"] = "off"
    """With async_steps: whether an episode in flight when the trainer updates takes the new weights (rollout/
    inflight.py). off: each rollout is sampled by the weights it started with; continue: the engine takes them
    between decoding steps and the episode goes on (cached keys and values kept); cut: the episode is cut there and
    resumed with its context computed again by the new weights. Every token is tagged with its weights' version."""
    mask_truncated: bool = False
    """Leave truncated trajectories (cut by a token limit) out of the loss, as DAPO's overlong filtering does."""
    infra_faults: Literal["mask", "keep"] = "mask"
    """mask: a trajectory hit by an infrastructure fault of a tool (timeout, crash, transport failure) is left out
    of its group's advantage statistics and of the loss, so that a tool's failure is never learned as the
    model's mistake; keep: train on it like any other."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    memory_limit_gb: float | None = Field(None, gt=0)
    """The memory a step may peak at: `toolrl train` refuses a configuration estimated above it (train/estimate.py).
    None: the memory available when the run starts."""
    lora: LoRAConfig = LoRAConfig()
    train_vision: bool = False
    """A vision-language policy: also train its vision tower and merger (frozen by default; LoRA adapts them)."""
    save_every: int = Field(0, ge=0)
    """Write a resumable checkpoint (last/) every N steps; 0: only at the end."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the test split every N steps and keep the best checkpoint (best/); 0 turns it off."""
    samples_per_step: int | None = Field(None, ge=0)
    """Trajectories written to samples.jsonl each step (records with tokens, log-probs, advantages, tool calls:
    what `toolrl ui`'s trajectory viewer shows); None: all of them, 0: none."""
    sample_images_per_step: int = Field(32, ge=0)
    """Images of the written trajectories (a vision-language policy's) saved as PNG under RUN/images/ per step
    and per evaluation, for the UI's trajectory viewer."""
    samples_max_mb: float = Field(200.0, gt=0)
    """Bound on samples.jsonl and evals.jsonl, each: once a file reaches it, later records are not written (a
    warning says so). A record of the default run is ~5 KB."""
    report_to: list[Literal["tensorboard", "wandb"]] = []
    """Loggers besides metrics.jsonl: tensorboard (runs/NAME/tensorboard), wandb (offline mode, no network)."""
    curriculum: CurriculumConfig = CurriculumConfig()
    warm_start: bool = False
    """Fine-tune with the `sft` section before the first RL step (the evaluation at start measures the model
    before it); `toolrl sft` is a run of the warm start alone."""

    @field_validator("partial_rollouts", mode="before")
    @classmethod
    def _off_as_yaml_reads_it(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads an unquoted `off` (a file's, a --set's) as false


class EvalConfig(Section):
    num_tasks: int = Field(100, ge=1)
    """Test-split tasks of each evaluation: a sample spread over the tasks' categories, seeded by env.seed, the same
    at every evaluation (envs/sample.py); the whole split where it has no more."""
    batch_size: int = Field(25, ge=1)
    at_start: bool = True
    at_end: bool = True
    sampling: SamplingConfig = SamplingConfig(temperature=1.0)
    samples_per_eval: int | None = Field(None, ge=0)
    """Trajectories of each evaluation written to evals.jsonl (the same test tasks at every evaluation: a viewer
    compares them across steps); None: all of them, 0: none."""
    trials: int = Field(1, ge=1, le=64)
    """Trajectories sampled per task (k): above 1, each evaluation reports pass@k (any of k succeeds) and pass^k
    (all k do, tau-bench's reliability) for every k up to it. Greedy sampling (temperature 0) repeats one
    trajectory: sample at a temperature above 0."""


class RunConfig(Section):
    plugins: list[str] = []
    """Modules to import first: they register parsers, advantage estimators, losses, engines, criteria or
    environments of your own (`@register_parser`, `@register_advantage`, ...); see docs/extending.md."""
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: str = "runs"
    run_name: str | None = None
    """The run's folder under output_dir (default: a timestamp and the environment's name): one folder name."""
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    tools: ToolsConfig = ToolsConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    _resolved: bool = PrivateAttr(False)
    _plugin_typed: tuple[Any, dict[str, Any]] | None = PrivateAttr(None)

    @field_validator("env", mode="before")
    @classmethod
    def _a_list_is_a_mix(cls, env: Any) -> Any:
        """`env` as a list of environments (each with its `weight`) is the `mix` environment of them (envs/mix)."""
        return {"name": "mix", "options": {"environments": env}} if isinstance(env, list) else env

    @field_validator("run_name")
    @classmethod
    def _one_folder_name(cls, name: str | None) -> str | None:
        # a config names its run's folder: `/etc`, `../x` or `a/b` would put the run outside output_dir
        problem = None if name is None else run_name_problem(name)
        if problem:
            raise ValueError(f"{problem}; output_dir says where runs go")
        return name

    @property
    def is_resolved(self) -> bool:
        """Whether config/resolve.py imported its code and checked its names against the registries."""
        return self._resolved

    def mark_resolved(self) -> None:
        self._resolved = True

    def keep_plugin_options(self, typed: dict[str, Any]) -> None:
        """The plug-ins' options as their models validated them (config/resolve.py's plugin_options)."""
        self._plugin_typed = (self._plugin_choice(), typed)

    def kept_plugin_options(self) -> dict[str, Any] | None:
        """The validated plug-in options, while the choices they were validated for are unchanged (else None)."""
        if self._plugin_typed is None or self._plugin_typed[0] != self._plugin_choice():
            return None
        return self._plugin_typed[1]

    def _plugin_choice(self) -> Any:
        context, t = self.rollout.context, self.train
        return copy.deepcopy((t.advantage, t.advantage_options, context.name, context.options, t.correction,
                              t.correction_options, t.tis_cap))  # fmt: skip
