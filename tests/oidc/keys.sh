#!/usr/bin/env bash
# The OpenID provider's signing keys for the tests, made once per run directory: rsa1.pem and
# rsa2.pem (RSA 2048, RS256; rsa2 replaces rsa1 in the rotation test), ec1.pem (P-256, ES256).
# The directory is readable by the PostgreSQL server (the JWKS file is written there); the private
# keys are readable by the test only.
set -euo pipefail
dir=$1
mkdir -p "$dir"
chmod 755 "$dir"
for k in rsa1 rsa2; do
  [ -s "$dir/$k.pem" ] || openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/$k.pem" 2>/dev/null
done
[ -s "$dir/ec1.pem" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ec1.pem"
chmod 600 "$dir"/*.pem
