#!/usr/bin/env bash
# What the tests need beside the venv: PostgreSQL's server programs (Debian's `postgresql`), for
# the tests' tracking server (`mlflow server` over PostgreSQL on loopback, started and stopped by
# a fixture, tests/servers.py). Found where installed; else installed with apt-get where this runs
# as root (or with password-less sudo); else the tests that need it are skipped, saying why.
set -euo pipefail

log() { printf '[setup] %s\n' "$*" >&2; }
have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

have_postgres && exit 0
as_root=()
if [[ $(id -u) != 0 ]]; then
    if sudo -n true 2>/dev/null; then as_root=(sudo -n); else
        log "PostgreSQL not found, and apt-get needs root: the PostgreSQL tracking tests will be skipped"
        exit 0
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL not found and no apt-get here: the PostgreSQL tracking tests will be skipped"
    exit 0
fi
log "installing PostgreSQL (Debian's postgresql) for the tests' tracking server"
out=$(mktemp)
if "${as_root[@]}" apt-get update -qq >"$out" 2>&1 &&
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >>"$out" 2>&1; then
    rm -f "$out"
else
    log "apt-get could not install postgresql (last lines below): the PostgreSQL tracking tests will be skipped"
    tail -5 "$out" >&2
    rm -f "$out"
fi
