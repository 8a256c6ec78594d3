"""Seeded multi-turn file tasks: a small starting tree and 2-4 user requests, each with the reference calls that
fulfil it and the tree they leave (what the episode compares with after each request, and at the end), and the
tools the task offers: the core ones, those its reference calls use, and a few others.

Every request leaves a tree seen at no earlier point of the task (not the starting one either), so doing
nothing fails every request and every task; some need reading first (count the lines of
a file, then write the number). Kinds: mkdir, move, rename, copy, delete, write, append, count, touch_in.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from toolrl.envs.base import Task
from toolrl.envs.files.backend import CORE_TOOLS, TOOL_NAMES, FileSystem, Tree

DISTRACTORS = 3
"""Tools a task offers beyond the core ones and those its reference calls use."""

FILE_NAMES = ["notes.txt", "todo.md", "draft.txt", "ideas.txt", "log.txt", "report.md", "plan.txt", "list.txt"]
BINARY_NAMES = ["photo.jpg", "budget.xlsx", "slides.pdf", "song.mp3"]
FOLDER_NAMES = ["docs", "archive", "projects", "photos", "old", "work", "backup", "drafts"]
WORDS = ["apples", "meeting at noon", "call Sam", "buy milk", "fix the bike", "send the report", "read chapter 3",
         "water plants", "book tickets", "pay rent"]  # fmt: skip
NEW_NAMES = ["summary.txt", "copy.txt", "final.txt", "count.txt", "readme.md", "memo.txt", "hello.txt", "keep.txt"]

Request = tuple[str, str, list[dict[str, Any]]]
"""(kind, text, reference calls as {"name", "arguments"})."""


def _files(tree: Tree, text_only: bool = False) -> list[str]:
    return sorted(n for n, v in tree.items() if isinstance(v, str) and (not text_only or "\n" in v or v == ""))


def _folders(tree: Tree) -> list[str]:
    return sorted(n for n, v in tree.items() if isinstance(v, dict))


def _new_name(tree: Tree, pool: list[str], rng: random.Random) -> str | None:
    free = [n for n in pool if n not in tree]
    return rng.choice(free) if free else None


def _mkdir(tree, rng):
    name = _new_name(tree, FOLDER_NAMES, rng)
    return name and ("mkdir", f"Create a folder called {name}.", [("mkdir", {"name": name})])


def _move(tree, rng):
    files, folders = _files(tree), _folders(tree)
    if not files or not folders:
        return None
    file, folder = rng.choice(files), rng.choice(folders)
    if file in tree[folder]:
        return None
    return "move", f"Move {file} into the {folder} folder.", [("mv", {"source": file, "destination": folder})]


def _rename(tree, rng):
    files, new = _files(tree), _new_name(tree, NEW_NAMES, rng)
    if not files or not new:
        return None
    file = rng.choice(files)
    return "rename", f"Rename {file} to {new}.", [("mv", {"source": file, "destination": new})]


def _copy(tree, rng):
    files, new = _files(tree), _new_name(tree, NEW_NAMES, rng)
    if not files or not new:
        return None
    file = rng.choice(files)
    return "copy", f"Make a copy of {file} named {new}.", [("cp", {"source": file, "destination": new})]


def _delete(tree, rng):
    files = _files(tree)
    if len(files) < 2:
        return None
    file = rng.choice(files)
    return "delete", f"Delete {file}.", [("rm", {"name": file})]


def _write(tree, rng):
    new, text = _new_name(tree, NEW_NAMES, rng), rng.choice(WORDS)
    return new and ("write", f"Create a file {new} that says: {text}", [("write", {"name": new, "text": text})])


def _append(tree, rng):
    files = _files(tree, text_only=True)
    if not files:
        return None
    file, line = rng.choice(files), rng.choice(WORDS)
    return "append", f"Add the line '{line}' at the end of {file}.", [("append", {"name": file, "line": line})]


def _count(tree, rng):
    files, out = [f for f in _files(tree, text_only=True) if tree[f]], _new_name(tree, NEW_NAMES, rng)
    if not files or not out:
        return None
    file = rng.choice(files)
    count = str(len(tree[file].splitlines()))
    text = f"Count the lines of {file} and write just the number into a new file {out}."
    return "count", text, [("wc", {"name": file}), ("write", {"name": out, "text": count})]


def _touch_in(tree, rng):
    folders, new = _folders(tree), rng.choice(NEW_NAMES)
    if not folders:
        return None
    folder = rng.choice(folders)
    if new in tree[folder]:
        return None
    return "touch_in", f"Inside {folder}, create an empty file {new}.", [("touch", {"name": f"{folder}/{new}"})]


KINDS: list[Callable[[Tree, random.Random], tuple | None]] = [
    _mkdir, _move, _rename, _copy, _delete, _write, _append, _count, _touch_in,
]  # fmt: skip


def starting_tree(rng: random.Random) -> Tree:
    tree: Tree = {}
    for name in rng.sample(FILE_NAMES, rng.randint(2, 3)):
        tree[name] = "".join(line + "\n" for line in rng.sample(WORDS, rng.randint(1, 4)))
    for name in rng.sample(BINARY_NAMES, rng.randint(0, 1)):
        tree[name] = "binary data"
    for name in rng.sample(FOLDER_NAMES, rng.randint(1, 2)):
        tree[name] = {}
    return tree


def canonical(tree: Tree) -> str:
    """A tree as a string that is equal for equal trees (for comparisons and anchor states)."""
    return json.dumps(tree, sort_keys=True)


def make_task(rng: random.Random, index: int, min_requests: int, max_requests: int) -> Task | None:
    """One task, or None when the drawn tree allows too few requests."""
    tree = starting_tree(rng)
    fs = FileSystem(tree)
    requests: list[Request] = []
    seen = {canonical(fs.root)}
    for _ in range(rng.randint(min_requests, max_requests)):
        for _ in range(20):
            drawn = rng.choice(KINDS)(fs.root, rng)
            if drawn:
                break
        else:
            return None
        kind, text, calls = drawn
        for name, arguments in calls:
            getattr(fs, name)(**arguments)
        if canonical(fs.root) in seen:  # a tree of its own after every request: doing nothing never passes
            return None
        seen.add(canonical(fs.root))
        requests.append((kind, text, [{"name": n, "arguments": a} for n, a in calls]))
    needed = {call["name"] for _, _, calls in requests for call in calls}
    others = [n for n in TOOL_NAMES if n not in needed and n not in CORE_TOOLS]
    offered = set(CORE_TOOLS) | needed | set(rng.sample(others, DISTRACTORS))
    meta = {
        "tree": tree,
        "tools": [n for n in TOOL_NAMES if n in offered],
        "requests": [text for _, text, _ in requests],
        "kinds": [kind for kind, _, _ in requests],
        "reference": [calls for _, _, calls in requests],
        "states": _states(tree, requests),
        "category": f"{len(requests)} requests",
    }
    return Task(f"files-{index}", requests[0][1], canonical(fs.root), meta)


def _states(tree: Tree, requests: list[Request]) -> list[str]:
    """The canonical tree after each request's reference calls."""
    fs, states = FileSystem(tree), []
    for _, _, calls in requests:
        for call in calls:
            getattr(fs, call["name"])(**call["arguments"])
        states.append(canonical(fs.root))
    return states


def generate(seed: int, num_train: int, num_test: int, min_requests: int, max_requests: int) -> dict[str, list[Task]]:
    """Distinct tasks (by starting tree and requests) from one seeded stream; the first num_test are the test
    split."""
    rng, tasks, seen = random.Random(seed), [], set()
    while len(tasks) < num_train + num_test:
        task = make_task(rng, len(tasks), min_requests, max_requests)
        key = task and (canonical(task.meta["tree"]), tuple(task.meta["requests"]))
        if task and key not in seen:
            seen.add(key)
            tasks.append(task)
    return {"test": tasks[:num_test], "train": tasks[num_test:]}
