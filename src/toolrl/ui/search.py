"""Search over the samples of steps and runs: text in the model's turns or the tool results, a tool's name, the
outcome, a reward range and the stop reason; each hit names its run, kind, step and record index, so that the page
opens that trajectory. Records are found through the run's record index (the viewer's: byte offsets and summaries
per step), newest step first; text is found in a record's bytes (fast beside parsing), and only records whose
line contains the text, lower-cased, are parsed. A run folder is data: files are opened as the index opens them,
hits are capped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.runs.files import open_in_run
from toolrl.text import clip
from toolrl.ui.runs import RECORD_FILES, RecordIndex

MAX_HITS = 200
SNIPPET_CHARS = 160


@dataclass(frozen=True)
class Query:
    text: str = ""
    tool: str = ""
    outcome: str = ""  # success | fail | "" (any)
    reward_min: float | None = None
    reward_max: float | None = None
    stop: str = ""

    def brief_passes(self, brief: dict[str, Any]) -> bool:
        reward, success = brief.get("reward"), brief.get("success")
        if self.outcome and (not isinstance(success, int | float) or (success >= 0.5) != (self.outcome == "success")):
            return False
        if self.reward_min is not None and not (isinstance(reward, int | float) and reward >= self.reward_min):
            return False
        if self.reward_max is not None and not (isinstance(reward, int | float) and reward <= self.reward_max):
            return False
        return not self.stop or brief.get("stop_reason") == self.stop


def _texts(record: dict[str, Any]) -> list[str]:
    """The searched text of a record: its model turns, observations and user turns, and its calls' results."""
    out = [s.get("text") for s in record.get("segments") or [] if isinstance(s, dict)]
    out += [c.get("result") for c in record.get("calls") or [] if isinstance(c, dict)]
    return [t for t in out if isinstance(t, str)]


def _tools(record: dict[str, Any]) -> set[str]:
    return {str(c.get("name")) for c in record.get("calls") or [] if isinstance(c, dict)}


def search(index: RecordIndex, root: Path, runs: list[Path], query: Query) -> dict[str, Any]:
    """Hits (at most MAX_HITS, newest step first within a run) and how many records were looked at. The index's
    summaries decide outcome, reward and stop reason without reading a record; a record is read (at its indexed
    offset) only when text or a tool is asked, and parsed only when its line holds the text."""
    hits: list[dict[str, Any]] = []
    looked = 0
    lowered = query.text.lower()
    needle = lowered.encode()
    for run in runs:
        for kind, name in RECORD_FILES.items():
            briefs = index.briefs(run, kind)
            where = sorted(index.locations(run, kind).items(), key=lambda at: (-at[1][0], at[1][1]))
            if not where:
                continue
            try:
                f = open_in_run(run, run / name)
            except OSError:
                continue
            with f:
                for offset, (step, i) in where:
                    brief = briefs[step][i]
                    looked += 1
                    if not query.brief_passes(brief):
                        continue
                    snippet = ""
                    if query.text or query.tool:
                        f.seek(offset)
                        line = f.readline()
                        if needle and needle not in line.lower():
                            continue
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        found = [t for t in _texts(record) if lowered in t.lower()] if query.text else [""]
                        if not found or (query.tool and query.tool not in _tools(record)):
                            continue
                        snippet = _snippet(found[0], query.text)
                    hits.append({"run": str(run.relative_to(root)), "kind": kind, "step": step, "index": i,
                                 "task_id": brief.get("task_id"), "reward": brief.get("reward"),
                                 "success": brief.get("success"), "stop_reason": brief.get("stop_reason"),
                                 "snippet": snippet})  # fmt: skip
                    if len(hits) >= MAX_HITS:
                        return {"hits": hits, "looked": looked, "capped": True}
    return {"hits": hits, "looked": looked, "capped": False}


def _snippet(text: str, needle: str) -> str:
    """The text around the first match of `needle`."""
    at = text.lower().find(needle.lower()) if needle else 0
    start = max(0, at - SNIPPET_CHARS // 3)
    return clip(("…" if start else "") + text[start : start + SNIPPET_CHARS], SNIPPET_CHARS + 2)
