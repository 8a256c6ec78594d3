"""Tasks from local files in the shapes people have: our JSONL, FlashRAG JSONL, Search-R1 parquet, a datasets
folder; bad files get one-line errors naming the file and row."""

import json

import pytest

from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.envs.tasks import load_tasks
from toolrl.errors import DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_with_extra_fields_in_meta(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "question": "Q?", "answer": "42", "sql": "SELECT 1"}])
    [task] = load_tasks(path)
    assert (task.id, task.question, task.answer, task.meta) == ("a", "Q?", "42", {"sql": "SELECT 1"})


def test_flashrag_golden_answers_keep_every_answer(tmp_path):
    path = write_jsonl(tmp_path / "nq.jsonl", [{"id": "7", "question": "who?", "golden_answers": ["Ann", "Ann B."]}])
    [task] = load_tasks(path)
    assert task.answer == "Ann" and task.meta["answers"] == ["Ann", "Ann B."]


def test_search_r1_parquet_shape(tmp_path):
    import datasets

    prompt = "Answer the question ... <answer> Beijing </answer>. Question: where is the louvre?\n"
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": prompt}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris", "paris, france"]}},
        "extra_info": {"split": "train", "index": 3},
    }
    datasets.Dataset.from_list([row]).to_parquet(str(tmp_path / "train.parquet"))
    [task] = load_tasks(tmp_path / "train.parquet")
    assert task.question == "where is the louvre?"
    assert task.answer == "Paris" and task.meta["answers"] == ["Paris", "paris, france"]
    assert task.id == "3" and task.meta["data_source"] == "nq"


def test_datasets_folder_and_json_list(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"query": "2+2?", "answers": ["4"]}]).save_to_disk(str(tmp_path / "ds"))
    [task] = load_tasks(tmp_path / "ds")
    assert (task.id, task.question, task.answer) == ("0", "2+2?", "4")
    (tmp_path / "t.json").write_text(json.dumps([{"problem": "p", "answer": 5}]))
    assert load_tasks(tmp_path / "t.json")[0].answer == "5"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.jsonl", '{"question": "q", "answer": "a"}\n{bad\n', "a.jsonl:2: not valid JSON"),
        ("b.jsonl", '{"answer": "a"}\n', "b.jsonl: row 0 has no question; give one of the fields question"),
        ("c.jsonl", '{"question": "q"}\n', "c.jsonl: row 0 has no answer; give one of the fields answer"),
        ("d.csv", "q,a\n", "d.csv: unknown task file type; use .jsonl, .json, .parquet or a datasets folder"),
        ("e.jsonl", "\n", "e.jsonl: no tasks in the file"),
    ],
)
def test_bad_task_files_say_where_and_what_to_do(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_tasks(tmp_path / name)
    with pytest.raises(DataError, match="task file not found"):
        load_tasks(tmp_path / "missing.jsonl")


def test_env_files_replace_an_environments_own_splits(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"question": "What is 1 + 2?", "answer": "3"}])
    env = make_env(EnvConfig(train_file=str(train), options={"num_train": 5, "num_test": 4}))
    assert [t.question for t in env.tasks("train")] == ["What is 1 + 2?"]
    assert len(env.tasks("test")) == 4  # still the generated test split


def test_a_task_file_that_is_not_utf8_or_not_json_is_one_line_naming_the_line(tmp_path):
    from toolrl.envs.tasks import load_tasks

    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"question": "caf\xe9?", "answer": "x"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.jsonl: not UTF-8 text \(byte 0xe9"):
        load_tasks(latin)
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"question": "q", "answer": ' + "9" * 5000 + "}\n")
    with pytest.raises(DataError, match=r"huge\.jsonl:1: not valid JSON \(Exceeds the limit"):
        load_tasks(huge)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "Q\\u0000?", "answer": "4"}', "t.jsonl: row 0 question holds control character U+0000"),
        ('{"question": "Q\x00?", "answer": "4"}', "t.jsonl:1: not valid JSON (Invalid control character"),
        ('{"question": "Q", "answer": "\\u001b[31m4"}', "t.jsonl: row 0 answer holds control character U+001B"),
        ('{"question": "Q", "answer": ' + "9" * 5000 + "}", "t.jsonl:1: not valid JSON (Exceeds the limit"),
    ],
)
def test_control_characters_and_huge_numbers_in_a_task_file_are_one_bounded_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DataError) as err:
        load_tasks(path)
    text = str(err.value)
    assert message in text and "\n" not in text and len(text) < 300 + len(str(tmp_path))
