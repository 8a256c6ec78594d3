"""Search-R1-style search: the offline corpus and questions, BM25, the retriever server's request and
response shape over real HTTP, and the environment using it."""

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.search import wiki
from toolrl.envs.search.env import NO_RESULTS
from toolrl.envs.search.retriever import format_docs, make_retriever, read_corpus
from toolrl.errors import DataError
from toolrl.rollout.trajectory import Trajectory

DOCS = [
    {"id": "0", "contents": '"Louvre"\nThe Louvre is an art museum in Paris. It houses the Mona Lisa.'},
    {"id": "1", "contents": '"Nile"\nThe Nile is a river in Africa, among the longest in the world.'},
    {"id": "2", "contents": '"Everest"\nMount Everest is the highest mountain above sea level.'},
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return path


def test_bm25_and_search_r1_passages(corpus):
    retriever = make_retriever(corpus, "bm25")
    [hits] = retriever.search(["which museum has the mona lisa"], topk=2)
    assert [(doc["id"], score > 0) for doc, score in hits] == [("0", True)]  # no other passage has its words
    assert format_docs([hits[0][0]], max_chars=30) == "Doc 1(Title: Louvre) The Louvre is an art museum ..."
    [hits] = retriever.search(["the longest river or mountain"], topk=3)
    assert [doc["id"] for doc, _ in hits] == ["1", "2"] and hits[0][1] > hits[1][1] > 0
    assert retriever.search(["Nikkei Sossam"], topk=3) == [[]]  # no word of the corpus: no passage, not any three
    assert retriever.respond({"queries": ["Nikkei"], "topk": 3}) == {"result": [[]]}
    reply = retriever.respond({"queries": ["highest mountain", "river in africa"], "topk": 1})
    assert reply == {"result": [[DOCS[2]], [DOCS[1]]]}
    scored = retriever.respond({"queries": ["river"], "topk": 1, "return_scores": True})
    assert scored["result"][0][0]["document"] == DOCS[1] and scored["result"][0][0]["score"] > 0
    with pytest.raises(ValueError, match='"queries" must be a list of strings'):
        retriever.respond({"queries": "river"})


def test_a_query_without_a_word_of_the_corpus_is_told_so_not_handed_three_unrelated_passages(corpus, tmp_path):
    import asyncio

    tasks = tmp_path / "qa.jsonl"
    tasks.write_text(
        json.dumps({"id": "q", "question": "Where is the Mona Lisa?", "golden_answers": ["Louvre"]}) + "\n"
    )
    config = EnvConfig(name="search", train_file=str(tasks), test_file=str(tasks), options={"corpus": str(corpus)})
    [tool] = make_env(config).tools()
    assert asyncio.run(tool({"query": "Nikkei"})) == f"<information>{NO_RESULTS}</information>"
    assert asyncio.run(tool({"query": "mona lisa"})).startswith("<information>Doc 1(Title: Louvre)")


def test_bad_corpus_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "x"}\n{"id": "1", "text": "y"}\n')
    with pytest.raises(DataError, match=r'c.jsonl:2: each line needs a "contents" string'):
        read_corpus(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_retriever_server_and_the_environment_through_it(corpus, tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "retriever", "serve", "--corpus", str(corpus), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"queries": ["mona lisa museum"], "topk": 2, "return_scores": True}
        reply = httpx.post(url, json=body, timeout=5).json()
        assert reply["result"][0][0]["document"]["id"] == "0"
        assert httpx.post(url, json={"queries": 3}, timeout=5).status_code == 422

        tasks = tmp_path / "qa.jsonl"
        tasks.write_text(
            json.dumps(
                {"id": "q", "question": "Where is the Mona Lisa?", "golden_answers": ["Louvre", "the Louvre museum"]}
            )
            + "\n"
        )
        config = EnvConfig(
            name="search", train_file=str(tasks), test_file=str(tasks), options={"retriever_url": url, "topk": 1}
        )
        env = make_env(config)
        [tool] = env.tools()
        import asyncio

        observation = asyncio.run(tool({"query": "mona lisa"}))
        assert observation.startswith("<information>Doc 1(Title: Louvre) The Louvre is an art museum in Paris.")
        assert observation.endswith("</information>")
    finally:
        server.terminate()
        server.wait(10)

    task = env.tasks("test")[0]
    messages = env.messages(task)
    assert messages[0]["role"] == "system" and "<search>" in messages[0]["content"]
    assert [m["role"] for m in messages[1:5]] == ["user", "assistant", "tool", "assistant"]  # in-context example
    assert messages[-1] == {"role": "user", "content": "Question: Where is the Mona Lisa?"}
    traj = Trajectory.start(task, [1])
    traj.add_model_turn([2], [0.0], "<think>it is in paris</think>\n<answer> The Louvre! </answer>")
    assert env.rubric.score(traj, task)[1] == {"correct": 1.0, "format": 1.0, "tool_calls": 0.0, "tool_errors": 0.0}


def test_offline_wikipedia_questions(tmp_path):
    pytest.importorskip("bm25s")
    out = wiki.build(tmp_path / "wiki")
    rows = {name: [json.loads(line) for line in (out / f"{name}.jsonl").open()] for name in ("corpus", "train", "test")}
    assert len(rows["corpus"]) > 9000 and len(rows["test"]) == wiki.NUM_TEST and len(rows["train"]) > 5000
    docs = {d["id"]: d["contents"] for d in rows["corpus"]}
    for qa in rows["test"][:50]:
        title = docs[qa["doc_id"]].split("\n")[0].strip('"')
        assert qa["golden_answers"] == [title]
        quoted = qa["question"].split(" is this about: ", 1)[1].strip('"')
        assert quoted in docs[qa["doc_id"]] and title not in quoted


def test_question_derivation():
    q = wiki.question_for(
        "Sidney Poitier",
        "Sidney Poitier was an actor. In 1964, he was the first Bahamian to win the Academy Award for Best Actor.",
        "Bahamian-American actor (1927–2022)",
    )
    expected = (
        'Which Bahamian-American actor (1927–2022) is this about: "In 1964, he was the first Bahamian to win the '
    )
    assert q == expected + 'Academy Award for Best Actor."'
    assert wiki.question_for(
        "Wine", "Wine is a drink. It is made from grapes and enjoyed widely in the world.", "Alcoholic drink"
    ) == ('Which alcoholic drink is this about: "It is made from grapes and enjoyed widely in the world."')
    assert wiki.question_for("Nile", "The Nile is long.", "river") is None  # one sentence: nothing to quote


def test_dense_retrieval_with_the_shipped_embedding_model_matches_meaning_and_caches(corpus, monkeypatch):
    from toolrl.envs.search import retriever as module

    dense = make_retriever(corpus, "dense")
    queries = ["painting gallery in France", "tallest peak on earth", "long African waterway"]
    assert [hits[0][0]["id"] for hits in dense.search(queries, topk=1)] == ["0", "2", "1"]  # no shared words
    cached = list(corpus.parent.glob("corpus.*.minilm.safetensors"))
    assert len(cached) == 1
    encoded = []
    monkeypatch.setattr(module.DenseRetriever, "encode", lambda self, texts: encoded.append(len(texts)) or None)
    module.DenseRetriever(dense.docs, cache=cached[0])
    assert encoded == []  # the corpus embeddings came from the cache
    with pytest.raises(DataError, match="retrieval method 'sparse' is unknown; use bm25 or dense"):
        make_retriever(corpus, "sparse")
