"""Pre-flight checks of a rollout's tasks, before anything is generated."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolrl.envs.base import Task
from toolrl.errors import DataError
from toolrl.text import clip


def refuse_long_prompts(rollout, tasks: Sequence[Task], context: int) -> None:
    """Before anything runs: a task whose prompt (its messages, the tool schemas it offers, the call syntax)
    leaves no room in the model's context for one generated token is a DataError naming it. Each task counts
    the tools it offers (Environment.offered: a built environment's task shows its few tools of hundreds). A
    prompt whose text is at most `context` UTF-8 bytes is not tokenized (no token is shorter than a byte)."""
    syntax = len(str(getattr(rollout.parser, "instructions", "")))
    sizes: dict[str, int] = {}
    for name, tool in rollout.executor.tools.items():
        sizes[name] = len(json.dumps(tool.to_openai()).encode()) if rollout.env.show_tool_schemas else 0
    for task in tasks:
        names = rollout.env.offered(task)
        tools = None if names is None else {n: rollout.executor.tools[n] for n in names if n in rollout.executor.tools}
        messages = rollout.env.messages(task)
        shown = sum(sizes.values()) if tools is None else sum(sizes[n] for n in tools)
        size = syntax + shown + sum(len(str(m.get("content", "")).encode()) + 32 for m in messages) + 256
        if size <= context:
            continue
        length = len(rollout.prompt_ids(task, messages, tools))
        if length >= context:
            raise DataError(
                f"env {rollout.env.name}, task {clip(str(task.id), 80)}: its prompt is {length:,} tokens (messages, "
                f"tool schemas and call syntax), the model's context {context:,}: nothing could be generated; "
                "shorten the task or offer fewer tools"
            )
