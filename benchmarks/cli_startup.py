"""How long `unmask --help`, `unmask <command> --help` and `unmask --version` take, as a user runs them (a new
process each time, the interpreter's start-up included), against `python -c pass` on the same machine.

    python -m benchmarks.cli_startup [--runs 5]

Prints the median wall time of each over --runs runs; the aim (issue 25) is under 0.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["--version"], ["pretrain", "--help"], ["finetune", "--help"], ["serve", "--help"],
            ["eval", "sts", "--help"], ["predict", "--help"]]


def seconds(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    baseline = statistics.median(seconds([sys.executable, "-c", "pass"]) for _ in range(args.runs))
    print(f"{'python -c pass':<28} {baseline:.3f} s")
    for command in COMMANDS:
        argv = [sys.executable, "-m", "unmask.cli", *command]
        median = statistics.median(seconds(argv) for _ in range(args.runs))
        print(f"{'unmask ' + ' '.join(command):<28} {median:.3f} s", flush=True)


if __name__ == "__main__":
    main()
