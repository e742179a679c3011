#!/usr/bin/env bash
# Build a released ctxguard from its git commit into a PostgreSQL of its own (a copy of Debian's
# PostgreSQL 15, relocated into a cache directory), so that an old release can run beside this tree's
# build: scripts/release_upgrade_test.sh starts a cluster with the release, then the same data
# directory with this build. Cached per commit in $PG_CACHE/release-<version>; idempotent.
#
#   scripts/release_build.sh VERSION COMMIT     prints the prefix (bin/ of that PostgreSQL)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
VERSION=$1 COMMIT=$2
[ "$PG_MAJOR" = "$PG_DEBIAN_MAJOR" ] || { echo "release_build: PostgreSQL $PG_DEBIAN_MAJOR only" >&2; exit 2; }
DIR=$PG_CACHE/release-$VERSION
PREFIX=$DIR/pg/usr/lib/postgresql/$PG_MAJOR
STAMP=$DIR/built-from
if [ "$(cat "$STAMP" 2>/dev/null)" = "$COMMIT" ] && [ -f "$PREFIX/lib/ctxguard.so" ]; then
  echo "$PREFIX"; exit 0
fi
git cat-file -e "$COMMIT^{commit}" 2>/dev/null || { echo "release_build: commit $COMMIT is not in this clone (a shallow clone?)" >&2; exit 1; }
log "building ctxguard $VERSION ($COMMIT) into $DIR (once; cached)"
rm -rf "$DIR/src" "$DIR/pg" && mkdir -p "$DIR/src" "$DIR/pg/usr/lib/postgresql" "$DIR/pg/usr/share/postgresql" "$DIR/pg/usr/include"
# Debian's PostgreSQL finds its share/ and lib/ relative to its binaries, so a copy works as is.
src_bin=$(pg_prefix "$PG_MAJOR")
cp -a "$src_bin" "$DIR/pg/usr/lib/postgresql/"
cp -a "/usr/share/postgresql/$PG_MAJOR" "$DIR/pg/usr/share/postgresql/"
cp -a /usr/include/postgresql "$DIR/pg/usr/include/"
rm -f "$PREFIX"/lib/ctxguard.so "$DIR"/pg/usr/share/postgresql/"$PG_MAJOR"/extension/ctxguard*
git archive "$COMMIT" | tar -x -C "$DIR/src"
(cd "$DIR/src/pg_ext/ctxguard" && CARGO_TARGET_DIR=$DIR/target \
   cargo pgrx install --release --pg-config "$PREFIX/bin/pg_config" >"$DIR/build.log" 2>&1) \
  || { tail -30 "$DIR/build.log" >&2; echo "release_build: building $VERSION failed" >&2; exit 1; }
# Build products only; the source tree and its target stay for the next build of the same commit.
echo "$COMMIT" >"$STAMP"
echo "$PREFIX"
