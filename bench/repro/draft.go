package repro

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/repronet/repronet/bench/corebench"
)

// A check without rules drafts the task entry instead (DraftEntry): every
// run returns its results/ folder, every number in its files (CSV cells,
// JSON numbers, numbers in text) and every date or time is found at a
// location a rule can extract again, and the K runs are compared value by
// value: the same in every run (kept), varying a little (kept, with its
// prediction interval), or flagged — a date or time, a number that looks
// like a Unix time, one that varies wildly, one not in every run. The kept
// values make a CORE-Bench task entry and a Spec the scientist edits
// (rewording the questions, dropping what does not matter) and submits.

// Verdicts of a drafted value.
const (
	// DraftStable: the same in every run; kept.
	DraftStable = "stable"
	// DraftInterval: a number that varies a little across the runs (a
	// seeded random estimate); kept with its 95% prediction interval.
	DraftInterval = "interval"
	// DraftTimestamp: a date or time, or a number that looks like a Unix
	// time; flagged.
	DraftTimestamp = "timestamp"
	// DraftWild: a number whose runs differ by more than WildSpread of
	// their mean, or in sign; flagged.
	DraftWild = "wild"
	// DraftMissing: not found in every run; flagged.
	DraftMissing = "missing"
)

// ResultsDir is the folder a draft check's runs return.
const ResultsDir = "results"

// Bounds of a draft.
const (
	// WildSpread: a number whose runs' standard deviation is over this
	// share of their mean's magnitude varies wildly.
	WildSpread = 0.25
	// MaxDraftValues bounds the values found in one run, MaxTextLines the
	// lines of a text file and MaxCSVRows the data rows of a CSV file read.
	MaxDraftValues = 500
	MaxTextLines   = 1000
	MaxCSVRows     = 1000
	// MaxLinePrefix bounds where in its line a value of a text file may
	// start (its rule holds what precedes it).
	MaxLinePrefix = 256
)

// Unix times from 2001-09-09 (10^9 s) to 2100-01-01, in seconds or
// milliseconds.
const (
	minUnixSeconds = 1e9
	maxUnixSeconds = 4102444800
)

// DraftValue is one value found in the runs' files.
type DraftValue struct {
	// Question is a draft question naming where the value is; Rule
	// extracts it again (its question is Question).
	Question string `json:"question"`
	Rule     Rule   `json:"rule"`
	// Values are the runs' texts, in run order ("" where it was not found).
	Values   []string  `json:"values"`
	Verdict  string    `json:"verdict"`
	Interval *Interval `json:"interval,omitempty"`
	Reason   string    `json:"reason"`
	// Published is the value the capsule published at the same place (its
	// results/ as submitted; "" for none), Comparison whether the runs
	// reproduce it (PublishedReproduced, PublishedNotReproduced,
	// PublishedNotCompared, PublishedNone; "" when the capsule published
	// nothing), and why (ComparePublished).
	Published        string `json:"published,omitempty"`
	Comparison       string `json:"comparison,omitempty"`
	ComparisonReason string `json:"comparison_reason,omitempty"`
}

// Kept reports whether the value is in the draft entry.
func (v DraftValue) Kept() bool { return v.Verdict == DraftStable || v.Verdict == DraftInterval }

// Draft is the draft task entry of a check without rules.
type Draft struct {
	// Values are every value found, in the order of the first run that
	// has them (files in name order, then file order).
	Values []DraftValue `json:"values"`
	// Spec holds a rule per kept value: edited and submitted, it checks
	// the capsule with rules.
	Spec Spec `json:"spec"`
	// Truncated names the runs' files in which not every value was read
	// (past MaxTextLines, MaxCSVRows, MaxLinePrefix or MaxDraftValues).
	Truncated []string `json:"truncated,omitempty"`
	// Published counts the files of the capsule's published results/ the
	// runs were compared with (ComparePublished); Unproduced names those
	// no run wrote.
	Published  int      `json:"published_files,omitempty"`
	Unproduced []string `json:"unproduced,omitempty"`
}

