package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The APIs a provider speaks.
const (
	// APIOpenAI is OpenAI's chat completions: the provider's base URL is
	// what OpenAI's clients take as base_url (e.g.
	// https://api.openai.com/v1, or a vLLM server's http://host:8000/v1);
	// calls go to base + "/chat/completions", Responses API calls to
	// base + "/responses".
	APIOpenAI = "openai"
	// APIAnthropic is Anthropic's Messages API: the base URL is what
	// Anthropic's clients take (https://api.anthropic.com); calls go to
	// base + "/v1/messages".
	APIAnthropic = "anthropic"
	// APIGemini is Google's Gemini API: the base URL is what Google's
	// clients take (https://generativelanguage.googleapis.com); calls go
	// to base + "/v1beta/models/{upstream}:generateContent" (or
	// ":streamGenerateContent?alt=sse", ":countTokens"), the key in
	// x-goog-api-key, never in the URL.
	APIGemini = "gemini"
)

// Provider is a model provider the gateway forwards to.
type Provider struct {
	Name    string `json:"name"`
	API     string `json:"api"`
	BaseURL string `json:"base_url"`
	// Key is the provider's API key. It is sent only to the provider; it
	// is never logged, recorded or sent toward a node.
	Key string `json:"-"`
	// KeyFile is where LoadConfig reads Key from (one line).
	KeyFile string `json:"key_file,omitempty"`
	// KeyEnv names the environment variable LoadConfig reads Key from
	// when there is no KeyFile.
	KeyEnv string `json:"key_env,omitempty"`
	// OutputField is the request field an OpenAI provider bounds output
	// with when the client set none: "max_completion_tokens" (the
	// default; OpenAI's reasoning models refuse max_tokens) or
	// "max_tokens" (older compatible servers).
	OutputField string `json:"output_field,omitempty"`
	// AnthropicVersion is sent as anthropic-version when the client sent
	// none; default 2023-06-01.
	AnthropicVersion string `json:"anthropic_version,omitempty"`
	// AnthropicBetas are anthropic-beta flags passed to this provider
	// besides the gateway's own list (DefaultAnthropicBetas()). Add only
	// flags whose cost the token prices and the call's bound cover.
	AnthropicBetas []string `json:"anthropic_betas,omitempty"`
}

// Model is a model agents may call, as they name it.
type Model struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	// Upstream is the model's name at the provider; empty: Name.
	Upstream string `json:"upstream,omitempty"`
	// Price in dollars per million tokens.
	Price PriceUSD `json:"price"`
	// MaxOutput is the most output tokens the gateway asks for in one
	// call (the model's own limit, or less).
	MaxOutput int64 `json:"max_output"`
	// ImageTokens bounds the input tokens of one image; default 8192.
	ImageTokens int64 `json:"image_tokens,omitempty"`
	// InputOverhead is added to every call's input bound for the tokens a
	// provider adds around the messages (chat template, tool-use system
	// prompt); default 1024.
	InputOverhead int64 `json:"input_overhead,omitempty"`
	// ServerTools are the provider-side tools (Anthropic's web_search_*,
	// web_fetch_*), by tool type, that calls of this model may use, each
	// metered at its price and bounded; any other is refused.
	ServerTools map[string]ServerTool `json:"server_tools,omitempty"`
}

// ServerTool is a provider-side tool a model may use, and what bounds it.
type ServerTool struct {
	// Price is dollars per use (Anthropic's web search: 0.01; web
	// fetch: 0).
	Price float64 `json:"price"`
	// MaxUses is the most uses in one call (the tool's max_uses is
	// lowered to it); 1 to 20.
	MaxUses int64 `json:"max_uses"`
	// InputTokensPerUse bounds the input tokens one use adds (a search's
	// results, a fetched page; web fetch's max_content_tokens is lowered
	// to it); 1 to 1,000,000.
	InputTokensPerUse int64 `json:"input_tokens_per_use"`
}

// PriceUSD is a price in dollars per million tokens, as price lists quote
// it.
type PriceUSD struct {
	Input       float64 `json:"input"`
	Output      float64 `json:"output"`
	CachedInput float64 `json:"cached_input"`
	// CacheWrite is a token written to the cache for the longest
	// lifetime allowed (Anthropic: one hour, 2 × input), or for a
	// lifetime the provider did not report.
	CacheWrite float64 `json:"cache_write"`
	// CacheWrite5m is a token the provider reports written for five
	// minutes (Anthropic: 1.25 × input); 0: CacheWrite.
	CacheWrite5m float64 `json:"cache_write_5m,omitempty"`
}

