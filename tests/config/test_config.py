import pytest

from toolrl.config import RunConfig, load_config
from toolrl.errors import ConfigError


def test_packaged_default_equals_schema_defaults_with_the_environments_options_filled_in():
    from toolrl.envs.calculator.env import CalculatorOptions

    config = load_config()
    assert config.env.options == CalculatorOptions().model_dump()
    config.env.options = {}
    assert config == RunConfig()


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
        (["train.lrr=1"], "unknown key 'train.lrr' (did you mean 'lr'?); nearest keys here: lr, lora"),
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


def alias_bomb(levels: int = 9) -> str:
    """The 'billion laughs' in YAML: each level lists the previous one ten times (10^levels values)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\ntrain:\n  lr: *a{levels - 1}\n"


@pytest.mark.parametrize("where", ["run", "tools"])
def test_files_that_are_not_configs_get_one_bounded_line(tmp_path, where):
    """Non-UTF-8 bytes, a YAML alias bomb (700 bytes that expand to 10^9 values), a self-referencing alias and a
    folder: each is one line of bounded length naming the file, never a traceback or a 72 MB message."""
    from toolrl.tools.toolset import Toolset

    load = load_config if where == "run" else Toolset.load
    cases = {
        "latin1.yaml": ("train:\n  lr: 0.1  # caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset"),
        "bomb.yaml": (alias_bomb().encode(), "expands to more than 100,000 values through its aliases"),
        "loop.yaml": (b"train: &t\n  lr: *t\n", "expands to more than 100,000 values"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ConfigError) as err:
            load(path)
        text = str(err.value)
        assert message in text and str(path) in text and "\n" not in text and len(text) < 400, text
    assert len(alias_bomb()) < 800
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"a-folder is a folder, not a .*; pass the file itself"):
        load(folder)


def test_anchors_and_aliases_within_bounds_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  sampling: &s {temperature: 0.7, top_p: 0.9}\neval:\n  sampling: *s\n")
    config = load_config(path)
    assert (config.eval.sampling.temperature, config.eval.sampling.top_p) == (0.7, 0.9)


def test_an_override_that_is_an_alias_bomb_is_refused():
    levels = ["&a0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    with pytest.raises(ConfigError, match=r"override train\.lr: expands to more than 100,000 values"):
        load_config(overrides=["train.lr=[" + ", ".join(levels) + "]"])


def test_bad_values_are_quoted_briefly(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["train.lr=" + "x" * 10_000])
    assert len(str(err.value)) < 400 and "train.lr must be a number" in str(err.value)
