#!/usr/bin/env bash
# The project's entry points. Each sets up the environment first (idempotent, seconds when done).
#
#   ./run.sh sweep [sweep.py args]   set up, then run the default sweep (local Ray, local MLflow)
#   ./run.sh test  [pytest args]     set up, then lint, type-check and run the test suite
#   ./run.sh setup                   only set up the environment (.venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
verb=${1:-}
shift || true
py=${RECSYS_VENV:-$PWD/.venv}/bin/python

case $verb in
    setup)
        bash scripts/setup.sh ;;
    sweep)
        bash scripts/setup.sh
        exec "$py" experiments/sweep.py "$@" ;;
    train)
        bash scripts/setup.sh
        exec "$py" experiments/train.py "$@" ;;
    test)
        bash scripts/setup.sh
        "$py" -m ruff check .
        "$py" -m ruff format --check .
        "$py" -m mypy
        exec "$py" -m pytest "$@" ;;
    *)
        echo "usage: ./run.sh {sweep|test|train|setup} [args...]" >&2
        exit 2 ;;
esac
