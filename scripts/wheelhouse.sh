#!/usr/bin/env bash
# Build a wheelhouse for a host without network, on a machine with network; scripts/setup.sh then
# installs from it alone (RECSYS_WHEELHOUSE=DIR: pip --no-index).
#
#   bash scripts/wheelhouse.sh OUT [options]
#     --python 3.12          the target's Python (default: this python3's)
#     --torch VERSION        a supported torch (recsys/runtime/stack.py), or "preinstalled": the target has
#                            it already, so no torch and none of its CUDA libraries are carried
#                            (default: the pinned 2.13.0)
#     --variant cpu|cuda     FBGEMM's build (default cpu)
#     --cuda cu130           the PyTorch CUDA index of a cuda variant's torch and fbgemm-gpu
#                            (default cu128)
#     --platform TAG         the target's platform (default manylinux_2_28_x86_64)
#     --part-mb N            also write OUT/parts/: one tar split into N MiB parts + SHA256SUMS,
#                            for hosts that take only small uploads (join them with --join)
#
#   bash scripts/wheelhouse.sh --join PARTS OUT   check the parts' SHA256SUMS, unpack into OUT
#
# The target then runs: RECSYS_WHEELHOUSE=OUT/wheels RECSYS_TORCH=... bash scripts/setup.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[wheelhouse] %s\n' "$*" >&2; }

join_parts() {
    local parts=$1 out=$2
    (cd "$parts" && sha256sum -c --quiet SHA256SUMS) || {
        log "error: a part in $parts is missing or damaged (SHA256SUMS does not match); nothing unpacked"
        exit 1
    }
    mkdir -p "$out.partial"
    cat "$parts"/wheels.tar.part* | tar -xf - -C "$out.partial"
    mv "$out.partial" "$out"
    log "unpacked into $out (wheels in $out/wheels)"
}

if [[ ${1:-} == --join ]]; then
    join_parts "${2:?PARTS}" "${3:?OUT}"
    exit 0
fi

out=${1:?usage: wheelhouse.sh OUT [--python V] [--torch V|preinstalled] [--variant cpu|cuda] [--cuda cuXXX] [--platform TAG] [--part-mb N]}
shift
pyver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
torch_choice=2.13.0 variant=cpu cuda=cu128 platform=manylinux_2_28_x86_64 part_mb=""
while (($#)); do
    case $1 in
        --python) pyver=$2 ;;
        --torch) torch_choice=$2 ;;
        --variant) variant=$2 ;;
        --cuda) cuda=$2 ;;
        --platform) platform=$2 ;;
        --part-mb) part_mb=$2 ;;
        *) log "unknown option $1"; exit 2 ;;
    esac
    shift 2
done
[[ $variant == cpu || $variant == cuda ]] || { log "--variant must be cpu or cuda, not $variant"; exit 2; }

# the pair for the target's torch (a preinstalled torch's version is needed only to pick it)
tv=$torch_choice
if [[ $torch_choice == preinstalled ]]; then
    tv=${RECSYS_TARGET_TORCH:?--torch preinstalled: set RECSYS_TARGET_TORCH to the target torch version, e.g. 2.11.0+cu130}
fi
read -r torch_pin torchrec_pin fbgemm_pin <<< "$(python3 "$root/recsys/runtime/stack.py" pair "$tv")"
fbgemm=fbgemm-gpu-cpu
[[ $variant == cuda ]] && fbgemm=fbgemm-gpu
fbgemm_pin="$fbgemm==${fbgemm_pin#fbgemm==}"

rm -rf "$out.partial" && mkdir -p "$out.partial/wheels"
dl=(quiet_download --quiet --only-binary=:all: --python-version "$pyver" --implementation cp
    --platform "$platform" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d "$out.partial/wheels")
quiet_download() { python3 -m pip download "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
index=()
[[ $variant == cuda ]] && index=(--index-url "https://download.pytorch.org/whl/$cuda")

log "target: Python $pyver, torch $tv ($torch_choice), $torchrec_pin, $fbgemm_pin, $platform"
python3 "$root/recsys/runtime/stack.py" requirements --build dev > "$out.partial/requirements.txt"
# pip resolves the dependencies of every requirement (torchmetrics needs a torch: with a
# preinstalled torch, the torch and CUDA wheels it brings are removed afterwards)
if [[ $torch_choice != preinstalled ]]; then
    "${dl[@]}" --no-deps "$torch_pin" "${index[@]}"
fi
"${dl[@]}" --no-deps "$fbgemm_pin" "${index[@]}"
"${dl[@]}" --no-deps "$torchrec_pin"
"${dl[@]}" -r "$out.partial/requirements.txt" "${torch_pin}"
if [[ $torch_choice == preinstalled ]]; then
    rm -f "$out.partial"/wheels/torch-* "$out.partial"/wheels/nvidia_* "$out.partial"/wheels/triton-*
fi
rm -rf "$out" && mv "$out.partial" "$out"
log "$(ls "$out/wheels" | wc -l) wheels, $(du -sh "$out/wheels" | cut -f1), in $out/wheels"

if [[ -n $part_mb ]]; then
    mkdir -p "$out/parts"
    (cd "$out" && tar -cf - wheels) | split -b "${part_mb}m" -d -a 3 - "$out/parts/wheels.tar.part"
    (cd "$out/parts" && sha256sum wheels.tar.part* > SHA256SUMS)
    log "$(ls "$out"/parts/wheels.tar.part* | wc -l) parts of at most $part_mb MiB in $out/parts"
fi