// Limits bound what the gateway reads and how long a call may take.
type Limits struct {
	// MaxRequestBytes bounds a request body; default 16 MiB.
	MaxRequestBytes int64 `json:"max_request_bytes,omitempty"`
	// MaxResponseBytes bounds what the gateway reads of a provider's
	// answer (a stream in total); default 64 MiB.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
	// MaxEventBytes bounds one server-sent event; default 4 MiB.
	MaxEventBytes int `json:"max_event_bytes,omitempty"`
	// CallTimeout bounds a call from request to the end of its answer;
	// default 10 minutes.
	CallTimeout Duration `json:"call_timeout,omitempty"`
	// MinOutputTokens is the fewest output tokens a call is made for
	// (fewer only when the client asked for fewer): below it the call is
	// refused as over budget. Default 16.
	MinOutputTokens int64 `json:"min_output_tokens,omitempty"`
	// CountTokensPerMinute bounds an attempt's token counting calls
	// (POST /v1/messages/count_tokens, free at the provider, so not
	// bounded by a budget); default 60.
	CountTokensPerMinute int `json:"count_tokens_per_minute,omitempty"`
}

// Duration is a time.Duration written in JSON as Go writes durations
// ("10m", "90s").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"10m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Config is the gateway's configuration.
type Config struct {
	Providers []Provider `json:"providers"`
	Models    []Model    `json:"models"`
	Limits    Limits     `json:"limits,omitzero"`
}

// Defaults of Limits and Model.
const (
	DefaultMaxRequestBytes  = 16 << 20
	DefaultMaxResponseBytes = 64 << 20
	DefaultMaxEventBytes    = 4 << 20
	DefaultCallTimeout      = 10 * time.Minute
	DefaultMinOutputTokens  = 16
	DefaultImageTokens      = 8192
	DefaultInputOverhead    = 1024
	DefaultAnthropicVersion = "2023-06-01"
	DefaultCountTokensRate  = 60
)

// LoadConfig reads a JSON configuration and the providers' key files
// (paths relative to the configuration's folder), then validates it.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("gateway config: %w", err)
	}
	return ParseConfig(b, path, filepath.Dir(path), os.Getenv)
}

// ParseConfig decodes a JSON configuration (unknown fields refused),
// reads each provider's key from its key_file (relative to dir) or its
// key_env variable (looked up with getenv), and validates the whole;
// every error names source and the provider or model at fault. A key is
// never part of an error.
func ParseConfig(data []byte, source, dir string, getenv func(string) string) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("gateway config %s: %w", source, err)
	}
	for i, p := range c.Providers {
		switch {
		case p.KeyFile != "" && p.KeyEnv != "":
			return Config{}, fmt.Errorf("gateway config %s: provider %q: key_file and key_env are both set", source, p.Name)
		case p.KeyFile != "":
			kf := p.KeyFile
			if !filepath.IsAbs(kf) {
				kf = filepath.Join(dir, kf)
			}
			k, err := os.ReadFile(kf)
			if err != nil {
				return Config{}, fmt.Errorf("gateway config %s: provider %q: key file: %w", source, p.Name, err)
			}
			c.Providers[i].Key = strings.TrimSpace(string(k))
		case p.KeyEnv != "":
			k := strings.TrimSpace(getenv(p.KeyEnv))
			if k == "" {
				return Config{}, fmt.Errorf("gateway config %s: provider %q: key_env %s is unset or empty", source, p.Name, p.KeyEnv)
			}
			c.Providers[i].Key = k
		}
	}
	if _, err := c.compile(); err != nil {
		return Config{}, fmt.Errorf("gateway config %s: %w", source, err)
	}
	return c, nil
}

// ModelNames lists the models the configuration serves, in its order.
func (c Config) ModelNames() []string {
	names := make([]string, 0, len(c.Models))
	for _, m := range c.Models {
		names = append(names, m.Name)
	}
	return names
}

// route is a model ready to be called.
type route struct {
	model    Model
	provider Provider
	price    Price
	endpoint string // the provider's URL for the model's API
	// responses is an OpenAI provider's Responses URL.
	responses string
	// tools are the model's server tools by type; betas the
	// anthropic-beta flags its provider takes.
	tools map[string]serverTool
	betas map[string]bool
}

