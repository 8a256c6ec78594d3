"""On-policy distillation from a teacher behind an OpenAI-compatible endpoint (`train.kl.teacher_endpoint`).

The policy's own trajectories go to the teacher as token ids (`/v1/completions` with `echo` and `logprobs`: the
prompt's log-probs, which vLLM and SGLang return), and the teacher's log-prob of each trained token comes back in
place of a local teacher's (`train.kl.teacher`) or the reference model's: the KL term and its estimators are
unchanged. Samples of one task go to one server (its prefix cache holds their shared prompt); several servers
share the work and a failed one is left out for a while (rollout/openai.py). What the endpoint cannot do is one
line: no prompt log-probs (llama.cpp's server), other token ids than those sent (another tokenizer), images.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from toolrl.errors import ConfigError, EngineError
from toolrl.rollout.trajectory import Trajectory

SETTING = "train.kl.teacher_endpoint"


class EndpointTeacher:
    """Scores trajectories' trained tokens with a served teacher (its log-probs at temperature 1)."""

    def __init__(self, engine) -> None:
        self.engine = engine  # an OpenAIEngine (its servers, failover and thread pool)

    def score(self, trajs: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Per trajectory, the teacher's log-prob of each token with loss_mask 1, in order."""
        if any(traj.images for traj in trajs):
            raise EngineError(f"{SETTING}: images cannot be sent as token ids; use train.kl.teacher (a local model)")

        async def every() -> list[list[float]]:
            asked = [self.engine.prompt_logprobs(("kl-teacher", traj.task.id), traj.token_ids) for traj in trajs]
            try:
                return await asyncio.gather(*asked)
            finally:
                for traj in trajs:
                    self.engine.release(("kl-teacher", traj.task.id))

        rows = asyncio.run(every())
        return [
            torch.tensor([lp for lp, m in zip(row, traj.loss_mask, strict=True) if m], dtype=torch.float32)
            for row, traj in zip(rows, trajs, strict=True)
        ]


def endpoint_teacher(bench, config) -> EndpointTeacher | None:
    """The served teacher of `train.kl.teacher_endpoint` (None without one, or with kl.coef 0); its engine is
    one of the workbench's side engines, closed with it. Settings that cannot work together are one line each."""
    from toolrl.http import bearer_header
    from toolrl.rollout.openai import OpenAIEngine

    kl, served = config.train.kl, config.train.kl.teacher_endpoint
    if served is None or kl.coef <= 0:
        return None
    if kl.teacher:
        raise ConfigError(f"{SETTING}: give one teacher, train.kl.teacher (a local model) or this endpoint")
    temperature = config.rollout.sampling.temperature
    if temperature != 1.0:
        raise ConfigError(
            f"{SETTING}: the endpoint's log-probs are at temperature 1 and rollout.sampling.temperature is "
            f"{temperature:g}; sample at 1.0 or use train.kl.teacher (a local model, scored at any temperature)"
        )
    if "kl-teacher" not in bench.side_engines:
        headers = bearer_header(served.api_key_env, f"{SETTING}.api_key_env")
        bench.side_engines["kl-teacher"] = OpenAIEngine(
            served.base_url, served.model or config.model.name, bench.chat.tokenizer, bench.chat.stop_ids, headers,
            served.timeout_s, served.max_concurrency, setting=f"{SETTING}.base_url",
        )  # fmt: skip
    return EndpointTeacher(bench.side_engines["kl-teacher"])
