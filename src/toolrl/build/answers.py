"""Answers compared by what they say, not how they are written: the builder's facts and a reply's final answer.

Two answers are the same when their canonical forms are: case, accents' composition, punctuation and spacing
aside; a number is its value (`8,848.86 m` is 8848.86 in metres: a unit on one side only is the same number, two
different units are not); `83.7 million` is 83,700,000; a list is the set of its items, however they are joined
(`,`, `;`, `and`, `&`) and ordered, less a leading article (`Anthony Russo and Joe Russo` = `Joe Russo, Anthony
Russo`). What this cannot equate is a true conflict (`The Russo brothers`): `fact_conflicts` lists them with both
values, and a built task keeps its own value for the calls it makes (scale's per-task overrides).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "k": 1e3, "m": 1e6, "bn": 1e9}
_NUMBER = re.compile(
    r"^(?:approximately |about |around |roughly |estimated at |estimated |~|\$|€|£|usd |us\$)*"
    r"([-+]?\d+(?:\.\d+)?)\s*(thousand|million|billion|trillion|bn)?\s*([a-z%°$€£][a-z0-9%°/.²³ ]{0,15})?$"
)
UNIT_NAMES = {
    "m": ("metre", "metres", "meter", "meters"), "km": ("kilometre", "kilometres", "kilometer", "kilometers"),
    "ft": ("foot", "feet"), "mi": ("mile", "miles"), "kg": ("kilogram", "kilograms", "kilo", "kilos"),
    "%": ("percent", "per cent", "pct"), "usd": ("$", "us$", "dollar", "dollars", "us dollars"),
    "km2": ("km²", "sq km", "square kilometres", "square kilometers", "km^2"), "min": ("minute", "minutes", "mins"),
}  # fmt: skip
_UNIT = {alias: unit for unit, aliases in UNIT_NAMES.items() for alias in aliases}
_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_JOINERS = re.compile(r"\s*(?:;|,|\band\b|&|\+)\s*")
_ARTICLE = re.compile(r"^(?:the|a|an)\s+")


def _plain(text: str) -> str:
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    return " ".join(text.replace("\u2019", "'").split())


def _words(text: str) -> str:
    words = " ".join(re.sub(r"[^\w%°.$€£'/-]+", " ", text).replace("'", "").split()).strip(" .")
    return re.sub(r"^-(?!\d)|(?<!\d)-$", "", words).strip()  # a dash, not a minus sign


@dataclass(frozen=True)
class Number:
    value: float
    unit: str

    def same(self, other: Number) -> bool:
        close = abs(self.value - other.value) <= 1e-9 * max(1.0, abs(self.value), abs(other.value))
        return close and (not self.unit or not other.unit or self.unit == other.unit)


def number(text: str) -> Number | None:
    """`text` as a number with its unit (`8,848.86 m` -> 8848.86 'm'), or None when it is not one."""
    plain = _SEPARATOR.sub("", _plain(text)).strip(" .")
    match = _NUMBER.match(plain)
    if match is None:
        return None
    value, scale, unit = float(match.group(1)), match.group(2), (match.group(3) or "").strip(" .")
    if unit in SCALES and not scale:  # "83.7 m" is metres, but "84 k" is thousands: only k and bn scale alone
        scale, unit = (unit, "") if unit in ("k", "bn") else (None, unit)
    if plain[:1] in "$€£" or plain.startswith(("usd", "us$")):
        unit = unit or "usd"
    return Number(value * SCALES.get(scale or "", 1.0), _UNIT.get(unit, unit))


def items(text: str) -> frozenset[str]:
    """The items of a list answer, canonical (one item for a plain answer)."""
    plain = _SEPARATOR.sub("", _plain(text))
    return frozenset(_ARTICLE.sub("", _words(part)) for part in _JOINERS.split(plain) if _words(part))


def same_answer(a: str, b: str) -> bool:
    """Whether two answers say the same (the module's rules)."""
    if _words(_plain(a)) == _words(_plain(b)):
        return True
    x, y = number(a), number(b)
    if x is not None and y is not None:
        return x.same(y)
    return items(a) == items(b)


def canonical(answer: str) -> str:
    """One text per class of `same_answer` where it can be (numbers by value, lists as sorted sets)."""
    found = number(answer)
    if found is not None:
        return f"{found.value:g}"
    return "; ".join(sorted(items(answer)))


def contains(reply: str, answer: str) -> bool:
    """The reply states `answer`: its words appear in the reply's, or it is a number the reply states (in any
    form: separators, a unit, a scale word), or it is a list whose every item the reply states."""
    text = _words(_SEPARATOR.sub("", _plain(reply)))
    wanted = _words(_SEPARATOR.sub("", _plain(answer)))
    if wanted and re.search(rf"(?<![\w.]){re.escape(wanted)}(?!\w|\.\d)", text):
        return True
    want = number(answer)
    if want is not None:
        return any(
            (have := number(m.group())) is not None and have.same(want)
            for m in re.finditer(r"\d+(?:\.\d+)?(?:\s*(?:thousand|million|billion|trillion|bn))?(?:\s*[a-z%°]+)?", text)
        )
    parts = items(answer)
    return len(parts) > 1 and all(contains(reply, part) for part in parts)


def fact_conflicts(rows: Iterable[tuple[str, str, str, str]]) -> list[dict[str, object]]:
    """True conflicts among facts, `(kind, key, answer, where)` rows: one entry per kind and key whose answers do
    not all say the same, with each different value and where it came from."""
    seen: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for kind, key, answer, where in rows:
        seen.setdefault((kind, key), []).append((answer, where))
    out = []
    for (kind, key), values in seen.items():
        distinct: list[tuple[str, str]] = []
        for answer, where in values:
            if not any(same_answer(answer, kept) for kept, _ in distinct):
                distinct.append((answer, where))
        if len(distinct) > 1:
            out.append({"kind": kind, "key": key, "values": [{"answer": a, "from": w} for a, w in distinct]})
    return out
