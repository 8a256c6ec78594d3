"""A run's config, resolved once: read the file (or the packaged default) and the `--set` overrides, check the
schema, import the code it names (`plugins`, then `env.module`), then check every name against the registries
those imports filled (environment, its options, parser, engine, advantage estimator, loss, aggregation, KL
estimator). What comes out is a typed `RunConfig` whose environment options are filled in; the layers below
take it and never read a config file or import the loader.

The order is the point: a plug-in that registers an environment, an estimator or a parser is imported before
the name that uses it is checked, so `plugins: [my_pkg]` with `env.name: mine` works the same from the CLI,
the UI and Python."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from toolrl.config.loader import apply_override, read_config_data
from toolrl.config.schema import RunConfig
from toolrl.errors import ConfigError
from toolrl.plugins import import_modules
from toolrl.validation import format_validation_error


def _hint(key: str) -> str:
    return "; environment settings go under env.options" if key.startswith("env.") else ""


def read(path: str | Path | None = None, overrides: Iterable[str] | None = None) -> dict[str, Any]:
    """The config's mapping: the YAML file (the packaged default when None) with `a.b=value` overrides applied."""
    data = read_config_data(Path(path) if path is not None else None)
    for override in overrides or []:
        apply_override(data, override)
    return data


def import_code(config: RunConfig) -> None:
    """Import what the config names to run (plug-ins, then the environment's module): they register names."""
    import_modules(config.plugins, "plugins")
    import_modules(config.env.modules(), "env.module")


def _registry_checks(config: RunConfig) -> list[tuple[Any, str]]:
    """(registry, name) pairs that must resolve; imported here so that reading a config stays cheap."""
    from toolrl.algos import ADVANTAGES, AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
    from toolrl.context import CONTEXTS
    from toolrl.parsers.base import PARSERS
    from toolrl.rollout.engine import ENGINES

    t, r = config.train, config.rollout
    checks = [
        (ENGINES, r.engine),
        (CONTEXTS, r.context.name),
        (ADVANTAGES, t.advantage),
        (CORRECTIONS, t.correction),
        (POLICY_LOSSES, t.loss),
        (AGGREGATIONS, t.aggregation),
        (KL_ESTIMATORS, t.kl.estimator),
    ]
    return checks + ([(PARSERS, r.parser)] if r.parser else [])


def checked(data: dict[str, Any], where: str = "config") -> RunConfig:
    """A config's mapping checked against the schema only: nothing imported, names not looked up (what reading
    a run's model and LoRA settings needs, say to export it, without running the code it names)."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where, RunConfig, hint=_hint)) from None


def read_checked(path: str | Path) -> RunConfig:
    """A config file checked against the schema only (see checked)."""
    return checked(read(path), str(path))


def plugin_options(config: RunConfig) -> dict[str, BaseModel]:
    """The options of the plug-ins a config names, each validated by the model its entry registered with (one
    line naming the key when wrong): {"advantage": ...}; once per config (it keeps them)."""
    kept = config.kept_plugin_options()
    if kept is not None:
        return kept
    from toolrl.algos import ADVANTAGES, CORRECTIONS
    from toolrl.context import CONTEXTS

    t, context, typed = config.train, config.rollout.context, {}
    correction = correction_name(t)
    correction_options = t.correction_options if t.tis_cap is None else {**t.correction_options, "cap": t.tis_cap}
    for key, registry, name, given, where in [
        ("advantage", ADVANTAGES, t.advantage, t.advantage_options, "train.advantage_options"),
        ("context", CONTEXTS, context.name, context.options, "rollout.context.options"),
        ("correction", CORRECTIONS, correction, correction_options, "train.correction_options"),
    ]:
        model = registry.options_model(name) or NoOptions
        try:
            typed[key] = model.model_validate(given)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, f"{where} of {name}", model, f"{where}.")) from None
    config.keep_plugin_options(typed)
    return typed


def correction_name(t) -> str:
    """The off-policy correction a train section names: train.tis_cap (the older key) is token_tis at its cap."""
    if t.tis_cap is None:
        return t.correction
    if t.correction not in ("none", "token_tis"):
        raise ConfigError(f"train.tis_cap is train.correction: token_tis; it cannot go with train.correction: "
                          f"{t.correction} (give that one's cap in train.correction_options)")  # fmt: skip
    return "token_tis"


class NoOptions(BaseModel):
    """What an entry that declares no options model takes: nothing."""

    model_config = ConfigDict(extra="forbid")


def resolve_data(data: dict[str, Any], where: str = "config") -> RunConfig:
    """A config's mapping resolved (`where` names it in the one-line errors): schema, code, registries."""
    return _against_registries(checked(data, where))


def _against_registries(config: RunConfig) -> RunConfig:
    import_code(config)
    from toolrl.envs.base import apply_rollout_defaults, environment_options

    options = environment_options(config.env)  # validated once: the environment keeps the typed options
    apply_rollout_defaults(config)  # the limits its tasks need, where the config sets none
    for registry, name in _registry_checks(config):
        registry.require(name)
    plugin_options(config)
    config.env.keep_options(options)
    config.mark_resolved()
    return config


def resolve_config(path: str | Path | None = None, overrides: Iterable[str] | None = None) -> RunConfig:
    """Read, override, import and validate a run config; a ConfigError with one line when anything is wrong."""
    where = str(path) if path is not None else "config"
    return resolve_data(read(path, overrides), where)


def resolved(config: RunConfig) -> RunConfig:
    """`config` as resolve_config() would give it: itself when it already was (a config built in Python is resolved
    here, once, by the first layer that needs it: Workbench.load)."""
    return config if config.is_resolved else _against_registries(config)
