"""Has a pretrained BERT left the bag-of-words phase? Where its attention goes, layer by layer.

    python -m benchmarks.attention_locality runs/step-1000 runs/step-1500 [...]

On 16 windows of a Gutenberg validation book (128 tokens each), through `transformers`' eager attention (which
returns the probabilities): each layer's attention entropy over that of uniform attention, and the attention mass
on the two neighbouring tokens (uniform attention puts 2/128 = 0.016 there). Early in MLM pretraining BERT attends
almost uniformly (entropy ratio ~0.9, neighbours ~0.015) and its loss sits on a plateau; local attention forming
in the first layer is what ends it (BENCHMARKS.md, "Does pretraining help?").
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.common import shared_data


def windows(count: int = 16, words: int = 90) -> list[str]:
    book = sorted(shared_data("gutenberg", "valid").glob("*.txt"))[0]
    text = book.read_text(encoding="utf-8")[20_000:].split()  # past the Project Gutenberg header
    return [" ".join(text[i : i + words]) for i in range(0, count * words, words)]


@torch.inference_mode()
def locality(model_dir: str) -> list[tuple[float, float]]:
    """(entropy / uniform entropy, mass on the +-1 neighbours) per layer."""
    import transformers

    transformers.logging.set_verbosity_error()  # the MLM head's weights are not needed here: no load report
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager", add_pooling_layer=False)
    batch = tokenizer(windows(), truncation=True, max_length=128, padding="max_length", return_tensors="pt")
    attentions = model.eval()(**batch, output_attentions=True).attentions  # per layer (B, nh, T, T)
    T = batch["input_ids"].shape[1]
    rows = []
    for a in attentions:
        entropy = -(a * a.clamp_min(1e-12).log()).sum(-1).mean().item() / math.log(T)
        i = torch.arange(T - 1)
        neighbours = (a[..., i, i + 1].mean() + a[..., i + 1, i].mean()).item()
        rows.append((entropy, neighbours))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="BERT model directories")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for model_dir in args.models:
        rows = locality(model_dir)
        print(model_dir)
        for layer, (entropy, neighbours) in enumerate(rows):
            print(f"  layer {layer}: entropy / uniform {entropy:.3f}, attention on the +-1 neighbours {neighbours:.3f}")


if __name__ == "__main__":
    main()
