"""The small-batch product kernel for generation (models/native): the same products as torch's, used only for a few
rows without autograd, chosen by `model.cpu_decode_kernel`, built once per machine, and never loaded from a file
another user could have planted."""

import asyncio
import os
import stat

import pytest
import torch

from toolrl.config import load_config
from toolrl.errors import ConfigError
from toolrl.models import native
from toolrl.models.linear import OneDNNLinear, PackedWeights, onednn_available, use_onednn_linear
from toolrl.rollout import HFEngine, SamplingParams

from .native_built import fresh_home_forgetting, needs

needs_kernel = needs(native.load, "the native kernel")


fresh_home = fresh_home_forgetting(native.load, native._log_once)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 16, 23, 64])
@pytest.mark.parametrize(("features", "out"), [(576, 1536), (100, 200), (1536, 192), (24, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_products_equal_torch(rows, features, out, bias):
    """Every row-block size (1-6 with AVX2, 1-12 with AVX-512, and their sums), outputs not a multiple of 16, an
    odd number of 16-output panels (AVX-512 takes them in pairs: 13, and a single one), inputs not a multiple of the
    kernel's chunk of 96, with and without bias; up to the kernel's own 64 rows whatever max_rows() is here."""
    torch.manual_seed(rows)
    weight, x = torch.randn(out, features), torch.randn(rows, features)
    b = torch.randn(out) if bias else None
    got = native.NativeWeight(weight, rows=64)(x, b)
    assert got.shape == (rows, out)
    assert torch.allclose(got, torch.nn.functional.linear(x, weight, b), rtol=1e-4, atol=1e-4)
    assert torch.allclose(native.NativeWeight(weight, rows=64)(x[None], b)[0], got)  # leading dimensions are kept


@needs_kernel
def test_more_rows_than_the_kernel_takes_are_refused_and_the_layer_uses_onednn():
    weight = torch.randn(192, 576)
    packed = native.NativeWeight(weight)
    many = torch.randn(native.max_rows() + 1, 576)
    assert packed.takes(torch.randn(native.max_rows(), 576)) and not packed.takes(many)
    with pytest.raises(RuntimeError, match="refused"):
        packed(many)
    if not onednn_available():
        return
    layer = torch.nn.Linear(576, 192, bias=False)
    use_onednn_linear(layer)
    weights = PackedWeights(layer, native=True)
    with torch.inference_mode(), weights.active():
        assert type(layer.packed) is native.NativeWeight
        for x in (torch.randn(3, 576), many):  # the kernel, then oneDNN from the plain weight
            assert torch.allclose(layer(x), x @ layer.weight.T, rtol=1e-4, atol=1e-4)
    assert weights.peak_bytes == packed.nbytes


@needs_kernel
@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")
def test_the_engine_on_the_kernel_samples_what_the_onednn_engine_samples(tiny_model_dir, tokenizer):
    """Greedy tokens equal, log-probs a plain forward pass's, with the kernel's copies made and freed."""
    from toolrl.models import load_model

    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    assert any(type(m) is OneDNNLinear for m in model.modules())
    prompts = [list(range(1000, 1030)) + [2000 + i] for i in range(6)]

    def generate(kernel):
        engine = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"),
                          decode_kernel=kernel)  # fmt: skip

        async def run():
            params = SamplingParams(temperature=0.0, max_new_tokens=6)
            return await asyncio.gather(*(engine.generate(i, p, params) for i, p in enumerate(prompts)))

        outs = asyncio.run(run())
        copies = list(engine.packed._copies.values())
        engine.free_memory()
        engine.close()
        return outs, copies

    ours, copies = generate("native")
    assert copies and all(type(copy) is native.NativeWeight for _, copy in copies)
    theirs, copies = generate("onednn")
    assert copies and all(type(copy) is torch.Tensor for _, copy in copies)
    assert [o.ids for o in ours] == [t.ids for t in theirs]
    for prompt, out in zip(prompts, ours, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.ids])).logits[0]
        plain = torch.log_softmax(logits.float(), -1)
        expect = [float(plain[len(prompt) + i - 1, t]) for i, t in enumerate(out.ids)]
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4)


