package repro

import (
	"fmt"
	"slices"
	"strings"

	"github.com/repronet/repronet/bench/corebench"
)

// A draft check compares its runs with what the capsule published: the
// files of its results/ folder as submitted (before any run; each run
// starts from an empty results/), read as the runs' are. Each value found
// in both says whether the runs reproduce the published one; a published
// value the runs never give, or a published file no run writes, is not
// reproduced.

// Comparisons of a published value with the runs.
const (
	// PublishedReproduced: the runs give the published value (the same
	// text or number in every run, or a number inside the runs' 95%
	// prediction interval).
	PublishedReproduced = "reproduced"
	// PublishedNotReproduced: the runs give another value, vary wildly,
	// or do not all give it.
	PublishedNotReproduced = "not_reproduced"
	// PublishedNotCompared: a date or time (a run's own, never the
	// published one).
	PublishedNotCompared = "not_compared"
	// PublishedNone: the capsule published no value there.
	PublishedNone = "not_published"
)

// ComparePublished compares each value of d with the published files
// (path relative to the capsule folder -> content; only those under
// results/ are read) and adds the published values no run gives. It does
// nothing when nothing was published. runs are the successful runs d was
// drafted from.
func ComparePublished(d *Draft, runs []Run, published map[string][]byte) {
	files := map[string][]byte{}
	for name, b := range published {
		if strings.HasPrefix(name, ResultsDir+"/") {
			files[name] = b
		}
	}
	if len(files) == 0 {
		return
	}
	order, byKey, cut := runValues(files)
	for _, n := range cut {
		d.Truncated = append(d.Truncated, "published: "+n)
	}
	d.Published = len(files)
	matched := map[string]bool{}
	for i := range d.Values {
		v := &d.Values[i]
		k := ruleKey(v.Rule)
		p, ok := byKey[k]
		if !ok {
			v.Comparison = PublishedNone
			continue
		}
		matched[k] = true
		v.Published = p.text
		v.Comparison, v.ComparisonReason = comparePublished(*v, p)
	}
	written := map[string]bool{}
	for _, r := range runs {
		for name := range r.Files {
			written[name] = true
		}
	}
	questions := map[string]bool{}
	for _, v := range d.Values {
		questions[v.Question] = true
	}
	for _, k := range order {
		p := byKey[k]
		switch {
		case matched[k]:
			continue
		case !written[p.rule.File]:
			if !slices.Contains(d.Unproduced, p.rule.File) {
				d.Unproduced = append(d.Unproduced, p.rule.File)
			}
			continue
		}
		q := p.question
		for n := 2; questions[q]; n++ {
			q = fmt.Sprintf("%s (%d)", strings.TrimSuffix(p.question, "."), n)
		}
		questions[q] = true
		v := DraftValue{Question: q, Rule: p.rule, Values: make([]string, len(runs)), Verdict: DraftMissing,
			Reason: fmt.Sprintf("not found in any of the %d runs", len(runs)), Published: p.text}
		v.Rule.Question = q
		if p.time {
			v.Comparison, v.ComparisonReason = PublishedNotCompared, "a date or time: not compared"
		} else {
			v.Comparison, v.ComparisonReason = PublishedNotReproduced, "published, but no run gives a value here"
		}
		d.Values = append(d.Values, v)
	}
	slices.Sort(d.Unproduced)
}

// comparePublished says whether the runs' value v reproduces the
// published value p, and why.
func comparePublished(v DraftValue, p found) (string, string) {
	switch v.Verdict {
	case DraftTimestamp:
		return PublishedNotCompared, "a date or time: not compared"
	case DraftMissing:
		return PublishedNotReproduced, "not every run gives a value here (" + v.Reason + ")"
	case DraftWild:
		return PublishedNotReproduced, "the runs disagree with each other (" + v.Reason + ")"
	}
	if p.time {
		return PublishedNotReproduced, fmt.Sprintf("published a date or time (%s), the runs give %s", clip(p.text), clip(v.Values[0]))
	}
	if v.Verdict == DraftStable {
		run := v.Values[0]
		num, _ := corebench.PyFloat(strings.TrimSuffix(run, "%"))
		if run == p.text || num == p.num {
			return PublishedReproduced, "every run gives the published value"
		}
		return PublishedNotReproduced, fmt.Sprintf("published %s, every run gives %s", clip(p.text), clip(run))
	}
	iv := v.Interval
	if iv != nil && p.num >= iv.Lower && p.num <= iv.Upper {
		return PublishedReproduced, fmt.Sprintf("the published %s is inside the runs' 95%% prediction interval [%.6g, %.6g]", clip(p.text), iv.Lower, iv.Upper)
	}
	if iv == nil {
		return PublishedNotReproduced, "no prediction interval to compare with"
	}
	return PublishedNotReproduced, fmt.Sprintf("the published %s is outside the runs' 95%% prediction interval [%.6g, %.6g]", clip(p.text), iv.Lower, iv.Upper)
}

// NotReproducedPublished lists the questions of the published values the
// runs did not reproduce, then the published files no run wrote.
func (d Draft) NotReproducedPublished() []string {
	var out []string
	for _, v := range d.Values {
		if v.Comparison == PublishedNotReproduced {
			out = append(out, v.Question)
		}
	}
	for _, f := range d.Unproduced {
		out = append(out, "published file "+f+": written by no run")
	}
	return out
}
