"""Registries as a plug-in author meets them: a taken name is refused unless replaced, options declared on the
registration are what the config is checked against (one line naming the key), and `toolrl list` shows them."""

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel, Field, field_validator

from toolrl.config import resolve_config
from toolrl.errors import ConfigError
from toolrl.registry import Registry

ROOT = Path(__file__).parents[1]


def first():
    return 1


def second():
    return 2


def test_a_taken_name_is_refused_unless_replaced():
    parts = Registry("part", "x.part")
    parts.register("a")(first)
    parts.register("a")(first)  # the same definition again (a module imported twice) is no conflict
    with pytest.raises(ConfigError, match=r"^part 'a' is registered already \(by tests\.test_registry\.first\)"):
        parts.register("a")(second)
    assert parts["a"] is first
    parts.register("a", replace=True)(second)
    assert parts["a"] is second


def test_a_builtin_name_cannot_be_taken_by_a_plugin_by_accident():
    from toolrl.algos import register_advantage

    with pytest.raises(ConfigError, match="advantage estimator 'grpo' is registered already"):
        register_advantage("grpo")(second)


class ScaleOptions(BaseModel):
    model_config = {"extra": "forbid"}
    scale: float = Field(1.0, gt=0)


def test_an_estimators_options_are_checked_by_the_model_it_registered_with():
    from toolrl.algos import ADVANTAGES, register_advantage

    register_advantage("scaled_test", options=ScaleOptions)(ADVANTAGES["grpo"])
    sets = ["train.advantage=scaled_test"]
    assert resolve_config(overrides=[*sets, "train.advantage_options.scale=0.5"]).train.advantage_options == {
        "scale": 0.5
    }
    with pytest.raises(
        ConfigError,
        match=r"^train\.advantage_options of scaled_test: train\.advantage_options\.scale must be greater than 0",
    ):
        resolve_config(overrides=[*sets, "train.advantage_options.scale=-1"])
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'train\.advantage_options\.scael' \(did you mean 'scale'\?\); nearest keys here: scale",
    ):
        resolve_config(overrides=[*sets, "train.advantage_options.scael=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'train\.advantage_options\.beta'; no keys are allowed here"):
        resolve_config(overrides=["train.advantage_options.beta=2"])  # grpo declares no options


def test_list_shows_each_kind_with_capabilities_and_a_plugins_options():
    out = subprocess.run(
        [sys.executable, "-m", "toolrl", "list", "engine"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    hf_vision = next(line for line in out.stdout.splitlines() if "hf-vision" in line)
    assert "supports_training" in hf_vision and "supports_images" in hf_vision
    plugin = ["--plugin", "tests.fixtures.plugin_env"]
    envs = subprocess.run(
        [sys.executable, "-m", "toolrl", "list", "environment", *plugin], capture_output=True, text=True, cwd=ROOT
    )
    assert envs.returncode == 0 and "plugin-shelf" in envs.stdout and "shelves=2" in envs.stdout
    bad = subprocess.run([sys.executable, "-m", "toolrl", "list", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: toolrl list: unknown kind 'nope'")


def fresh_python(probe: str) -> list[str]:
    """The lines `probe` prints in a new interpreter (nothing imported yet) at the repository's root."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_reading_and_checking_a_config_imports_no_torch_and_still_checks_every_name():
    """Built-in entries are declared by name: a config's engine, estimator, loss and environment are checked, and
    `toolrl config show` answers, without importing torch (6 s before the declarations, 0.5 s after)."""
    probe = (
        "import sys\n"
        "from toolrl.config import resolve_config\n"
        "from toolrl.errors import ConfigError\n"
        "c = resolve_config('recipes/calculator.yaml', ['rollout.engine=vllm', 'train.advantage=gae'])\n"
        "try:\n"
        "    resolve_config('recipes/calculator.yaml', ['train.loss=ppo_clipp'])\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "heavy = ('torch', 'transformers', 'toolrl.rollout.hf', 'toolrl.envs.files')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    error, imported = fresh_python(probe)
    assert error.startswith(
        "train.loss: unknown policy loss 'ppo_clipp' (did you mean 'ppo_clip'?); known: gspo, ppo_clip, vanilla_pg"
    )
    assert imported == "[]"


def test_a_declared_entry_is_imported_when_asked_for_and_must_say_what_it_was_declared_with(tmp_path, monkeypatch):
    (tmp_path / "declared_parts.py").write_text(
        "from toolrl.registry import Registry\n"
        "from tests.test_registry import PARTS\n"
        "@PARTS.register('fast', fast=True)\n"
        "def fast():\n"
        "    return 'fast'\n"
        "@PARTS.register('slow', fast=True)\n"
        "def slow():\n"
        "    return 'slow'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    PARTS.declare("fast", "declared_parts", fast=True)
    PARTS.declare("slow", "declared_parts", fast=False)
    assert "fast" in PARTS and PARTS.capability("slow", "fast") is False
    assert "declared_parts" not in sys.modules  # known by name without importing it
    with pytest.raises(ConfigError, match=r"^part 'slow': declared_parts\.slow registers it with options None and "):
        PARTS["fast"]
    with pytest.raises(ConfigError, match=r"^part 'slow' is registered already \(by declared_parts\)"):
        PARTS.register("slow")(second)  # a plug-in cannot take a declared name by accident


PARTS: Registry = Registry("part", "x.part")


def test_a_plugin_may_replace_a_builtin_before_the_builtin_is_imported():
    """Replacing imports the built-in first, so that importing it later (the trainer does) is no conflict."""
    probe = (
        "from toolrl.algos.registries import KL_ESTIMATORS\n"
        "def mine(a, b):\n"
        "    return a - b\n"
        "KL_ESTIMATORS.register('k3', replace=True)(mine)\n"
        "import toolrl.algos.losses\n"
        "print(KL_ESTIMATORS['k3'] is mine, KL_ESTIMATORS['k1'].__name__)"
    )
    assert fresh_python(probe) == ["True kl_k1"]


def test_every_builtin_declaration_agrees_with_its_registration():
    """What each built-in is declared with (before any import) is what its module registers it with, from
    that module."""
    probe = (
        "import json\n"
        "from toolrl.cli.registries import registries\n"
        "kinds = registries()\n"
        "said = {k: {n: [r.declared[n], r.capabilities[n], str(r.options.get(n))] for n in r.declared} "
        "for k, r in kinds.items()}\n"
        "got = {k: {n: [r.declared[n], r.capabilities[n], str(r.options.get(n))] for n, e in r.items() "
        "if n in r.declared and (e.__module__ + '.').startswith(r.declared[n] + '.')} for k, r in kinds.items()}\n"
        "print(json.dumps([said, got]))"
    )
    said, got = json.loads(fresh_python(probe)[0])
    assert said == got
    assert set(said["engine"]) == {"hf", "hf-vision", "openai", "vllm-server", "vllm"}
    assert said["advantage"]["gae"][1] == {"needs_values": True}


class CountedOptions(BaseModel):
    model_config = {"extra": "forbid"}
    scale: float = 1.0
    checks: ClassVar[list[float]] = []

    @field_validator("scale")
    @classmethod
    def _count(cls, value: float) -> float:
        cls.checks.append(value)
        return value


def test_a_plugins_options_are_validated_once_and_again_only_when_changed():
    from toolrl.algos import ADVANTAGES, register_advantage
    from toolrl.config.resolve import plugin_options

    register_advantage("counted_test", options=CountedOptions)(ADVANTAGES["grpo"])
    config = resolve_config(overrides=["train.advantage=counted_test", "train.advantage_options.scale=2"])
    assert CountedOptions.checks == [2.0]
    typed = plugin_options(config)["advantage"]  # what the trainer reads: the options resolved, not a new check
    assert typed.scale == 2.0 and CountedOptions.checks == [2.0]
    config.train.advantage_options = {"scale": 3}
    assert plugin_options(config)["advantage"].scale == 3.0 and CountedOptions.checks == [2.0, 3.0]
