import pytest

from toolrl.config import RunConfig, load_config
from toolrl.errors import ConfigError


def test_packaged_default_equals_schema_defaults():
    assert load_config() == RunConfig()


def test_overrides_are_typed():
    cfg = load_config(overrides=["train.lr=0.001", "train.steps=3", "eval.at_start=false", "run_name=x"])
    assert cfg.train.lr == 0.001 and cfg.train.steps == 3 and cfg.eval.at_start is False and cfg.run_name == "x"


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 7\n  group_size: 2\n")
    cfg = load_config(path, ["train.steps=9"])
    assert (cfg.train.steps, cfg.train.group_size) == (9, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.lrr=1"], "unknown key 'train.lrr'; known keys here: steps"),
        (["train.lr=abc"], "train.lr must be a number, got 'abc'"),
        (["train.steps=1.5"], "train.steps must be an integer"),
        (["device=tpu"], "device must be one of 'auto', 'cpu' or 'cuda'"),
        (["train.group_size=0"], "train.group_size must be greater than or equal to 1"),
        (["train=3"], "train must be a section"),
        (["nonsense"], "must look like section.key=value"),
    ],
)
def test_bad_config_fails_with_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml line 2: not valid YAML"):
        load_config(bad)


def test_missing_required_key_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  betas: [0.9]\n")
    with pytest.raises(ConfigError, match=r"train\.betas"):
        load_config(path)
