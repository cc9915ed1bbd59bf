// Package sample owns the stand-in HeurekaBench suite of tests and demos:
// question files in the published format (one paper, "paperT": three
// multiple-choice questions, one with two correct options, and two
// open-ended ones), the paper's stand-in datasets (small text files under
// the published names' base names, cells.h5ad and markers.txt), the
// sample agent ("analyst": a busybox script that analyses the datasets
// with awk and answers in <solution></solution>, listing letters as
// "B, D"; it cannot analyse one multiple-choice question and leaves it
// unanswered), and the scripted judge (package modelsim): it rates the
// first open-ended answer 4 with the rating token's log-probabilities and
// the second 2 without any, as a provider that returns none.
//
// Expected metrics, by hand (see the tests): MCQ accuracy 1/3 under
// heureka-mcq-published@2 ("B, D" predicts {"B", " D"}) and 2/3 under
// heureka-mcq-trimmed@1; OEQ mean (Weighted + 2)/2, one weighted score
// and one plain.
//
// Nothing here does I/O but reading the busybox binary for the image.
package sample

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"math"
	"sort"
	"time"

	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/modelsim"
)

//go:embed agents
var agents embed.FS

// Paper is the stand-in paper's key; Agent the sample agent's name;
// JudgeModel the scripted judge.
const (
	Paper      = "paperT"
	Agent      = "analyst"
	JudgeModel = "heureka-judge"
)

var data = map[string]string{
	"benchmark/scdata/paperT/data/cells.h5ad":  "Shares of neoplastic cell states before and after chemotherapy (stand-in: state before after)",
	"benchmark/scdata/paperT/data/markers.txt": "Marker genes per cell state (stand-in: state gene score)",
}

// Datasets are the stand-in datasets by base name.
func Datasets() map[string]string {
	return map[string]string{
		"cells.h5ad":  "state before after\nADRN-baseline 0.40 0.20\nADRN-calcium 0.20 0.45\nADRN-proliferating 0.30 0.10\nMES 0.10 0.25\n",
		"markers.txt": "state gene score\nADRN-baseline PHOX2B 0.91\nADRN-calcium CACNA1D 0.77\nMES YAP1 0.88\n",
	}
}

func insight(summary, qkey, text string) map[string]any {
	return map[string]any{"summary": summary, "how": "Stand-in: computed from the stand-in datasets.",
		"relevant": "Stand-in: no paper text.", "data": data, qkey: text}
}

// MCQText are the multiple-choice questions as the file holds them.
const (
	MCQIncrease = "**Question1:** Which neoplastic cell states increase in proportion after chemotherapy?\n" +
		"A) ADRN-baseline\nB) ADRN-calcium\nC) ADRN-proliferating\nD) MES\n\n**Answer1:**B,D\n\n" +
		"**Question2:** Which cell state has the largest proportion after chemotherapy?\n" +
		"A) ADRN-calcium\nB) MES\nC) ADRN-baseline\nD) ADRN-proliferating\n\n**Answer2:** A\n"
	MCQMarker = "**Question1:** Which gene is most specific to the mesenchymal state across patients?\n" +
		"A) PHOX2B\nB) HAND2\nC) YAP1\nD) GATA2\n\n**Answer1:** C\n"
)

// MCQFile is the stand-in mcq.json.
func MCQFile() []byte {
	b, _ := json.MarshalIndent(map[string]any{Paper: map[string]any{
		"insight #1": insight("ADRN-calcium and MES states expand after chemotherapy.", "mcq_question", MCQIncrease),
		"insight #2": insight("YAP1 marks the mesenchymal state.", "mcq_question", MCQMarker),
	}}, "", "  ")
	return b
}

// The open-ended questions (their texts mark the judge's requests).
const (
	OEQShift  = "How do the proportions of the neoplastic cell states change after chemotherapy?"
	OEQMarker = "Which marker gene characterises the mesenchymal (MES) state in these data?"
)

// OEQFile is the stand-in oeq.json.
func OEQFile() []byte {
	b, _ := json.MarshalIndent(map[string]any{Paper: map[string]any{
		"insight #1": insight("ADRN-calcium and MES states expand after chemotherapy.", "oe_question",
			"**Question1:** "+OEQShift+"\n\n**Answer1:** ADRN-calcium and MES states increase after chemotherapy, while ADRN-baseline and ADRN-proliferating decrease.\n"),
		"insight #2": insight("YAP1 marks the mesenchymal state.", "oe_question",
			"**Question1:** "+OEQMarker+"\n\n**Answer1:** YAP1 is the marker of MES cells.\n"),
	}}, "", "  ")
	return b
}

// DataTarball is the content of the paper's datasets: a gzip'd tar of the
// stand-in files at its top, deterministic.
func DataTarball() ([]byte, error) {
	files := Datasets()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, n := range names {
		h := &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n])),
			ModTime: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// AgentImage builds the analyst's image from the busybox binary.
func AgentImage(busybox string) ([]byte, error) {
	files, err := agentimage.Script(agents, "agents", []string{Agent}, Agent)
	if err != nil {
		return nil, err
	}
	return agentimage.Build(Agent, busybox, files)
}

// RatingLogprobs are the scripted alternatives of the first open-ended
// answer's rating token: 4 most likely, then 5 and 3.
var RatingLogprobs = []modelsim.Logprob{{Token: "4", Logprob: -0.1}, {Token: "5", Logprob: -2.5}, {Token: "3", Logprob: -3.0}}

// WeightedRating is the published probability-weighted rating of
// RatingLogprobs, by hand: sum of p_i r_i, p_i = exp(l_i) / sum exp(l_j).
func WeightedRating() float64 {
	z := math.Exp(-0.1) + math.Exp(-2.5) + math.Exp(-3.0)
	return (4*math.Exp(-0.1) + 5*math.Exp(-2.5) + 3*math.Exp(-3.0)) / z
}

// Judgements are the scripted judge's answers.
const (
	shiftFacts = "<facts>\nF1: PRESENT | ADRN-calcium increases after chemotherapy\nF2: PRESENT | MES increases after chemotherapy\n" +
		"F3: PARTIAL | ADRN-baseline and ADRN-proliferating decrease\n</facts>\n"
	markerJudgement = "<facts>\nF1: PARTIAL | YAP1 marks MES cells\n</facts>\n<rating>2</rating>"
)

// Script is the scripted judge.
func Script() modelsim.Script {
	return modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{Model: JudgeModel, AnyContains: OEQShift}, Reply: modelsim.Reply{
			Content:       shiftFacts + "<rating>4</rating>",
			ContentTokens: []string{shiftFacts + "<rating>", "4", "</rating>"},
			TopLogprobs:   [][]modelsim.Logprob{nil, RatingLogprobs}}},
		{When: modelsim.Cond{Model: JudgeModel, AnyContains: OEQMarker}, Reply: modelsim.Reply{Content: markerJudgement, NoLogprobs: true}},
	}}
}
