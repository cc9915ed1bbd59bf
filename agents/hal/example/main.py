"""A small HAL-style CORE-Bench agent, standard library only.

HAL's harness calls run(input, **kwargs) with {task_id: {"prompt", "files",
"gpu"}} in a folder where the task's files are under environment/, and
takes {task_id: answers} back. This agent gives the model the prompt and
two tools, bash (run a command, see its output) and submit (the answers),
over OpenAI's chat completions API at OPENAI_BASE_URL with OPENAI_API_KEY,
through urllib. kwargs: model_name (required), max_steps (default 8).

It checks HAL's layout before it starts, so that it fails loudly where a
harness lays the task out otherwise.
"""

import json
import os
import subprocess
import urllib.request

TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command; see its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the answers: an object mapping each question to its answer.",
        "parameters": {"type": "object", "properties": {"answers": {"type": "object"}}, "required": ["answers"]}}},
]


def chat(model, messages):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    body = json.dumps({"model": model, "messages": messages, "tools": TOOLS}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.load(resp)


def check_layout(task):
    if not os.path.isdir("environment"):
        raise RuntimeError(f"no environment/ in {os.getcwd()}")
    for target, source in task["files"].items():
        if not target.startswith("/root/environment/"):
            raise RuntimeError(f"file {target} is not under /root/environment/")
        rel = target[len("/root/environment/"):]
        if not os.path.exists(os.path.join("environment", rel)) or not os.path.exists(source):
            raise RuntimeError(f"file {target} ({source}) is not in environment/")
    if not task["files"]:
        raise RuntimeError("the task has no files")


def solve(model, prompt, max_steps):
    messages = [{"role": "system", "content": "You answer questions about a scientific capsule, using the tools."},
                {"role": "user", "content": prompt}]
    for _ in range(max_steps):
        msg = chat(model, messages)["choices"][0]["message"]
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            return None
        for call in calls:
            args = json.loads(call["function"]["arguments"] or "{}")
            if call["function"]["name"] == "submit":
                return args["answers"]
            out = subprocess.run(["sh", "-c", args["command"]], capture_output=True, text=True, timeout=600)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": (out.stdout + out.stderr)[-20000:]})
    return None


def run(input, **kwargs):
    model = kwargs["model_name"]
    max_steps = int(kwargs.get("max_steps", 8))
    results = {}
    for task_id, task in input.items():
        check_layout(task)
        answers = solve(model, task["prompt"], max_steps)
        if answers is not None:
            # HAL's CORE-Bench agents often return a JSON string.
            results[task_id] = json.dumps(answers)
    return results
