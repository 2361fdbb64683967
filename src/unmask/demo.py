"""The lesson, reproduced on its synthetic grammar: what masking does, and why reading both sides helps.

The grammar has 16 real words. A sentence is `the SUBJECT VERB FOLLOWER ... TIME`, e.g. "the cat sat on the mat
today". The subject (cat/dog/bird) says nothing about the verb (sat/ran/went), but the word after the verb does:
sat -> on, ran -> in, went -> home. So a reader that sees only the left side guesses the verb one time in three,
and a reader that sees both sides always gets it right. That is the case for a bidirectional encoder.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass

import torch

from unmask.data.masking import mlm_mask, whole_word_spans
from unmask.models.outputs import IGNORE_INDEX, mlm_loss

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
REAL_WORDS = ["the", "cat", "dog", "bird", "sat", "ran", "went", "on", "in", "home",
              "mat", "rug", "park", "garden", "today", "now"]
VOCAB = SPECIAL_TOKENS + REAL_WORDS
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
PAD, CLS, SEP, MASK = (TOKEN_ID[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
SPECIAL_IDS = tuple(TOKEN_ID[t] for t in SPECIAL_TOKENS)

SUBJECTS = ["cat", "dog", "bird"]
VERBS = ["sat", "ran", "went"]
OBJECTS = {"on": ["mat", "rug"], "in": ["park", "garden"], "home": []}
BLANK_POSITION = {"verb": 2, "subject": 1}  # word positions in "the SUBJECT VERB ..."

MASKING_TOKENS = 200_000
TRAIN_SENTENCES = 20_000
TEST_SENTENCES = 500
LESSON_PIECES = ["the", "un", "##believ", "##able", "cat", "play", "##ed"]


@dataclass(frozen=True)
class DemoOptions:
    mlm_probability: float = 0.15
    mask_special_tokens: bool = False  # drop the guard that keeps [CLS]/[SEP] from being chosen
    shared_follower: bool = False  # "sat" and "ran" are both followed by "on"
    blank: str = "verb"  # which word the fill-in-the-blank test hides: "verb" or "subject"
    seed: int = 0


def followers(shared_follower: bool) -> dict[str, str]:
    return {"sat": "on", "ran": "on" if shared_follower else "in", "went": "home"}


def sample_sentence(rng: random.Random, shared_follower: bool = False) -> list[str]:
    verb = rng.choice(VERBS)
    follower = followers(shared_follower)[verb]
    words = ["the", rng.choice(SUBJECTS), verb, follower]
    if OBJECTS[follower]:
        words += ["the", rng.choice(OBJECTS[follower])]
    return words + [rng.choice(["today", "now"])]


def corpus_ids(n_tokens: int, seed: int) -> torch.Tensor:
    """Exactly `n_tokens` real tokens as `[CLS] sentence [SEP]` rows, right-padded. (N, T) long."""
    rng = random.Random(seed)
    rows, total = [], 0
    while total < n_tokens:
        words = sample_sentence(rng)[: n_tokens - total]
        rows.append([CLS] + [TOKEN_ID[w] for w in words] + [SEP])
        total += len(words)
    ids = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids


def measure_masking(options: DemoOptions) -> dict:
    """Mask the corpus once and count what happened to the chosen tokens."""
    ids = corpus_ids(MASKING_TOKENS, options.seed)
    maskable = ids != PAD if options.mask_special_tokens else None
    generator = torch.Generator().manual_seed(options.seed)
    inputs, labels = mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL_IDS, vocab_size=len(VOCAB),
                              mlm_probability=options.mlm_probability, maskable=maskable, generator=generator)
    chosen = labels != IGNORE_INDEX
    selected = int(chosen.sum())
    became_mask = int((chosen & (inputs == MASK)).sum())
    unchanged = int((chosen & (inputs == ids)).sum())
    return {
        "tokens": int((~torch.isin(ids, torch.tensor(SPECIAL_IDS))).sum()),
        "selected": selected,
        "mask": round(became_mask / selected, 4),
        "random": round((selected - became_mask - unchanged) / selected, 4),
        "unchanged": round(unchanged / selected, 4),
        "_special_selected": {VOCAB[i]: int((chosen & (ids == i)).sum()) for i in (CLS, SEP)},
        "_example": (ids[0], inputs[0], labels[0]),
    }


def fill_blank(options: DemoOptions) -> dict:
    """Best guess for the blanked word from training counts, seeing the left side only or both sides."""
    position = BLANK_POSITION[options.blank]
    rng = random.Random(options.seed + 1)
    left_counts: dict[tuple, Counter] = defaultdict(Counter)
    both_counts: dict[tuple, Counter] = defaultdict(Counter)
    for _ in range(TRAIN_SENTENCES):
        words = sample_sentence(rng, options.shared_follower)
        left, right = tuple(words[:position]), tuple(words[position + 1 :])
        left_counts[left][words[position]] += 1
        both_counts[(left, right)][words[position]] += 1

    def guess(counts: Counter) -> str | None:
        return counts.most_common(1)[0][0] if counts else None

    test_rng = random.Random(options.seed + 2)
    left_right = both_right = 0
    for _ in range(TEST_SENTENCES):
        words = sample_sentence(test_rng, options.shared_follower)
        left, right = tuple(words[:position]), tuple(words[position + 1 :])
        left_right += guess(left_counts[left]) == words[position]
        both_right += guess(both_counts[(left, right)]) == words[position]
    return {"test_sentences": TEST_SENTENCES, "left_only": round(left_right / TEST_SENTENCES, 4),
            "both_sides": round(both_right / TEST_SENTENCES, 4)}


def worked_example() -> tuple[float, list[str], dict[int, float]]:
    """The lesson's loss: p=0.5 and p=0.2 on the true token at the two labelled positions of the sentence."""
    words = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    ids = torch.tensor([[TOKEN_ID[w] for w in words]])
    target_prob = {2: 0.5, 6: 0.2}  # "cat" and "mat" were masked
    labels = torch.full_like(ids, IGNORE_INDEX)
    probs = torch.full((1, len(words), len(VOCAB)), 1.0 / len(VOCAB))
    for pos, p in target_prob.items():
        labels[0, pos] = ids[0, pos]
        probs[0, pos] = (1 - p) / (len(VOCAB) - 1)
        probs[0, pos, ids[0, pos]] = p
    loss = mlm_loss(probs.log(), labels).item()  # log-probs are valid logits: softmax gives the probs back
    return round(loss, 4), words, target_prob


