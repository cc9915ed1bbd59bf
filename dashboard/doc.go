// Package dashboard owns the web pages a coordinator serves to people: the
// leaderboards with their cost-accuracy Pareto charts, an agent's per-task
// results, evaluations with live progress (replays counted apart),
// attempts with their logs, outputs, readable trajectory and verification
// by replay, nodes and operators with their credit, reproducibility checks
// (with a draft check's values and draft spec), accounts, and the forms to sign in, push
// an agent and start an evaluation. Pages are rendered on the server from
// embedded templates, with SVG charts and one embedded style sheet: no
// script, nothing loaded from elsewhere.
//
// It also owns the views (views.go): what a reader sees of each thing, as
// plain data, which the coordinator's JSON API serves as they are, and the
// pure computations over them: boards from leaderboard entries (accuracy
// mean and min-max over runs, an evaluation's run 1 never merged with
// another's, written and vision accuracy, cost, tokens, runtime,
// cross-checked share, replay-verified units, the grader of the numbers,
// the cost-accuracy frontier on model cost or CPU time), per-task
// results, credit by node and operator, and messages read from model call
// bodies, each call's new part of a growing conversation marked.
//
// What a page shows is what the API says of the same object: the pages
// format the views' numbers (FormatPercent, FormatUSD, Hours, YesNo...)
// and decide nothing; a *bool verdict is never tested with if or with (a
// pointer to false is true there).
//
// It renders what it is given and decides nothing about who may see it:
// the coordinator fills the views for the reader's scope. It must not
// import the coordinator, libp2p, storage or any benchmark family.
package dashboard
