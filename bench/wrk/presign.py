#!/usr/bin/env python3
"""Writes pre-signed Standard Webhooks requests, one a line, for `replay.lua` to send with wrk.

Each line is `webhook-id<TAB>webhook-timestamp<TAB>webhook-signature<TAB>body`: the signature is
`v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), the key being the base64 part of a `whsec_`
secret (Standard Webhooks specification, "Signature scheme"). Every id is distinct, so every request is a new
receipt, never a duplicate. The timestamps are "now": the server accepts them for its tolerance (5 minutes by
default), so sign just before the run.

    bench/wrk/presign.py --count 200000 --out /tmp/requests.tsv   # secret from STANDARD_WEBHOOK_SECRET
"""
import argparse, base64, hashlib, hmac, json, os, sys, time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, required=True, help="requests to write (each a distinct webhook-id)")
    p.add_argument("--out", required=True, help="file to write (one request a line)")
    p.add_argument("--secret", default=os.environ.get("STANDARD_WEBHOOK_SECRET"),
                   help="whsec_ secret (default: $STANDARD_WEBHOOK_SECRET)")
    p.add_argument("--body-bytes", type=int, default=512, help="approximate body size in bytes (default 512)")
    a = p.parse_args()
    if not a.secret or not a.secret.startswith("whsec_"):
        print("presign: a whsec_ secret is needed (--secret or STANDARD_WEBHOOK_SECRET)", file=sys.stderr)
        return 2
    if a.count < 1:
        print("presign: --count must be at least 1", file=sys.stderr)
        return 2
    key = base64.b64decode(a.secret[len("whsec_"):])
    ts = str(int(time.time()))
    pad = "x" * max(0, a.body_bytes - 120)
    run = os.urandom(4).hex()
    with open(a.out, "w") as f:
        for i in range(a.count):
            msg_id = f"msg_wrk{run}{i:010d}"
            body = json.dumps({"type": "bench.event", "id": msg_id, "data": {"n": i, "pad": pad}},
                              separators=(",", ":"))
            mac = hmac.new(key, f"{msg_id}.{ts}.{body}".encode(), hashlib.sha256).digest()
            f.write(f"{msg_id}\t{ts}\tv1,{base64.b64encode(mac).decode()}\t{body}\n")
    print(f"presign: {a.count} requests in {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
