"""Chat-template handling: tool prompts and token-exact observation framing."""

from toolrl.chat.format import FALLBACK_TOOL_PROMPT, ChatFormat

__all__ = ["FALLBACK_TOOL_PROMPT", "ChatFormat"]
