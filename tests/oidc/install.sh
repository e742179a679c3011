#!/usr/bin/env bash
# Install the OpenID provider the tests run (npm oidc-provider, pinned by tests/oidc/package-lock.json)
# into a cache directory outside the checkout, once: `npm ci` runs only when the lock file changed.
# Prints the node_modules directory. Sourced helpers: scripts/lib.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
if [ "$(id -u)" = 0 ]; then CACHE=${CTXGUARD_OIDC_CACHE:-/var/cache/ctxguard/oidc-node}
else CACHE=${CTXGUARD_OIDC_CACHE:-$HOME/.cache/ctxguard/oidc-node}; fi
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  log "installing nodejs npm" >&2
  as_root apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi
mkdir -p "$CACHE"
(
  flock 9
  if ! cmp -s "$ROOT/tests/oidc/package-lock.json" "$CACHE/package-lock.json" \
     || [ ! -f "$CACHE/node_modules/oidc-provider/package.json" ]; then
    log "npm ci oidc-provider ($CACHE)" >&2
    cp "$ROOT/tests/oidc/package.json" "$ROOT/tests/oidc/package-lock.json" "$CACHE/"
    (cd "$CACHE" && npm ci --no-audit --no-fund --loglevel=error >&2)
  fi
) 9>"$CACHE.lock"
echo "$CACHE/node_modules"
