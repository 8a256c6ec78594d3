"""Rollouts: generation engines, trajectories and the multi-turn tool loop."""

from toolrl.rollout.engine import ENGINES, Engine, Sampled, get_engine_factory
from toolrl.rollout.hf import HFEngine
from toolrl.rollout.loop import Rollout, RolloutLimits
from toolrl.rollout.openai import OpenAIEngine
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory
from toolrl.rollout.vision import VisionEngine
from toolrl.rollout.vllm import VLLMEngine

__all__ = [
    "ENGINES",
    "Engine",
    "HFEngine",
    "OpenAIEngine",
    "Rollout",
    "RolloutLimits",
    "Sampled",
    "SamplingParams",
    "Trajectory",
    "VLLMEngine",
    "VisionEngine",
    "get_engine_factory",
]
