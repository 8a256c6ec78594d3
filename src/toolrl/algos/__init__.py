"""RL math: advantage estimators, policy losses, aggregations, KL estimators; each family a registry."""

from toolrl.algos.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    Advantages,
    TurnInput,
    group_advantages,
    informative_groups,
    register_advantage,
)
from toolrl.algos.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PolicyInputs,
    StepTotals,
    entropy_from_logits,
    kl_k1,
    kl_k3,
    register_aggregation,
    register_policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "Advantages",
    "PolicyInputs",
    "StepTotals",
    "TurnInput",
    "entropy_from_logits",
    "group_advantages",
    "informative_groups",
    "kl_k1",
    "kl_k3",
    "register_advantage",
    "register_aggregation",
    "register_policy_loss",
    "value_loss",
]
