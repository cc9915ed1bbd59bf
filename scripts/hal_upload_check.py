#!/usr/bin/python3
"""Runs HAL's own upload check on repronet's HAL exports.

HAL's leaderboard app (github.com/benediktstroebl/hal-frontend) checks an
uploaded <run_id>_UPLOAD.json with check_upload_structure in its
utils/processing.py before it ingests it. This script imports that module
from a copy of HAL's repository (nothing of it is copied into repronet)
and runs the check on each file given:

    scripts/hal_upload_check.py --processing HAL_FRONTEND/utils/processing.py FILE...

It prints one line per file and exits 1 if any file fails the check, 2 on
a usage error. The module imports aiofiles and tqdm (Debian:
python3-aiofiles, python3-tqdm) and the app's own agent_monitor package,
which pulls in OpenAI's client for the app's later LLM analysis of the
calls; check_upload_structure uses none of agent_monitor, so that package
is replaced by empty modules here.
"""

import argparse
import asyncio
import importlib.util
import sys
import types


def load_processing(path):
    for name in ("agent_monitor", "agent_monitor.monitor", "agent_monitor.failure_report"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["agent_monitor.monitor"].analyze_agent_steps = None
    sys.modules["agent_monitor.failure_report"].analyze_agent_performance = None
    sys.modules["agent_monitor.failure_report"].AsyncOpenAIClient = None
    spec = importlib.util.spec_from_file_location("hal_frontend_processing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processing", required=True, help="HAL leaderboard app's utils/processing.py")
    parser.add_argument("files", nargs="+", help="<run_id>_UPLOAD.json files")
    args = parser.parse_args()
    processing = load_processing(args.processing)
    failed = 0
    for path in args.files:
        result = asyncio.run(processing.check_upload_structure(path))
        print(f"{path}: is_valid={result['is_valid']}: {result['message']}")
        if not result["is_valid"]:
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
