"""A rollout's engine steps run on the thread that started it (rollout/caller_thread.py): one OpenMP pool for the
process's compute, not two. The executor's contract: calls within `run` on the calling thread, others on the
fallback worker; the coroutine's result and errors come back; an interrupt stops the rollout and is raised."""

import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from toolrl.rollout import HFEngine, SamplingParams, caller_thread
from toolrl.rollout.caller_thread import CallerThread
from toolrl.rollout.engine import Engine, Sampled


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """The layout a quiet machine gets, whatever the machine running the tests is doing."""
    monkeypatch.setattr(caller_thread, "ON_CALLER", True)


@pytest.fixture
def executor(two_threads):
    box = CallerThread(ThreadPoolExecutor(max_workers=1, thread_name_prefix="fallback"))
    yield box
    box.shutdown()


@pytest.fixture
def two_threads():
    """PyTorch on two threads in this thread, as on the 2-core machines (the caller's steps need a pool to share;
    a test run beside others in this process may have left one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def where(executor):
    async def ask():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*(loop.run_in_executor(executor, threading.current_thread) for _ in range(3)))

    return ask


def test_calls_within_run_run_on_the_calling_thread_and_others_on_the_worker(executor):
    threads = executor.run(where(executor)())
    assert threads == [threading.current_thread()] * 3 and executor.served == 3
    assert executor.submit(threading.current_thread).result().name.startswith("fallback")
    # without a caller serving, a rollout's calls go to the worker, as before
    assert {t.name[:8] for t in asyncio.run(where(executor)())} == {"fallback"}


def test_the_coroutine_runs_on_a_helper_loop_and_its_result_and_errors_come_back(executor):
    async def loop_thread():
        return threading.current_thread().name

    assert executor.run(loop_thread()) == "toolrl-rollout-loop"

    async def fails():
        await asyncio.get_running_loop().run_in_executor(executor, int, "x")

    with pytest.raises(ValueError, match="invalid literal"):
        executor.run(fails())
    assert executor.submit(threading.current_thread).result().name.startswith("fallback")  # it stopped serving


def test_an_interrupt_on_the_calling_thread_cancels_the_rollout_and_is_raised(executor):
    """Ctrl-C arrives on the main thread, here inside a step; the rollout's loop is cancelled and its thread ends."""
    finished = []

    def step():
        raise KeyboardInterrupt

    async def rollout():
        try:
            await asyncio.get_running_loop().run_in_executor(executor, step)
            await asyncio.sleep(30)
        finally:
            finished.append(True)

    with pytest.raises(KeyboardInterrupt):
        executor.run(rollout())
    assert finished == [True]
    assert not [t for t in threading.enumerate() if t.name == "toolrl-rollout-loop"]


def test_an_interrupt_that_ends_the_rollout_before_it_is_cancelled_is_raised(executor, monkeypatch):
    """CI (stop 81): the interrupt reached the coroutine, which ended and closed its loop before the calling thread
    cancelled it; cancelling a closed loop raised RuntimeError in place of the interrupt. Here the calling thread
    waits for the loop's thread to end first, every time."""
    run = CallerThread._run

    def late(self, job):
        try:
            run(self, job)
        except KeyboardInterrupt:
            for thread in threading.enumerate():
                if thread.name == "toolrl-rollout-loop":
                    thread.join(10)
            raise

    monkeypatch.setattr(CallerThread, "_run", late)

    def step():
        raise KeyboardInterrupt

    async def rollout():
        await asyncio.get_running_loop().run_in_executor(executor, step)

    with pytest.raises(KeyboardInterrupt):
        executor.run(rollout())


def test_a_second_caller_while_one_serves_runs_its_loop_itself(executor):
    """Two rollouts at once (a step ahead beside an evaluation): the second's calls go to the thread serving."""
    entered, release = threading.Event(), threading.Event()

    async def first():
        await asyncio.get_running_loop().run_in_executor(executor, entered.set)
        await asyncio.to_thread(release.wait)

    seen = []
    server = threading.Thread(target=lambda: seen.append(executor.run(first())))
    server.start()
    entered.wait(5)
    try:
        threads = executor.run(where(executor)())
    finally:
        release.set()
        server.join(5)
    assert threads == [server] * 3 and seen == [None]


def test_an_engine_of_ones_own_runs_a_rollout_as_asyncio_does():
    class Echo(Engine):
        async def generate(self, seq, tokens, params):
            return Sampled(list(tokens[-1:]), [0.0], True)

    async def rollout():
        return (await Echo().generate(0, [1, 2, 3], SamplingParams()), threading.current_thread())

    sampled, thread = Echo().run(rollout())
    assert sampled.ids == [3] and thread is threading.current_thread()


def test_the_hf_engines_steps_run_on_the_rollouts_caller(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    stepped = []
    step = engine._step
    engine._step = lambda batch: stepped.append(threading.current_thread()) or step(batch)

    async def rollout():
        params = SamplingParams(temperature=1.0, max_new_tokens=4)
        outs = await asyncio.gather(*(engine.generate(i, [100 + i, 200, 300], params) for i in range(3)))
        for i in range(3):
            engine.release(i)
        return outs

    try:
        outs = engine.run(rollout())
        assert all(len(out.ids) >= 1 for out in outs)
        assert stepped and set(stepped) == {threading.current_thread()}
        stepped.clear()
        asyncio.run(rollout())  # a caller that does not use `run` (the gateway's loop): the worker thread
        assert stepped and threading.current_thread() not in stepped
        engine.free_memory()
    finally:
        engine.close()


def test_on_a_busy_machine_the_steps_stay_on_the_worker(executor, monkeypatch):
    """With one OpenMP pool its threads spin at barriers, which costs a busy machine 4x (beside make test)."""
    monkeypatch.setattr(caller_thread, "ON_CALLER", None)
    monkeypatch.setattr(caller_thread, "BUSY_REUSE_S", 0.0)
    monkeypatch.setattr(caller_thread, "others_share", lambda probe_s=0.1: 0.9)
    assert {t.name[:8] for t in executor.run(where(executor)())} == {"fallback"} and executor.on_worker == 1
    monkeypatch.setattr(caller_thread, "others_share", lambda probe_s=0.1: 0.0)
    assert executor.run(where(executor)()) == [threading.current_thread()] * 3
    monkeypatch.setattr(caller_thread, "others_share", lambda probe_s=0.1: None)  # not measurable: the caller
    assert executor.run(where(executor)()) == [threading.current_thread()] * 3 and executor.on_worker == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torchrun's ranks: one OpenMP thread, no pool to share
    try:
        assert {t.name[:8] for t in executor.run(where(executor)())} == {"fallback"} and executor.on_worker == 2
    finally:
        torch.set_num_threads(threads)


def test_others_share_sees_processes_keeping_this_processs_cpus_busy():
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:
        time.sleep(0.3)
        share = caller_thread.others_share(0.5)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert share is not None and share >= caller_thread.BUSY_SHARE


def test_a_look_at_the_machine_serves_the_rollouts_that_start_soon_after(monkeypatch, two_threads):
    looks = []
    monkeypatch.setattr(caller_thread, "ON_CALLER", None)
    monkeypatch.setattr(caller_thread, "_looked", [])
    monkeypatch.setattr(caller_thread, "others_share", lambda probe_s=0.1: looks.append(1) or 0.9)
    assert [caller_thread.on_caller() for _ in range(3)] == [False] * 3 and len(looks) == 1
    monkeypatch.setattr(caller_thread, "BUSY_REUSE_S", 0.0)
    assert caller_thread.on_caller() is False and len(looks) == 2
