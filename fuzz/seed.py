#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/seed-*) from the repo's own
fixtures (tests/fixtures, crates/wire/testdata, examples/). Run from the repo root:
`python3 fuzz/seed.py`. The seeds are committed; a long run adds what it finds under the same folders
(docs/fuzzing.md says what to keep)."""
import glob, json, os, uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def req(flags, headers, body):
    head = "".join(f"{k}: {v}\n" for k, v in headers)
    return bytes([flags]) + head.encode() + b"\n" + body


gh = sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/github/*/*.json")))
for i, p in enumerate(gh[::4]):
    event = os.path.basename(os.path.dirname(p))
    body = open(p, "rb").read()
    hs = [("x-github-event", event), ("x-github-delivery", str(uuid.UUID(int=i))),
          ("content-type", "application/json")]
    write("github", f"{i:02}", req(1, hs, body))
    write("json_limits", f"gh-{i:02}", bytes([0xff]) + body)
    write("json_limits", f"gh-tight-{i:02}", bytes([i * 37 % 256]) + body)
write("github", "form", req(1, [("x-github-event", "ping"), ("x-github-delivery", "d-1"),
      ("content-type", "application/x-www-form-urlencoded")], b"payload=%7B%22zen%22%3A%22x%22%7D"))
write("github", "unsigned", req(0, [("x-github-event", "ping"), ("x-hub-signature-256", "sha256=00")], b"{}"))

sw = [b'{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{"id":"in_1","amount":5}}',
      b'{"type":"user.created","data":{"nested":[{"a":[1,2,{"b":null}]}]}}', b'[]', b'{"type":7}']
for i, body in enumerate(sw):
    write("standard_webhooks", f"{i:02}", req(1, [("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
          ("content-type", "application/json")], body))
write("standard_webhooks", "many", req(1, [("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
      ("webhook-signature", " ".join(["v1,AAAA"] * 40))], sw[0]))

for i, body in enumerate([b'{"event":"x"}', b'plain text', b'']):
    for v in (0, 5, 31):
        write("hmac", f"{i}-{v}", bytes([1, v]) + f"\nx-id: id-{i}\nx-event: push\n\n".encode() + body)

ado = [{"id": "2ab4e3d3-b7a6-425e-92b1-5a9982c1269e", "eventType": "git.pullrequest.created",
        "resource": {"pullRequestId": 1, "repository": {"id": "r", "name": "repo", "project": {"id": "p"}},
                     "status": "active", "title": "t", "sourceRefName": "refs/heads/x"}},
       {"id": "b0a2f1c4-0000-4000-8000-000000000001", "eventType": "build.complete",
        "resource": {"id": 5, "status": "completed", "result": "succeeded", "definition": {"id": 3}}},
       {"id": "c", "eventType": "git.push", "resource": {"refUpdates": [{"name": "refs/heads/main"}]}}]
for i, body in enumerate(ado):
    for v in (0, 1, 2):
        write("azure_devops", f"{i}-{v}", bytes([1, v]) + b"content-type: application/json\n\n"
              + json.dumps(body).encode())

for i, body in enumerate([b'{"ok":true}', b'{"a":[1,2,3],"b":{"c":"d"}}', b'"x"', b'{"deep":[[[[[[1]]]]]]}']):
    write("capability", f"{i}", req(1, [("content-type", "application/json")], body))
    write("json_limits", f"cap-{i}", bytes([i * 91 % 256]) + body)

wv = json.load(open(os.path.join(ROOT, "crates/wire/testdata/derived/wire-vectors.derived.json")))
for i, m in enumerate(wv["message_shape_vectors"]):
    body = m["go_encoder_noescape"].encode()
    for which in range(4):
        write("wire_decode", f"{i}-{which}", bytes([which]) + body)
for i, m in enumerate(wv["manifest_hash_vectors"]):
    write("wire_decode", f"manifest-{i}", bytes([3]) + m["canonical_hash_input"].encode())
write("wire_decode", "headers", bytes([4]) + b"Nats-Msg-Id: a\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n")
write("wire_decode", "time", bytes([5]) + b"2026-05-26T14:30:46.123456789Z")

for p in glob.glob(os.path.join(ROOT, "examples/*.toml")):
    write("config", os.path.basename(p), open(p, "rb").read())
write("config", "limits", b'[limits]\nmax_json_depth = 8\ncontent_encodings = ["gzip"]\n'
      b'[[subscriptions]]\nid = "gh"\nconnector = "github"\nsecret = "env:NOPE"\n'
      b'[subscriptions.limits]\nmax_headers = 300\n')

TP = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
for i, v in enumerate([f"00-{TP}-01", f"00-{TP}-00", f" \t00-{TP}-01 ", f"cc-{TP}-01-what-next",
                       "00-00000000000000000000000000000000-00f067aa0ba902b7-01", f"ff-{TP}-01",
                       f"00-{TP.upper()}-01"]):
    write("traceparent", f"{i}", v.encode())
