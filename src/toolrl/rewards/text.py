"""Answer normalisation and matching as in SQuAD's evaluation (and Search-R1's exact-match reward)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def final_answer(text: str) -> str | None:
    """The content of the last <answer>...</answer> in `text`, stripped, or None."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(gold) for gold in golds))


def token_f1(prediction: str | None, golds: Iterable[str]) -> float:
    """SQuAD's token-overlap F1 against the best-matching gold answer."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold).split()
        common = sum((Counter(predicted) & Counter(expected)).values())
        if common:
            precision, recall = common / len(predicted), common / len(expected)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def gold_answers(task) -> list[str]:
    """Every accepted answer of a task: `meta["answers"]` when the task has several, else its answer."""
    answers = task.meta.get("answers")
    return [str(a) for a in answers] if answers else [task.answer]
