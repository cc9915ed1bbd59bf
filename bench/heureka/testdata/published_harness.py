"""Runs HeurekaBench's published evaluate_agent_answer.py on given answers.

repronet's own test harness (not the published code): it imports the
published script from the path given on the command line, with stand-ins
for what it needs but does not use to compute scores (OpenAI's client, which
here returns the synthetic judge answers it is given; dotenv; the prompt
module, whose template here is the answer itself; pandas' CSV output; the
two-second sleep), runs its own functions (main for multiple choice,
main_non_batch for open-ended) and prints, as JSON, every figure those
functions compute, read from their local variables when they return.

Input (stdin, JSON): {"script": path, "dataset": path, "kind": "mcq"|"oe",
"cases": [{"results": {paper: {insight: {QuestionN: answer}}},
"judge": {answer: {"content": str, "logprobs": [{"token": str,
"top_logprobs": [{"token": str, "logprob": float}]}] or null}}}]}.
Output: one object per case: the figures, or {"error": "<exception>"}.
"""
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import types


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def stub_modules(judge):
    openai = types.ModuleType("openai")

    class Completions:
        def create(self, model, messages, **kw):
            answer = messages[1]["content"]
            r = judge[answer]
            lp = None
            if r.get("logprobs") is not None:
                lp = Obj(content=[Obj(token=t["token"], logprob=t.get("logprob", 0.0),
                                      top_logprobs=[Obj(token=a["token"], logprob=a["logprob"]) for a in (t.get("top_logprobs") or [])])
                                  for t in r["logprobs"]])
            return Obj(choices=[Obj(message=Obj(content=r["content"]), logprobs=lp)])

    class OpenAI:
        def __init__(self, api_key=None):
            self.chat = Obj(completions=Completions())

    openai.OpenAI = OpenAI
    dotenv = types.ModuleType("dotenv")
    dotenv.load_dotenv = lambda *a, **k: None
    geval = types.ModuleType("geval_prompts")
    geval.eval_prompts = Obj(get_g_eval_prompt=lambda method="basic": ("{answer}", "system"))
    pandas = types.ModuleType("pandas")
    pandas.DataFrame = lambda rows: Obj(to_csv=lambda *a, **k: None)
    sys.modules.update({"openai": openai, "dotenv": dotenv, "geval_prompts": geval,
                        "geval_prompts.eval_prompts": geval.eval_prompts, "pandas": pandas})


def load(script):
    spec = importlib.util.spec_from_file_location("published_eval", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.time = Obj(sleep=lambda s: None)
    mod.print = lambda *a, **k: None
    return mod


def run(fn, *args):
    """Calls fn and returns its local variables as it returned."""
    seen = {}

    def prof(frame, event, arg):
        if event == "return" and frame.f_code is fn.__code__:
            seen.update(frame.f_locals)

    sys.setprofile(prof)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


def main():
    req = json.load(sys.stdin)
    judge = {}
    stub_modules(judge)
    mod = load(req["script"])
    out = []
    with tempfile.TemporaryDirectory() as d:
        for case in req["cases"]:
            results = os.path.join(d, "results.json")
            with open(results, "w") as f:
                json.dump(case["results"], f)
            judge.clear()
            judge.update(case.get("judge") or {})
            try:
                if req["kind"] == "mcq":
                    v = run(mod.main, req["dataset"], results, "mcq")
                    out.append({"total": v["total"], "correct": v["correct"], "answered": v["total_answered"],
                                "accuracy": v["accuracy"], "macro_precision": v["macro_precision"],
                                "macro_recall": v["macro_recall"],
                                "macro_f1": statistics.mean(v["f1s"]) if v["f1s"] else None,
                                "micro_precision": v["micro_precision"], "micro_recall": v["micro_recall"],
                                "micro_f1": v["micro_f1"]})
                else:
                    v = run(mod.main_non_batch, req["dataset"], results, "oe")
                    out.append({"mean": v["final_score"],
                                "scores": {"%s/%s/%s" % (r["p_id"], r["i_id"], r["q_id"]): r["score"] for r in v["results"]}})
            except Exception as e:  # the published code's crash, named
                out.append({"error": "%s: %s" % (type(e).__name__, e)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
