#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment with the pinned stack.
#
#   bash scripts/setup.sh            # idempotent: a second run with nothing to do takes seconds
#
# Environment:
#   RECSYS_VENV     where the venv lives (default: .venv in the project folder)
#   RECSYS_PYTHON   the interpreter that creates it (default: python3)
#   RECSYS_FBGEMM   cpu | cuda | auto (default auto: cuda when nvidia-smi lists a GPU, else cpu)
#   RECSYS_CUDA     the PyTorch CUDA wheel index for cuda installs: cu126 | cu128 | ... (default
#                   cu128); torch and fbgemm-gpu both come from
#                   https://download.pytorch.org/whl/$RECSYS_CUDA, as FBGEMM's install docs ask,
#                   so their CUDA builds match
#
# Why the dance with FBGEMM: torchrec declares the CUDA build `fbgemm-gpu`, which fails to import on a
# host whose torch has no CUDA (libtorch_cuda.so missing). There `fbgemm-gpu-cpu` must be installed in
# its place, not beside it (both write the same `fbgemm_gpu/` folder). So on such hosts torchrec is
# installed with --no-deps and its other dependencies come from pyproject.toml.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${RECSYS_VENV:-$root/.venv}
python=${RECSYS_PYTHON:-python3}
want=${RECSYS_FBGEMM:-auto}
cuda=${RECSYS_CUDA:-cu128}
stamp=$venv/.recsys-setup-stamp

log() { printf '[setup] %s\n' "$*" >&2; }

fingerprint() {
    cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1
}

ensure_venv() {
    if [[ ! -x $venv/bin/python ]]; then
        log "creating virtual environment at $venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
    fi
}

host_variant() {
    # cuda when this machine has an NVIDIA GPU (nvidia-smi lists one), else cpu
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
        echo cuda
    else
        echo cpu
    fi
}

project_requirements() {
    # Every requirement of the project (core + the given extras) except torchrec itself.
    "$venv/bin/python" - "$root/pyproject.toml" "$@" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"])
for extra in sys.argv[2:]:
    reqs += project["optional-dependencies"][extra]
print("\n".join(r for r in reqs if not r.lower().startswith("torchrec")))
PY
}

quiet_pip() {
    # pip install, minus the noise of mirror folders that lack a package.
    "$venv/bin/python" -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

install_stack() {
    local pip=(quiet_pip)
    local variant=$want
    [[ $variant == auto ]] && variant=$(host_variant)
    log "FBGEMM variant: $variant"
    if [[ $variant == cuda ]]; then
        local index=https://download.pytorch.org/whl/$cuda
        log "installing torch==2.13.0 and fbgemm-gpu==1.8.0 from $index"
        "$venv/bin/python" -m pip uninstall --quiet -y fbgemm-gpu-cpu 2>/dev/null || true
        # a CPU torch (2.13.0+cpu) satisfies ==2.13.0 and would stay: remove it first
        if "$venv/bin/python" -W ignore -c 'import sys, torch; sys.exit(bool(torch.version.cuda))' 2>/dev/null; then
            "$venv/bin/python" -m pip uninstall --quiet -y torch
        fi
        "${pip[@]}" torch==2.13.0 fbgemm-gpu==1.8.0 --index-url "$index"
        "${pip[@]}" -e "$root[cuda,dev]"
    else
        log "installing torch==2.13.0"
        "${pip[@]}" torch==2.13.0
        "$venv/bin/python" -m pip uninstall --quiet -y fbgemm-gpu 2>/dev/null || true
        project_requirements cpu dev > "$venv/requirements-cpu.txt"
        "${pip[@]}" -r "$venv/requirements-cpu.txt"
        "${pip[@]}" --no-deps torchrec==1.8.0
        "${pip[@]}" --no-deps -e "$root"
    fi
}

main() {
    ensure_venv
    if [[ -f $stamp && $(cat "$stamp") == "$(fingerprint)-$want-$cuda" ]]; then
        log "environment up to date ($venv)"
    else
        install_stack
        fingerprint | sed "s/\$/-$want-$cuda/" > "$stamp.tmp"
    fi
    # Prove the result: torchrec imports and one FBGEMM op runs.
    "$venv/bin/python" -m recsys.env_check
    [[ -f $stamp.tmp ]] && mv "$stamp.tmp" "$stamp"
    return 0
}

main "$@"
