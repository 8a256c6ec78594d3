"""Tasks from local files: JSONL, JSON, Parquet or a `datasets` folder (save_to_disk), in common shapes.

A record becomes a Task from the first field present of each kind:
- question: `question`, `query`, `problem`, `prompt` (a string, or chat messages: the last user message;
  Search-R1's parquet puts its instructions before "Question:", which is cut off);
- answer: `answer`, `answers`, `golden_answers` (FlashRAG), `reward_model.ground_truth.target` (Search-R1),
  `reward_model.ground_truth`; a list keeps every answer in `meta["answers"]`;
- id: `id`, `extra_info.index`, else the row number.
Every other field is kept in `meta` (gold SQL, sub-problems, data source).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from toolrl.envs.base import EnvOptions, Task
from toolrl.errors import DataError
from toolrl.files import read_text
from toolrl.text import CONTROL, SURROGATE, clip, first_line

QUESTION_FIELDS = ("question", "query", "problem", "prompt")
ANSWER_FIELDS = ("answer", "answers", "golden_answers", "reward_model.ground_truth.target", "reward_model.ground_truth")
ID_FIELDS = ("id", "extra_info.index")
IMAGE_FIELDS = ("images", "image")
"""A record's images: file paths (relative to the task file's folder), data: URLs, or a dataset's image values
(PIL images, {"bytes": ...}); read when a trajectory shows them (toolrl.tools.images checks each)."""


def _get(record: Mapping[str, Any], dotted: str) -> Any:
    value: Any = record
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _first(record: Mapping[str, Any], fields: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in fields:
        value = _get(record, name)
        if value is not None:
            return name, value
    return None, None


def _question_text(value: Any) -> str | None:
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, list):
        users = [m.get("content", "") for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
        value = users[-1] if users else None
    if not isinstance(value, str) or not value.strip():
        return None
    if "Question:" in value:  # Search-R1's prompt: instructions, then "Question: ..."
        value = value.rsplit("Question:", 1)[1]
    return value.strip()


"""Control characters other than tab, newline and carriage return: no task text means them."""


def task_from_record(record: Mapping[str, Any], row: int, where: str) -> Task:
    _, question = _first(record, QUESTION_FIELDS)
    question = _question_text(question)
    if question is None:
        raise DataError(f"{where}: row {row} has no question; give one of the fields {', '.join(QUESTION_FIELDS)}")
    answer_field, answer = _first(record, ANSWER_FIELDS)
    if hasattr(answer, "tolist"):
        answer = answer.tolist()
    if answer is None or answer == [] or answer == "":
        raise DataError(f"{where}: row {row} has no answer; give one of the fields {', '.join(ANSWER_FIELDS)}")
    answers = [str(a) for a in answer] if isinstance(answer, list) else [str(answer)]
    _, task_id = _first(record, ID_FIELDS)
    for field, text in (("question", question), ("answer", answers[0]), ("id", str(task_id or ""))):
        if found := CONTROL.search(text):
            raise DataError(
                f"{where}: row {row} {field} holds control character U+{ord(found.group()):04X} at offset "
                f"{found.start()}; remove it (tabs and newlines are fine)"
            )
        if found := SURROGATE.search(text):
            raise DataError(
                f"{where}: row {row} {field} holds a lone surrogate U+{ord(found.group()):04X} at offset "
                f"{found.start()} (half of a broken \\u escape), which is not text; fix or remove it"
            )
    top = {answer_field.split(".")[0], "id", "question", "query", "problem", "prompt", *IMAGE_FIELDS}
    meta = {k: v for k, v in record.items() if k not in top}
    if len(answers) > 1:
        meta["answers"] = answers
    images = _images(record, row, where)
    return Task(str(task_id if task_id is not None else row), question, answers[0], meta, images)


def _images(record: Mapping[str, Any], row: int, where: str) -> list[Any]:
    """The record's image references; a file path is made absolute and must exist."""
    field, value = _first(record, IMAGE_FIELDS)
    if value is None:
        return []
    values = list(value) if isinstance(value, list | tuple) else [value]
    images = []
    for image in values:
        if isinstance(image, str) and not image.startswith("data:"):
            path = Path(image).expanduser()
            path = path if path.is_absolute() else Path(where).parent / path
            if not path.is_file():
                hint = "paths are relative to the task file"
                raise DataError(f"{where}: row {row} {field}: no image file {path}; {hint}")
            image = path
        images.append(image)
    return images


