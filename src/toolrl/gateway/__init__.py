"""A gateway over the policy that speaks the wire protocols agents are written for (OpenAI chat completions and
Responses, Anthropic Messages): agents and harnesses run unchanged against it, and what they sample is recorded
token-exactly for training (capture.py)."""

from toolrl.gateway.capture import Sample, Segment
from toolrl.gateway.protocols import PROTOCOLS, Protocol, register_protocol
from toolrl.gateway.server import Gateway
from toolrl.gateway.turns import GatewayError, Turn, TurnRequest

__all__ = ["PROTOCOLS", "Gateway", "GatewayError", "Protocol", "Sample", "Segment", "Turn", "TurnRequest",
           "register_protocol"]  # fmt: skip
