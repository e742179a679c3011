#!/usr/bin/env bash
# Idempotent setup for a fresh Debian machine (root or sudo-capable user).
# Installs: PostgreSQL 15 + server headers, clang, cargo-pgrx 0.18.0, and
# registers the system pg_config with pgrx. A second run only checks.
set -euo pipefail

PGRX_VERSION=0.18.0
PG_MAJOR=${PG_MAJOR:-15}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
for pkg in postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-$PG_MAJOR-pgtap libtap-parser-sourcehandler-pgtap-perl postgresql-contrib clang libclang-dev sudo pkg-config libssl-dev python3-jwt python3-cryptography python3-venv; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
[ -x "$PG_CONFIG" ] || PG_CONFIG=$(command -v pg_config)

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  echo "setup: installing cargo-pgrx $PGRX_VERSION"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
if ! grep -qs "pg$PG_MAJOR = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml"; then
  echo "setup: cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
  cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG"
fi
echo "setup: ok (pgrx $PGRX_VERSION, $("$PG_CONFIG" --version))"
