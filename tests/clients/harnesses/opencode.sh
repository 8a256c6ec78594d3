#!/bin/sh
# opencode as an agent program (env.options.command): `opencode run` on the task's question, its model an
# OpenAI-compatible provider (chat completions) at the sample's base URL, declared in the opencode.json beside this
# script ({env:OPENAI_BASE_URL}, {env:OPENAI_API_KEY}); nothing else changed.
here=$(cd "$(dirname "$0")" && pwd)
export OPENCODE_CONFIG="$here/opencode.json"
exec "$here/node_modules/.bin/opencode" run "$TOOLRL_QUESTION"
