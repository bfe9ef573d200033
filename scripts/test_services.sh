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
skipped_pg="the PostgreSQL tracking tests will be skipped"
skipped_browser="the browser test of the MLflow UI will be skipped"
have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_chromium() {
    [[ -n ${RECSYS_CHROMIUM:-} ]] || command -v chromium >/dev/null 2>&1 ||
        command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}
need_pg=false
need_browser=false
have_postgres || need_pg=true
have_chromium || need_browser=true
if ! $need_pg && ! $need_browser; then exit 0; fi

skip_all() {  # $1: why nothing is installed
    if $need_pg; then log "PostgreSQL not found, and $1: $skipped_pg"; fi
    if $need_browser; then log "Chromium not found, and $1: $skipped_browser"; fi
    exit 0
}
if [[ ${RECSYS_NO_APT:-} == 1 ]]; then
    skip_all "RECSYS_NO_APT=1: not installing it"
    exit 0
fi
as_root=()
if [[ $(id -u) != 0 ]]; then
    if sudo -n true 2>/dev/null; then as_root=(sudo -n); else skip_all "apt-get needs root"; fi
fi
command -v apt-get >/dev/null 2>&1 || skip_all "no apt-get here"

# what is installed and why, said before apt-get runs
if $need_pg; then
    # Debian 12's postgresql-15 with what it pulls in (LLVM for its JIT, Z3): ~50 MB of packages
    log "installing PostgreSQL (Debian package postgresql, about 50 MB to download, 200 MB on disk)" \
        "for the tests' own tracking server on 127.0.0.1 (mlflow server over PostgreSQL, started" \
        "and stopped by the tests); set RECSYS_NO_APT=1 to skip (those tests are then skipped)"
fi
if $need_browser; then
    log "installing Chromium (Debian packages chromium fonts-liberation, without recommended" \
        "packages, about 100 MB to download, 350 MB on disk) for the test that opens the MLflow" \
        "UI in a headless browser; set RECSYS_NO_APT=1 to skip (that test is then skipped)"
fi

install() {  # $1: why it is wanted, for the failure line; $@: apt-get install's arguments
    local skipped=$1
    shift
    if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" \
        >"$out" 2>&1; then
        log "apt-get could not install $* (last lines below): $skipped"
        tail -5 "$out" >&2
    fi
}
out=$(mktemp)
if ! "${as_root[@]}" apt-get update -qq >"$out" 2>&1; then
    log "apt-get update failed (last lines below)"
    tail -5 "$out" >&2
fi
if $need_pg; then install "$skipped_pg" postgresql; fi
if $need_browser; then install "$skipped_browser" --no-install-recommends chromium fonts-liberation; fi
rm -f "$out"
