#!/usr/bin/env bash
# The project's entry points. Each sets up the environment first (idempotent, seconds when done).
#
#   ./run.sh sweep [sweep.py args]   set up, then run the default sweep (local Ray, local MLflow)
#   ./run.sh test  [pytest args]     set up, then lint, type-check and run the test suite
#   ./run.sh train [train.py args]   set up, then train one configuration (the debug experiment)
#   ./run.sh setup                   only set up the environment (.venv)
#   ./run.sh test-clusters [pytest args]  the multi-node tests of minutes each (a trial across
#                                    nodes, a lost node under a sweep, a Ray job); not run by CI
#   ./run.sh test-extended [pytest args]  those and the end-to-end cases of minutes whose path the
#                                    suite covers otherwise (marker `extended`); not run by CI
#   ./run.sh gpu-check [item ...]    on a GPU host: set up the CUDA stack, run the GPU-only checks
#   ./run.sh test-compat 2.11 [pytest args]  the suite on another supported torch (recsys/runtime/stack.py),
#                                    in its own venv (.venv-torch2.11); not run by CI
#   ./run.sh test-offline            build a CPU wheelhouse for this host, set up a fresh venv from
#                                    it with no index and no network, run the offline checks
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
        bash scripts/test_services.sh   # PostgreSQL for the tests' tracking server
        "$py" -m ruff check .
        "$py" -m ruff format --check .
        "$py" -m mypy
        # the files spread over 2 processes (RECSYS_TEST_PROCS; `-n 0` in the args: one), in the
        # units of work and the order tests/conftest.py gives them (tests/ray/ is three units)
        exec "$py" -m pytest -n "${RECSYS_TEST_PROCS:-2}" --dist loadfile --no-loadscope-reorder "$@" ;;
    test-clusters)
        # the multi-node tests of minutes each, which ./run.sh test skips (marker `clusters`)
        bash scripts/setup.sh
        RECSYS_CLUSTER_TESTS=1 exec "$py" -m pytest -n 0 -m clusters tests/ray "$@" ;;
    test-extended)
        # the `clusters` and `extended` tests, which ./run.sh test skips (Ray's one at a time)
        bash scripts/setup.sh
        bash scripts/test_services.sh
        RECSYS_CLUSTER_TESTS=1 RECSYS_EXTENDED_TESTS=1 exec "$py" -m pytest -n 0 \
            -m "clusters or extended" "$@" ;;
    gpu-check)
        if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
            python3 scripts/gpu_check.py --list
            echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi lists none); nothing was run" >&2
            exit 1
        fi
        RECSYS_FBGEMM=cuda bash scripts/setup.sh   # also runs FBGEMM's CUDA kernels (env_check)
        exec "$py" scripts/gpu_check.py "$@" ;;
    test-compat)
        version=${1:?usage: ./run.sh test-compat TORCH_VERSION [pytest args]}
        shift
        export RECSYS_VENV=$PWD/.venv-torch$version RECSYS_TORCH=$version
        bash scripts/setup.sh
        exec "$RECSYS_VENV/bin/python" -m pytest "$@" ;;
    test-offline)
        bash scripts/offline_check.sh "$@" ;;
    *)
        echo "usage: ./run.sh {sweep|test|train|setup|gpu-check|test-clusters|test-extended|test-compat|test-offline} [args...]" >&2
        exit 2 ;;
esac
