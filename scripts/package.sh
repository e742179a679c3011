#!/usr/bin/env bash
# A Debian package of ctxguard for one PostgreSQL major:
#
#   scripts/package.sh PG_MAJOR [--debian-layout] [--test]
#
# builds postgresql-NN-ctxguard_VERSION-1_ARCH.deb in target/debian/ with `cargo pgrx package` (against
# that major's pg_config, feature pgNN) and dpkg-deb. The files go where that major's pg_config puts
# extensions:
#   15      Debian's postgresql-15 (and any pg_config of Debian's own, CTXGUARD_PG<NN>_PREFIX=/usr/lib/postgresql/NN):
#           /usr/lib/postgresql/NN/lib/ctxguard.so and /usr/share/postgresql/NN/extension/ctxguard*;
#           Depends: postgresql-NN.
#   17, 18  the PostgreSQL that scripts/setup.sh built into $PG_CACHE/pgNN: the same files under that
#           prefix (lib/postgresql/, share/postgresql/extension/); no dependency on a server package,
#           since no Debian package provides that prefix.
# --debian-layout (16, 17, 18): the files where Debian's own postgresql-NN puts them (Debian 13 and
#   later, or the PostgreSQL project's apt repository), Depends: postgresql-NN. That package cannot be
#   installed on Debian 12, which has no postgresql-NN server package for it: its contents are checked.
# --test: install the .deb, start a clean cluster with ctxguard preloaded, CREATE EXTENSION ctxguard,
#   run the smoke set (lib.sh), stop, `dpkg -r`, and check that every packaged file is gone. Files that
#   `cargo pgrx install` had put there (owned by no package) are moved aside and put back afterwards.
PG_MAJOR=${1:?usage: scripts/package.sh PG_MAJOR [--debian-layout] [--test]}
shift
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

LAYOUT=prefix TEST=0
for arg in "$@"; do
  case $arg in
    --debian-layout) LAYOUT=debian ;;
    --test) TEST=1 ;;
    *) echo "package.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
command -v dpkg-deb >/dev/null || { echo "package.sh: dpkg-deb not found (Debian's dpkg)" >&2; exit 1; }
bash scripts/setup.sh >/dev/null

PG_CONFIG=$PG_BIN/pg_config
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
ARCH=$(dpkg --print-architecture)
PKG=postgresql-$PG_MAJOR-ctxguard
DEB_VERSION=$VERSION-1
OUT=$CARGO_TARGET_DIR/debian
DEB=$OUT/${PKG}_${DEB_VERSION}_${ARCH}.deb
PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
SHAREDIR=$("$PG_CONFIG" --sharedir)
# A pg_config of Debian's own (15 here, or CTXGUARD_PG<NN>_PREFIX=/usr/lib/postgresql/NN) is Debian's layout.
[ "$PKGLIBDIR" = "/usr/lib/postgresql/$PG_MAJOR/lib" ] && LAYOUT=debian
# Installable here: a prefix, or Debian's layout where Debian's postgresql-NN is installed.
INSTALLABLE=1
if [ "$LAYOUT" = debian ] && ! dpkg-query -W -f='${Status}' "postgresql-$PG_MAJOR" 2>/dev/null | grep -q "install ok installed"; then
  INSTALLABLE=0
fi

