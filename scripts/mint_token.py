#!/usr/bin/env python3
"""Mint context tokens for the local demo/test cluster with PyJWT (an independent JWT implementation).

  mint_token.py keygen --dir RUN                 # HS256 secret + Ed25519 key pair (once per cluster)
  mint_token.py mint --dir RUN --sub alice --tenant acme --roles ap_clerk [--alg HS256|EdDSA|none|confused]
                     [--ttl 600] [--nbf-in 0] [--aud X] [--bad-signature] [--crit] [--dup-tenant T]

For tests only: the hostile variants (alg none, HS/EdDSA confusion, forged signature) exist so the
database's refusal can be proven.
"""
import argparse
import base64
import json
import os
import secrets
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def keygen(d: str) -> None:
    os.makedirs(d, exist_ok=True)
    if not os.path.exists(os.path.join(d, "jwt_secret")):
        with open(os.path.join(d, "jwt_secret"), "w") as f:
            f.write(secrets.token_hex(32))
    if not os.path.exists(os.path.join(d, "ed25519.pem")):
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        with open(os.path.join(d, "ed25519.pem"), "wb") as f:
            f.write(pem)
        with open(os.path.join(d, "ed25519_public_x"), "w") as f:
            f.write(b64url(raw))


def mint(a) -> str:
    now = int(time.time())
    claims = {"sub": a.sub, "tenant_id": a.tenant, "roles": [r for r in a.roles.split(",") if r], "iat": now}
    if a.ttl is not None:
        claims["exp"] = now + a.ttl
    if a.nbf_in:
        claims["nbf"] = now + a.nbf_in
    if a.aud:  # an empty --aud means "no audience"
        claims["aud"] = a.aud
    secret = open(os.path.join(a.dir, "jwt_secret")).read().strip()
    if a.dup_tenant:
        # A correctly signed HS256 token whose claims repeat tenant_id (the second value last): JSON
        # written by hand, as no JSON encoder repeats a member. Refused whichever value a parser keeps.
        body = json.dumps(claims)
        assert body.endswith("}")
        body = body[:-1] + ", " + json.dumps("tenant_id") + ": " + json.dumps(a.dup_tenant) + "}"
        head = b64url(b'{"alg":"HS256","typ":"JWT"}') + "." + b64url(body.encode())
        import hashlib, hmac
        tok = head + "." + b64url(hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest())
    elif a.crit:
        # A correctly signed token whose header names an extension the verifier must understand (and
        # does not): RFC 7515 §4.1.11 says reject it.
        head = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "crit": ["x-ctxguard-test"], "x-ctxguard-test": True}).encode())
        head += "." + b64url(json.dumps(claims).encode())
        import hashlib, hmac
        tok = head + "." + b64url(hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest())
    elif a.alg == "HS256":
        tok = jwt.encode(claims, secret, algorithm="HS256")
    elif a.alg == "EdDSA":
        pem = open(os.path.join(a.dir, "ed25519.pem"), "rb").read()
        tok = jwt.encode(claims, serialization.load_pem_private_key(pem, None), algorithm="EdDSA")
    elif a.alg == "none":
        tok = b64url(b'{"alg":"none","typ":"JWT"}') + "." + b64url(json.dumps(claims).encode()) + "."
    elif a.alg == "confused":
        # HS256 keyed with the Ed25519 *public* key: the classic algorithm-confusion forgery.
        pub = open(os.path.join(a.dir, "ed25519_public_x")).read().strip()
        head = b64url(b'{"alg":"HS256","typ":"JWT"}') + "." + b64url(json.dumps(claims).encode())
        import hashlib, hmac
        tok = head + "." + b64url(hmac.new(pub.encode(), head.encode(), hashlib.sha256).digest())
    else:
        sys.exit(f"unknown alg {a.alg}")
    if a.bad_signature:
        head, body, sig = tok.split(".")
        tok = f"{head}.{body}.{sig[:-4]}AAAA"
    return tok


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keygen")
    k.add_argument("--dir", required=True)
    m = sub.add_parser("mint")
    m.add_argument("--dir", required=True)
    m.add_argument("--sub", required=True)
    m.add_argument("--tenant", required=True)
    m.add_argument("--roles", default="")
    m.add_argument("--alg", default="HS256")
    m.add_argument("--ttl", type=int, default=3600)
    m.add_argument("--no-exp", dest="ttl", action="store_const", const=None)
    m.add_argument("--nbf-in", type=int, default=0)
    m.add_argument("--aud", default=None)
    m.add_argument("--bad-signature", action="store_true")
    m.add_argument("--crit", action="store_true", help="HS256 with a crit header naming an unknown extension")
    m.add_argument("--dup-tenant", default=None, metavar="T",
                   help="HS256 whose claims repeat tenant_id, T the second (last) value")
    a = p.parse_args()
    if a.cmd == "keygen":
        keygen(a.dir)
    else:
        print(mint(a))


if __name__ == "__main__":
    main()
