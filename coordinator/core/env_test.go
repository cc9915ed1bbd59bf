package core

import (
	"strings"
	"testing"
)

// TestCheckAgentEnvReserved: the names the node sets for model access
// (and those with which Google's SDK would go around them) are refused in
// an evaluation's Env; others pass.
func TestCheckAgentEnvReserved(t *testing.T) {
	for _, tc := range []struct {
		kv      string
		refused bool
	}{
		{"MODEL=gpt-4.1", false},
		{"GEMINI_MODEL=gemini-2.5-pro", false},
		{"OPENAI_API_KEY=x", true},
		{"ANTHROPIC_BASE_URL=http://x", true},
		{"GEMINI_API_KEY=x", true},
		{"GOOGLE_GEMINI_BASE_URL=http://x", true},
		{"GOOGLE_API_KEY=x", true},
		{"GOOGLE_GENAI_USE_VERTEXAI=true", true},
		{"GOOGLE_VERTEX_BASE_URL=http://x", true},
		{"REPRONET_MODEL_URL=x", true},
	} {
		err := checkAgentEnv(Evaluation{Env: []string{tc.kv}})
		if refused := err != nil && strings.Contains(err.Error(), "are the node's"); refused != tc.refused {
			t.Errorf("%s: error %v, want refused %v", tc.kv, err, tc.refused)
		}
	}
}
