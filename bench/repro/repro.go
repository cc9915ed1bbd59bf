// Package repro owns the pure core of a reproducibility check: the rules
// that say where the answer to each question is found in a capsule's
// output files (file and extraction rule), and the turning of K runs of the
// capsule's own run script, on distinct nodes, into a CORE-Bench task
// entry (one gold run per successful run), the 95% prediction interval of
// every numeric answer, and the questions that did not reproduce. A check
// without rules is a draft (draft.go): the runs return their results/
// folder, every number, date and time in it is compared across the runs,
// and the report is a draft task entry (stable values kept, varying ones
// with their interval, timestamps and wild values flagged) with the rules
// that read the kept values, for the scientist to edit; each value is
// also compared with the one the capsule published at the same place in
// its own results/ as submitted (published.go), and a published value the
// runs do not reproduce makes the capsule not reproducible.
//
// It is pure: bytes and plain data in, a Report out. It must not touch the
// network, containers or storage, nor depend on the coordinator; the
// coordinator schedules the runs, collects the requested files and calls
// Check.
package repro

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/repronet/repronet/bench/corebench"
)

// Extraction kinds.
const (
	// KindText: the whole file, with surrounding whitespace trimmed.
	KindText = "text"
	// KindRegex: the first match of Expr (RE2 syntax) in the file; its
	// first capture group when it has one, else the whole match.
	KindRegex = "regex"
	// KindJSON: the value at Expr, an RFC 6901 JSON Pointer ("/metrics/auc",
	// "/folds/0"; "" is the whole document), in a JSON file.
	KindJSON = "json"
	// KindCSV: one cell of a CSV file with a header row. Expr is
	// "COLUMN@ROW": the column named COLUMN in the header (or "#N", the
	// N-th column from 1), and the ROW-th data row from 1 (negative: from
	// the end, -1 is the last).
	KindCSV = "csv"
)

// Answer types.
const (
	// TypeNumber: the text is read as the CORE-Bench grader reads an
	// answer: every % removed, then Python's float(). JSON numbers stay as
	// they are.
	TypeNumber = "number"
	// TypeString: the text as it is; a JSON value must be a string.
	TypeString = "string"
	// TypeAuto (json only): the JSON value as it is (number, string or
	// list). For other kinds it means TypeString.
	TypeAuto = ""
)

// MaxFileSize bounds an output file the rules read.
const MaxFileSize = 16 << 20

// Rule says where the answer to one question is.
type Rule struct {
	// Question is the literal question text, as in a CORE-Bench task.
	Question string `json:"question"`
	// File is the output file, slash-separated and relative to the capsule
	// folder ("results/metrics.json").
	File string `json:"file"`
	Kind string `json:"kind"`
	Expr string `json:"expr,omitempty"`
	Type string `json:"type,omitempty"`
}

// Validate checks a rule, naming its question and field.
func (r Rule) Validate() error {
	name := fmt.Sprintf("rule %q", r.Question)
	switch {
	case r.Question == "":
		return errors.New("rule: field question: empty")
	case !fs.ValidPath(r.File) || r.File == ".":
		return fmt.Errorf("%s: field file: %q is not a slash-separated path inside the capsule", name, r.File)
	case r.Type != TypeNumber && r.Type != TypeString && r.Type != TypeAuto:
		return fmt.Errorf("%s: field type: unknown %q (number, string, or empty)", name, r.Type)
	}
	switch r.Kind {
	case KindText:
		if r.Expr != "" {
			return fmt.Errorf("%s: field expr: a text rule takes none", name)
		}
	case KindRegex:
		if _, err := regexp.Compile(r.Expr); err != nil || r.Expr == "" {
			return fmt.Errorf("%s: field expr: not a regular expression: %v", name, err)
		}
	case KindJSON:
		if r.Expr != "" && !strings.HasPrefix(r.Expr, "/") {
			return fmt.Errorf("%s: field expr: %q is not a JSON Pointer (it starts with /)", name, r.Expr)
		}
	case KindCSV:
		if _, _, err := parseCell(r.Expr); err != nil {
			return fmt.Errorf("%s: field expr: %w", name, err)
		}
	default:
		return fmt.Errorf("%s: field kind: unknown %q (text, regex, json, csv)", name, r.Kind)
	}
	return nil
}

// ValidateRules checks every rule and that no question repeats.
func ValidateRules(rules []Rule) error {
	if len(rules) == 0 {
		return errors.New("rules: none")
	}
	seen := map[string]bool{}
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
		if seen[r.Question] {
			return fmt.Errorf("rule %q: field question: appears twice", r.Question)
		}
		seen[r.Question] = true
	}
	return nil
}

func parseCell(expr string) (col string, row int, err error) {
	i := strings.LastIndexByte(expr, '@')
	if i <= 0 {
		return "", 0, fmt.Errorf("%q is not COLUMN@ROW", expr)
	}
	row, err = strconv.Atoi(expr[i+1:])
	if err != nil || row == 0 {
		return "", 0, fmt.Errorf("%q: row %q is not a non-zero integer", expr, expr[i+1:])
	}
	return expr[:i], row, nil
}