log "cargo pgrx package for PostgreSQL $PG_MAJOR ($("$PG_CONFIG" --version))"
STAGE=$OUT/$PKG
rm -rf "$STAGE" "$OUT/pgrx-$PG_MAJOR"
mkdir -p "$OUT"
(cd pg_ext/ctxguard && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$OUT/pgrx-$PG_MAJOR" >/dev/null)
[ -f "$OUT/pgrx-$PG_MAJOR$PKGLIBDIR/ctxguard.so" ] || { echo "package.sh: cargo pgrx package made no $PKGLIBDIR/ctxguard.so" >&2; exit 1; }

# Where the files go in the package.
if [ "$LAYOUT" = debian ]; then
  DEST_LIB=/usr/lib/postgresql/$PG_MAJOR/lib DEST_SHARE=/usr/share/postgresql/$PG_MAJOR
else
  DEST_LIB=$PKGLIBDIR DEST_SHARE=$SHAREDIR
fi
mkdir -p "$STAGE/DEBIAN" "$STAGE$DEST_LIB" "$STAGE$DEST_SHARE/extension" "$STAGE/usr/share/doc/$PKG"
install -m 644 "$OUT/pgrx-$PG_MAJOR$PKGLIBDIR/ctxguard.so" "$STAGE$DEST_LIB/"
install -m 644 "$OUT/pgrx-$PG_MAJOR$SHAREDIR"/extension/ctxguard* "$STAGE$DEST_SHARE/extension/"
strip --strip-unneeded "$STAGE$DEST_LIB/ctxguard.so"
install -m 644 README.md "$STAGE/usr/share/doc/$PKG/README.md"
# The steps around pg_upgrade (README, "Upgrading PostgreSQL").
install -D -m 644 -t "$STAGE/usr/share/doc/$PKG/pg_upgrade" sql/pg_upgrade/before.sql sql/pg_upgrade/after.sql
[ -f LICENSE ] && install -m 644 LICENSE "$STAGE/usr/share/doc/$PKG/copyright"

# Dependencies: the server package (Debian's layout), and the C library at the newest symbol version
# the library uses (it links nothing else).
libs=$(objdump -p "$STAGE$DEST_LIB/ctxguard.so" | awk '$1 == "NEEDED" { print $2 }' | sort | tr '\n' ' ')
for lib in $libs; do
  case $lib in libc.so.*|libm.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|ld-linux*) ;;
    *) echo "package.sh: ctxguard.so needs $lib, which the package does not declare" >&2; exit 1 ;;
  esac
done
glibc=$(objdump -T "$STAGE$DEST_LIB/ctxguard.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
depends="libc6 (>= $glibc)"
case " $libs " in *" libgcc_s.so.1 "*) depends+=", libgcc-s1" ;; esac
if [ "$LAYOUT" = debian ]; then
  depends="postgresql-$PG_MAJOR, $depends"
  for_what="Debian's postgresql-$PG_MAJOR"
else
  for_what="the PostgreSQL $PG_MAJOR that ctxguard's scripts/setup.sh builds into $(pg_prefix "$PG_MAJOR")"
fi
cat >"$STAGE/DEBIAN/control" <<CONTROL
Package: $PKG
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: ctxguard developers <ctxguard@example.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
Depends: $depends
Section: database
Priority: optional
Homepage: https://example.invalid/ctxguard
Description: ctxguard $VERSION for PostgreSQL $PG_MAJOR
 The database as the truth layer for LLM tool use: signed page context, fail-closed tool policies
 (Gate A/B), tenant RLS and audit. Built for $for_what.
 .
 Add ctxguard to shared_preload_libraries, restart PostgreSQL, then CREATE EXTENSION ctxguard
 (ALTER EXTENSION ctxguard UPDATE in databases that have an older version).
CONTROL
(cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | sort | xargs md5sum) >"$STAGE/DEBIAN/md5sums"
find "$STAGE" -type d -exec chmod 755 {} +
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
log "built $DEB"
dpkg-deb --info "$DEB" | sed -n 's/^ \(Package\|Version\|Depends\):/  \1:/p'
dpkg-deb --contents "$DEB" | awk '$NF !~ /\/$/ { print "  " $NF }'

[ "$TEST" = 1 ] || exit 0

# --- The test -----------------------------------------------------------------------------------
fail() { echo "package test: $*" >&2; exit 1; }
mapfile -t files < <(dpkg-deb --contents "$DEB" | awk '$NF !~ /\/$/ { sub(/^\.\//, "/", $NF); print $NF }')
if [ "$INSTALLABLE" = 0 ]; then
  # Installing needs Debian's postgresql-NN, which Debian 12 does not have: check the layout instead.
  for f in "/usr/lib/postgresql/$PG_MAJOR/lib/ctxguard.so" "/usr/share/postgresql/$PG_MAJOR/extension/ctxguard.control" \
           "/usr/share/postgresql/$PG_MAJOR/extension/ctxguard--$VERSION.sql"; do
    printf '%s\n' "${files[@]}" | grep -qx "$f" || fail "$f is not in the package"
  done
  dpkg-deb --info "$DEB" | grep -q "Depends: postgresql-$PG_MAJOR," || fail "the package does not depend on postgresql-$PG_MAJOR"
  echo "ok: $PKG in Debian's layout (not installed: Debian 12 has no postgresql-$PG_MAJOR)"
  exit 0