def _records(path: Path) -> Iterator[Mapping[str, Any]]:
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in (".parquet", ".arrow"):
        yield from _dataset_records(path)
    elif suffix == ".jsonl":
        for number, line in enumerate(read_text(path, "task file", DataError, max_bytes=None).splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except (ValueError, RecursionError) as exc:
                    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else clip(first_line(exc), 100)
                    raise DataError(f"{path}:{number}: not valid JSON ({reason}); one object per line") from None
    elif suffix == ".json":
        try:
            data = json.loads(read_text(path, "task file", DataError, max_bytes=None))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{path}: cannot be read as JSON ({clip(first_line(exc), 100)})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of task objects")
        yield from data
    else:
        raise DataError(f"{path}: unknown task file type; use .jsonl, .json, .parquet or a datasets folder")


def _dataset_records(path: Path) -> Iterator[Mapping[str, Any]]:
    import datasets

    try:
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
            if isinstance(data, datasets.DatasetDict):
                raise DataError(f"{path}: a DatasetDict with splits {list(data)}; point at one split's folder")
        elif path.suffix.lower() == ".parquet":
            data = datasets.Dataset.from_parquet(str(path))
        else:
            data = datasets.Dataset.from_file(str(path))
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: cannot be read as a dataset ({type(exc).__name__}: {exc})") from None
    yield from data


class GeneratedTasks(EnvOptions):
    """Options of an environment that generates its tasks from a seed (`env.seed`)."""

    num_train: int = Field(2000, ge=1)
    num_test: int = Field(100, ge=1)


def unique_seeded_tasks(
    seed: int,
    options: GeneratedTasks,
    draw: Callable[[random.Random, int], tuple[str, str, dict[str, Any]]],
    prefix: str,
    exclude=(),
) -> dict[str, list[Task]]:
    """`num_train + num_test` tasks with distinct questions from one stream seeded by `seed`: `draw(rng, i)`
    gives (question, answer, meta); questions in `exclude` (in-context examples) are skipped. The first
    `num_test` are the test split, so growing `num_train` never changes the test split."""
    rng = random.Random(seed)
    seen = set(exclude)
    tasks: list[Task] = []
    total = options.num_train + options.num_test
    for i in range(total * 50):
        if len(tasks) == total:
            break
        question, answer, meta = draw(rng, i)
        if question not in seen:
            seen.add(question)
            tasks.append(Task(f"{prefix}-{len(tasks)}", question, answer, meta))
    return {"test": tasks[: options.num_test], "train": tasks[options.num_test :]}


def interleaved(tasks: Sequence[Task], key: Callable[[Task], Any]) -> list[Task]:
    """`tasks` taken in turn from each group of equal `key` (groups in the order first seen, each in its own
    order), so that any first N of the result covers every group: a split written group by group (a built
    environment's scenarios) would otherwise give a warm start of `sft.num_tasks` or an evaluation of
    `eval.num_tasks` its first groups only."""
    groups: dict[Any, list[Task]] = {}
    for task in tasks:
        groups.setdefault(key(task), []).append(task)
    columns = itertools.zip_longest(*groups.values())
    return [task for column in columns for task in column if task is not None]


def load_tasks(path: str | Path) -> list[Task]:
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"{path}: task file not found")
    tasks = [task_from_record(record, row, str(path)) for row, record in enumerate(_records(path))]
    if not tasks:
        raise DataError(f"{path}: no tasks in the file")
    return tasks


class TaskSplits:
    """An environment's splits: its own tasks (a mapping, or a function of the split name built on first use),
    replaced split by split by the files `env.train_file` and `env.test_file` when those are set."""

    def __init__(self, config, own: Mapping[str, list[Task]] | Callable[[str], list[Task]] | None = None):
        self.own = own if own is not None else {}
        self.files = config.task_files()
        self.loaded: dict[str, list[Task]] = {}

    def __call__(self, split: str) -> list[Task]:
        if split not in self.loaded:
            file = self.files.get(split)
            if file:
                self.loaded[split] = load_tasks(file)
            elif callable(self.own):
                self.loaded[split] = self.own(split)
            elif split in self.own:
                self.loaded[split] = self.own[split]
            else:
                raise DataError(f"env.{split}_file: this environment has no {split} tasks of its own; give a file")
        return self.loaded[split]
