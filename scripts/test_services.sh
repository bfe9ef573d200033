#!/usr/bin/env bash
# What the tests need beside the venv:
#  - PostgreSQL's server programs (Debian's `postgresql`), for the tests' tracking server
#    (`mlflow server` over PostgreSQL on loopback, started and stopped by a fixture,
#    tests/servers.py);
#  - a headless browser (Debian's `chromium`, with `fonts-liberation`), that opens the MLflow UI
#    on the link a sweep prints (tests/browser.py).
# Each is found where installed; else installed with apt-get where this runs as root (or with
# password-less sudo), after saying what and why; else the tests that need it are skipped, saying
# why (`missing` in tests/servers.py, tests/browser.py). Never fatal.
#
# Environment:
#   RECSYS_NO_APT=1   never run apt-get: what is not installed already is not installed, and the
#                     tests that need it are skipped (tests/README.md lists them)
set -euo pipefail

log() { printf '[setup] %s\n' "$*" >&2; }
have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_chromium() {
    [[ -n ${RECSYS_CHROMIUM:-} ]] || command -v chromium >/dev/null 2>&1 ||
        command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}

# packages | apt-get options | why | what is skipped without them
wanted=()
have_postgres || wanted+=("postgresql||about 50 MB to download, 200 MB on disk on Debian 12, for the tests' own tracking server on 127.0.0.1 (mlflow server over PostgreSQL, started and stopped by the tests)|the PostgreSQL tracking tests will be skipped")
have_chromium || wanted+=("chromium fonts-liberation|--no-install-recommends|about 100 MB to download, 350 MB on disk, without its recommended packages, for the test that opens the MLflow UI in a headless browser|the browser test of the MLflow UI will be skipped")
[[ ${#wanted[@]} == 0 ]] && exit 0

skip_all() {
    local item
    for item in "${wanted[@]}"; do
        IFS='|' read -r packages _ _ skipped <<< "$item"
        log "$packages not found, and $1: $skipped"
    done
    exit 0
}
[[ ${RECSYS_NO_APT:-} == 1 ]] && skip_all "RECSYS_NO_APT=1: not installing it"
as_root=()
if [[ $(id -u) != 0 ]]; then
    if sudo -n true 2>/dev/null; then as_root=(sudo -n); else skip_all "apt-get needs root"; fi
fi
command -v apt-get >/dev/null 2>&1 || skip_all "no apt-get here"

out=$(mktemp)
if ! "${as_root[@]}" apt-get update -qq >"$out" 2>&1; then
    log "apt-get update failed (last lines below)"
    tail -5 "$out" >&2
fi
for item in "${wanted[@]}"; do
    IFS='|' read -r packages options why skipped <<< "$item"
    log "installing $packages (Debian packages, $why); set RECSYS_NO_APT=1 to skip (those tests" \
        "are then skipped)"
    # shellcheck disable=SC2086  # (the options and package names are words)
    if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $options \
        $packages >"$out" 2>&1; then
        log "apt-get could not install $packages (last lines below): $skipped"
        tail -5 "$out" >&2
    fi
done
rm -f "$out"
