"""Intra-op threads as the machine allows (toolrl/threads.py): a thread's products go down to one thread while the
CPU is contended and back once it is not; other threads keep their own count. A standalone evaluation beside a
training run had taken 87 s with two threads where one took 20 s (issue 73, item 4)."""

import threading

import pytest
import torch

from toolrl import threads


@pytest.fixture
def pressure(tmp_path, monkeypatch):
    path = tmp_path / "cpu"
    monkeypatch.setattr(threads, "PRESSURE", path)
    monkeypatch.setattr(threads, "INTERVAL_S", 0.0)
    monkeypatch.setenv("TOOLRL_ADAPT_THREADS", "1")  # opt-in

    def set_to(avg10: float) -> None:
        path.write_text(f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00\n")

    return set_to


def in_a_thread(fn):
    """fn() in a fresh thread (torch's thread count is the thread's own), with 2 threads to start from."""
    out = {}

    def run():
        torch.set_num_threads(2)
        out["value"] = fn()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return out["value"]


def test_a_contended_cpu_takes_the_thread_to_one_and_an_idle_one_gives_its_count_back(pressure):
    main = torch.get_num_threads()
    levels = [5.0, 80.0, 18.0, 8.0]  # idle, contended, in between (no change), idle again

    def steps():
        seen = []
        for level in levels:
            pressure(level)
            seen.append((threads.adapt(), torch.get_num_threads()))
        return seen

    assert in_a_thread(steps) == [(2, 2), (1, 1), (1, 1), (2, 2)]
    assert torch.get_num_threads() == main  # the main thread's own count is untouched


def test_no_pressure_file_or_switched_off_changes_nothing(pressure, monkeypatch):
    monkeypatch.setenv("TOOLRL_ADAPT_THREADS", "0")
    pressure(90.0)
    assert in_a_thread(lambda: (threads.adapt(), torch.get_num_threads())) == (2, 2)  # off: the count stays
    monkeypatch.setenv("TOOLRL_ADAPT_THREADS", "1")
    threads.PRESSURE.unlink()
    assert threads.cpu_pressure() is None
    assert in_a_thread(lambda: (threads.adapt(), torch.get_num_threads()))[1] == 2
