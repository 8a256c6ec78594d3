"""One exception hierarchy for toolrl: every message says what went wrong and what to do next."""

from __future__ import annotations


class ToolRLError(Exception):
    """Base of every error toolrl raises on purpose; the CLI prints it as one line."""


class ConfigError(ToolRLError):
    """A config file or override is invalid."""


class ModelNotFoundError(ToolRLError):
    """A model name or path cannot be resolved to weights on this machine."""


class ToolError(ToolRLError):
    """A tool definition is invalid (not a failed call: failed calls become observations)."""


class TemplateError(ToolRLError):
    """A chat template does not have the structure toolrl needs."""


class EngineError(ToolRLError):
    """A generation engine cannot serve: a server that is down or answers in the wrong shape."""


class DataError(ToolRLError):
    """A task or corpus file cannot be read or lacks a field toolrl needs."""
