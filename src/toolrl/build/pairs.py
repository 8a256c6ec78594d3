"""Integration measured on labeled pairs of relations: would the stage make one tool of the two?

A pair is two relation names as a data set's questions ask them, a few facts of each (entity -> answer) and the
label: `same` (synonyms that must merge) or not (false friends that must stay apart). Each relation becomes the
document the documents stage writes for it, with its facts, and the pair is run through integration (`cluster`)
alone: precision and recall of "merged" against the labels. bench/data/relation_pairs.jsonl holds 117 pairs of
relation names of FanOutQA's dev set (bench/env_builder.py prints the scores; docs/benchmarks.md).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from toolrl.build.artifacts import FactRow, SubProblem
from toolrl.build.documents import programmatic_doc
from toolrl.build.integrate import cluster
from toolrl.build.judge import Judge
from toolrl.errors import DataError


def load_pairs(path: str | Path) -> list[dict[str, Any]]:
    from toolrl.files import read_jsonl

    rows = read_jsonl(path, DataError)
    for number, row in enumerate(rows, 1):
        if not {"a", "b", "same", "a_examples", "b_examples"} <= set(row):
            raise DataError(f"{path}: row {number}: a pair needs a, b, same, a_examples and b_examples")
    return rows


def merged(row: dict[str, Any], method: str, threshold: float, judge: Judge | None = None) -> bool:
    """Whether integration makes one tool of the pair's two relations."""
    docs, kinds, facts = [], [], {}
    for side in ("a", "b"):
        kind, examples = row[side], row[f"{side}_examples"]
        first = examples[0]
        sub = SubProblem(
            id=side, question=kind, kind=kind, arguments={"entity": first["entity"]}, answer=first["answer"]
        )
        docs.append(programmatic_doc(sub, random.Random(f"pair:{side}:{kind}"), False))
        kinds.append({kind})
        facts[kind] = [FactRow(arguments={"entity": e["entity"]}, answer=str(e["answer"])) for e in examples]
    return len(cluster(docs, kinds, facts, method, threshold, judge)) == 1


def pair_scores(rows: list[dict[str, Any]], method: str, threshold: float, judge: Judge | None = None) -> dict:
    """Precision and recall of merging against the labels, with the pairs it got wrong."""
    tp = fp = fn = 0
    wrong = []
    for row in rows:
        same = merged(row, method, threshold, judge)
        tp += same and row["same"]
        fp += same and not row["same"]
        fn += not same and row["same"]
        if same != row["same"]:
            wrong.append({"a": row["a"], "b": row["b"], "labeled": "same" if row["same"] else "different"})
    return {
        "pairs": len(rows),
        "synonyms": sum(1 for r in rows if r["same"]),
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "merged_right": tp,
        "merged_wrong": fp,
        "missed": fn,
        "wrong": wrong,
    }
