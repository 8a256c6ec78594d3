"""Chat-template handling: tool prompts and token-exact observation framing."""

from toolrl.chat.format import FALLBACK_TOOL_PROMPT, TOOL_RESPONSE_FALLBACK, ChatFormat

__all__ = ["FALLBACK_TOOL_PROMPT", "TOOL_RESPONSE_FALLBACK", "ChatFormat"]
