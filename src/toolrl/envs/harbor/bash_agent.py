"""A bash agent: the smallest harness program, trained through the gateway on Harbor tasks.

    env: {name: harbor, options: {agent: [python, -m, toolrl.envs.harbor.bash_agent]}}

It asks the model (OPENAI_BASE_URL, OPENAI_API_KEY: the gateway) for a turn with one tool, `bash`, runs each call in
the task's box (TOOLRL_BOX_URL, TOOLRL_BOX_TOKEN: sandbox/serve.py), sends back the output, and stops at a turn
without calls or after TOOLRL_AGENT_TURNS turns (default 8). Only the standard library: a harness of one's own in
any language does the same with two HTTP endpoints.
"""

from __future__ import annotations

import json
import os
import urllib.request

SYSTEM = ("You are an agent working in a Linux shell; your working folder is {workdir}. Run commands with the bash "
          "tool to do the task. When it is done, reply with one short sentence without a tool call.")  # fmt: skip
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's working folder and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def post(url: str, body: dict, token: str) -> dict:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def run_call(call: dict, box: str, token: str) -> str:
    try:
        arguments = json.loads(call["function"].get("arguments") or "{}")
        command = arguments["command"]
    except (ValueError, KeyError, TypeError):
        return 'error: bash takes {"command": "..."}'
    done = post(f"{box}/exec", {"command": str(command), "timeout_s": 30}, token)
    status = done["status"]
    note = "" if status == 0 else ("\n[stopped after 30 s]" if status is None else f"\n[exit {status}]")
    return (done["output"].strip() or "(no output)") + note


def main() -> None:
    base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"]
    box, token = os.environ["TOOLRL_BOX_URL"], os.environ["TOOLRL_BOX_TOKEN"]
    task = json.loads(os.environ["TOOLRL_TASK"])
    messages = [{"role": "system", "content": SYSTEM.format(workdir=os.environ.get("TOOLRL_WORKDIR", "/app"))},
                {"role": "user", "content": task["question"]}]  # fmt: skip
    turns, calls_run = 0, 0
    while turns < int(os.environ.get("TOOLRL_AGENT_TURNS", "8")):
        turns += 1
        reply = post(f"{base}/chat/completions", {"model": "policy", "messages": messages, "tools": [BASH]}, key)
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append(
            {"role": "assistant", "content": message.get("content") or "", **({"tool_calls": calls} if calls else {})}
        )
        if not calls:
            break
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_call(call, box, token)})
            calls_run += 1
    print(json.dumps({"turns": turns, "calls": calls_run}))


if __name__ == "__main__":
    main()