// found is one value of one file of one run.
type found struct {
	rule     Rule
	question string
	text     string
	num      float64
	time     bool // a date or time
}

// Patterns of values in text.
const (
	numPattern  = `[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?`
	timePattern = `[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?(?:Z|[-+][0-9]{2}:?[0-9]{2})?)?` +
		`|[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?`
)

var (
	numRe      = regexp.MustCompile(numPattern)
	timeRe     = regexp.MustCompile(timePattern)
	wholeNum   = regexp.MustCompile(`^` + numPattern + `%?$`)
	wholeTime  = regexp.MustCompile(`^(?:` + timePattern + `)$`)
	labelTrims = " \t:=,;|()[]{}\"'"
)

// findValues finds the values of one file (path relative to the capsule
// folder), at most MaxDraftValues; truncated is true when the file has
// more than it reads.
func findValues(name string, data []byte) (out []found, truncated bool) {
	if bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) || len(data) > MaxFileSize {
		return nil, false // not text: a figure, a binary
	}
	switch strings.ToLower(path.Ext(name)) {
	case ".csv":
		return csvValues(name, data)
	case ".json":
		if doc, err := corebench.ParseValue(data); err == nil {
			cut := jsonValues(name, doc, "", &out)
			return out, cut
		}
	}
	return textValues(name, data)
}

// span is a value in a line of text.
type span struct {
	start, end int
	time       bool
}

// lineSpans finds the dates and times and the numbers of a line that
// start within its first limit bytes, in order (more: some start
// further); a number must stand alone (not inside a name such as x2 or
// capsule-0000004, nor a version such as 1.2.3). It takes time linear in
// the line's length.
func lineSpans(line string, limit int) (out []span, more bool) {
	var times []span
	for pos := 0; pos < len(line); {
		m := timeRe.FindStringIndex(line[pos:])
		if m == nil {
			break
		}
		start, end := pos+m[0], pos+m[1]
		if start > limit {
			more = true
			break
		}
		if standsAlone(line, start, end) {
			times = append(times, span{start, end, true})
		}
		pos = end
	}
	t := 0
	for pos := 0; pos < len(line); {
		m := numRe.FindStringIndex(line[pos:])
		if m == nil {
			break
		}
		start, end := pos+m[0], pos+m[1]
		pos = end
		if start > limit {
			more = true
			break
		}
		for t < len(times) && times[t].end <= start {
			t++
		}
		if t < len(times) && times[t].start < end || !standsAlone(line, start, end) {
			continue // inside a date or time, or not alone
		}
		if end < len(line) && line[end] == '%' {
			end++
		}
		out = append(out, span{start, end, false})
	}
	out = append(out, times...)
	slices.SortFunc(out, func(a, b span) int { return a.start - b.start })
	return out, more
}

