#!/usr/bin/env python3
"""A minimal loopback receiver for end-to-end benchmarks: answers every POST 200 at once and counts the
distinct `webhook-id` headers it saw (the http executor's delivery id, stable across attempts), so a figure
comes from what arrived, not from the product's own counters.

    bench/wrk/receiver.py --listen 127.0.0.1:18091 &
    curl -s 127.0.0.1:18091/count    # {"posts": N, "distinct": D, "first": t0, "last": t1}  (unix seconds)

HTTP/1.1 with keep-alive, Content-Length bodies only (what the executor sends); asyncio, one process.
"""
import argparse, asyncio, json, sys, time

seen: set = set()
stats = {"posts": 0, "first": None, "last": None}


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            length, wid = 0, None
            for h in lines[1:]:
                k, _, v = h.partition(":")
                k = k.strip().lower()
                if k == "content-length":
                    length = int(v.strip())
                elif k == "webhook-id":
                    wid = v.strip()
            if length:
                await reader.readexactly(length)
            if method == "GET" and target == "/count":
                body = json.dumps({"posts": stats["posts"], "distinct": len(seen),
                                   "first": stats["first"], "last": stats["last"]}).encode()
            else:
                now = time.time()
                stats["posts"] += 1
                stats["first"] = stats["first"] or now
                stats["last"] = now
                if wid:
                    seen.add(wid)
                body = b"{}"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main(host: str, port: int) -> None:
    server = await asyncio.start_server(handle, host, port, backlog=1024)
    print(f"receiver: listening on {host}:{port}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:18091", help="HOST:PORT (default 127.0.0.1:18091)")
    a = p.parse_args()
    host, _, port = a.listen.rpartition(":")
    try:
        asyncio.run(main(host, int(port)))
    except KeyboardInterrupt:
        pass
