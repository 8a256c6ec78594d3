"""verifiers environments (a `vf.Environment`: dataset, rollout loop, rubric) as toolrl environments, run in
verifiers' own virtual environment through a bridge process (bridge.py)."""

from toolrl.envs.verifiers.env import VerifiersEnv

__all__ = ["VerifiersEnv"]
