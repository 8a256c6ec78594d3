"""The algorithm families' registries (advantage estimators, policy losses, loss aggregations, KL estimators)
with their built-in entries declared by name: a config's names are checked, and `toolrl list` shows them,
without importing torch. The math is in advantages.py and losses.py, which register each entry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolrl.algos import correction_options
from toolrl.registry import Registry

Entry = Callable[..., Any]
"""The entries' own types are beside their math (advantages.Estimator, losses.PolicyLoss, ...), which imports
torch; this module does not."""

ADVANTAGES: Registry[Entry] = Registry("advantage estimator", "train.advantage")
"""Capabilities: needs_values (it reads value estimates and returns value targets). A trajectory of several segments is
one sample to every estimator (its trained tokens, segment after segment): train/update.py splits its advantages."""
register_advantage = ADVANTAGES.register

POLICY_LOSSES: Registry[Entry] = Registry("policy loss", "train.loss")
register_policy_loss = POLICY_LOSSES.register

AGGREGATIONS: Registry[Entry] = Registry("loss aggregation", "train.aggregation")
register_aggregation = AGGREGATIONS.register

KL_ESTIMATORS: Registry[Entry] = Registry("KL estimator", "train.kl.estimator")

CORRECTIONS: Registry[Entry] = Registry("off-policy correction", "train.correction")
"""How a token sampled by another policy than the trainer's is weighed (algos/corrections.py)."""
register_correction = CORRECTIONS.register

_BUILTIN: list[tuple[Registry[Any], str, list[str], dict[str, dict[str, Any]]]] = [
    (
        ADVANTAGES,
        "toolrl.algos.advantages",
        ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gigpo", "igpo"],
        {"gae": {"needs_values": True}},
    ),
    (POLICY_LOSSES, "toolrl.algos.losses", ["ppo_clip", "gspo", "vanilla_pg"], {}),
    (AGGREGATIONS, "toolrl.algos.losses", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"], {}),
    (KL_ESTIMATORS, "toolrl.algos.losses", ["k1", "k3"], {}),
    (CORRECTIONS, "toolrl.algos.corrections", ["none"], {}),
]
_CORRECTION_OPTIONS = {"token_tis": "CapOptions", "seq_tis": "CapOptions", "mis": "MaskOptions",
                       "icepop": "BandOptions", "decoupled_ppo": "ProximalOptions"}  # fmt: skip
for _name, _model in _CORRECTION_OPTIONS.items():
    CORRECTIONS.declare(_name, "toolrl.algos.corrections", options=getattr(correction_options, _model))
ADVANTAGES.declare("gdpo", "toolrl.algos.advantages", options=correction_options.GDPOOptions)
for _registry, _module, _plain, _capable in _BUILTIN:
    for _name in _plain:
        _registry.declare(_name, _module)
    for _name, _capabilities in _capable.items():
        _registry.declare(_name, _module, **_capabilities)
