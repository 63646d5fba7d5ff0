#!/usr/bin/env bash
# Every test on a GPU machine, in one call: the kernel tests run on the real GPU (the backend
# picks it) and the tests marked `gpu` (the graph executor, ...) run too. Notebooks are left to CI.
#   bash tools/run_gpu_tests.sh [test paths and pytest args; default: all of tests/]
set -euo pipefail
cd "$(dirname "$0")/.."
export BLINK_EDU_BACKEND=gpu PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -o addopts="" -m "not notebook" -p no:cacheprovider -q "${@:-tests}"
