#!/bin/sh
# opencode as an agent program (env.options.command): `opencode run` on the task's question, its model an
# OpenAI-compatible provider (chat completions) at the sample's base URL, declared in the opencode.json beside this
# script ({env:OPENAI_BASE_URL}, {env:OPENAI_API_KEY}); nothing else changed. Each run keeps its session database
# in an XDG_DATA_HOME of its own: runs at once on one database fail with "database is locked".
here=$(cd "$(dirname "$0")" && pwd)
data=$(mktemp -d "${TMPDIR:-/tmp}/opencode-run.XXXXXX") || exit 1
trap 'rm -rf "$data"' EXIT
XDG_DATA_HOME="$data" OPENCODE_CONFIG="$here/opencode.json" "$here/node_modules/.bin/opencode" run "$TOOLRL_QUESTION"
