// Package heureka owns HeurekaBench's formats and rules as pure logic: the
// published question files (mcq.json, oeq.json and their _lite versions),
// the extraction of an agent's answer from its final message, the
// multiple-choice metrics under named graders, and the open-ended judge:
// its prompt, the parsing of its answer and the score from the rating and,
// when the provider returns them, the rating token's log-probabilities.
//
// It must not touch the network, files, containers, models or the
// coordinator's state: it takes bytes and strings and returns plain values,
// and the caller (the family's adapter) sends the judge's messages through
// the model gateway. It imports nothing of repronet.
//
// # Questions
//
// ParseMCQFile and ParseOEQFile read the files as published
// (mlbio-epfl/HeurekaBench, scheurekabench/benchmark/): papers, insights,
// then "**QuestionN:**" blocks keyed QuestionN within their insight. An
// insight's summary, how and relevant state its finding: they are gold and
// must never reach an agent; only the question (and options) and the data
// files do. Parsing is strict and every error names paper, insight and
// question.
//
// # Multiple choice
//
// ExtractSolution takes the last <solution>...</solution> of the final
// message. ScoreMCQ and AggregateMCQ compute accuracy (exact set),
// precision, recall and F1 per question, macro (mean over questions) and
// micro (pooled counts), under MCQPublished (the published
// evaluate_agent_answer.py exactly: split on "," only, so "B, D" fails; an
// unanswered question counted in accuracy and left out of every other
// figure) or MCQTrimmed (repronet's own: spaces trimmed; an unanswered
// question counts in every figure, as wrong with precision and recall 0,
// so that not answering never raises one). Origin says whose rule a
// grader is, for the boards; RegradeMCQ and RegradeOEQ grade files
// offline (repronet grade heureka).
//
// # Open-ended
//
// OEQJudgePrompt asks for the gold answer's atomic facts labelled PRESENT,
// PARTIAL, MISSING or INCORRECT and a rating 1-5 in <rating>N</rating>.
// ScoreOEQ reads the answer (ParseOEQJudgement) and scores it: with the
// rating token's top-3 log-probabilities, the probability-weighted rating
// (OEQPublished as the published code: the first token with the rating's
// text, normalised over all its alternatives, a non-digit one counting 0,
// an unanswered question left out of the mean, its crashes errors;
// OEQRatingTokens, repronet's: the token at the rating's place, the rating
// alternatives only, an unanswered question scored 1), otherwise the
// plain rating; OEQScore.Weighted says which, and SummariseOEQ reports the
// mix.
package heureka