// Extract applies the rule to the files of one run (path -> content).
func Extract(r Rule, files map[string][]byte) (corebench.Value, error) {
	if err := r.Validate(); err != nil {
		return corebench.Value{}, err
	}
	data, ok := files[r.File]
	if !ok {
		return corebench.Value{}, fmt.Errorf("file %s: missing", r.File)
	}
	if len(data) > MaxFileSize {
		return corebench.Value{}, fmt.Errorf("file %s: %d bytes, over the %d byte limit", r.File, len(data), MaxFileSize)
	}
	var text string
	switch r.Kind {
	case KindText:
		text = strings.TrimSpace(string(data))
	case KindRegex:
		re := regexp.MustCompile(r.Expr)
		m := re.FindSubmatch(data)
		if m == nil {
			return corebench.Value{}, fmt.Errorf("file %s: no match for %s", r.File, r.Expr)
		}
		text = string(m[0])
		if len(m) > 1 {
			text = string(m[1])
		}
	case KindCSV:
		cell, err := csvCell(data, r.Expr)
		if err != nil {
			return corebench.Value{}, fmt.Errorf("file %s: %w", r.File, err)
		}
		text = cell
	case KindJSON:
		doc, err := corebench.ParseValue(data)
		if err != nil {
			return corebench.Value{}, fmt.Errorf("file %s: %w", r.File, err)
		}
		v, err := pointer(doc, r.Expr)
		if err != nil {
			return corebench.Value{}, fmt.Errorf("file %s: %w", r.File, err)
		}
		return jsonAnswer(r, v)
	}
	return textAnswer(r, text)
}

func textAnswer(r Rule, text string) (corebench.Value, error) {
	if r.Type != TypeNumber {
		return corebench.StringValue(text), nil
	}
	f, ok := corebench.PyFloat(strings.ReplaceAll(text, "%", ""))
	if !ok {
		return corebench.Value{}, fmt.Errorf("file %s: %q is not a number", r.File, clip(text))
	}
	return numberValue(text, f)
}

// numberValue keeps the text as the literal when it is a JSON number.
func numberValue(text string, f float64) (corebench.Value, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return corebench.Value{}, fmt.Errorf("%q is not a finite number", clip(text))
	}
	t := strings.TrimSpace(strings.ReplaceAll(text, "%", ""))
	if v, err := corebench.NumberValue(t); err == nil && v.Num == f {
		if v.Int {
			if _, err := strconv.ParseInt(v.Lit, 10, 64); err != nil {
				return corebench.NumberValue(strconv.FormatFloat(f, 'g', -1, 64))
			}
		}
		return v, nil
	}
	lit := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(lit, ".e") {
		lit += ".0" // a float, as Python's float() made it
	}
	return corebench.NumberValue(lit)
}

func jsonAnswer(r Rule, v corebench.Value) (corebench.Value, error) {
	switch r.Type {
	case TypeNumber:
		switch v.Kind {
		case corebench.Number:
			if math.IsNaN(v.Num) || math.IsInf(v.Num, 0) {
				return corebench.Value{}, fmt.Errorf("file %s: %s is not a finite number", r.File, v.Lit)
			}
			return v, nil
		case corebench.String:
			return textAnswer(r, v.Str)
		}
		return corebench.Value{}, fmt.Errorf("file %s: at %q a JSON %s, want a number", r.File, r.Expr, v.Kind)
	case TypeString:
		if v.Kind != corebench.String {
			return corebench.Value{}, fmt.Errorf("file %s: at %q a JSON %s, want a string", r.File, r.Expr, v.Kind)
		}
		return v, nil
	}
	switch v.Kind {
	case corebench.Number:
		if math.IsNaN(v.Num) || math.IsInf(v.Num, 0) {
			return corebench.Value{}, fmt.Errorf("file %s: %s is not a finite number", r.File, v.Lit)
		}
	case corebench.String, corebench.List:
	default:
		return corebench.Value{}, fmt.Errorf("file %s: at %q a JSON %s, want a number, string or list", r.File, r.Expr, v.Kind)
	}
	return v, nil
}

// pointer resolves an RFC 6901 JSON Pointer.
func pointer(doc corebench.Value, ptr string) (corebench.Value, error) {
	if ptr == "" {
		return doc, nil
	}
	v := doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v.Kind {
		case corebench.Object:
			w, ok := v.Get(tok)
			if !ok {
				return corebench.Value{}, fmt.Errorf("%s: no key %q", ptr, tok)
			}
			v = w
		case corebench.List:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v.List) || (len(tok) > 1 && tok[0] == '0') {
				return corebench.Value{}, fmt.Errorf("%s: no index %q in a list of %d", ptr, tok, len(v.List))
			}
			v = v.List[i]
		default:
			return corebench.Value{}, fmt.Errorf("%s: %q goes into a JSON %s", ptr, tok, v.Kind)
		}
	}
	return v, nil
}

func csvCell(data []byte, expr string) (string, error) {
	col, row, err := parseCell(expr)
	if err != nil {
		return "", err
	}
	rd := csv.NewReader(bytes.NewReader(data))
	rd.FieldsPerRecord = -1
	records, err := rd.ReadAll()
	if err != nil {
		return "", fmt.Errorf("csv: %w", err)
	}
	if len(records) < 2 {
		return "", errors.New("csv: no data row under the header")
	}
	header, rows := records[0], records[1:]
	c := -1
	if n, ok := strings.CutPrefix(col, "#"); ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 1 {
			c = i - 1
		}
	} else {
		for i, h := range header {
			if strings.TrimSpace(h) == col {
				c = i
				break
			}
		}
	}
	if c < 0 {
		return "", fmt.Errorf("csv: no column %q", col)
	}
	r := row - 1
	if row < 0 {
		r = len(rows) + row
	}
	if r < 0 || r >= len(rows) {
		return "", fmt.Errorf("csv: no data row %d (there are %d)", row, len(rows))
	}
	if c >= len(rows[r]) {
		return "", fmt.Errorf("csv: row %d has no column %q", row, col)
	}
	return strings.TrimSpace(rows[r][c]), nil
}

// clip shortens text quoted in a message, on a rune boundary.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
