"""toolrl.memory.keep_freed_memory: a step that allocates the same large tensors again reuses freed memory
instead of faulting fresh pages in, trim() still hands it back, and the environment's own malloc settings win."""

import os
import subprocess
import sys

import pytest

from toolrl.memory import _libc

pytestmark = pytest.mark.skipif(_libc() is None, reason="not glibc")

STEPS = """
import resource, sys, torch
from toolrl.memory import keep_freed_memory, trim
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def step():  # a decode step's sampler: a few 6 MB tensors made and freed
    logits = torch.randn(32, 49152)
    logp = torch.log_softmax(logits, -1)
    return int(logp.exp().argmax())
for _ in range(8):  # the heap grows to the step's size over the first few
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
held = rss()
trim()
print(kept, faults, held - rss())
"""


def run(mode: str, **env: str) -> tuple[bool, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


def test_kept_memory_is_reused_without_page_faults_and_trim_returns_it():
    kept, faults_kept, returned = run("keep")
    assert kept and returned > 18 << 20  # trim() hands back at least the step's three freed tensors
    plain, faults_plain, _ = run("plain")
    assert not plain
    # 20 steps x 3 tensors x 1536 pages faulted again without it; with it, the heap's pages are reused
    assert faults_plain > 20_000 and faults_kept < faults_plain / 10


def test_the_environments_malloc_settings_take_precedence():
    kept, faults, _ = run("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert not kept and faults > 20_000
