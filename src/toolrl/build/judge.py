"""Integration's optional LLM judge (`integrate.method: llm`): a model decides whether two tool documents are one
function, for the pairs the no-LLM rules leave open.

Within a block of documents that already share their input and output types, each pair of distinct relation
phrases at least `integrate.judge_floor` alike in words (relations.relation_key) is asked once, with a few of
each one's facts; the reply is validated (`{"same": bool, "why": str}`), retried, cached in `llm/integrate.jsonl`
like every stage's. Phrases one wording apart are the same without asking; a pair that facts or question words
keep apart is never asked. Groups then form by average linkage over the verdicts (1 same, 0 not) at
`integrate.threshold`: a group joins another only when most of their pairs were judged the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

JUDGE_SCHEMA = {
    "type": "object",
    "required": ["same"],
    "properties": {"same": {"type": "boolean"}, "why": {"type": "string"}},
}
JUDGE_PROMPT = """Two tools were written from questions about entities. Are they the same function: the same
relation asked of the same kind of entity, giving the same kind of answer (so that one tool can serve both)?
A relation and its inverse are not the same (director of a film vs films of a director); nor are a figure and a
variant of it (GDP vs GDP per capita; population vs population in 2010), nor different events (nominated vs won).

Tool A answers "{a}". Examples: {a_examples}
Tool B answers "{b}". Examples: {b_examples}

Reply with only a JSON object: {{"same": true or false, "why": "one short reason"}}."""

Judge = Callable[[str, str], bool]


def ask_judge(llm, examples: dict[str, list[str]]) -> Judge:
    """A judge over a StageLLM: phrase pair -> same function (a rejected reply counts as not the same)."""

    def judge(a: str, b: str) -> bool:
        a, b = sorted((a, b))
        prompt = JUDGE_PROMPT.format(
            a=a, b=b, a_examples="; ".join(examples.get(a, [])[:3]), b_examples="; ".join(examples.get(b, [])[:3])
        )
        value = llm.ask_json(f"{a} | {b}", prompt, JUDGE_SCHEMA)
        return bool(value and value.get("same"))

    return judge


def judged_similarity(phrases: list[str], word_vectors: np.ndarray, forbidden: np.ndarray, floor: float,
                      judge: Judge) -> np.ndarray:  # fmt: skip
    """Pairwise verdicts (1 same, 0 not) of the phrases of one block: identical vectors (one wording apart) are the
    same, pairs under `floor` in words or forbidden are not, the judge decides the others (once per phrase pair)."""
    sim = word_vectors @ word_vectors.T
    verdict = np.zeros_like(sim)
    asked: dict[tuple[str, str], bool] = {}
    for j in range(len(phrases)):
        for k in range(j + 1, len(phrases)):
            if forbidden[j, k] or sim[j, k] < floor:
                continue
            if sim[j, k] >= 1 - 1e-9 or phrases[j] == phrases[k]:
                same = True
            else:
                pair = (min(phrases[j], phrases[k]), max(phrases[j], phrases[k]))
                if pair not in asked:
                    asked[pair] = judge(*pair)
                same = asked[pair]
            verdict[j, k] = verdict[k, j] = float(same)
    np.fill_diagonal(verdict, 1.0)
    return verdict


def matrix_linkage(sim: np.ndarray, forbidden: np.ndarray, threshold: float) -> list[list[int]]:
    """Average linkage over a similarity matrix: the most similar pair of groups merges while the average of
    their pairwise similarities is >= threshold and `forbidden` (carried to merged groups) allows it."""
    n = len(sim)
    sums = sim.astype(np.float64).copy()
    sizes = np.ones(n)
    blocked = forbidden.copy()
    average = sums.copy()
    average[blocked] = -np.inf
    np.fill_diagonal(average, -np.inf)
    members = [[i] for i in range(n)]
    alive = np.ones(n, dtype=bool)
    for _ in range(n - 1):
        a, b = divmod(int(np.argmax(average)), n)
        if average[a, b] < threshold:
            break
        a, b = min(a, b), max(a, b)
        sums[a] += sums[b]
        sums[:, a] = sums[a]
        sizes[a] += sizes[b]
        members[a] += members[b]
        blocked[a] |= blocked[b]
        blocked[:, a] = blocked[a]
        alive[b] = False
        row = sums[a] / (sizes[a] * sizes)
        row[blocked[a] | ~alive] = -np.inf
        row[a] = -np.inf
        average[a], average[:, a] = row, row
        average[b], average[:, b] = -np.inf, -np.inf
    return [members[i] for i in range(n) if alive[i]]
