"""An OpenAI-compatible gateway over the policy: agents written for any OpenAI client run unchanged against it,
and what they sample is recorded token-exactly for training (capture.py)."""

from toolrl.gateway.capture import Sample, Segment
from toolrl.gateway.server import Gateway

__all__ = ["Gateway", "Sample", "Segment"]
