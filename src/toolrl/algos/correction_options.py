"""The options of the built-in off-policy corrections (algos/corrections.py) and advantage estimators
(algos/advantages.py), apart from their math so that a config's `train.correction_options` and
`train.advantage_options` are checked without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CapOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cap: float = Field(2.0, gt=0)
    """The most a weight may be."""


class MaskOptions(CapOptions):
    level: Literal["token", "sequence"] = "token"
    """token: each token whose ratio is above the cap is masked; sequence: every token of a sequence whose ratio
    is."""


class BandOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    low: float = Field(0.5, gt=0)
    high: float = Field(2.0, gt=0)
    """Tokens whose ratio is outside [low, high] are masked."""


class ProximalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cap: float | None = Field(None, gt=0)
    """Truncate the behaviour weight at this value; None: untruncated."""


class GDPOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_norm: bool = True
    """Whiten the summed advantages over the step's valid trajectories (GDPO's batch normalization); False leaves
    the sum of the per-component group advantages as it is."""
