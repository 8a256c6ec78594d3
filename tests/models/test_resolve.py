import os
import subprocess
import sys

import pytest

from toolrl.errors import ModelNotFoundError
from toolrl.models import resolve_model


def test_local_folder_resolves_to_itself(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir


def test_folder_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))


def test_unreachable_hub_id_fails_with_one_line_naming_the_model(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("some-org/not-downloaded-model")
    message = str(err.value)
    assert "'some-org/not-downloaded-model'" in message and "pass its folder as model.name" in message
    assert "\n" not in message
    with pytest.raises(ModelNotFoundError, match=r"pass its folder as train\.kl\.teacher$"):  # the setting named
        resolve_model("runs/calculator-zero/final", "train.kl.teacher")  # the distill recipe before `make demo`


@pytest.mark.slow
def test_two_processes_convert_the_embedded_model_once(tmp_path):
    env = {**os.environ, "TOOLRL_HOME": str(tmp_path)}
    fetch = [sys.executable, "-m", "toolrl", "model", "fetch"]
    procs = [subprocess.Popen(fetch, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    target = tmp_path / "models" / "smollm2-135m-instruct"
    assert outputs == [str(target), str(target)]
    assert sorted(p.name for p in target.parent.iterdir()) == ["smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
    assert (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()


def test_a_disk_without_room_for_the_embedded_model_is_refused_before_converting(tmp_path, monkeypatch):
    """A CI disk shared with other jobs once filled mid-conversion and printed a safetensors traceback: the room
    is checked first and named in one line, with what to do."""
    from toolrl.models import resolve as module

    usage = module.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(module.shutil, "disk_usage", lambda _: usage._replace(free=100_000_000))
    monkeypatch.setattr(module.EmbeddedModel, "gguf_path", lambda self: pytest.fail("converted without room"))
    target = tmp_path / "models" / "smollm2-135m-instruct"
    with pytest.raises(ModelNotFoundError) as err:
        module.convert_embedded("smollm2-135m-instruct", target)
    message = str(err.value)
    assert "needs 0.54 GB" in message and "0.10 GB free" in message and "TOOLRL_HOME" in message
    assert str(target.parent) in message and "\n" not in message


def _failing_save(error: Exception):
    def save(*args, **kwargs):
        raise error

    return save


@pytest.mark.slow
def test_a_disk_that_fills_during_conversion_is_named_and_leaves_nothing_behind(tmp_path, monkeypatch):
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    from toolrl.models import resolve as module

    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", _failing_save(full))
    target = tmp_path / "models" / "smollm2-135m-instruct"
    with pytest.raises(ModelNotFoundError, match=r"needs 0\.54 GB in .*free space there or set TOOLRL_HOME"):
        module.convert_embedded("smollm2-135m-instruct", target)
    assert [p.name for p in target.parent.iterdir()] == ["smollm2-135m-instruct.lock"]  # no half-written folder
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", _failing_save(RuntimeError("not a disk error")))
    with pytest.raises(RuntimeError, match="not a disk error"):  # other failures keep their own message
        module.convert_embedded("smollm2-135m-instruct", target)
