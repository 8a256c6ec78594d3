"""Progress counted in items (an evaluation's tasks): done/total, rate, ETA; a line at the first item, then at
most every 10 s, and always at the end."""

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
