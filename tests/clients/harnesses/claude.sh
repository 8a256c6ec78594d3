#!/bin/sh
# Claude Code as an agent program (env.options.command): `claude -p` on the task's question, its model at the
# sample's base URL (ANTHROPIC_BASE_URL, the Messages API) with the key in ANTHROPIC_API_KEY; nothing else changed.
# Each run keeps its settings and sessions in a CLAUDE_CONFIG_DIR of its own (runs at once share nothing).
here=$(dirname "$0")
config=$(mktemp -d "${TMPDIR:-/tmp}/claude-run.XXXXXX") || exit 1
trap 'rm -rf "$config"' EXIT
CLAUDE_CONFIG_DIR="$config" "$here/node_modules/.bin/claude" -p "$TOOLRL_QUESTION"
