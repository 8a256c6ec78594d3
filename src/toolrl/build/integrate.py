"""Stage c, function integration: documents that describe the same function merge into one tool, n -> m <= n.

Two documents are the same function when all of these hold:

1. **The same input**: the same parameters (names and JSON types).
2. **The same output type**: what the answers of the facts they serve look like (a year, a month, a date, a
   number, yes/no or text; `value_type`), or, without facts, the document's `returns`.
3. **The same meaning**: what the function gives, in words (`phrase`: its name less verbs such as get/find/lookup
   and less what its parameters are; "lookup_year_of_birth_of_person" gives "year of birth"), at least
   `integrate.threshold` similar: the cosine of all-MiniLM-L6-v2 embeddings (`method: embedding`), or of the
   phrases' sets of words (`method: name`, no model). Groups merge by average linkage, most similar pair first.
4. **Facts that never disagree**: no arguments that the kinds they serve answer differently.

"birth year" and "year of birth" merge; "month of birth" (a month) and "year of birth" (a year) do not; nor
do "birth year" and "death year" (0.64 apart in meaning, under the default 0.8). A document's phrase is embedded
once and the grouping works on vectors (a sum per group), so the stage grows with the number of documents, not
with its cube. Writes `3_tools.jsonl` (MergedTool rows) and `3_mapping.jsonl` (each sub-problem's tool).
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

from toolrl.build.answers import number, same_answer
from toolrl.build.artifacts import DocRow, FactRow, MergedTool, ToolDoc, Workspace
from toolrl.build.decompose import read_facts
from toolrl.build.documents import DOCUMENTS_FILE
from toolrl.build.judge import Judge, ask_judge, judged_similarity, matrix_linkage
from toolrl.build.relations import canonical_phrase, relation_key

TOOLS_FILE = "3_tools.jsonl"
MAPPING_FILE = "3_mapping.jsonl"
VERBS = {"get", "find", "lookup", "look", "up", "fetch", "retrieve", "query", "search", "return", "returns",
         "gives", "give", "compute", "calculate", "resolve", "read", "list", "tool", "api"}  # fmt: skip
CONNECTORS = {"of", "for", "by", "the", "a", "an", "given", "from", "to", "with", "in", "on", "its", "s"}
GENERIC = {"info", "information", "data", "details", "detail", "value", "result", "record", "entry"}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
          "dec"]  # fmt: skip
_MONTH = "(" + "|".join(MONTHS) + r")\.?"
_ORDINAL = "(st|nd|rd|th)?"
VALUE_TYPES: dict[str, re.Pattern[str]] = {
    "boolean": re.compile(r"yes|no|true|false"),
    "year": re.compile(r"(1\d|20)\d\d"),
    "month": re.compile(_MONTH),
    "date": re.compile(
        rf"\d{{4}}-\d\d-\d\d|\d{{1,2}}{_ORDINAL} {_MONTH},? \d{{3,4}}|{_MONTH} \d{{1,2}}{_ORDINAL},? \d{{3,4}}"
    ),
    "number": re.compile(r"[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?( ?[a-z%]{1,12})?"),
}
"""What an answer looks like, tried in this order (a year is also a number: the first that fits)."""
TYPE_SHARE = 0.8
"""A kind's answers have a value type when at least this share of them fits it (real data has a few odd ones)."""


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def _strip(words: list[str]) -> list[str]:
    while words and words[0] in CONNECTORS:
        words = words[1:]
    while words and words[-1] in CONNECTORS:
        words = words[:-1]
    return words


def phrase(doc: ToolDoc) -> str:
    """What the function gives, in words: its name less verbs and the words of its parameters' names and
    descriptions (they say what goes in, not what comes out: "get_person_mother" taking "the name of the person"
    gives "mother"); the description's words the same way when the name says nothing more specific ("get_info")."""
    properties = doc.parameters.get("properties", {})
    inputs = {w for name, p in properties.items() for w in _words(f"{name} {p.get('description', '')}")}

    def meaning(text: str) -> list[str]:
        return _strip([w for w in _words(text) if w not in VERBS and w not in inputs])

    words = meaning(doc.name.replace("_", " "))
    if not set(words) - CONNECTORS - GENERIC:
        words = meaning(doc.description) or words
    return " ".join(words) or doc.name


def value_type(answers: Sequence[str], declared: str = "string") -> str:
    """The type of a function's output read off its answers (or its `returns` when it has none)."""
    if not answers:
        return "number" if declared in ("number", "integer") else "boolean" if declared == "boolean" else "text"
    texts = [a.strip().lower() for a in answers]

    def share(fits) -> bool:
        return sum(1 for t in texts if fits(t)) >= TYPE_SHARE * len(texts)

    for name, pattern in VALUE_TYPES.items():
        if share(pattern.fullmatch):
            return name
    if share(lambda t: VALUE_TYPES["year"].fullmatch(t) or VALUE_TYPES["date"].fullmatch(t)):
        return "date"  # a year where the day is not known: a date as precise as it gets
    if share(lambda t: number(t) is not None):
        return "number"  # with a currency, a unit, a scale word: `$6.4 million`, `approximately 31.8 billion`
    return "text"


