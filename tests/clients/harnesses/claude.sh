#!/bin/sh
# Claude Code as an agent program (env.options.command): `claude -p` on the task's question, its model at the
# sample's base URL (ANTHROPIC_BASE_URL, the Messages API) with the key in ANTHROPIC_API_KEY; nothing else changed.
here=$(dirname "$0")
exec "$here/node_modules/.bin/claude" -p "$TOOLRL_QUESTION"