fi

# Files a `cargo pgrx install` left (owned by no package) are moved aside, and put back at the end.
BACKUP=$(mktemp -d)
[ "$(id -u)" = 0 ] || sudo chown "$(id -u)" "$BACKUP"
restore() {
  local f
  for f in "${files[@]}"; do
    [ -e "$BACKUP$f" ] && as_root mkdir -p "$(dirname "$f")" && as_root mv -f "$BACKUP$f" "$f"
  done
  rm -rf "$BACKUP"
}
cleanup() {
  stop_cluster_at "$PKG_RUN/pgdata"
  dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed" && as_root dpkg -r "$PKG" >/dev/null
  restore
}
if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed"; then
  fail "$PKG is installed already: remove it first (dpkg -r $PKG)"
fi
for f in "${files[@]}"; do
  if [ -e "$f" ]; then
    owner=$(dpkg-query -S "$f" 2>/dev/null | cut -d: -f1 || true)
    [ -z "$owner" ] || fail "$f belongs to package $owner"
    as_root mkdir -p "$(dirname "$BACKUP$f")"
    as_root mv "$f" "$BACKUP$f"
  fi
done
PKG_RUN=$RUN-package
trap cleanup EXIT
[ "$PG_MAJOR" = "$PG_DEBIAN_MAJOR" ] && [ -f /tmp/ctxguard-build-state ] &&
  echo "$(date -Is) package test: $PKG (built from this tree) installed over /usr/lib/postgresql/15 for a minute; the earlier files are put back after dpkg -r" >>/tmp/ctxguard-build-state

log "dpkg -i $(basename "$DEB")"
as_root dpkg -i "$DEB" >/dev/null
for f in "${files[@]}"; do [ -f "$f" ] || fail "$f not installed"; done

# A clean cluster of its own (the next port after the cluster without preload).
as_pg rm -rf "$PKG_RUN" 2>/dev/null || rm -rf "$PKG_RUN"
RUN=$PKG_RUN PGPORT=$((PGPORT + 2)) PGDATA_DIR=$PKG_RUN/pgdata
start_cluster
psql_su -d postgres -o /dev/null -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS ctxguard_pkg" \
  -c "CREATE DATABASE ctxguard_pkg"
psql_su -d ctxguard_pkg -o /dev/null -c "SET client_min_messages = warning" -c "CREATE EXTENSION ctxguard"
[ "$(psql_su -d ctxguard_pkg -Atc "SELECT extversion FROM pg_extension WHERE extname = 'ctxguard'")" = "$VERSION" ] \
  || fail "CREATE EXTENSION ctxguard did not make version $VERSION"
[ "$(psql_su -d ctxguard_pkg -Atc "SHOW shared_preload_libraries")" = ctxguard ] || fail "ctxguard is not preloaded"
log "smoke set on the packaged ctxguard"
create_demo_db ctxguard_pkg_demo
psql_su -d ctxguard_pkg_demo -o /dev/null -f sql/tests/fixtures.sql
run_smoke_set ctxguard_pkg_demo
stop_cluster_at "$PKG_RUN/pgdata"

log "dpkg -r $PKG"
# (dpkg leaves PostgreSQL's own directories, which hold other files.)
as_root dpkg -r "$PKG" 2>&1 >/dev/null | { grep -v "not empty so not removed" || true; } >&2
for f in "${files[@]}"; do [ ! -e "$f" ] || fail "$f is still there after dpkg -r"; done
trap - EXIT
restore
echo "ok: $PKG installs, CREATE EXTENSION ctxguard and the smoke set pass on a clean cluster, dpkg -r removes it"
