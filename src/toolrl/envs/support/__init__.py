"""The `support` environment: customer service for a small shop, tau-bench style. A written policy, a database
the tools change, a user (scripted, or a model playing a scenario the policy never sees) and tau-bench's reward:
the final database equals the one the reference actions leave, and the agent said what the user had to hear."""

from toolrl.envs.support.env import SupportEnv

__all__ = ["SupportEnv"]
