"""Agents you already have, trained unchanged through the gateway: an `agent` environment runs your program per
sample against its own OpenAI-compatible base URL and scores its result with your reward."""

from toolrl.envs.agent.env import AgentEnv, AgentOutcome

__all__ = ["AgentEnv", "AgentOutcome"]
