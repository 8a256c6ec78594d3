"""What a relation name means, without a model: the words that name it, less the ones that do not change it.

Annotators name one relation many ways: `who directed` / `director`, `capital` / `capital city`, `gini` /
`gini index`, `year founded` / `founding year` / `when founded`, `how old` / `age`. A relation's key is the set
of its words after:

- question words are set apart (`who`, `when`, `where`, `how many`, ...): two relations whose question words
  differ are different (`when born` is not `where born`), one without is compatible with any;
- a small thesaurus of English word forms (`born` -> birth, `birthday` -> birth date, `headquartered` ->
  headquarter, `established` -> founded, `how old` -> age);
- filler dropped: words that say how an answer is given, not what it is (current, total, approximately, name,
  number, value, ...), and the type nouns of an answer (city, date, year, index, ...): the output type
  (integrate.value_type) keeps `year born` and `month born` apart, not these words;
- stems (director, directed, direct -> direct).

What it keeps apart is what changes the relation: `gdp` / `gdp per capita`, `nominated` / `won`, `population` /
`population 2000`, `head of state` / `head of government`. Measured on a labeled set of real relation names
(bench/data/relation_pairs.jsonl, docs/benchmarks.md).
"""

from __future__ import annotations

import re

QUESTION_WORDS = {"who": "who", "whom": "who", "whose": "who", "when": "when", "where": "where", "why": "why",
                  "how_many": "how_many", "how_much": "how_much", "how_long": "how_long"}  # fmt: skip
THESAURUS = {
    "born": "birth", "birthday": "birth date", "birthdate": "birth date", "birthplace": "birth place",
    "dob": "birth date", "birthplaces": "birth place",
    "hometown": "home town", "headquartered": "headquarter", "headquarters": "headquarter",
    "hq": "headquarter", "established": "founded", "establishment": "founded", "establish": "founded",
    "how_old": "age", "died": "death", "die": "death", "deceased": "death", "languages": "language",
    "undergrad": "undergraduate", "kids": "children", "children": "child",
}  # fmt: skip
"""Forms of one word; not synonyms of meaning (those are the embedding's and the judge's). No misspelling of the
measured set is listed: a misspelt relation stays apart unless the embedding or the judge joins it."""
FILLER = {
    "current", "currently", "present", "total", "overall", "approximately", "approximate", "about", "around",
    "estimated", "recent", "latest_known", "called", "named", "name", "names", "list", "number", "count",
    "amount", "value", "figure", "all", "time", "ever", "known", "official_name", "city", "town", "place",
    "date", "year", "years", "index", "title", "data", "info", "information", "details", "do", "does", "did",
    "get", "go", "went", "it", "he", "she", "they", "them", "his", "her", "their", "its", "so", "if", "there",
    "of", "the", "a", "an", "in", "on", "for", "to", "by", "from", "at", "as", "with", "and", "or", "is", "are",
    "was", "were", "be", "been", "what", "which",
    "minutes", "minute", "hours", "seconds", "usd", "dollars", "millions", "million", "billions", "billion",
    "thousands", "feet", "foot", "ft", "inches", "meters", "metres", "km", "miles", "kg", "pounds", "lbs",
    "celsius", "fahrenheit", "percent", "percentage",
}  # fmt: skip
"""Words that do not change what a relation is: how its answer is given (including its unit)."""
_SUFFIX = re.compile(r"(?<=...)(ers|er|ors|or|ed|ing|es|e|s)$")
_TOKEN = re.compile(r"[a-z0-9]+")


def stem(word: str) -> str:
    return _SUFFIX.sub("", word)


def _tokens(name: str) -> list[str]:
    """The words of a relation name (`who_directed`, `how many employees`), `how X` as one word."""
    words = _TOKEN.findall(name.lower().replace("_", " "))
    out: list[str] = []
    for word in words:
        if out and out[-1] == "how" and word in ("many", "much", "long", "old"):
            out[-1] = f"how_{word}"
        else:
            out.append(word)
    return out


def relation_key(name: str) -> tuple[frozenset[str], str | None]:
    """(The stems that name the relation, its question word or None): the module's rules."""
    question = None
    stems: set[str] = set()
    for word in _tokens(name):
        if word in QUESTION_WORDS:
            question = question or QUESTION_WORDS[word]
            continue
        for part in THESAURUS.get(word, word).split():
            if part not in FILLER:
                stems.add(stem(part))
    return frozenset(stems), question


def canonical_phrase(name: str) -> str:
    """The relation's words less question words and filler, with the thesaurus's forms (for an embedding)."""
    words = []
    for word in _tokens(name):
        if word not in QUESTION_WORDS:
            words += [p for p in THESAURUS.get(word, word).split() if p not in FILLER]
    return " ".join(words) or name