func standsAlone(line string, start, end int) bool {
	word := func(c byte) bool {
		return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	if start > 0 && (word(line[start-1]) || line[start-1] == '.') {
		return false
	}
	if end < len(line) && (word(line[end]) || line[end] == '.' && end+1 < len(line) && line[end+1] >= '0' && line[end+1] <= '9') {
		return false
	}
	return true
}

// textValues finds the values of a text file, each with a rule that finds
// it again: its line (by number) and what precedes it there, other values
// in between matched by their pattern.
func textValues(name string, data []byte) (out []found, truncated bool) {
	lines := strings.Split(string(data), "\n")
	if len(lines) > MaxTextLines {
		lines, truncated = lines[:MaxTextLines], true
	}
	for i, line := range lines {
		line = strings.TrimSuffix(line, "\r")
		spans, more := lineSpans(line, MaxLinePrefix)
		truncated = truncated || more
		var prefix strings.Builder
		prefix.WriteString(`\A`)
		if i > 0 {
			fmt.Fprintf(&prefix, `(?:[^\n]*\n){%d}`, i)
		}
		last := 0
		for k, s := range spans {
			prefix.WriteString(regexp.QuoteMeta(line[last:s.start]))
			pat, typ := numPattern+`%?`, TypeNumber
			if s.time {
				pat, typ = timePattern, TypeString
			}
			f := found{text: line[s.start:s.end], time: s.time,
				rule: Rule{File: name, Kind: KindRegex, Expr: prefix.String() + "(" + pat + ")", Type: typ}}
			prefix.WriteString("(?:" + pat + ")")
			last = s.end
			if !s.time {
				f.num, _ = corebench.PyFloat(strings.TrimSuffix(f.text, "%"))
				if math.IsInf(f.num, 0) || math.IsNaN(f.num) {
					continue // 1e999: no answer a grader takes
				}
			}
			label := strings.Trim(line[:s.start], labelTrims)
			if j := strings.LastIndexAny(label, " \t"); j >= 0 && k == 0 {
				label = strings.Trim(label[j+1:], labelTrims)
			}
			if k > 0 || label == "" || len(label) > 60 {
				f.question = fmt.Sprintf("Report value %d on line %d of %s.", k+1, i+1, name)
			} else {
				f.question = fmt.Sprintf("Report `%s` on line %d of %s.", label, i+1, name)
			}
			if len(out) == MaxDraftValues {
				return out, true
			}
			out = append(out, f)
		}
	}
	return out, truncated
}

// csvValues finds the numeric, date and time cells of a CSV file with a
// header row (else its values are found as text).
func csvValues(name string, data []byte) (out []found, truncated bool) {
	rd := csv.NewReader(bytes.NewReader(data))
	rd.FieldsPerRecord = -1
	records, err := rd.ReadAll()
	if err != nil || len(records) < 2 {
		return textValues(name, data)
	}
	header, rows := records[0], records[1:]
	if len(rows) > MaxCSVRows {
		rows, truncated = rows[:MaxCSVRows], true
	}
	names := make([]string, len(header))
	for i, h := range header {
		names[i] = strings.TrimSpace(h)
	}
	for r, row := range rows {
		for c, cell := range row {
			cell = strings.TrimSpace(cell)
			isTime := wholeTime.MatchString(cell)
			if !isTime && !wholeNum.MatchString(cell) {
				continue
			}
			// The column by name when csvCell finds it by that name (the
			// first of that trimmed name, no '@', not "#..."), else by place.
			col := ""
			if c < len(names) {
				col = names[c]
			}
			if col == "" || strings.Contains(col, "@") || strings.HasPrefix(col, "#") || slices.Index(names, col) != c {
				col = fmt.Sprintf("#%d", c+1)
			}
			f := found{text: cell, time: isTime, rule: Rule{File: name, Kind: KindCSV, Expr: fmt.Sprintf("%s@%d", col, r+1), Type: TypeNumber},
				question: fmt.Sprintf("Report column `%s` of data row %d of %s.", col, r+1, name)}
			if isTime {
				f.rule.Type = TypeString
			} else if f.num, _ = corebench.PyFloat(strings.TrimSuffix(cell, "%")); math.IsInf(f.num, 0) || math.IsNaN(f.num) {
				continue
			}
			if len(out) == MaxDraftValues {
				return out, true
			}
			out = append(out, f)
		}
	}
	return out, truncated
}

// jsonValues finds the numbers, dates and times of a JSON document, at
// most MaxDraftValues in all (cut: there were more).
func jsonValues(name string, v corebench.Value, ptr string, out *[]found) (cut bool) {
	add := func(f found) bool {
		if len(*out) == MaxDraftValues {
			return true
		}
		*out = append(*out, f)
		return false
	}
	switch v.Kind {
	case corebench.Number:
		if math.IsNaN(v.Num) || math.IsInf(v.Num, 0) {
			return false
		}
		return add(found{text: v.Lit, num: v.Num, rule: Rule{File: name, Kind: KindJSON, Expr: ptr, Type: TypeNumber},
			question: fmt.Sprintf("Report `%s` in %s.", ptr, name)})
	case corebench.String:
		if wholeTime.MatchString(strings.TrimSpace(v.Str)) {
			return add(found{text: v.Str, time: true, rule: Rule{File: name, Kind: KindJSON, Expr: ptr, Type: TypeString},
				question: fmt.Sprintf("Report `%s` in %s.", ptr, name)})
		}
	case corebench.List:
		for i, e := range v.List {
			if jsonValues(name, e, ptr+"/"+strconv.Itoa(i), out) {
				return true
			}
		}
	case corebench.Object:
		for _, m := range v.Object {
			tok := strings.ReplaceAll(strings.ReplaceAll(m.Key, "~", "~0"), "/", "~1")
			if jsonValues(name, m.Value, ptr+"/"+tok, out) {
				return true
			}
		}
	}
	return false
}

// runValues finds every value of one run's files (name order), within
// MaxDraftValues, keyed by rule; truncated names the files not read whole.
func runValues(files map[string][]byte) (order []string, byKey map[string]found, truncated []string) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	byKey = map[string]found{}
	for _, n := range names {
		vals, cut := findValues(n, files[n])
		if len(byKey)+len(vals) > MaxDraftValues {
			vals, cut = vals[:max(0, MaxDraftValues-len(byKey))], true
		}
		if cut {
			truncated = append(truncated, n)
		}
		for _, f := range vals {
			k := ruleKey(f.rule)
			if _, dup := byKey[k]; dup {
				continue
			}
			byKey[k] = f
			order = append(order, k)
		}
	}
	return order, byKey, truncated
}

