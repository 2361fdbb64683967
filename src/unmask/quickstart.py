"""The main job on embedded data: pretrain a tiny BERT on the lesson's grammar, then fill blanks that only the
right-hand context can decide ("the cat [MASK] on the mat": sat, because "on" follows only "sat")."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from unmask.demo import sample_sentence
from unmask.models import from_pretrained
from unmask.pipelines.fill_mask import fill_mask
from unmask.tokenizer import load_tokenizer
from unmask.train.pretrain import PretrainArgs, pretrain

PROBES = [
    ("the dog [MASK] on the rug now", "sat"),
    ("the cat [MASK] in the garden today", "ran"),
    ("the bird [MASK] home now", "went"),
    ("the [MASK] sat on the mat today", None),  # the subject: the right side does not decide it
]


def write_corpus(path: Path, n_sentences: int = 20_000, seed: int = 0) -> Path:
    """One sentence per JSON line, so each is its own document (and its own sequence)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": " ".join(sample_sentence(rng))}) + "\n"
                            for _ in range(n_sentences)), encoding="utf-8")
    return path


def quickstart(output_dir: str | Path = "runs/quickstart", seed: int = 0, max_steps: int = 300) -> dict:
    output_dir = Path(output_dir)
    train = write_corpus(output_dir / "data" / "train.jsonl", seed=seed)
    valid = write_corpus(output_dir / "data" / "valid.jsonl", n_sentences=1000, seed=seed + 1)
    config = output_dir / "data" / "tiny_config.json"
    config.write_text(json.dumps({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "intermediate_size": 256,
                                  "max_position_embeddings": 32, "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0}))
    model_dir = output_dir / "model"
    start = time.perf_counter()
    result = pretrain(PretrainArgs(
        train_file=[str(train)], validation_file=[str(valid)], output_dir=str(model_dir), model_config=str(config),
        vocab_size=120, max_seq_length=16, per_device_train_batch_size=64, learning_rate=3e-3, warmup_steps=30,
        max_steps=max_steps, logging_steps=50, mlm_probability=0.3, seed=seed, cache_dir=str(output_dir / "cache"),
        show_progress=True, overwrite_output_dir=True))  # its own directory: a rerun replaces it
    seconds = time.perf_counter() - start
    print(f"\npretrained in {seconds:.0f} s: validation masked-token accuracy {result['eval_accuracy']:.3f},"
          f" perplexity {result['eval_perplexity']:.2f}  -> {model_dir}\n")
    model = from_pretrained(model_dir, "masked-lm")
    tokenizer = load_tokenizer(model_dir, model.config)
    right = 0
    for (text, answer), candidates in zip(PROBES, fill_mask(model, tokenizer, [t for t, _ in PROBES], top_k=3)):
        shown = ", ".join(f"{c['token_str']} {c['score']:.2f}" for c in candidates)
        verdict = "" if answer is None else ("  <- right" if candidates[0]["token_str"] == answer else "  <- wrong")
        right += answer is not None and candidates[0]["token_str"] == answer
        print(f"  {text:<38} {shown}{verdict}")
    print("\nThe verb is decided by the word after it; the subject is not decided by anything, so the model spreads"
          " its bet.\nTry: unmask fill-mask " + str(model_dir) + ' "the cat [MASK] in the park now"')
    return {**result, "probes_right": right, "seconds": seconds}