def run(options: DemoOptions = DemoOptions()) -> dict:
    masking = measure_masking(options)
    loss, _, _ = worked_example()
    return {
        "masking": {k: v for k, v in masking.items() if not k.startswith("_")},
        "whole_word_spans": whole_word_spans(LESSON_PIECES),
        "fill_blank": fill_blank(options),
        "worked_example_loss": loss,
        "_masking_details": masking,
    }


def public(result: dict) -> dict:
    return {k: v for k, v in result.items() if not k.startswith("_")}


def differences(default: dict, variant: dict, prefix: str = "") -> list[str]:
    """Lines 'key: default -> variant' for every number or value that changed."""
    lines = []
    for key, value in variant.items():
        if isinstance(value, dict):
            lines += differences(default[key], value, f"{prefix}{key}.")
        elif value != default[key]:
            lines.append(f"{prefix}{key}: {default[key]} -> {value}")
    return lines


def describe(result: dict, options: DemoOptions) -> str:
    m, fb = result["masking"], result["fill_blank"]
    details = result["_masking_details"]
    n_real = len(REAL_WORDS)
    p_mask, p_random = 0.8, 0.1
    original, inputs, labels = details["_example"]
    shown = [VOCAB[i] for i in inputs.tolist() if i != PAD]
    label_words = [VOCAB[int(label)] if label != IGNORE_INDEX else "-"
                   for label, i in zip(labels.tolist(), original.tolist()) if i != PAD]
    loss, words, target_prob = worked_example()
    lines = [
        f"1. Masking {m['tokens']:,} real tokens with p = {options.mlm_probability}"
        f" ({n_real} real words in the vocabulary)",
        f"   selected   {m['selected']:,} positions ({m['selected'] / m['tokens']:.2%} of the real tokens)",
        f"   -> [MASK]  {m['mask']:.3f} of selected (expected {p_mask:.3f})",
        f"   -> random  {m['random']:.3f} (expected 0.1 x {n_real - 1}/{n_real} = "
        f"{p_random * (n_real - 1) / n_real:.3f}: a random draw hits the original 1 time in {n_real})",
        f"   -> kept    {m['unchanged']:.3f} (expected 0.1 + 0.1/{n_real} = {0.1 + p_random / n_real:.3f})",
        f"   special tokens chosen: {details['_special_selected']}"
        + ("  <- the guard is off" if options.mask_special_tokens else "  (never: the guard keeps them out)"),
        f"   e.g. input  {' '.join(shown)}",
        f"        labels {' '.join(label_words)}",
        "",
        f"2. Whole-word spans of {LESSON_PIECES}:",
        f"   {result['whole_word_spans']}",
        "",
        f"3. Fill in the blank ({options.blank}, word {BLANK_POSITION[options.blank]}) on {fb['test_sentences']}"
        f" test sentences, best guess from {TRAIN_SENTENCES:,} training sentences:",
        f"   left side only  {fb['left_only']:.3f}",
        f"   both sides      {fb['both_sides']:.3f}",
        "",
        f"4. Worked example: {' '.join(words)}",
        "   labelled positions " + ", ".join(f"{words[p]!r} (p = {q})" for p, q in target_prob.items()),
        f"   loss = -(ln 0.5 + ln 0.2) / 2 = {loss:.4f}  (cross-entropy, ignore_index=-100, as in training)",
    ]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """The lesson's two panels: the measured 80/10/10 split, and left-only vs both-sides accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, fb = result["masking"], result["fill_blank"]
    n_real = len(REAL_WORDS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["[MASK]", "random", "unchanged"]
    measured = [m["mask"], m["random"], m["unchanged"]]
    expected = [0.8, 0.1 * (n_real - 1) / n_real, 0.1 + 0.1 / n_real]
    bars = left.bar(names, measured, color=["#4c72b0", "#dd8452", "#55a868"])
    left.scatter(names, expected, color="black", marker="_", s=600, zorder=3, label="expected")
    left.bar_label(bars, fmt="%.3f")
    left.set_title(f"What the {m['selected']:,} chosen tokens became")
    left.set_ylabel("fraction of chosen tokens")
    left.set_ylim(0, 1)
    left.legend()
    bars = right.bar(["left side only", "both sides"], [fb["left_only"], fb["both_sides"]],
                     color=["#8c8c8c", "#4c72b0"])
    right.bar_label(bars, fmt="%.3f")
    right.axhline(1 / 3, color="black", linestyle=":", label="chance among 3 verbs")
    right.set_ylim(0, 1.05)
    right.set_ylabel("accuracy")
    right.set_title(f"Fill in the blank, {fb['test_sentences']} test sentences")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def is_default(options: DemoOptions) -> bool:
    return options == DemoOptions(seed=options.seed)


def main(options: DemoOptions, as_json: bool = False, plot_path: str | None = None) -> dict:
    import json

    result = run(options)
    if as_json:
        print(json.dumps(public(result)))
    else:
        print(describe(result, options))
        if not is_default(options):
            changed = differences(public(run(DemoOptions(seed=options.seed))), public(result))
            print("\nAgainst the default run:")
            print("\n".join(f"   {line}" for line in changed) or "   nothing changed")
    if plot_path:
        plot(result, plot_path)
        if not as_json:
            print(f"\nfigure written to {plot_path}")
    return public(result)

