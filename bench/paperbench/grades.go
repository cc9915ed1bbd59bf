package paperbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// MaxGradesBytes bounds a leaf-grades file ParseLeafGrades reads.
const MaxGradesBytes = 64 << 20

// ParseLeafGrades reads the leaves' grades of one paper, for re-grading a
// score from its inputs (repronet grade paperbench), in any of three
// shapes, told apart by their first JSON value:
//
//   - a list of leaf records, as a repronet verdict's "grading" holds them:
//     [{"id": "...", "score": 0|1, "failed": bool, "reason": "..."}], or
//     such a verdict itself ({"grading": [...], ...});
//   - an object keyed by leaf id: {"<id>": 0|1} or
//     {"<id>": {"score": 0|1, "failed": bool, "reason": "..."}};
//   - the original's graded tree (openai/preparedness' grader output): a
//     rubric node with "id" and "sub_tasks" whose leaves carry "score" and
//     "valid_score" (false: the judging failed) and "explanation".
//
// A score must be 0 or 1 (a failed leaf's score is ignored); a leaf id may
// appear once. Score checks that the grades are exactly the rubric's
// leaves.
func ParseLeafGrades(data []byte) (map[string]LeafGrade, error) {
	if len(data) > MaxGradesBytes {
		return nil, fmt.Errorf("leaf grades: %d bytes, more than %d", len(data), MaxGradesBytes)
	}
	t := bytes.TrimSpace(data)
	if len(t) == 0 {
		return nil, errors.New("leaf grades: empty")
	}
	out := map[string]LeafGrade{}
	switch t[0] {
	case '[':
		return out, parseRecords(t, out)
	case '{':
	default:
		return nil, errors.New("leaf grades: want a JSON list or object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(t, &obj); err != nil {
		return nil, fmt.Errorf("leaf grades: %w", err)
	}
	if g, ok := obj["grading"]; ok {
		return out, parseRecords(g, out)
	}
	if _, ok := obj["sub_tasks"]; ok {
		if err := parseGradedTree(t, out, "", 0); err != nil {
			return nil, err
		}
		return out, nil
	}
	for id, v := range obj {
		var n float64
		if err := json.Unmarshal(v, &n); err == nil {
			s, err := leafScore(id, n)
			if err != nil {
				return nil, err
			}
			out[id] = LeafGrade{Score: s}
			continue
		}
		var r gradeRecord
		if err := strictUnmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("leaf grades: leaf %q: want 0, 1 or {\"score\", \"failed\", \"reason\"}: %w", id, err)
		}
		r.ID = id
		if err := addRecord(r, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type gradeRecord struct {
	ID       string   `json:"id"`
	Score    *float64 `json:"score"`
	Failed   bool     `json:"failed"`
	Reason   string   `json:"reason"`
	Category string   `json:"category"`
	// A repronet leaf record's other fields, read and not used.
	Auto        bool            `json:"auto"`
	Files       []string        `json:"files"`
	Explanation string          `json:"explanation"`
	Second      json.RawMessage `json:"second"`
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func parseRecords(data []byte, out map[string]LeafGrade) error {
	var recs []json.RawMessage
	if err := json.Unmarshal(data, &recs); err != nil {
		return fmt.Errorf("leaf grades: %w", err)
	}
	for i, raw := range recs {
		var r gradeRecord
		if err := strictUnmarshal(raw, &r); err != nil {
			return fmt.Errorf("leaf grades: record %d: %w", i, err)
		}
		if r.ID == "" {
			return fmt.Errorf("leaf grades: record %d has no id", i)
		}
		if err := addRecord(r, out); err != nil {
			return err
		}
	}
	return nil
}

func addRecord(r gradeRecord, out map[string]LeafGrade) error {
	if _, dup := out[r.ID]; dup {
		return fmt.Errorf("leaf grades: leaf %q graded twice", r.ID)
	}
	if r.Failed {
		out[r.ID] = LeafGrade{Failed: true, Reason: r.Reason}
		return nil
	}
	if r.Score == nil {
		return fmt.Errorf("leaf grades: leaf %q has no score and is not failed", r.ID)
	}
	s, err := leafScore(r.ID, *r.Score)
	if err != nil {
		return err
	}
	out[r.ID] = LeafGrade{Score: s}
	return nil
}

func leafScore(id string, v float64) (int, error) {
	if v != 0 && v != 1 || math.IsNaN(v) {
		return 0, fmt.Errorf("leaf grades: leaf %q: score %v, want 0 or 1", id, v)
	}
	return int(v), nil
}

// gradedNode is a node of the original's graded tree, as far as grading
// needs it.
type gradedNode struct {
	ID          string            `json:"id"`
	Score       *float64          `json:"score"`
	ValidScore  *bool             `json:"valid_score"`
	Explanation string            `json:"explanation"`
	SubTasks    []json.RawMessage `json:"sub_tasks"`
}

func parseGradedTree(data []byte, out map[string]LeafGrade, path string, depth int) error {
	if depth > MaxRubricDepth {
		return fmt.Errorf("leaf grades: graded tree deeper than %d at %s", MaxRubricDepth, path)
	}
	var n gradedNode
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("leaf grades: graded tree at %q: %w", path, err)
	}
	if n.ID == "" {
		return fmt.Errorf("leaf grades: graded tree: a node without id under %q", path)
	}
	if len(n.SubTasks) > 0 {
		for _, c := range n.SubTasks {
			if err := parseGradedTree(c, out, path+"/"+n.ID, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	r := gradeRecord{ID: n.ID, Score: n.Score}
	if n.ValidScore != nil && !*n.ValidScore {
		r.Failed, r.Reason = true, "valid_score false: "+n.Explanation
	}
	return addRecord(r, out)
}
