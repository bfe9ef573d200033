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
#   RECSYS_TORCH    pinned | preinstalled | a supported version such as 2.11 (default pinned:
#                   torch 2.13.0). preinstalled keeps the torch that $RECSYS_PYTHON already has (a
#                   cluster image's): the venv sees it (--system-site-packages) and gets the
#                   torchrec and FBGEMM that pair with it. recsys/runtime/stack.py holds the pairs; any
#                   other torch is refused before anything is installed.
#   RECSYS_WHEELHOUSE  a folder of wheels (scripts/wheelhouse.sh builds one): everything is
#                   installed from it alone (pip --no-index), no network
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
torch_choice=${RECSYS_TORCH:-pinned}
wheelhouse=${RECSYS_WHEELHOUSE:-}
stamp=$venv/.recsys-setup-stamp

log() { printf '[setup] %s\n' "$*" >&2; }

fingerprint() {
    cat "$root/pyproject.toml" "$root/scripts/setup.sh" "$root/recsys/runtime/stack.py" | sha256sum | cut -d' ' -f1
}

settings() { echo "$want-$cuda-$torch_choice-${wheelhouse:+wheelhouse}"; }

ensure_venv() {
    if [[ ! -x $venv/bin/python ]]; then
        local shared=()
        [[ $torch_choice == preinstalled ]] && shared=(--system-site-packages)
        log "creating virtual environment at $venv ${shared[*]}"
        "$python" -m venv "${shared[@]}" "$venv"
        [[ -n $wheelhouse ]] || "$venv/bin/python" -m pip install --quiet --upgrade pip 2> >(pip_noise)
        if [[ $torch_choice == preinstalled ]]; then see_host_packages; fi
    fi
    return 0
}

see_host_packages() {
    # --system-site-packages reaches the base interpreter's packages; where $python is itself a
    # venv's (the image's torch lives in that venv), a .pth file adds its site-packages after ours
    if "$python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
        local purelib
        purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$python" -c 'import site; print("\n".join(site.getsitepackages()))' > "$purelib/recsys-host.pth"
        log "the venv also sees $python's packages ($purelib/recsys-host.pth)"
    fi
    return 0
}

torch_version() {
    # The torch version to build on: the preinstalled one, the pinned one, or the one asked for.
    case $torch_choice in
        pinned) echo 2.13.0 ;;
        preinstalled)
            "$python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null || {
                log "RECSYS_TORCH=preinstalled, but $python cannot import torch"; return 1; } ;;
        *) echo "$torch_choice" ;;
    esac
}

host_variant() {
    # cuda when this machine has an NVIDIA GPU (nvidia-smi lists one), else cpu
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
        echo cuda
    else
        echo cpu
    fi
}

pip_noise() {
    # pip's stderr minus the noise: mirror folders that lack a package, and setuptools' ten-line
    # warning on editable installs (a folder named like the package in the working directory
    # could shadow it), which here is this project's own folder: one line says what it means.
    awk '
        /is ignored: it is neither/ { next }
        /BuildBackendWarning: Editable installation/ {
            print "[setup] note: recsys is installed in editable mode: it runs from this folder, edits here take effect"
            skip = 1; next
        }
        skip && /with strategy, WheelFile/ { skip = 0; next }
        skip { next }
        { print }
    ' >&2
}

quiet_pip() {
    # pip install (from the wheelhouse alone when there is one), minus the noise (pip_noise).
    local source=()
    [[ -n $wheelhouse ]] && source=(--no-index --find-links "$wheelhouse")
    "$venv/bin/python" -m pip install --quiet "${source[@]}" "$@" 2> >(pip_noise)
}

resolve_pair() {
    # Sets tv, torch_pin, torchrec_pin, fbgemm_pin; refuses an unsupported torch before anything
    # is created or installed.
    local pins
    tv=$(torch_version) || exit 1
    pins=$("$python" "$root/recsys/runtime/stack.py" pair "$tv") || exit 1
    read -r torch_pin torchrec_pin fbgemm_pin <<< "$pins"
    fbgemm_pin=${fbgemm_pin#fbgemm==}
}

install_stack() {
    local variant=$want
    [[ $variant == auto ]] && variant=$(host_variant)
    log "torch $tv ($torch_choice): $torchrec_pin, FBGEMM $fbgemm_pin ($variant)${wheelhouse:+, from $wheelhouse}"
    local index=() other=fbgemm-gpu fbgemm=fbgemm-gpu-cpu
    if [[ $variant == cuda ]]; then
        other=fbgemm-gpu-cpu fbgemm=fbgemm-gpu
        if [[ -z $wheelhouse ]]; then
            index=(--index-url "https://download.pytorch.org/whl/$cuda")
            # name the wheel an index lacks (a CUDA variant that does not build this torch for
            # this Python) before pip's generic "no matching distribution"
            if [[ $torch_choice != preinstalled ]]; then
                "$python" "$root/recsys/runtime/stack.py" cuda-wheels "$tv" "$cuda" "${index[1]}" || exit 1
            fi
        fi
    fi
    "$venv/bin/python" -m pip uninstall --quiet -y "$other" 2>/dev/null || true
    if [[ $torch_choice != preinstalled ]]; then
        # a CPU torch satisfies ==X.Y.Z and would stay where a CUDA one is wanted: remove it first
        if [[ $variant == cuda ]] && "$venv/bin/python" -W ignore -c 'import sys, torch; sys.exit(bool(torch.version.cuda))' 2>/dev/null; then
            "$venv/bin/python" -m pip uninstall --quiet -y torch
        fi
        quiet_pip "$torch_pin" "${index[@]}"
    fi
    quiet_pip "$fbgemm==$fbgemm_pin" "${index[@]}"
    # torchrec declares the CUDA fbgemm-gpu and the project pins the default pair: both go in
    # without dependencies, and everything else they need comes from pyproject.toml
    "$venv/bin/python" "$root/recsys/runtime/stack.py" requirements dev > "$venv/requirements.txt"
    quiet_pip -r "$venv/requirements.txt"
    quiet_pip --no-deps "$torchrec_pin"
    quiet_pip --no-deps -e "$root"
}

main() {
    resolve_pair
    ensure_venv
    if [[ -f $stamp && $(cat "$stamp") == "$(fingerprint)-$(settings)" ]]; then
        log "environment up to date ($venv)"
    else
        install_stack
        echo "$(fingerprint)-$(settings)" > "$stamp.tmp"
    fi
    # Prove the result: torchrec imports and one FBGEMM op runs.
    "$venv/bin/python" -m recsys.runtime.env_check
    [[ -f $stamp.tmp ]] && mv "$stamp.tmp" "$stamp"
    return 0
}

main "$@"
