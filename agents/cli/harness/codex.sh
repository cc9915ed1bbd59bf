#!/bin/bash
# Codex CLI's harness in repronet's sandbox (agents/cli): writes
# ~/.codex/config.toml with a model provider whose base URL is the node's
# model endpoint (OPENAI_BASE_URL, OpenAI's Responses API) and whose key
# is the attempt's token (OPENAI_API_KEY), runs `codex exec` unchanged on
# the task's prompt with the evaluation's MODEL, and exits with its
# status. Its JSON events are the log.
set -euo pipefail
: "${PROMPT_FILE:?PROMPT_FILE is not set}" "${OPENAI_BASE_URL:?OPENAI_BASE_URL is not set}" "${OPENAI_API_KEY:?OPENAI_API_KEY is not set}"
model=${MODEL:-}
if [ -z "$model" ]; then
	echo "codex harness: set the model with the evaluation's MODEL=NAME" >&2
	exit 2
fi
export HOME=${HOME:-/root}
export CODEX_HOME=${CODEX_HOME:-$HOME/.codex}
mkdir -p "$CODEX_HOME"
toml() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
cat >"$CODEX_HOME/config.toml" <<TOML
model = $(toml "$model")
model_provider = "repronet"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
# The gateway refuses provider-side tools (their cost is not bounded).
web_search = "disabled"

[model_providers.repronet]
name = "repronet"
base_url = $(toml "$OPENAI_BASE_URL")
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 2
stream_max_retries = 2

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"
TOML
exec codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -m "$model" - <"$PROMPT_FILE"