// compiled is a validated configuration.
type compiled struct {
	routes map[string]route
	limits Limits
}

// Validate checks the configuration; every error names the provider or
// model and the field.
func (c Config) Validate() error {
	_, err := c.compile()
	return err
}

func (c Config) compile() (compiled, error) {
	var errs []error
	providers := map[string]Provider{}
	for i, p := range c.Providers {
		name := fmt.Sprintf("providers[%d] %q", i, p.Name)
		switch {
		case p.Name == "":
			errs = append(errs, fmt.Errorf("%s: name is required", name))
		case providers[p.Name].Name != "":
			errs = append(errs, fmt.Errorf("%s: name used twice", name))
		}
		if p.API != APIOpenAI && p.API != APIAnthropic && p.API != APIGemini {
			errs = append(errs, fmt.Errorf("%s: api %q is not %q, %q or %q", name, p.API, APIOpenAI, APIAnthropic, APIGemini))
		}
		u, err := url.Parse(p.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, fmt.Errorf("%s: base_url %q is not an http(s) URL without query", name, p.BaseURL))
		}
		if p.OutputField == "" {
			p.OutputField = "max_completion_tokens"
		}
		if p.OutputField != "max_completion_tokens" && p.OutputField != "max_tokens" {
			errs = append(errs, fmt.Errorf("%s: output_field %q is neither max_completion_tokens nor max_tokens", name, p.OutputField))
		}
		if p.AnthropicVersion == "" {
			p.AnthropicVersion = DefaultAnthropicVersion
		}
		for _, b := range p.AnthropicBetas {
			if b == "" || strings.ContainsAny(b, ", \t\r\n") || len(b) > 100 {
				errs = append(errs, fmt.Errorf("%s: anthropic_betas entry %q is not one beta flag", name, b))
			}
		}
		if strings.ContainsAny(p.Key, "\r\n") {
			errs = append(errs, fmt.Errorf("%s: key has a line break", name))
		}
		providers[p.Name] = p
	}
	out := compiled{routes: map[string]route{}, limits: c.Limits.withDefaults()}
	for i, m := range c.Models {
		name := fmt.Sprintf("models[%d] %q", i, m.Name)
		if m.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is required", name))
		}
		if _, dup := out.routes[m.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: name used twice", name))
		}
		p, ok := providers[m.Provider]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: provider %q is not configured", name, m.Provider))
		}
		price, err := PerMillion(m.Price.Input, m.Price.Output, m.Price.CachedInput, m.Price.CacheWrite)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		price.CacheWrite5m = price.CacheWrite
		if m.Price.CacheWrite5m != 0 {
			if price.CacheWrite5m, err = perMillion(m.Price.CacheWrite5m); err != nil {
				errs = append(errs, fmt.Errorf("%s: cache_write_5m price: %w", name, err))
			}
		}
		tools, err := compileServerTools(m.ServerTools, p.API, &price)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		if m.MaxOutput < 1 || m.MaxOutput > 1<<24 {
			errs = append(errs, fmt.Errorf("%s: max_output %d is not in [1, %d]", name, m.MaxOutput, 1<<24))
		}
		if m.ImageTokens == 0 {
			m.ImageTokens = DefaultImageTokens
		}
		if m.InputOverhead == 0 {
			m.InputOverhead = DefaultInputOverhead
		}
		if m.ImageTokens < 0 || m.ImageTokens > 1<<24 || m.InputOverhead < 0 || m.InputOverhead > 1<<24 {
			errs = append(errs, fmt.Errorf("%s: image_tokens %d and input_overhead %d must be in [0, %d]", name, m.ImageTokens, m.InputOverhead, 1<<24))
		}
		if m.Upstream == "" {
			m.Upstream = m.Name
		}
		endpoint := strings.TrimSuffix(p.BaseURL, "/") + "/chat/completions"
		if p.API == APIAnthropic {
			endpoint = strings.TrimSuffix(p.BaseURL, "/") + "/v1/messages"
		}
		if p.API == APIGemini {
			endpoint = strings.TrimSuffix(p.BaseURL, "/") + geminiPrefix + "/" + m.Upstream
			if strings.ContainsAny(m.Upstream, ":/?#% ") {
				errs = append(errs, fmt.Errorf("%s: upstream %q of a Gemini model must be one path segment without ':'", name, m.Upstream))
			}
		}
		responses := strings.TrimSuffix(p.BaseURL, "/") + "/responses"
		out.routes[m.Name] = route{model: m, provider: p, price: price, endpoint: endpoint, responses: responses, tools: tools,
			betas: anthropicBetas(p.AnthropicBetas)}
	}
	if err := out.limits.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return compiled{}, err
	}
	return out, nil
}

