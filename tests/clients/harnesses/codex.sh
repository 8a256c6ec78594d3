#!/bin/sh
# Codex CLI as an agent program (env.options.command): `codex exec` on the task's question, its model behind a
# custom model provider at the sample's base URL (OPENAI_BASE_URL, the Responses API) with the key in
# OPENAI_API_KEY; nothing else changed. Each run keeps its state in a CODEX_HOME of its own (runs at once share
# nothing), outside the temporary folder (Codex puts no sandbox helper there). Its last line of output is its
# final message.
here=$(dirname "$0")
home=$(mktemp -d "${HOME:-/tmp}/.codex-run.XXXXXX") || exit 1
trap 'rm -rf "$home"' EXIT
CODEX_HOME="$home" "$here/node_modules/.bin/codex" exec --skip-git-repo-check \
  -c model_provider=toolrl -c model=policy -c 'model_providers.toolrl.name="toolrl"' \
  -c "model_providers.toolrl.base_url=\"$OPENAI_BASE_URL\"" -c 'model_providers.toolrl.env_key="OPENAI_API_KEY"' \
  -c 'model_providers.toolrl.wire_api="responses"' "$TOOLRL_QUESTION"
