"""SPLADE pooling's training memory: forward + backward of one gradient-caching mini-batch (32 x 256 tokens) through
all-MiniLM-L6-v2 under a masked-LM head, pooled the way `pipelines.sparse.splade_pool` does it (each sequence's
maximum of the logits, then log(1 + relu)) or the way it did before (log(1 + relu) of every token, then the maximum).

    python -m benchmarks.splade_memory [--pooling max_first|per_token] [--steps 2]

Run each pooling in a process of its own (peak RSS is the process's): the two print their peak and their time.
"""

from __future__ import annotations

import argparse
import resource
import time
import warnings

import torch

from benchmarks.common import minilm_dir


def per_token(model, input_ids, attention_mask):
    """The earlier form: (tokens, V) weights, then a scatter max into (B, V)."""
    out = model(input_ids, attention_mask, sparse_prediction=True)
    weights = torch.log1p(torch.relu(out.logits))  # (M, V)
    rows = out.predicted_positions.nonzero()[:, 0]
    pooled = weights.new_zeros(input_ids.shape[0], weights.shape[1])
    return pooled.scatter_reduce(0, rows[:, None].expand_as(weights), weights, reduce="amax")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pooling", choices=["max_first", "per_token"], default="max_first")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    from unmask.models import from_pretrained
    from unmask.pipelines.sparse import splade_pool

    warnings.simplefilter("ignore")  # the new MLM head's notice
    model = from_pretrained(minilm_dir(), "masked-lm").train()
    torch.manual_seed(0)
    input_ids = torch.randint(1000, 30000, (32, 256))
    attention_mask = torch.ones_like(input_ids)
    pool = splade_pool if args.pooling == "max_first" else per_token
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    for _ in range(args.steps):
        pool(model, input_ids, attention_mask).sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.pooling}: peak {peak:,.0f} MiB (model loaded: {loaded:,.0f}), {time.perf_counter() - start:.1f} s "
          f"for {args.steps} forward + backward")


if __name__ == "__main__":
    main()