@needs_kernel
def test_a_kernel_file_others_may_write_is_not_loaded(fresh_home):
    """A library at the kernel's path that group or others may write (planted, or left by a careless copy) is
    refused with the path named, and auto keeps oneDNN."""
    path = native.kernels().path(native._compiler())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a library")
    path.chmod(0o666)
    with pytest.raises(native.KernelUnavailable, match="others may write it: not loaded"):
        native.load()
    native.load.cache_clear()
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)  # now trusted, but not a library: refused with what to do
    with pytest.raises(native.KernelUnavailable, match="delete it to build it again"):
        native.load()


def test_a_home_that_cannot_be_written_keeps_onednn(fresh_home, monkeypatch):
    """$TOOLRL_HOME where no folder can be made (under a file: refused even to root): auto keeps oneDNN."""
    fresh_home.parent.mkdir(exist_ok=True)
    blocker = fresh_home.parent / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TOOLRL_HOME", str(blocker / "home"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with pytest.raises(native.KernelUnavailable, match="cannot build into"):
        native.load()
    native.load.cache_clear()
    assert native.wanted("auto") is False


def test_a_compiler_that_fails_keeps_onednn_under_auto_and_stops_native(fresh_home, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # a compiler that fails every build
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with caplog.at_level("WARNING", logger="toolrl.models.native"):
        assert native.wanted("auto") is False
    assert "generation keeps oneDNN" in caplog.text and "failed to build small_gemm.c" in caplog.text
    with pytest.raises(native.KernelUnavailable, match=r"model\.cpu_decode_kernel: native: .*set it to auto or onednn"):
        native.wanted("native")
    assert native.wanted("onednn") is False
    assert not list(fresh_home.glob("kernels/*.so"))  # nothing half-built is left to load


def test_auto_keeps_onednn_where_the_kernel_was_not_measured(fresh_home, monkeypatch):
    """On a CPU capability outside ROWS_BY_ISA auto does not even build it."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "ZVECTOR")
    monkeypatch.setenv("CC", "false")
    assert native.wanted("auto") is False
    assert not (fresh_home / "kernels").exists()


@needs_kernel
@pytest.mark.parametrize(("capability", "rows"), [("AVX2", 64), ("AVX512", 32)])
def test_auto_uses_it_on_avx2_and_avx512_up_to_the_rows_measured_faster(monkeypatch, capability, rows):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert native.wanted("auto") is True
    assert native.max_rows() == rows
    packed = native.NativeWeight(torch.randn(32, 96))
    assert packed.takes(torch.randn(rows, 96)) and not packed.takes(torch.randn(rows + 1, 96))
    assert native.NativeWeight(torch.randn(32, 96), rows=1000).rows == 64  # never above the kernel's own limit


def test_the_config_field_takes_the_three_choices_only():
    assert load_config(overrides=["model.cpu_decode_kernel=onednn"]).model.cpu_decode_kernel == "onednn"
    assert load_config().model.cpu_decode_kernel == "auto"
    with pytest.raises(ConfigError, match=r"model\.cpu_decode_kernel must be one of"):
        load_config(overrides=["model.cpu_decode_kernel=fast"])


@needs_kernel
def test_the_built_library_is_private_to_its_user(fresh_home):
    native.load()
    built = list((fresh_home / "kernels").glob("small_gemm-*.so"))
    assert len(built) == 1
    info = built[0].stat()
    assert info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@pytest.mark.parametrize(
    ("capability", "cpu", "avx512"),
    [("AVX512", {"avx2", "avx512f"}, True), ("AVX2", {"avx2", "avx512f"}, False), ("AVX512", {"avx2"}, False)],
)
def test_the_avx512_build_needs_both_pytorchs_capability_and_the_cpus_flag(monkeypatch, capability, cpu, avx512):
    """ATEN_CPU_CAPABILITY=avx2 (how a benchmark measures the AVX2 path on an AVX-512 machine) keeps the AVX2
    build; a capability reported without the CPU flag (a test's patch) never builds code the CPU cannot run."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(native, "_cpu_flags", lambda: frozenset(cpu))
    assert ("-mavx512f" in native.flags()) is avx512
    assert native.flags()[: len(native.FLAGS)] == native.FLAGS