func (l Limits) withDefaults() Limits {
	if l.MaxRequestBytes == 0 {
		l.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if l.MaxResponseBytes == 0 {
		l.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if l.MaxEventBytes == 0 {
		l.MaxEventBytes = DefaultMaxEventBytes
	}
	if l.CallTimeout == 0 {
		l.CallTimeout = Duration(DefaultCallTimeout)
	}
	if l.MinOutputTokens == 0 {
		l.MinOutputTokens = DefaultMinOutputTokens
	}
	if l.CountTokensPerMinute == 0 {
		l.CountTokensPerMinute = DefaultCountTokensRate
	}
	return l
}

func (l Limits) validate() error {
	var errs []error
	if l.MaxRequestBytes < 1<<10 || l.MaxResponseBytes < 1<<10 || l.MaxEventBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("limits: max request (%d), response (%d) and event (%d) bytes must be at least 1 KiB",
			l.MaxRequestBytes, l.MaxResponseBytes, l.MaxEventBytes))
	}
	if time.Duration(l.CallTimeout) < time.Second {
		errs = append(errs, fmt.Errorf("limits: call timeout %s is under a second", time.Duration(l.CallTimeout)))
	}
	if l.MinOutputTokens < 1 {
		errs = append(errs, fmt.Errorf("limits: min output tokens %d is below 1", l.MinOutputTokens))
	}
	if l.CountTokensPerMinute < 1 || l.CountTokensPerMinute > 6000 {
		errs = append(errs, fmt.Errorf("limits: count_tokens_per_minute %d is not in [1, 6000]", l.CountTokensPerMinute))
	}
	return errors.Join(errs...)
}

// serverTool is a configured provider-side tool: what kind it is, its
// price per use and its bounds.
type serverTool struct {
	kind     string // "web_search" or "web_fetch"
	price    Money
	maxUses  int64
	perUse   int64 // input tokens one use may add
	typeName string
}

// serverToolKinds are the provider-side tools the gateway can meter: the
// prefix of their type, and what their use is counted as in Anthropic's
// usage.server_tool_use. Others (code execution, billed by container
// time; MCP connectors) are refused.
var serverToolKinds = []string{"web_search", "web_fetch"}

// compileServerTools checks a model's server tools and sets their prices
// in p.
func compileServerTools(tools map[string]ServerTool, api string, p *Price) (map[string]serverTool, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	if api != APIAnthropic {
		return nil, errors.New("server_tools: only Anthropic models have server tools")
	}
	out := map[string]serverTool{}
	var errs []error
	seen := map[string]string{}
	for typ, t := range tools {
		kind := ""
		for _, k := range serverToolKinds {
			if strings.HasPrefix(typ, k+"_") {
				kind = k
			}
		}
		if kind == "" {
			errs = append(errs, fmt.Errorf("server_tools %q: not a tool the gateway can meter (only %s_*)", typ, strings.Join(serverToolKinds, "_*, ")))
			continue
		}
		if other, dup := seen[kind]; dup {
			errs = append(errs, fmt.Errorf("server_tools %q: %s is already configured as %q (one version per kind: their uses are counted together)", typ, kind, other))
			continue
		}
		seen[kind] = typ
		price, err := Dollars(t.Price)
		if err != nil {
			errs = append(errs, fmt.Errorf("server_tools %q: price: %w", typ, err))
		}
		if t.MaxUses < 1 || t.MaxUses > 20 {
			errs = append(errs, fmt.Errorf("server_tools %q: max_uses %d is not in [1, 20]", typ, t.MaxUses))
		}
		if t.InputTokensPerUse < 1 || t.InputTokensPerUse > 1_000_000 {
			errs = append(errs, fmt.Errorf("server_tools %q: input_tokens_per_use %d is not in [1, 1000000]", typ, t.InputTokensPerUse))
		}
		switch kind {
		case "web_search":
			p.WebSearch = price
		case "web_fetch":
			p.WebFetch = price
		}
		out[typ] = serverTool{kind: kind, price: price, maxUses: t.MaxUses, perUse: t.InputTokensPerUse, typeName: typ}
	}
	return out, errors.Join(errs...)
}
