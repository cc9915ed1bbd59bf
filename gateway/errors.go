package gateway

import (
	"encoding/json"
	"net/http"
)

// Error types the gateway answers with (the "type" of an OpenAI error
// object, of an Anthropic error).
const (
	errInvalidRequest = "invalid_request_error"
	errAuthentication = "authentication_error"
	errPermission     = "permission_error"
	errNotFound       = "not_found_error"
	errTooLarge       = "request_too_large"
	errAPI            = "api_error"
	// errBudget is budget_exhausted: the attempt's outcome when it stops
	// here.
	errBudget = RefusedBudget
)

// writeAPIError answers status with msg in api's error format: OpenAI's
// {"error": {"message", "type", "param", "code"}}, Anthropic's
// {"type": "error", "error": {"type", "message"}} or Gemini's
// {"error": {"code", "message", "status"}}.
func writeAPIError(w http.ResponseWriter, api string, status int, typ, msg string) {
	var body any
	if api == APIAnthropic {
		body = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	} else if api == APIGemini {
		body = geminiError(status, typ, msg)
	} else {
		body = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": typ}}
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
