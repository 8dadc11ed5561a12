#!/usr/bin/env python3
"""Bounded load test of `yomi serve` on loopback: N streaming chat requests from C concurrent
clients (8 by default), with the server's RSS sampled over time.

Every request streams (`stream_options.include_usage`); it succeeds when it answers 200, streams
text, a finish reason, the usage chunk and `[DONE]`. Prompts share a few long system prompts so
the prefix cache is exercised (and evicts: its bound is set low). The run ends after N requests
or the time limit, whichever comes first. Standard library only.

    python3 bench/load_test.py --yomi target/release/yomi --model path/to/model.gguf

Prints a summary and a Markdown block for bench/RESULTS.md; --json writes the raw numbers.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

SYSTEMS = [
    "You are a concise assistant. Answer in two sentences at most. " * 6,
    "You are a Python expert who reviews code for bugs and style, briefly. " * 6,
    "You are a travel guide. Suggest one place and one dish, no more. " * 6,
    "You explain science to children with simple words and one example. " * 6,
]
QUESTIONS = [
    "What is a prime number?",
    "Why is the sky blue?",
    "How do I reverse a list in Python?",
    "What should I see in Kyoto?",
    "What is photosynthesis?",
    "Explain recursion.",
    "What is the capital of Australia?",
    "How does a rainbow form?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def get_json(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def one_request(port, model, i, max_tokens, timeout):
    """Returns a dict with ok, ttft_s, e2e_s, completion_tokens, cached_tokens, error."""
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEMS[i % len(SYSTEMS)]},
            {"role": "user", "content": f"{QUESTIONS[(i // len(SYSTEMS)) % len(QUESTIONS)]} (#{i})"},
        ],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    res = {"ok": False, "ttft_s": None, "e2e_s": None, "completion_tokens": 0,
           "cached_tokens": None, "error": None}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return res
        done = finish = False
        usage = None
        for raw in r:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                res["error"] = f"stream error: {ev['error']}"
                return res
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if d.get("content") or d.get("reasoning_content"):
                    if res["ttft_s"] is None:
                        res["ttft_s"] = time.perf_counter() - t0
                if ch.get("finish_reason"):
                    finish = True
            if ev.get("usage"):
                usage = ev["usage"]
        res["e2e_s"] = time.perf_counter() - t0
        if not (done and finish and usage):
            res["error"] = f"incomplete stream (done={done}, finish={finish}, usage={usage is not None})"
            return res
        res["completion_tokens"] = usage["completion_tokens"]
        res["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        res["ok"] = res["ttft_s"] is not None or usage["completion_tokens"] == 0
        if not res["ok"]:
            res["error"] = "no text streamed"
        return res
    except Exception as e:  # noqa: BLE001 — every failure is counted, never raised
        res["error"] = f"{type(e).__name__}: {e}"
        return res
    finally:
        c.close()


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yomi", default="target/release/yomi")
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds (the run stops early)")
    ap.add_argument("--prefix-cache-mb", type=int, default=64)
    ap.add_argument("--queue-size", type=int, default=32)
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `yomi serve` argument (repeatable)")
    a = ap.parse_args()

    port = free_port()
    cmd = [a.yomi, "serve", "--model", a.model, "--port", str(port), "--served-model-name", "load",
           "--prefix-cache-mb", str(a.prefix_cache_mb), "--queue-size", str(a.queue_size), *a.server_arg]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            if srv.poll() is not None:
                sys.exit(f"yomi serve exited: {srv.stderr.read()}")
            try:
                if get_json(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("yomi serve did not become healthy")
            time.sleep(0.1)

        rss = []  # (t, KiB)
        stop = threading.Event()
        t_start = time.perf_counter()

        def sample():
            while not stop.is_set():
                v = rss_kib(srv.pid)
                if v is not None:
                    rss.append((time.perf_counter() - t_start, v))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        lock = threading.Lock()
        next_i = [0]
        results = []
        time_limit = t_start + a.time_limit

        def client():
            while True:
                with lock:
                    if next_i[0] >= a.requests or time.perf_counter() > time_limit:
                        return
                    i = next_i[0]
                    next_i[0] += 1
                r = one_request(port, "load", i, a.max_tokens, timeout=max(60.0, a.time_limit))
                r["i"] = i
                r["t_end"] = time.perf_counter() - t_start
                with lock:
                    results.append(r)

        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t_start
        time.sleep(1.0)
        stop.set()
        sampler.join()
        health = get_json(port, "/health")[1]
    finally:
        if srv.poll() is None:
            srv.terminate()
            try:
                srv.wait(10)
            except subprocess.TimeoutExpired:
                srv.kill()

    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in ok]
    tokens = sum(r["completion_tokens"] for r in ok)
    cached = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    mib = [(t, v / 1024) for t, v in rss]
    n = len(mib)
    quarter = [mib[min(n - 1, (n * k) // 4)][1] for k in range(4)] + [mib[-1][1]] if n else []
    second_half = [v for t, v in mib[n // 2:]] if n else []
    summary = {
        "clients": a.clients,
        "requests_sent": len(results),
        "ok": len(ok),
        "failed": len(failed),
        "failures": sorted({r["error"] for r in failed})[:10],
        "wall_s": wall,
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_s": {"median": statistics.median(ttft) if ttft else None, "p90": pct(ttft, 0.9), "max": max(ttft, default=None)},
        "e2e_s": {"median": statistics.median(e2e) if e2e else None, "p90": pct(e2e, 0.9), "max": max(e2e, default=None)},
        "cached_tokens_median": statistics.median(cached) if cached else None,
        "rss_mib": {
            "samples": n,
            "at_0_25_50_75_100pct": quarter,
            "min": min((v for _, v in mib), default=None),
            "max": max((v for _, v in mib), default=None),
            "second_half_min": min(second_half, default=None),
            "second_half_max": max(second_half, default=None),
        },
        "server_health": health,
        "command": " ".join(cmd[:1] + ["serve", "--model", os.path.basename(a.model)] + cmd[4:]),
    }
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "results": results, "rss": rss}, f)
    r = summary["rss_mib"]
    print()
    print(f"| clients | requests | ok | failed | wall s | tok/s (all clients) | TTFT median / p90 s | e2e median / p90 s | RSS MiB at 0/25/50/75/100 % | RSS 2nd half min–max |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {a.clients} | {len(results)} | {len(ok)} | {len(failed)} | {wall:.0f} | {summary['aggregate_tokens_per_s']:.1f} | "
          f"{summary['ttft_s']['median']:.2f} / {summary['ttft_s']['p90']:.2f} | {summary['e2e_s']['median']:.2f} / {summary['e2e_s']['p90']:.2f} | "
          f"{' / '.join(f'{v:.0f}' for v in r['at_0_25_50_75_100pct'])} | {r['second_half_min']:.0f}–{r['second_half_max']:.0f} |")
    sys.exit(0 if not failed and results else 1)


if __name__ == "__main__":
    main()
