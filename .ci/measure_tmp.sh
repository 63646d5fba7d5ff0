#!/usr/bin/env bash
# CI step: every command the README documents runs on exactly the install the README names for
# it, each from a fresh venv holding only that extra (cheaply: --help, one lab check, one
# chapter; the book is built for real). The main CI venv has [dev], which holds almost
# everything and so hides a missing dependency; these venvs do not.
#
#   base   pip install -e .              serve/generate/bench.* --help
#   labs   pip install -e '.[labs]'      jupyter lab exists; labs check 4 on the solutions
#   notebooks  pip install -e '.[notebooks]'  one chapter executed with nbclient
#   book   pip install -e '.[book]'      python tools/build_book.py (every chapter executed)
#
# pip stays quiet and uses its cache (the packages are the main venv's, downloaded once).
set -euo pipefail
cd "$(dirname "$0")/.."
step_start=$(date +%s)
venvs=$(mktemp -d "${TMPDIR:-/tmp}/blink_edu_ci_venvs.XXXXXX")
trap 'rm -rf "$venvs"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1

# fresh NAME SPEC: a new venv under $venvs with `pip install -e SPEC` and nothing else
fresh() {
    local t0=$(date +%s)
    python3 -m venv "$venvs/$1"
    "$venvs/$1/bin/python" -m pip install -qq -e "$2"
    echo "[documented commands] venv $1 ($2) installed in $(( $(date +%s) - t0 )) s"
}

# --- base install: the server, generate and the benchmarks answer --help ---
fresh base .
for module in serve generate bench.decode bench.persistent bench.kv_transfer bench.slo \
              bench.serve; do
    echo "+ python -m blink_edu.$module --help"
    "$venvs/base/bin/python" -m "blink_edu.$module" --help >/dev/null || echo "FAILED: $module --help"
done

# --- [labs]: installed on top of the base venv, which is what `pip install -e '.[labs]'` makes
# of a fresh one (base is a subset of it) ---
"$venvs/base/bin/python" -m pip install -qq -e '.[labs]'
echo "+ jupyter lab --version"
"$venvs/base/bin/jupyter" lab --version >/dev/null
echo "+ BLINK_EDU_LAB_SOLUTIONS=1 python -m blink_edu.labs check 4"
BLINK_EDU_LAB_SOLUTIONS=1 "$venvs/base/bin/python" -m blink_edu.labs check 4

# --- [notebooks]: one quick chapter, executed in the venv's own python3 kernel ---
fresh notebooks '.[notebooks]'
echo "+ jupyter execute notebooks/01_model.ipynb"
(cd notebooks && "$venvs/notebooks/bin/jupyter" execute 01_model.ipynb)

# --- [book]: the README's book command ---
fresh book '.[book]'
echo "+ python tools/build_book.py"
"$venvs/book/bin/python" tools/build_book.py

echo "[documented commands] finished in $(( $(date +%s) - step_start )) s"