def _signature(doc: ToolDoc) -> str:
    properties = doc.parameters.get("properties", {})
    return json.dumps(sorted((name, str(p.get("type"))) for name, p in properties.items()))


def _key(arguments: dict[str, Any]) -> str:
    return json.dumps({k: str(v).strip().lower() for k, v in arguments.items()}, sort_keys=True)


def conflicts(facts: dict[str, list[FactRow]]) -> set[frozenset[str]]:
    """Pairs of kinds that answer some arguments differently (answers.same_answer: `8,848.86 m` and `8848.86`
    do not differ); one pass over the facts."""
    answers: dict[str, list[tuple[str, set[str]]]] = {}
    for kind, rows in facts.items():
        for row in rows:
            distinct = answers.setdefault(_key(row.arguments), [])
            for answer, kinds in distinct:
                if same_answer(answer, row.answer):
                    kinds.add(kind)
                    break
            else:
                distinct.append((row.answer, {kind}))
    pairs: set[frozenset[str]] = set()
    for distinct in answers.values():
        for (_, a), (_, b) in combinations(distinct, 2):
            pairs |= {frozenset((x, y)) for x in a for y in b if x != y}
    return pairs


def same_wording(phrases: list[str]) -> list[int]:
    """For each phrase, the first phrase with the same relation key (relations.relation_key: `director` and
    `who directed`, `capital city` and `capital`) or the same words run together (`birth place`, `birthplace`):
    its representative."""
    first: dict[Any, int] = {}
    out = []
    for i, text in enumerate(phrases):
        stems = relation_key(text)
        joined = "".join(w for w in _words(text) if w not in CONNECTORS)
        rep = first.get(stems, first.get(joined, i))
        first.setdefault(stems, rep)
        first.setdefault(joined, rep)
        out.append(rep)
    return out


@functools.cache
def _embedder():
    """The shipped all-MiniLM-L6-v2, loaded once per process (a stage, or the 117 pairs of a measurement)."""
    from toolrl.envs.search.retriever import Embedder

    return Embedder()


def vectors(phrases: list[str], method: str) -> np.ndarray:
    """One unit vector per phrase: its embedding, or its set of words (one-hot over the words seen); phrases one
    wording apart (`same_wording`) get the same vector (the embedding model is weak on word forms)."""
    reps = same_wording(phrases)
    if method == "embedding":
        distinct = sorted(set(reps))
        encoded = _embedder().encode([canonical_phrase(phrases[i]) for i in distinct]).numpy().astype(np.float64)
        row = {rep: k for k, rep in enumerate(distinct)}
        return encoded[[row[r] for r in reps]]
    sets = [set(relation_key(phrases[r])[0]) or {phrases[r]} for r in reps]
    vocabulary: dict[str, int] = {}
    for words in sets:
        for w in sorted(words):
            vocabulary.setdefault(w, len(vocabulary))
    matrix = np.zeros((len(sets), max(len(vocabulary), 1)))
    for i, words in enumerate(sets):
        matrix[i, [vocabulary[w] for w in words]] = 1.0
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def average_linkage(vecs: np.ndarray, forbidden: np.ndarray, threshold: float) -> list[list[int]]:
    """Groups of rows of `vecs` (unit vectors): the most similar pair of groups merges while its average pairwise
    cosine is >= threshold and `forbidden` (a symmetric boolean matrix, carried to the merged group) allows it.
    The average of pairwise cosines is the dot product of the groups' sums over the product of their sizes."""
    n = len(vecs)
    sums, sizes = vecs.copy(), np.ones(n)
    blocked = forbidden.copy()
    alive = np.ones(n, dtype=bool)
    sim = sums @ sums.T
    np.fill_diagonal(sim, -np.inf)
    sim[blocked] = -np.inf
    members = [[i] for i in range(n)]
    while n > 1:
        flat = int(np.argmax(sim))
        a, b = divmod(flat, len(vecs))
        if sim[a, b] < threshold:
            break
        a, b = min(a, b), max(a, b)
        sums[a] += sums[b]
        sizes[a] += sizes[b]
        members[a] += members[b]
        blocked[a] |= blocked[b]
        blocked[:, a] = blocked[a]
        alive[b] = False
        row = (sums @ sums[a]) / (sizes * sizes[a])
        row[~alive] = -np.inf
        row[blocked[a]] = -np.inf
        row[a] = -np.inf
        sim[a], sim[:, a] = row, row
        sim[b], sim[:, b] = -np.inf, -np.inf
        n -= 1
    return [members[i] for i in range(len(vecs)) if alive[i]]


