"""The peak resident memory of each phase of a run (toolrl.memory.PeakMeter): each phase's own peak, nested
phases counted in both, and what a run reports (RUN/memory.json, memory/* metrics, the step line)."""

import pytest
import torch

from toolrl.cli.progress import step_line
from toolrl.memory import PeakMeter, rss_gb

pytestmark = pytest.mark.skipif(not PeakMeter().available, reason="needs Linux's /proc/self/clear_refs")


def allocate(mb: int) -> None:
    block = torch.ones(mb * 2**20 // 4)  # touched, so resident
    assert float(block[-1]) == 1.0


def test_each_phase_has_its_own_peak_and_a_nested_phase_counts_in_its_parent():
    meter = PeakMeter()
    with meter.phase("big"):
        allocate(300)
    with meter.phase("small"):
        allocate(20)
    with meter.phase("outer"), meter.phase("inner"):
        allocate(200)
    now = rss_gb()
    # A phase's peak is at least what it held at once; the small phase does not inherit the big one's peak.
    assert meter.last["big"] >= now + 0.25
    assert meter.last["small"] < meter.last["big"] - 0.2
    assert meter.last["inner"] >= now + 0.15 and meter.last["outer"] >= meter.last["inner"]
    assert meter.current_overall() >= meter.last["big"]


def test_a_phase_that_raises_is_still_measured():
    meter = PeakMeter()
    with pytest.raises(RuntimeError), meter.phase("failing"):
        allocate(100)
        raise RuntimeError("boom")
    assert meter.last["failing"] > 0 and meter._open == []


def test_the_step_line_shows_the_step_s_peak_memory():
    metrics = {"step": 3, "reward": 0.5, "success": 0.25, "tool_calls": 1.0, "gen_tokens_per_s": 80.0, "step_s": 12.0,
               "memory/rollout_peak_gb": 2.41, "memory/update_peak_gb": 3.46, "memory/rss_gb": 2.0}  # fmt: skip
    assert "mem 3.5 GB" in step_line(metrics, 6, None)
    del metrics["memory/rollout_peak_gb"], metrics["memory/update_peak_gb"]
    assert "mem" not in step_line(metrics, 6, None)  # a platform without the meter: no figure made up
