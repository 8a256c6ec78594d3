"""OpenEnv environments (reset/step/state over HTTP and WebSocket) as toolrl environments, and toolrl
environments served as OpenEnv servers (server.py)."""

from toolrl.envs.openenv.env import OpenEnvEnv

__all__ = ["OpenEnvEnv"]
