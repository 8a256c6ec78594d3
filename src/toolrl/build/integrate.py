"""Stage c, function integration: documents whose functions overlap merge into one tool, n -> m <= n.

The rule: two groups of documents merge when their parameters are the same (names and types), their texts
are similar (average cosine similarity of all-MiniLM-L6-v2 embeddings of name and description, at least
`integrate.threshold`; or, with `method: name`, the overlap of the names' words), and their functions never
disagree (no arguments answered differently by the kinds they serve). The most similar pair merges first.

Writes `3_tools.jsonl` (MergedTool rows) and `3_mapping.jsonl` (each sub-problem's tool).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from toolrl.build.artifacts import DocRow, FactRow, MergedTool, ToolDoc, Workspace
from toolrl.build.decompose import read_facts
from toolrl.build.documents import DOCUMENTS_FILE

TOOLS_FILE = "3_tools.jsonl"
MAPPING_FILE = "3_mapping.jsonl"
_FILLER = {"get", "find", "lookup", "of", "the", "a", "for", "by"}


def _signature(doc: ToolDoc) -> str:
    properties = doc.parameters.get("properties", {})
    return json.dumps(sorted((name, str(p.get("type"))) for name, p in properties.items()))


def _text(doc: ToolDoc) -> str:
    return f"{doc.name.replace('_', ' ')}: {doc.description}"


def _words(doc: ToolDoc) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", doc.name.lower())) - _FILLER - {""}


def similarity_matrix(docs: list[ToolDoc], method: str) -> list[list[float]]:
    if method == "embedding":
        from toolrl.envs.search.retriever import Embedder

        vectors = Embedder().encode([_text(d) for d in docs])
        return (vectors @ vectors.T).tolist()
    words = [_words(d) for d in docs]
    return [[len(a & b) / max(len(a | b), 1) for b in words] for a in words]


def _key(arguments: dict[str, Any]) -> str:
    return json.dumps({k: str(v).strip().lower() for k, v in arguments.items()}, sort_keys=True)


def consistent(kinds: set[str], facts: dict[str, list[FactRow]]) -> bool:
    """No arguments that the kinds answer differently."""
    seen: dict[str, str] = {}
    for kind in kinds:
        for row in facts.get(kind, []):
            key, answer = _key(row.arguments), row.answer.strip().lower()
            if seen.setdefault(key, answer) != answer:
                return False
    return True


def cluster(
    docs: list[ToolDoc], kinds: list[set[str]], facts: dict[str, list[FactRow]], method: str, threshold: float
) -> list[list[int]]:
    """Average-linkage merging of documents of the same signature, most similar pair first; returns groups of
    indices into `docs`."""
    groups: dict[str, list[int]] = {}
    for i, doc in enumerate(docs):
        groups.setdefault(_signature(doc), []).append(i)
    result: list[list[int]] = []
    for members in groups.values():
        sims = similarity_matrix([docs[i] for i in members], method)
        clusters = [[j] for j in range(len(members))]
        served = [set(kinds[members[j]]) for j in range(len(members))]
        while len(clusters) > 1:
            best, pair = threshold, None
            for a in range(len(clusters)):
                for b in range(a + 1, len(clusters)):
                    mean = sum(sims[x][y] for x in clusters[a] for y in clusters[b]) / (
                        len(clusters[a]) * len(clusters[b])
                    )
                    if mean >= best and consistent(served[a] | served[b], facts):
                        best, pair = mean, (a, b)
            if pair is None:
                break
            a, b = pair
            clusters[a] += clusters.pop(b)
            served[a] |= served.pop(b)
        result += [[members[j] for j in c] for c in clusters]
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
    groups = cluster(docs, kinds, facts, spec.integrate.method, spec.integrate.threshold)
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
    }
