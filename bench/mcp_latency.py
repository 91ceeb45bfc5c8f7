#!/usr/bin/env python3
"""What `trigger-bridge mcp` costs an agent (issue #15), measured with an independent MCP client.

Starts a server on a fresh SQLite store with the quickstart config, creates one `pr-session` session
through the API, attaches the official Python MCP SDK to `trigger-bridge mcp` over stdio, and prints:

- `raise_signal` as an MCP tool call vs the same `POST /v1/runs/{id}/signals` over HTTP (the bridge's
  own overhead: one JSON-RPC hop and one process);
- the wake latency: a `wait_for_signal` blocked in its tool call, the signal raised over the API, the
  time from the raise's answer to the tool call's result.

    python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install 'mcp==2.3.0'
    cargo build --release && /tmp/mcpvenv/bin/python bench/mcp_latency.py [--bin target/release/trigger-bridge]

The mailbox bound of the quickstart session is 64, so the raise loop stays under it.
"""
import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx2 as httpx  # the HTTP client the MCP SDK 2.x depends on
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def q(xs):
    xs = sorted(xs)
    return (f"median {statistics.median(xs) * 1000:.1f} ms, p90 {xs[int(len(xs) * 0.9)] * 1000:.1f} ms, "
            f"max {xs[-1] * 1000:.1f} ms (n={len(xs)})")


async def measure(base, binary, raises, wakes):
    async with httpx.AsyncClient() as h:
        run = (await h.post(base + "/v1/runs", json={"workflowId": "pr-session"})).json()["runId"]
        for _ in range(200):
            if (await h.get(f"{base}/v1/runs/{run}")).json()["status"] == "running":
                break
            await asyncio.sleep(0.02)
        params = StdioServerParameters(command=binary, args=["mcp"],
                                       env={"TRIGGER_BRIDGE_SERVER": base, "PATH": os.environ["PATH"]})
        async with stdio_client(params) as (rd, wr):
            async with ClientSession(rd, wr) as s:
                await s.initialize()
                await s.list_tools()
                via_mcp, via_http = [], []
                for _ in range(raises):
                    t = time.perf_counter()
                    await s.call_tool("raise_signal", {"runId": run, "name": "bench.mcp"})
                    via_mcp.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    await h.post(f"{base}/v1/runs/{run}/signals", json={"name": "bench.http"})
                    via_http.append(time.perf_counter() - t)
                wake = []
                for i in range(wakes):
                    call = asyncio.create_task(s.call_tool(
                        "wait_for_signal", {"runId": run, "name": f"bench.wake.{i}", "budgetS": 20}))
                    for _ in range(400):
                        waits = (await h.get(f"{base}/v1/runs/{run}/waits")).json()["waits"]
                        if any(w["state"] == "armed" for w in waits):
                            break
                        await asyncio.sleep(0.005)
                    await asyncio.sleep(0.05)
                    t = time.perf_counter()
                    await h.post(f"{base}/v1/runs/{run}/signals", json={"name": f"bench.wake.{i}"})
                    result = await call
                    wake.append(time.perf_counter() - t)
                    if result.structured_content.get("resolved") is not True:
                        sys.exit(f"wait {i} did not resolve: {result.structured_content}")
                print("raise_signal as an MCP tool call :", q(via_mcp))
                print("POST /v1/runs/{id}/signals (HTTP):", q(via_http))
                print("wake: raise -> blocked wait_for_signal returns:", q(wake))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/trigger-bridge"))
    ap.add_argument("--raises", type=int, default=25, help="raise_signal pairs (at most 30: mailbox bound 64)")
    ap.add_argument("--wakes", type=int, default=30)
    a = ap.parse_args()
    if a.raises > 30:
        sys.exit("--raises is at most 30 (the quickstart session's mailbox holds 64 signals)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, GITHUB_WEBHOOK_SECRET="bench", RUST_LOG="warn",
                   STANDARD_WEBHOOK_SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        server = subprocess.Popen([a.bin, "serve", "--config", os.path.join(REPO, "examples/quickstart.toml"),
                                   "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(d, "data")],
                                  env=env, stdout=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    if httpx.get(base + "/health").status_code == 200:
                        break
                except Exception:
                    time.sleep(0.05)
            else:
                sys.exit("the server did not become healthy")
            asyncio.run(measure(base, a.bin, a.raises, a.wakes))
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
