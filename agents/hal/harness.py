#!/usr/bin/python3
"""repronet's adapter for HAL agents (docs/agents.md, "HAL agents").

HAL's harness (princeton-pli/hal-harness) calls an agent as a Python
function run(input, **kwargs) in a folder holding the agent's files and the
task's files, and takes its return value as the answers. This script does
the same inside a repronet sandbox, for one CORE-Bench task:

- the workspace (the working folder) holds the prompt and one folder, the
  capsule, named by its task ID; the capsule is moved to environment/ and
  the agent's files are copied beside it, as HAL's runner lays them out;
- input is {task_id: {"prompt": the prompt, "files": {"/root/environment/
  REL": the file's path here, ...}, "gpu": whether a GPU is visible}};
  input.json and agent_args.json are written as HAL's runner writes them;
- kwargs are HAL_AGENT_ARGS, a JSON object (HAL's -A arguments); the
  function is HAL_AGENT_FUNCTION (HAL's --agent_function, "main.run"), in
  the agent folder HAL_AGENT_DIR;
- requirements.txt in the agent folder is installed with pip first
  (through the node's proxy, when the suite grants one), unless
  HAL_INSTALL_REQUIREMENTS=0;
- the return value's entry for the task (an answers object, or a JSON
  string of one) is written to report.json in the workspace.

Model access is the node's: OPENAI_BASE_URL and OPENAI_API_KEY (and
ANTHROPIC_*) are in the environment, so HAL agents using OpenAI's or
Anthropic's SDK, or plain HTTP, reach the gateway unchanged.

Exit status 0 when the answers were written, 1 when the agent failed or
returned nothing for the task, 2 when the workspace or settings are wrong.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import traceback

REPORT = "report.json"


class SetupError(Exception):
    """The workspace or the adapter's settings are not as the contract says."""


def settings():
    agent_dir = os.environ.get("HAL_AGENT_DIR", "/agent/agent")
    function = os.environ.get("HAL_AGENT_FUNCTION", "main.run")
    if "." not in function:
        raise SetupError(f"HAL_AGENT_FUNCTION {function!r}: want MODULE.FUNCTION")
    try:
        kwargs = json.loads(os.environ.get("HAL_AGENT_ARGS", "{}"))
    except json.JSONDecodeError as e:
        raise SetupError(f"HAL_AGENT_ARGS is not JSON: {e}") from e
    if not isinstance(kwargs, dict):
        raise SetupError("HAL_AGENT_ARGS: want a JSON object (HAL's agent arguments)")
    if not os.path.isdir(agent_dir):
        raise SetupError(f"HAL_AGENT_DIR {agent_dir}: no such folder")
    prompt_file = os.environ.get("PROMPT_FILE")
    if not prompt_file:
        raise SetupError("PROMPT_FILE is not set")
    with open(prompt_file, encoding="utf-8") as f:
        prompt = f.read()
    return agent_dir, function, kwargs, prompt


def task_folder(workspace):
    """The capsule: the workspace's one folder."""
    dirs = sorted(e.name for e in os.scandir(workspace) if e.is_dir(follow_symlinks=False))
    if len(dirs) != 1:
        raise SetupError(f"workspace {workspace}: want one task folder, found {dirs}")
    if dirs[0] == "environment":
        raise SetupError("workspace: the task folder is named environment")
    return dirs[0]


def lay_out(workspace, task_id, agent_dir):
    """HAL's layout: the task's files under environment/, the agent's beside it."""
    env = os.path.join(workspace, "environment")
    os.rename(os.path.join(workspace, task_id), env)
    files = {}
    for root, _, names in os.walk(env):
        for name in names:
            src = os.path.join(root, name)
            files["/root/environment/" + os.path.relpath(src, env)] = src
    for entry in os.scandir(agent_dir):
        dst = os.path.join(workspace, entry.name)
        if entry.name == "environment":
            raise SetupError("the agent's folder holds an environment/ of its own")
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, dst, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry.path, dst, follow_symlinks=False)
    return files


def install_requirements(workspace):
    req = os.path.join(workspace, "requirements.txt")
    if not os.path.exists(req) or os.environ.get("HAL_INSTALL_REQUIREMENTS") == "0":
        return
    print(f"hal adapter: pip install -r {req}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "--break-system-packages", "-r", req], check=True)


def load(workspace, function):
    module_name, function_name = function.rsplit(".", 1)
    path = os.path.join(workspace, *module_name.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or not os.path.exists(path):
        raise SetupError(f"HAL_AGENT_FUNCTION {function}: no {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, function_name, None)
    if not callable(fn):
        raise SetupError(f"HAL_AGENT_FUNCTION {function}: {module_name} has no function {function_name}")
    return fn


def answers_of(result, task_id):
    """The task's answers from run()'s return value, as HAL reads them."""
    if not isinstance(result, dict) or task_id not in result:
        raise ValueError(f"run() returned no answers for {task_id}: {str(result)[:500]}")
    answers = result[task_id]
    if isinstance(answers, str):
        try:
            answers = json.loads(answers)
        except json.JSONDecodeError as e:
            raise ValueError(f"run()'s answers for {task_id} are a string that is not JSON: {answers[:500]!r}") from e
    if not isinstance(answers, dict):
        raise ValueError(f"run()'s answers for {task_id}: want an object of answers, got {type(answers).__name__}")
    return answers


def main():
    workspace = os.getcwd()
    try:
        agent_dir, function, kwargs, prompt = settings()
        task_id = task_folder(workspace)
        files = lay_out(workspace, task_id, agent_dir)
        gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
        task = {"prompt": prompt, "files": files, "gpu": gpu}
        # As HAL's runner: the input with file names only, and the arguments.
        with open(os.path.join(workspace, "input.json"), "w", encoding="utf-8") as f:
            json.dump({task_id: dict(task, files={k: os.path.basename(v) for k, v in files.items()})}, f)
        with open(os.path.join(workspace, "agent_args.json"), "w", encoding="utf-8") as f:
            json.dump(kwargs, f)
        install_requirements(workspace)
        sys.path.insert(0, workspace)
        fn = load(workspace, function)
    except (SetupError, OSError, subprocess.CalledProcessError) as e:
        print(f"hal adapter: {e}", file=sys.stderr)
        return 2
    try:
        result = fn({task_id: task}, **kwargs)
        answers = answers_of(result, task_id)
    except Exception:  # the agent's failure: its traceback is the log
        traceback.print_exc()
        return 1
    # The agent may have changed folder; the report goes to the workspace.
    with open(os.path.join(workspace, REPORT), "w", encoding="utf-8") as f:
        json.dump(answers, f)
    print(f"hal adapter: {len(answers)} answers for {task_id} written to {REPORT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
