"""The pipeline state machine (``tests/unit/streams/test_pipeline_machine.py``) at a size the
test command cannot afford: the same hypothesis machine, more examples. (not a test)

    .venv/bin/python benchmarks/machine.py [--examples 1000] [--steps 30] [--smoke]

The test command runs it with 100 examples; the nightly size is 1,000 (10x). Prints a table
and, last, one JSON line: examples, steps, seconds, passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/unit/streams/test_pipeline_machine.py::test_the_pipeline_through_faults"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="20 examples")
    args = parser.parse_args()
    examples = 20 if args.smoke else args.examples
    env = {**os.environ, "MEMSTREAM_MACHINE_EXAMPLES": str(examples),
           "MEMSTREAM_MACHINE_STEPS": str(args.steps)}
    began = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - began, 1)
    passed = run.returncode == 0
    if not passed:
        print(run.stdout[-6000:], run.stderr[-2000:], sep="\n", file=sys.stderr)
    print("| examples | steps | seconds | passed |\n|---|---|---|---|")
    print(f"| {examples} | {args.steps} | {seconds} | {passed} |")
    print(json.dumps({"examples": examples, "steps": args.steps, "seconds": seconds,
                      "passed": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
