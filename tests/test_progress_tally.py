"""Progress counted in items (an evaluation's tasks): done/total, rate, ETA; a line at the first item, then at
most every 10 s, and always at the end."""

import itertools

from toolrl.progress import Tally, progress_line


def test_a_progress_line_has_done_total_rate_and_eta():
    assert progress_line("eval start", 0, 50, 0.0) == "eval start: 0/50 tasks"
    assert progress_line("eval start", 10, 50, 20.0) == "eval start: 10/50 tasks  0.50 tasks/s  eta 80 s"
    assert progress_line("eval", 1, 400, 2.0).endswith("eta 13.3 min")
    assert progress_line("eval end", 50, 50, 61.0) == "eval end: 50/50 tasks  0.82 tasks/s  61 s"


def test_a_tally_tells_the_first_item_then_every_ten_seconds_and_the_end():
    now, lines = [0.0], []
    tally = Tally("eval", 5, lines.append, clock=lambda: now[0])
    for t in (1.0, 2.0, 12.5, 13.0, 14.0):
        now[0] = t
        tally.advance()
    assert [line.split(":")[1].split()[0] for line in lines] == ["1/5", "3/5", "5/5"]


def test_a_batched_evaluation_counts_down_and_says_where_it_is_while_a_batch_runs():
    """40 tasks, 16 at a time, each batch ending at once after 100 s: a line every 10 s even while no task finishes
    (the heartbeat's tick), no ETA before the first batch ends, then one that falls with the clock, never rises
    by more than the batches' spread, and reaches the end when the work does."""
    now, lines = [0.0], []
    tally = Tally("eval", 40, lines.append, clock=lambda: now[0], batch=16)
    etas, told = [], []
    for second in range(1, 301):
        now[0] = float(second)
        before = len(lines)
        if second % 100 == 0:  # a batch's tasks land together
            tally.advance(min(16, 40 - tally.done))
        else:
            tally.tick()
        if len(lines) > before:
            told.append(second)
            if "eta" in lines[-1]:
                value = float(lines[-1].split("eta ")[1].split()[0])
                etas.append((second, value * (60 if "min" in lines[-1] else 1)))
    assert lines[0] == "eval: 0/40 tasks  10 s so far" and "eta" not in " ".join(lines[:9])
    assert all(b[1] <= a[1] + 1 for a, b in itertools.pairwise(etas))  # never swings up
    assert etas[0][0] == 100 and abs(etas[0][1] - 200) <= 6  # 2 batches left after the first (3.3 min)
    assert etas[-1][1] <= 20  # nearly done when the last batch is about to end
    assert lines[-1] == "eval: 40/40 tasks  0.13 tasks/s  300 s"
    assert max(b - a for a, b in zip([0, *told], told, strict=False)) <= 10  # a line at least every 10 s
