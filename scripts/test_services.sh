#!/usr/bin/env bash
# What the tests need beside the venv: PostgreSQL's server programs (Debian's `postgresql`), for
# the tests' tracking server (`mlflow server` over PostgreSQL on loopback, started and stopped by
# a fixture, tests/servers.py). Found where installed; else installed with apt-get where this runs
# as root (or with password-less sudo), after saying what and why; else the tests that need it are
# skipped, saying why (tests/servers.py `missing`).
#
# Environment:
#   RECSYS_NO_APT=1   never run apt-get: where PostgreSQL is not installed already, the tests that
#                     need it are skipped (tests/README.md lists them)
set -euo pipefail

log() { printf '[setup] %s\n' "$*" >&2; }
skipped="the PostgreSQL tracking tests will be skipped"
have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

have_postgres && exit 0
if [[ ${RECSYS_NO_APT:-} == 1 ]]; then
    log "PostgreSQL not found, and RECSYS_NO_APT=1: not installing it; $skipped"
    exit 0
fi
as_root=()
if [[ $(id -u) != 0 ]]; then
    if sudo -n true 2>/dev/null; then as_root=(sudo -n); else
        log "PostgreSQL not found, and apt-get needs root: $skipped"
        exit 0
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL not found and no apt-get here: $skipped"
    exit 0
fi
# Debian 12's postgresql-15 with what it pulls in (LLVM for its JIT, Z3): ~50 MB of packages
log "installing PostgreSQL (Debian package postgresql, about 50 MB to download, 200 MB on disk)" \
    "for the tests' own tracking server on 127.0.0.1 (mlflow server over PostgreSQL, started" \
    "and stopped by the tests); set RECSYS_NO_APT=1 to skip (those tests are then skipped)"
out=$(mktemp)
if "${as_root[@]}" apt-get update -qq >"$out" 2>&1 &&
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >>"$out" 2>&1; then
    rm -f "$out"
else
    log "apt-get could not install postgresql (last lines below): $skipped"
    tail -5 "$out" >&2
    rm -f "$out"
fi
