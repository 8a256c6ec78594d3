"""Published multi-hop data sets, read as `decompositions` records (`tasks.format` in the spec).

`decompositions` is toolrl's own JSONL (docs/environments.md). `fanoutqa` is FanOutQA's JSON (a list of
questions, each with a tree of sub-questions, their answers, dependencies and the Wikipedia page that answers
them; the `fanoutqa` package ships the dev set of 310 questions). A sub-question becomes one tool call:

- its argument is the entity it asks about, found in its text: an earlier answer it depends on, else the title of
  its evidence page (less a disambiguation in brackets), else the shortest span covering the title's words;
- its kind is what is asked of that entity: the question less the entity, less function words, keeping the
  question word that carries meaning (`where born` and `when born` are different relations); a question that is
  only its entity (`What are the new 7 wonders of the world?`) asks for the members of a group (`members`);
- a sub-question that has its own decomposition is replaced by its leaves (a dependency on it is on them).

Every record keeps its row number, so a bad one is a one-line error naming the file and the row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from toolrl.errors import DataError
from toolrl.registry import Registry

Reader = Callable[[Path], Iterator[tuple[int, Any]]]
FORMATS: Registry[Reader] = Registry("task format", "tasks.format")

FUNCTION_WORDS = {
    "what", "which", "is", "are", "was", "were", "did", "does", "do", "has", "have", "had", "the", "a", "an", "of",
    "in", "for", "to", "by", "s", "be", "been", "on", "at", "as", "its", "their", "his", "her", "this", "that",
    "these", "those", "and", "or", "please", "tell", "me", "list", "give", "name", "there",
}  # fmt: skip
"""Words that say nothing of the relation asked. The question words that do (who, where, when, how) stay."""
MAX_WORDS = 8
"""A relation named by more words is cut (a question that lists its options: "... one of Columbia, Cornell, ...")."""
WORD = re.compile(r"[^\W_][\w.&'\-]*")


@FORMATS.register("decompositions")
def read_decompositions(path: Path) -> Iterator[tuple[int, Any]]:
    from toolrl.files import read_jsonl

    yield from enumerate(read_jsonl(path, DataError), 1)


def _value(answer: Any) -> Any:
    """A FanOutQA answer as a value or a list of values (a mapping: its `key: value` pairs; yes/no for bools)."""
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    if isinstance(answer, dict):
        return [f"{k}: {_value(v)}" for k, v in answer.items()]
    if isinstance(answer, list):
        return [_value(a) for a in answer]
    return answer


def _span(question: str, name: str) -> tuple[int, int] | None:
    at = question.lower().find(name.lower()) if name.strip() else -1
    return (at, at + len(name)) if at >= 0 else None


def _covering_span(question: str, title: str) -> tuple[int, int] | None:
    """The shortest span of `question` from the first to the last of its words that are in `title`."""
    words = {w.lower() for w in WORD.findall(title)} - FUNCTION_WORDS
    hits = [m.span() for m in WORD.finditer(question) if m.group().lower() in words]
    return (hits[0][0], hits[-1][1]) if hits else None


def relation(question: str, span: tuple[int, int]) -> str:
    """What a question asks of the entity at `span`: its other words, less function words, as a kind name."""
    rest = f"{question[: span[0]]} {question[span[1] :]}"
    words = [w.lower().strip(".'-") for w in WORD.findall(rest)]
    words = [w for w in words if w and w not in FUNCTION_WORDS]
    if words and words[0] == "how" and len(words) > 1 and words[1] in ("many", "much", "old", "long", "tall"):
        words = [f"how_{words[1]}", *words[2:]]
    kind = "_".join(re.sub(r"[^a-z0-9]+", "_", w).strip("_") for w in words[:MAX_WORDS]).strip("_")
    kind = re.sub(r"_+", "_", kind)
    return kind if kind[:1].isalpha() else f"about_{kind}" if kind else "members"


def _leaves(subs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for sub in subs:
        if sub.get("decomposition"):
            yield from _leaves(sub["decomposition"])
        else:
            yield sub


def _fanout_record(record: dict[str, Any]) -> dict[str, Any]:
    nodes = record.get("decomposition")
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("decomposition: a non-empty list of sub-questions is required")
    leaves_of: dict[str, list[str]] = {}

    def index(subs: list[dict[str, Any]]) -> list[str]:
        ids: list[str] = []
        for sub in subs:
            own = index(sub["decomposition"]) if sub.get("decomposition") else [str(sub["id"])]
            leaves_of[str(sub["id"])] = own
            ids += own
        return ids

    index(nodes)
    answers: dict[str, Any] = {}
    out = []
    for sub in _leaves(nodes):
        question = str(sub.get("question", "")).strip()
        depends = list(dict.fromkeys(leaf for d in sub.get("depends_on", []) for leaf in leaves_of.get(str(d), [])))
        spans = []
        for dep in depends:
            earlier = answers.get(dep)
            for value in earlier if isinstance(earlier, list) else [earlier]:
                if isinstance(value, str) and (span := _span(question, value)):
                    spans.append(span)
        title = re.sub(r"\s*\([^)]*\)\s*$", "", str((sub.get("evidence") or {}).get("title", ""))).strip()
        found = _span(question, title) or _covering_span(question, title)
        spans = spans or ([found] if found else [])
        if spans:
            span = max(spans, key=lambda s: s[1] - s[0])
            entity, kind = question[span[0] : span[1]].strip(" '\"?"), relation(question, span)
        else:  # nothing of the page's title is in the question: the page is what it asks about
            entity, kind = title or question, relation(question, (0, 0))
        answers[str(sub["id"])] = value = _value(sub.get("answer"))
        out.append(
            {
                "id": str(sub["id"]),
                "question": question,
                "kind": kind,
                "arguments": {"entity": entity or title},
                "answer": value if value not in (None, "", []) else "none",
                "depends_on": [d for d in depends if d in answers],
            }
        )
    answer = _value(record.get("answer"))
    if isinstance(record.get("answer"), dict):  # a mapping: the reply must hold each value (keys are the entities)
        answer = list(dict.fromkeys(str(_value(v)) for v in record["answer"].values()))
    return {"id": str(record.get("id", "")), "question": str(record.get("question", "")), "answer": answer,
            "subproblems": out}  # fmt: skip


@FORMATS.register("fanoutqa")
def read_fanoutqa(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a FanOutQA JSON file ({exc}); set tasks.format to the file's format") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: a FanOutQA file is a JSON list of questions; set tasks.format to the file's format")
    for number, record in enumerate(data, 1):
        try:
            yield number, _fanout_record(record if isinstance(record, dict) else {})
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path}: row {number}: not a FanOutQA question ({exc})") from None


def resolve(path: str) -> Path:
    """`tasks.path`: a file, or the name of a set an installed package ships (`fanoutqa-dev`)."""
    given = Path(path).expanduser()
    if not given.exists() and path in SHIPPED:
        found = SHIPPED[path]()
        if found is None:
            raise DataError(f"tasks.path {path}: its package is not installed (pip install --no-deps fanoutqa)")
        return found
    return given


def fanoutqa_dev() -> Path | None:
    """The FanOutQA dev set the `fanoutqa` package ships (310 questions, CC BY-SA 4.0), or None."""
    import importlib.util

    found = importlib.util.find_spec("fanoutqa")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / "data" / "fanout-final-dev.json"
    return path if path.is_file() else None


SHIPPED = {"fanoutqa-dev": fanoutqa_dev}
"""Data sets a package ships, by the name `tasks.path` may give instead of a file."""
