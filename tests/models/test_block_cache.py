"""Freed large CPU blocks kept for the next request of their size (models/native/block_cache.py): taken again
without new page faults, bounded by size and age, emptied by memory.trim(), the same values as PyTorch's own
allocator, installed by long sequences as model.cpu_block_cache_mb says, and never loaded from a planted file."""

import ast
import logging
import stat
import subprocess
import sys
import threading

import pytest
import torch

from toolrl import memory
from toolrl.config import load_config
from toolrl.errors import ConfigError
from toolrl.models import native
from toolrl.models.native import block_cache

from .native_built import fresh_home_forgetting, needs

needs_cache = needs(block_cache.load, "the block cache")
MB = 1 << 20


@pytest.fixture
def cache():
    """The cache installed with 64 MB for the test, PyTorch's own allocator again after it."""
    assert block_cache.install(64)  # the peak in use counts from now
    block_cache.flush()  # nothing kept
    yield block_cache
    block_cache.uninstall()
    assert not block_cache.installed()


def _floats(mb: float) -> int:
    return int(mb * MB) // 4


@needs_cache
def test_a_freed_large_block_is_taken_again_by_the_next_request_of_its_size(cache):
    before = cache.stats()
    a = torch.empty(_floats(8))
    where = a.data_ptr()
    del a
    b = torch.empty(_floats(8))
    assert b.data_ptr() == where  # the same mapping: its pages are not faulted in again
    other = torch.empty(_floats(8) + 4096)  # another page count: another block
    assert other.data_ptr() != where
    small = torch.empty(1000)  # below 1 MiB: malloc's, as with PyTorch's own allocator
    now = cache.stats()
    assert (now.hits - before.hits, now.misses - before.misses) == (1, 2)
    del small


@needs_cache
def test_a_reused_block_gives_the_same_values_as_pytorch_s_allocator(cache):
    """Kept blocks come back with what the last tensor wrote in them: every operation must still compute the same
    numbers (a training step of a small network whose activations are over 1 MiB, on dirty blocks)."""

    def step() -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256))
        x = torch.randn(2048, 256)
        for _ in range(3):
            loss = net(x).square().mean()
            loss.backward()
        return [loss.detach(), *(p.grad for p in net.parameters())]

    torch.full((_floats(8),), float("nan"))  # a dirty block, freed at once
    cached = step()
    assert cache.stats().hits > 0
    assert torch.zeros(_floats(8)).abs().sum() == 0  # zeros is zeros on a reused block
    block_cache.uninstall()
    plain = step()
    for got, expected in zip(cached, plain, strict=True):
        assert torch.equal(got, expected)


@needs_cache
def test_kept_blocks_are_bounded_by_size_and_age_and_trim_gives_them_back(cache):
    assert block_cache.install(16, max_age=4)  # the limits of the installed cache change
    before = cache.stats()
    blocks = [torch.ones(_floats(6)) for _ in range(3)]
    del blocks  # 18 MB freed: 12 are kept, the oldest block is unmapped
    assert (cache.stats().kept_bytes, cache.stats().evicted - before.evicted) == (12 * MB, 1)
    for k in range(3):  # other sizes, each freed at once: 6 ticks in which no one asked for 6 MB
        torch.empty(_floats(1) + 1024 * k)
    now = cache.stats()
    assert now.expired - before.expired == 2
    assert now.kept_bytes < 4 * MB
    touched = torch.ones(_floats(8))
    del touched  # kept, and resident, until the phase's trim
    assert cache.stats().kept_bytes > 8 * MB
    resident = memory.rss_gb()
    memory.trim()
    assert cache.stats().kept_bytes == 0
    if resident is not None:
        assert memory.rss_gb() < resident - 7 / 1024  # the 8 MB block left the resident set


@needs_cache
def test_what_is_mapped_never_exceeds_the_peak_of_blocks_in_use(cache):
    """PyTorch's own allocator maps exactly the blocks in use; kept blocks are unmapped, oldest first, before a new
    block would take what is mapped past the most that was in use at once since the cache was installed."""
    before = cache.stats()
    in_use = before.mapped_bytes - before.kept_bytes
    small = torch.ones(_floats(4))
    del small  # kept: 4 MB in use was the peak so far
    assert cache.stats().kept_bytes == 4 * MB
    big = torch.ones(_floats(8))  # a new peak in use: 8 MB; 12 would be mapped with the kept block
    now = cache.stats()
    assert (now.kept_bytes, now.evicted - before.evicted) == (0, 1)
    assert now.mapped_bytes - in_use == 8 * MB
    del big
    pair = [torch.ones(_floats(4)) for _ in range(2)]  # 4 and 8 in use: the kept 8 MB block goes at the first
    assert cache.stats().mapped_bytes - in_use == 8 * MB
    del pair  # both kept: what is mapped stays at the peak
    assert (cache.stats().kept_bytes, cache.stats().mapped_bytes - in_use) == (8 * MB, 8 * MB)


@needs_cache
def test_blocks_in_use_when_the_cache_is_removed_are_still_given_back(cache):
    kept = torch.ones(_floats(4))
    block_cache.uninstall()
    assert not block_cache.installed()
    mapped = block_cache.stats().mapped_bytes
    del kept
    assert block_cache.stats().mapped_bytes == mapped - 4 * MB