def cluster(
    docs: list[ToolDoc],
    kinds: list[set[str]],
    facts: dict[str, list[FactRow]],
    method: str,
    threshold: float,
    judge: Judge | None = None,
    floor: float = 0.5,
) -> list[list[int]]:
    """Groups of indices into `docs` that are one function each (the module's rules); with `judge` (method llm),
    the judge decides the pairs the words leave open (judge.py)."""
    types = {kind: value_type([r.answer for r in rows]) for kind, rows in facts.items()}
    blocks: dict[tuple[str, str], list[int]] = {}
    for i, doc in enumerate(docs):
        declared = value_type([], doc.returns)
        served = sorted({types.get(k) or declared for k in kinds[i]}) or [declared]
        blocks.setdefault((_signature(doc), "|".join(served)), []).append(i)
    phrases = [phrase(d) for d in docs]
    distinct = sorted(set(phrases))
    table = vectors(distinct, "name" if judge is not None else method)
    row_of = {p: i for i, p in enumerate(distinct)}
    clashes = conflicts(facts)
    words = [relation_key(p)[1] for p in phrases]
    asked = {q: k for k, q in enumerate(sorted({q for q in words if q}))}
    question = np.array([asked[q] if q else -1 for q in words])
    result: list[list[int]] = []
    for members in blocks.values():
        vecs = table[[row_of[phrases[i]] for i in members]]
        q = question[members]  # `when founded` and `who founded` are two relations; `founded` fits either
        forbidden = (q[:, None] != q[None, :]) & (q[:, None] >= 0) & (q[None, :] >= 0)
        serving: dict[str, list[int]] = {}
        for j, i in enumerate(members):
            for kind in kinds[i]:
                serving.setdefault(kind, []).append(j)
        for p, q in (tuple(pair) for pair in clashes):
            for x in serving.get(p, []):
                forbidden[x, serving.get(q, [])] = True
                forbidden[serving.get(q, []), x] = True
        if judge is None:
            groups = average_linkage(vecs, forbidden, threshold)
        else:
            verdicts = judged_similarity([phrases[i] for i in members], vecs, forbidden, floor, judge)
            groups = matrix_linkage(verdicts, forbidden, threshold)
        result += [[members[j] for j in group] for group in groups]
    return result


def run(spec, ws: Workspace, llm_for) -> dict[str, Any]:
    rows = ws.read_rows(DOCUMENTS_FILE, DocRow, "documents")
    facts = read_facts(ws)
    unique: dict[str, int] = {}
    docs: list[ToolDoc] = []
    members: list[list[DocRow]] = []
    for row in rows:
        key = row.doc.model_dump_json()
        if key not in unique:
            unique[key] = len(docs)
            docs.append(row.doc)
            members.append([])
        members[unique[key]].append(row)
    kinds = [{r.kind for r in group} for group in members]
    knobs, llm, report = spec.integrate, None, {}
    if knobs.method == "llm":
        llm = llm_for("integrate")
        examples: dict[str, list[str]] = {}
        for doc, served in zip(docs, kinds, strict=True):
            rows_ = [row for kind in sorted(served) for row in facts.get(kind, [])]
            examples.setdefault(phrase(doc), []).extend(f"{json.dumps(r.arguments)} -> {r.answer}" for r in rows_[:3])
    try:
        judge = ask_judge(llm, examples) if llm is not None else None
        groups = cluster(docs, kinds, facts, knobs.method, knobs.threshold, judge, knobs.judge_floor)
    finally:
        if llm is not None:
            llm.close()
            report["llm"] = llm.stats.report()
    tools: list[MergedTool] = []
    mapping = []
    taken: set[str] = set()
    for group in sorted(groups, key=lambda g: min(g)):
        rows_in = [r for i in group for r in members[i]]
        name = Counter(r.doc.name for r in rows_in).most_common(1)[0][0]
        base, n = name, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        described = Counter(r.doc.description for r in rows_in).most_common(1)[0][0]
        doc = docs[group[0]].model_copy(update={"name": name, "description": described})
        tool = MergedTool(
            doc=doc,
            members=[f"{r.task}/{r.subproblem}" for r in rows_in],
            kinds=sorted(set().union(*(kinds[i] for i in group))),
        )
        tools.append(tool)
        mapping += [{"task": r.task, "subproblem": r.subproblem, "tool": name} for r in rows_in]
    ws.write_rows(TOOLS_FILE, tools)
    ws.write_rows(MAPPING_FILE, mapping)
    per_kind = Counter(k for t in tools for k in t.kinds)
    return {
        "documents": len(rows),
        "distinct_documents": len(docs),
        "tools": len(tools),
        "kinds": len(per_kind),
        "kinds_in_several_tools": sum(1 for c in per_kind.values() if c > 1),
        "method": spec.integrate.method,
        "threshold": spec.integrate.threshold,
        **report,
    }