func ruleKey(r Rule) string { return r.File + "\x00" + r.Kind + "\x00" + r.Expr }

// DraftEntry compares the successful runs (at least 2) of a capsule's run
// script value by value and drafts its task entry (see Draft). Every kept
// value's rule is checked to read it back (Extract, on the first run), so
// the entry is what the rules give.
func DraftEntry(c Capsule, runs []Run) (Draft, corebench.Task, error) {
	var ok []Run
	for _, r := range runs {
		if r.Outcome == "ok" {
			ok = append(ok, r)
		}
	}
	if len(ok) < 2 {
		return Draft{}, corebench.Task{}, fmt.Errorf("draft of %s: %d successful runs of %d, at least 2 are needed", c.CapsuleID, len(ok), len(runs))
	}
	var d Draft
	perRun := make([]map[string]found, len(ok))
	var order []string
	seen := map[string]bool{}
	for i, r := range ok {
		o, byKey, cut := runValues(r.Files)
		perRun[i] = byKey
		for _, n := range cut {
			d.Truncated = append(d.Truncated, fmt.Sprintf("run %d (%s): %s", i+1, r.Node, n))
		}
		for _, k := range o {
			if !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
	}
	task := corebench.Task{Field: c.Field, Language: c.Language, CapsuleTitle: c.CapsuleTitle, CapsuleID: c.CapsuleID,
		CapsuleDOI: c.CapsuleDOI, TaskPrompt: c.TaskPrompt, Results: make([]corebench.Answers, len(ok))}
	for i := range task.Results {
		task.Results[i] = corebench.Answers{}
	}
	questions := map[string]int{}
	for _, k := range order {
		var fs []found
		var first found
		for i := range ok {
			f, has := perRun[i][k]
			fs = append(fs, f)
			if has && first.rule.File == "" {
				first = f
			}
		}
		q := first.question
		if questions[q]++; questions[q] > 1 {
			q = fmt.Sprintf("%s (%d)", strings.TrimSuffix(q, "."), questions[q])
		}
		v := DraftValue{Question: q, Rule: first.rule}
		v.Rule.Question = q
		for i, f := range fs {
			if _, has := perRun[i][k]; has {
				v.Values = append(v.Values, f.text)
			} else {
				v.Values = append(v.Values, "")
			}
		}
		judgeDraft(&v, fs, perRun, k)
		if v.Kept() {
			answers, err := keptAnswers(v.Rule, fs, ok)
			if err != nil {
				v.Verdict, v.Reason = DraftMissing, "its rule does not read it back: "+err.Error()
			} else {
				for i, a := range answers {
					task.Results[i] = append(task.Results[i], corebench.Answer{Question: q, Value: a})
				}
				d.Spec.Rules = append(d.Spec.Rules, v.Rule)
			}
		}
		d.Values = append(d.Values, v)
	}
	d.Spec.Capsule, d.Spec.Runs = c, len(runs)
	if err := validateEntry(task); err != nil {
		return Draft{}, corebench.Task{}, fmt.Errorf("draft of %s: the task entry is invalid: %w", c.CapsuleID, err)
	}
	return d, task, nil
}

// judgeDraft gives a value its verdict from the runs' texts.
func judgeDraft(v *DraftValue, fs []found, perRun []map[string]found, k string) {
	missing := 0
	for i := range fs {
		if _, has := perRun[i][k]; !has {
			missing++
		}
	}
	if missing > 0 {
		v.Verdict, v.Reason = DraftMissing, fmt.Sprintf("not found in %d of %d runs", missing, len(fs))
		return
	}
	same := true // the same text, or the same number
	for _, f := range fs[1:] {
		same = same && (f.text == fs[0].text || !f.time && !fs[0].time && f.num == fs[0].num)
	}
	for _, f := range fs {
		if f.time {
			v.Verdict, v.Reason = DraftTimestamp, "a date or time"
			if !same {
				v.Reason += ", different in every run"
			}
			return
		}
	}
	xs := make([]float64, len(fs))
	unix := true
	for i, f := range fs {
		xs[i] = f.num
		a := math.Abs(f.num)
		unix = unix && f.num == math.Trunc(f.num) && (a >= minUnixSeconds && a <= maxUnixSeconds || a >= minUnixSeconds*1000 && a <= maxUnixSeconds*1000)
	}
	if unix {
		v.Verdict, v.Reason = DraftTimestamp, "an integer that looks like a Unix time (seconds or milliseconds since 1970)"
		return
	}
	if same {
		v.Verdict, v.Reason = DraftStable, "the same in every run"
		return
	}
	iv := corebench.PredictionInterval(xs)
	v.Interval = &Interval{N: iv.N, Mean: iv.Mean, Std: iv.Std, Lower: iv.Lower, Upper: iv.Upper}
	lo, hi := slices.Min(xs), slices.Max(xs)
	switch {
	case lo < 0 && hi > 0:
		v.Verdict, v.Reason = DraftWild, fmt.Sprintf("changes sign across the runs (%g to %g)", lo, hi)
	case iv.Mean == 0 || iv.Std > WildSpread*math.Abs(iv.Mean):
		v.Verdict, v.Reason = DraftWild, fmt.Sprintf("varies wildly: standard deviation %.3g for a mean of %.3g", iv.Std, iv.Mean)
	default:
		v.Verdict, v.Reason = DraftInterval, fmt.Sprintf("varies across the runs (%g to %g): kept with its 95%% prediction interval", lo, hi)
	}
}

// keptAnswers are a kept value's answers in every run, read from the
// texts found (as Extract turns a text into an answer); its rule is
// checked once, on the first run: it must read back the same number
// (reading every run with it would cost a pass over the file per run).
func keptAnswers(r Rule, fs []found, runs []Run) ([]corebench.Value, error) {
	out := make([]corebench.Value, len(fs))
	for i, f := range fs {
		v, err := textAnswer(r, f.text)
		if err != nil {
			return nil, fmt.Errorf("run %d (%s): %w", i+1, runs[i].Node, err)
		}
		out[i] = v
	}
	v, err := Extract(r, runs[0].Files)
	if err != nil {
		return nil, fmt.Errorf("run 1 (%s): %w", runs[0].Node, err)
	}
	if v.Kind != corebench.Number || v.Num != out[0].Num {
		return nil, fmt.Errorf("run 1 (%s): it reads %s, not %s", runs[0].Node, clip(v.Repr()), clip(fs[0].text))
	}
	return out, nil
}
