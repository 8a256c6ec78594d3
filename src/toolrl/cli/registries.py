"""`toolrl list`: every registered part (built in and the plug-ins named), its capabilities and its options."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from toolrl.cli.app import app, console
from toolrl.errors import ConfigError
from toolrl.text import did_you_mean


def registries() -> dict[str, Any]:
    """Kind -> registry, for every kind of part a config picks by name."""
    from toolrl.algos import ADVANTAGES, AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
    from toolrl.context import CONTEXTS
    from toolrl.envs.base import ENVIRONMENTS
    from toolrl.parsers.base import PARSERS
    from toolrl.rewards.rubric import CRITERIA
    from toolrl.rollout.engine import ENGINES
    from toolrl.runs.loggers import LOGGERS
    from toolrl.tools.toolset import ENTRY_KINDS

    return {
        "environment": ENVIRONMENTS,
        "parser": PARSERS,
        "engine": ENGINES,
        "context": CONTEXTS,
        "advantage": ADVANTAGES,
        "loss": POLICY_LOSSES,
        "aggregation": AGGREGATIONS,
        "kl": KL_ESTIMATORS,
        "correction": CORRECTIONS,
        "criterion": CRITERIA,
        "logger": LOGGERS,
        "tool-entry": ENTRY_KINDS,
    }


def describe_options(model: Any, form: str = "{key}={default}") -> str:
    """An options model's fields with their defaults ("required" where there is none), or "-"."""
    fields = getattr(model, "model_fields", {})
    shown = [  # a default_factory's value, made (a list default is no PydanticUndefined)
        form.format(key=key, default="required" if f.is_required() else repr(f.get_default(call_default_factory=True)))
        for key, f in fields.items()
    ]
    return ", ".join(shown) or "-"


def _options(registry: Any, name: str) -> str:
    return describe_options(registry.options_model(name))


@app.command("list")
def list_(
    kind: Annotated[
        str | None, typer.Argument(help="Only this kind (environment, parser, engine, advantage, ...).")
    ] = None,
    plugin: Annotated[list[str] | None, typer.Option(help="Import this module first (as plugins: does).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The entries as one JSON object on stdout.")] = False,
) -> None:
    """The parts a config can name: each registered entry, the config key that picks it, what it declares it
    can do, and its options with their defaults."""
    from toolrl.plugins import import_modules

    import_modules(plugin or [], "--plugin")
    kinds = registries()
    if kind is not None and kind not in kinds:
        guess = did_you_mean(kind, kinds)
        raise ConfigError(f"toolrl list: unknown kind {kind[:60]!r}{guess}; known: {', '.join(kinds)}")
    chosen = {name: registry for name, registry in kinds.items() if kind in (None, name)}
    if as_json:
        print(json.dumps({name: {"config_key": registry.config_key, "entries": {
            entry: {"capabilities": registry.capabilities.get(entry, {}), "options": _options(registry, entry)}
            for entry in sorted(registry)}} for name, registry in chosen.items()}, default=str))  # fmt: skip
        return
    for name, registry in chosen.items():
        table = Table(title=f"{name} ({registry.config_key})")
        for column in ("name", "capabilities", "options (defaults)"):
            table.add_column(column)
        for entry in sorted(registry):
            declared = registry.capabilities.get(entry, {})
            capabilities = ", ".join(k for k, v in declared.items() if v is True) or "-"
            table.add_row(entry, capabilities, _options(registry, entry))
        console.print(table)