@needs_cache
def test_threads_allocating_and_freeing_at_once_keep_the_counts_whole(cache):
    """Tensors made and freed on several threads (a rollout's worker beside the trainer): no block is lost or
    given twice, and once all are freed everything mapped is kept or unmapped."""
    errors: list[BaseException] = []
    before = cache.stats()
    in_use = before.mapped_bytes - before.kept_bytes  # tensors made under the cache earlier that are still alive

    def churn(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            held = []
            for _ in range(200):
                size = int(torch.randint(1, 5, (1,), generator=g)) * MB + 4096 * seed
                held.append(torch.full((size // 4,), float(seed)))
                if len(held) > 3:
                    block = held.pop(0)
                    assert float(block[0]) == seed and float(block[-1]) == seed
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = cache.stats()
    assert stats.mapped_bytes - stats.kept_bytes == in_use  # the threads' blocks are all kept or unmapped
    assert stats.hits > 0
    assert stats.mapped_bytes <= stats.peak_in_use_bytes
    memory.trim()
    assert cache.stats().mapped_bytes == in_use


@needs_cache
def test_long_sequences_install_the_cache_as_model_cpu_block_cache_mb_says():
    """In fresh processes (the allocator is the process's): from LONG_SEQUENCE tokens the cache is installed with
    the configured MB, a freed block is taken again by the next request of its size, and the run's metrics count
    both; with 0 nothing is installed or counted."""
    script = """
import sys, torch
from toolrl import memory
from toolrl.models.native import block_cache
memory.keep_blocks(int(sys.argv[1]))
memory.for_sequences(memory.LONG_SEQUENCE - 1)
assert not block_cache.installed()
memory.for_sequences(memory.LONG_SEQUENCE)
x = torch.ones(4 << 20)
del x
x = torch.ones(4 << 20)
stats = block_cache.stats()
kept = stats.kept_bytes if stats else 0
del x
memory.trim()
counted = {k: v for k, v in memory.meter.metrics(()).items() if "kept_block" in k}  # a run's step metrics
print(block_cache.installed(), kept, block_cache.stats().kept_bytes if stats else 0, sorted(counted.items()))
"""
    for mb, expected in (
        ("256", "True 0 0 [('memory/kept_block_hits', 1), ('memory/kept_block_misses', 1)]"),
        ("0", "False 0 0 []"),
    ):
        done = subprocess.run([sys.executable, "-c", script, mb], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == expected, (mb, done.stdout)


@pytest.mark.parametrize("mb", ["-1", str(1 << 40), "lots"])
def test_a_cache_size_out_of_range_is_refused_naming_the_field(mb):
    with pytest.raises(ConfigError, match="cpu_block_cache_mb"):
        load_config(overrides=[f"model.cpu_block_cache_mb={mb}"])


fresh_home = fresh_home_forgetting(block_cache.load, block_cache._log_once)


@needs_cache
def test_a_library_others_may_write_is_not_loaded_and_nothing_is_installed(fresh_home, caplog):
    path = block_cache.build().path(native._compiler("CXX", ("c++", "g++")))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a library")
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="toolrl.models.native.block_cache"):
        assert block_cache.install(64) is False
    assert "others may write it: not loaded" in caplog.text
    assert not block_cache.installed()
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)  # now trusted, but not a library: refused with what to do
    block_cache.load.cache_clear()
    with pytest.raises(native.KernelUnavailable, match="delete it to build it again"):
        block_cache.load()


def test_without_a_cxx_compiler_the_reason_is_logged_once_and_blocks_are_mapped_as_before(
    fresh_home, monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with caplog.at_level(logging.WARNING, logger="toolrl.models.native.block_cache"):
        assert block_cache.install(64) is False
        assert block_cache.install(64) is False
    warnings = [r.getMessage() for r in caplog.records if "not kept for reuse" in r.getMessage()]
    assert len(warnings) == 1 and "no compiler found ($CXX, c++, g++ on PATH)" in warnings[0]


@needs_cache
def test_a_step_s_passes_take_kept_blocks_and_stay_within_the_peak_in_use(tmp_path, tiny_model_dir):
    """A GRPO update and a warm-start step on the 4.9k-token handbook prompt (a tiny model, in a fresh process):
    the cache is installed by their long sequences and serves their passes, and when each step's gradients are
    clipped, what it maps is within the most that was in use at once."""
    script = """
import sys, torch
from toolrl.config import load_config
from toolrl.config.schema import SFTConfig
from toolrl.models.native import block_cache
from toolrl.train import Trainer, Workbench
from toolrl.train.sft import fine_tune

seen = []
clip = torch.nn.utils.clip_grad_norm_
def watched(*args, **kwargs):
    stats = block_cache.stats()
    seen.append((block_cache.installed(), stats.hits, stats.mapped_bytes <= stats.peak_in_use_bytes))
    return clip(*args, **kwargs)
torch.nn.utils.clip_grad_norm_ = watched
config = load_config(overrides=[f"model.name={sys.argv[1]}", f"output_dir={sys.argv[2]}", "device=cpu",
    "env.name=support", "env.options.handbook=true", "train.prompts_per_step=1", "train.group_size=2",
    "rollout.max_turns=1", "rollout.max_new_tokens=8", "eval.at_start=false", "eval.at_end=false"])
bench = Workbench.load(config)
trainer = Trainer(bench)
trajs = trainer.collector.roll_out(1).trajs
assert min(len(t.token_ids) for t in trajs) >= 2048
for i, traj in enumerate(trajs):
    traj.reward = float(i % 2)
trainer.update(trajs)
fine_tune(trainer.model, trajs, SFTConfig(batch_size=2), 1024, 0, lambda record: None)
bench.close()
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(seen) >= 2  # the update's clipping and the warm start's
    assert all(installed and within for installed, _, within in seen), seen
    assert 0 < seen[0][1] < seen[-1][1]  # the update's passes took kept blocks, and the warm start's more
