"""RL math: advantage estimators, policy losses, aggregations, KL estimators; each family a registry. Names are
imported from their modules when first read (toolrl.lazy): the registries (registries.py) import no torch."""

from toolrl.lazy import lazy_exports

_REGISTRIES = ["ADVANTAGES", "AGGREGATIONS", "CORRECTIONS", "KL_ESTIMATORS", "POLICY_LOSSES"]
_REGISTRATION = ["register_advantage", "register_aggregation", "register_correction", "register_policy_loss"]
_ADVANTAGES = ["AdvantageInputs", "Advantages", "TurnInput", "group_advantages", "informative_groups"]
_LOSSES = ["PolicyInputs", "StepTotals", "entropy_from_logits", "kl_k1", "kl_k3", "value_loss"]
_EXPORTS = {
    **dict.fromkeys(_REGISTRIES + _REGISTRATION, "toolrl.algos.registries"),
    **dict.fromkeys(_ADVANTAGES, "toolrl.algos.advantages"),
    **dict.fromkeys(_LOSSES, "toolrl.algos.losses"),
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
