#!/usr/bin/env bash
# The offline install, end to end on this (CPU) host: build a wheelhouse with network, split it into
# parts and join them, then set up a fresh venv from it with pip's index pointed at a dead address
# and no find-links or config (anything not in the wheelhouse fails), and run checks in that venv.
#
#   bash scripts/offline_check.sh [WORKDIR]      (./run.sh test-offline; WORKDIR is removed after)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-$(mktemp -d)}
trap 'rm -rf "$work"' EXIT
cd "$root"
start=$SECONDS
bash scripts/wheelhouse.sh "$work/house" --part-mb 60
bash scripts/wheelhouse.sh --join "$work/house/parts" "$work/joined"
built=$SECONDS
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=0 \
    RECSYS_VENV="$work/venv" RECSYS_WHEELHOUSE="$work/joined/wheels" bash scripts/setup.sh
installed=$SECONDS
# pip check, less the one known line: torchrec declares the CUDA fbgemm-gpu, fbgemm-gpu-cpu is
# installed in its place on a CPU host (scripts/setup.sh)
problems=$("$work/venv/bin/python" -m pip check 2>&1 | grep -v "^No broken requirements" \
    | grep -v "^torchrec [0-9.]* requires fbgemm-gpu, which is not installed" || true)
[[ -z $problems ]] || { echo "pip check: $problems" >&2; exit 1; }
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit/test_stack.py \
    "tests/distributed/test_resume.py::test_resume_is_exact_with_every_optimizer"
echo "offline check passed: wheelhouse $((built - start)) s ($(du -sh "$work/house/wheels" | cut -f1)," \
     "$(ls "$work/house/parts" | grep -c part) parts), offline setup $((installed - built)) s," \
     "checks $((SECONDS - installed)) s"
