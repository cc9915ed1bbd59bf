#!/bin/bash
# Gemini CLI's harness in repronet's sandbox (agents/cli): points it at
# the node's model endpoint (GOOGLE_GEMINI_BASE_URL, Gemini's API) with
# the attempt's token as its API key (GEMINI_API_KEY; the auth type is
# "gemini-api-key": its non-interactive mode refuses the "gateway" type
# that GOOGLE_GEMINI_BASE_URL alone selects, and the API key type takes
# the base URL from the same variable), trusts the working folder (else
# --yolo is turned back to asking), turns off its telemetry and update
# checks and leaves out its web tools (they call Google's own search and
# URL tools, which the gateway refuses) in ~/.gemini/settings.json, runs `gemini -p` unchanged on the
# task's prompt with the evaluation's MODEL, and exits with its status.
set -euo pipefail
: "${PROMPT_FILE:?PROMPT_FILE is not set}"
# The node's Gemini variables; else the same endpoint and token under
# their generic names.
export GOOGLE_GEMINI_BASE_URL=${GOOGLE_GEMINI_BASE_URL:-${REPRONET_MODEL_URL:?REPRONET_MODEL_URL is not set}}
export GEMINI_API_KEY=${GEMINI_API_KEY:-${OPENAI_API_KEY:?OPENAI_API_KEY is not set}}
unset GOOGLE_API_KEY GOOGLE_GENAI_USE_VERTEXAI GOOGLE_GENAI_USE_GCA
model=${MODEL:-${GEMINI_MODEL:-}}
if [ -z "$model" ]; then
	echo "gemini-cli harness: set the model with the evaluation's MODEL=NAME" >&2
	exit 2
fi
export HOME=${HOME:-/root}
mkdir -p "$HOME/.gemini"
cat >"$HOME/.gemini/settings.json" <<JSON
{
  "general": {"disableAutoUpdate": true, "disableUpdateNag": true, "checkpointing": {"enabled": false}},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
  "tools": {"exclude": ["google_web_search", "web_fetch"]},
  "ui": {"hideBanner": true, "hideTips": true}
}
JSON
export GEMINI_CLI_NO_RELAUNCH=true GEMINI_TELEMETRY_ENABLED=false GEMINI_CLI_TRUST_WORKSPACE=true
exec gemini -p "$(cat "$PROMPT_FILE")" --yolo -m "$model" --output-format stream-json
