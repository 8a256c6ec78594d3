"""Sandboxes that tasks run in: a box per episode, started by a provider (a registry: `local`, `container`, yours).

A box has a working folder and a few other writable folders; the host runs commands in it, copies files in and
out (always through a program run inside: the host never opens a path the box's code could have made a link),
and stops it, leaving nothing behind. Providers register with `@register_provider("name")` from any module that
`plugins` names (tests/fixtures/own_provider.py is one written outside the package).
"""

from toolrl.sandbox.provider import (
    PROVIDERS,
    Box,
    BoxSpec,
    ExecResult,
    ProviderOptions,
    SandboxProvider,
    make_provider,
    register_provider,
)

PROVIDERS.declare("local", "toolrl.sandbox.local")
PROVIDERS.declare("container", "toolrl.sandbox.container")

__all__ = [
    "PROVIDERS",
    "Box",
    "BoxSpec",
    "ExecResult",
    "ProviderOptions",
    "SandboxProvider",
    "make_provider",
    "register_provider",
]
