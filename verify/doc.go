// Package verify owns what makes a model-driven attempt's result
// trustworthy without running the model twice: the conversation chain
// (chain.go: the head a gateway returns and a node signs, and the
// append-only rule every request of an attempt must keep), the reading of
// an attempt's calls as concurrent conversations (conversation.go) and the
// pairing of a replay's calls with the recorded ones by conversation and
// content (match.go: the gateway pairs with it as calls come, the judge
// when comparing), the binding of
// a report's answers to the recorded trajectory (bind.go), the comparison
// of a replay's tool results with the recorded ones and its verdict
// (replay.go), and the adaptive replay policy kept per node (policy.go).
//
// It is pure: it takes recorded exchanges (request and answer bodies as
// bytes) and answers as plain data and returns plain data; it reads no
// clock, keeps no state and does no I/O. It knows the wire of OpenAI's
// chat completions and Anthropic's Messages API (messages.go), OpenAI's
// Responses API and Gemini's generateContent (apis.go) only as far as
// reading messages; it must not know the gateway's records, a
// benchmark family, the coordinator's state or the network. The gateway
// computes chain heads and serves replays with it; the coordinator judges
// with it. docs/verification.md describes the whole.
package verify
