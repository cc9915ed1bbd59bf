#!/bin/bash
# Claude Code's harness in repronet's sandbox (agents/cli): runs
# `claude -p` unchanged on the task's prompt, against the node's model
# endpoint (ANTHROPIC_BASE_URL) with the attempt's token
# (ANTHROPIC_API_KEY), the model of the evaluation's MODEL, and exits with
# its status. Its stream-json events are the log.
set -euo pipefail
: "${PROMPT_FILE:?PROMPT_FILE is not set}" "${ANTHROPIC_BASE_URL:?ANTHROPIC_BASE_URL is not set}" "${ANTHROPIC_API_KEY:?ANTHROPIC_API_KEY is not set}"
model=${MODEL:-${ANTHROPIC_MODEL:-}}
if [ -z "$model" ]; then
	echo "claude-code harness: set the model with the evaluation's MODEL=NAME" >&2
	exit 2
fi
# One model for every role, so that side calls (a smaller model's) are
# made to a model the evaluation allows, unless the evaluation names its
# small model (SMALL_MODEL=NAME, allowed too: --models main,small); no
# traffic but the model's.
small=${SMALL_MODEL:-$model}
export ANTHROPIC_MODEL=$model ANTHROPIC_SMALL_FAST_MODEL=$small ANTHROPIC_DEFAULT_HAIKU_MODEL=$small \
	ANTHROPIC_DEFAULT_SONNET_MODEL=$model ANTHROPIC_DEFAULT_OPUS_MODEL=$model CLAUDE_CODE_SUBAGENT_MODEL=$model \
	CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
	DISABLE_BUG_COMMAND=1 CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1 CLAUDE_CODE_DISABLE_TERMINAL_TITLE=1
# The sandbox runs the agent as root in a user namespace of its own:
# Claude Code refuses --dangerously-skip-permissions as root unless it is
# told it is in a sandbox.
export IS_SANDBOX=1
export HOME=${HOME:-/root}
mkdir -p "$HOME"
if [ -n "${CLAUDE_MAX_TURNS:-}" ]; then set -- --max-turns "$CLAUDE_MAX_TURNS"; fi
exec claude -p --model "$model" --output-format stream-json --verbose --dangerously-skip-permissions "$@" <"$PROMPT_FILE"
