"""Registries as a plug-in author meets them: a taken name is refused unless replaced, options declared on the
registration are what the config is checked against (one line naming the key), and `toolrl list` shows them."""

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

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
    with pytest.raises(ConfigError, match=r"unknown key 'train\.advantage_options\.scael'; known keys here: scale"):
        resolve_config(overrides=[*sets, "train.advantage_options.scael=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'train\.advantage_options\.beta'; known keys here: none"):
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
