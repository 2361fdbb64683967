"""A small generated sample of every file the README's examples read (`unmask example-data DIR`), in the layout and
formats of the public datasets they stand for: each documented command runs right after cloning. The texts come
from seeded templates, so the commands run and learn something, but their figures are not the real datasets'."""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena"]
PLACES = ["Lisbon", "New York", "Nairobi", "Oslo", "Lima", "Hanoi", "Cairo", "Buenos Aires", "Perth", "Quebec"]
ORGANISATIONS = ["Reuters", "United Nations", "Acme Mills", "Northern Rail", "City Bank", "Red Cross"]
ANIMALS = ["cat", "dog", "horse", "bird", "fox", "goat"]
THINGS = ["garden", "river", "letter", "window", "lantern", "bridge", "road", "harbour", "market", "forest"]
PLAIN = ["old", "quiet", "long", "small", "narrow", "grey", "bright", "cold"]
BOOK_SENTENCES = [
    "It was a {plain} morning in {place}, and {name} walked down to the {thing}.",
    "{name} had never seen the {thing} so {plain}; the {animal} sat beside it all day.",
    "\"We must leave {place} before the {thing} closes,\" said {name}.",
    "The {animal} followed {name} along the {plain} {thing} until night fell.",
    "Nobody in {place} remembered the {thing}, but {name} wrote a letter about it.",
    "At the {thing}, {name} met {other}, who had come from {place} with a {plain} {animal}.",
]
POSITIVE = ["charming", "moving", "brilliant", "warm", "funny", "gorgeous", "clever", "tender", "gripping"]
NEGATIVE = ["dull", "tedious", "clumsy", "bland", "shallow", "messy", "tiresome", "lifeless", "hollow"]
ADVERBS = ["often", "always", "quietly", "truly", "rather", "oddly", "deeply"]
FILMS = ["journey", "comedy", "thriller", "drama", "film", "story", "portrait", "romance"]
REVIEWS = ["a {a} and {adv} {b} {film}", "the {film} is {adv} {a}", "{adv} {a} , this {film} feels {b}",
           "an {adv} {a} {film} with a {b} cast"]
ENTITY_SENTENCES = ["{PER} flew from {LOC} to {LOC} on Monday .", "{PER} works for {ORG} in {LOC} .",
                    "{ORG} said {PER} would visit {LOC} next week .", "In {LOC} , {PER} and {PER} met {ORG} staff ."]
ACTORS = [("A man", "A person"), ("A woman", "A lady"), ("A child", "A young kid"), ("The dog", "A puppy")]
ACTIONS = [("is playing a guitar", "plays the guitar"), ("is riding a horse", "rides a horse"),
           ("is cutting an onion", "slices an onion"), ("is swimming in a pool", "swims in the pool"),
           ("is reading a book", "reads a novel"), ("is running on a beach", "jogs along the shore")]
SUBSTANCES = ["vitamin D", "aspirin", "metformin", "caffeine", "zinc", "statins", "melatonin", "folic acid"]
OUTCOMES = ["blood pressure", "tumour growth", "bone density", "insulin resistance", "sleep quality", "inflammation"]
GROUPS = ["older adults", "mice", "pregnant women", "children", "smokers", "athletes"]
EFFECTS = [("increases", "raises"), ("reduces", "lowers"), ("does not change", "has no effect on")]


def write_example_data(root: str | Path, seed: int = 0) -> list[Path]:
    """Writes the sample under `root` (gutenberg/, sst2/, conll2003/, stsb/, scifact/, sentences.txt, pairs.tsv,
    shards/); returns the files written."""
    rng, root = random.Random(seed), Path(root)
    writers = [_books, _reviews, _entities, _similarity, _claims, _extras]
    return [path for write in writers for path in write(root, rng)]


def _fill(template: str, rng: random.Random, **choices: list[str]) -> str:
    """The template with each {slot} replaced by a fresh choice from its list."""
    parts = template.split("{")
    out = [parts[0]]
    for part in parts[1:]:
        slot, rest = part.split("}", 1)
        out.append(rng.choice(choices[slot]) + rest)
    return "".join(out)


def _book_sentence(rng: random.Random) -> str:
    return _fill(rng.choice(BOOK_SENTENCES), rng, plain=PLAIN, place=PLACES, name=NAMES, other=NAMES,
                 thing=THINGS, animal=ANIMALS)


def _book(rng: random.Random, paragraphs: int) -> str:
    return "\n\n".join(" ".join(_book_sentence(rng) for _ in range(rng.randint(3, 6))) for _ in range(paragraphs))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def _books(root: Path, rng: random.Random) -> list[Path]:
    """Project Gutenberg's role: plain-text books, a file a document."""
    files = [_write(root / "gutenberg" / "train" / f"book-{n}.txt", _book(rng, 60)) for n in range(4)]
    return files + [_write(root / "gutenberg" / "valid" / "book-4.txt", _book(rng, 20))]


def _reviews(root: Path, rng: random.Random) -> list[Path]:
    """SST-2's role: `sentence<TAB>label` with a header, 1 positive, 0 negative."""
    def review() -> str:
        label = rng.random() < 0.5
        words = POSITIVE if label else NEGATIVE
        return _fill(rng.choice(REVIEWS), rng, a=words, b=words, adv=ADVERBS, film=FILMS) + f"\t{int(label)}"
    return [_write(root / "sst2" / name, "sentence\tlabel\n" + "".join(review() + "\n" for _ in range(rows)))
            for name, rows in (("train.tsv", 400), ("dev.tsv", 100))]


def _entity_sentence(rng: random.Random) -> str:
    """CoNLL-2003 lines (token, part of speech, chunk, tag) for one sentence, BIO tags."""
    lines = []
    for word in rng.choice(ENTITY_SENTENCES).split():
        if word.startswith("{"):
            kind = word[1:-1]
            pieces = rng.choice({"PER": NAMES, "LOC": PLACES, "ORG": ORGANISATIONS}[kind]).split()
            lines += [f"{piece} NNP B-NP {'B' if i == 0 else 'I'}-{kind}" for i, piece in enumerate(pieces)]
        else:
            lines.append(f"{word} NN I-NP O")
    return "\n".join(lines)


def _entities(root: Path, rng: random.Random) -> list[Path]:
    return [_write(root / "conll2003" / name, "-DOCSTART- -X- -X- O\n\n" +
                   "".join(_entity_sentence(rng) + "\n\n" for _ in range(rows)))
            for name, rows in (("train.txt", 300), ("valid.txt", 80))]


def _sentence_pair(rng: random.Random) -> tuple[float, str, str]:
    """A pair and its 0-5 score: a paraphrase, the same actor doing something else, or nothing shared."""
    actor, action = rng.choice(ACTORS), rng.choice(ACTIONS)
    kind = rng.choice(["paraphrase", "same actor", "unrelated"])
    if kind == "paraphrase":
        return 4.2 + 0.8 * rng.random(), f"{actor[0]} {action[0]}.", f"{actor[1]} {action[1]}."
    other_action = rng.choice([a for a in ACTIONS if a != action])
    other_actor = actor if kind == "same actor" else rng.choice([a for a in ACTORS if a != actor])
    score = 1.5 + rng.random() if kind == "same actor" else 0.6 * rng.random()
    return score, f"{actor[0]} {action[0]}.", f"{other_actor[1]} {other_action[1]}."


def _similarity(root: Path, rng: random.Random) -> list[Path]:
    """The STS Benchmark release: genre, file, year, id, score, sentence 1, sentence 2 (tab-separated, no header)."""
    def rows(count: int) -> str:
        return "".join(f"main-captions\tsample\t2026\t{n:04d}\t{score:.3f}\t{a}\t{b}\n"
                       for n, (score, a, b) in enumerate(_sentence_pair(rng) for _ in range(count)))
    return [_write(root / "stsb" / name, rows(count)) for name, count in (("sts-train.csv", 300),
                                                                          ("sts-dev.csv", 100))]


def _claims(root: Path, rng: random.Random) -> list[Path]:
    """BEIR's layout (SciFact's role): corpus.jsonl (_id, title, text), queries.train.jsonl, qrels/train.tsv. Each
    query restates the finding of one abstract in other words."""
    docs, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for n in range(200):
        substance, outcome, group, effect = (rng.choice(SUBSTANCES), rng.choice(OUTCOMES), rng.choice(GROUPS),
                                             rng.choice(EFFECTS))
        title = f"{substance[0].upper() + substance[1:]} {effect[0]} {outcome} in {group}"
        text = (f"We studied {rng.randint(40, 900)} {group} for {rng.randint(2, 36)} months. "
                f"Daily {substance} {effect[0]} {outcome} compared with placebo. {_book_sentence(rng)}")
        docs.append({"_id": str(1000 + n), "title": title, "text": text})
        if n % 3 == 0:
            queries.append({"_id": str(n), "text": f"In {group}, {substance} {effect[1]} {outcome}."})
            qrels.append(f"{n}\t{1000 + n}\t1")
    return [_write(root / "scifact" / "corpus.jsonl", _jsonl(docs)),
            _write(root / "scifact" / "queries.train.jsonl", _jsonl(queries)),
            _write(root / "scifact" / "qrels" / "train.tsv", "\n".join(qrels) + "\n")]


def _extras(root: Path, rng: random.Random) -> list[Path]:
    """Files of the user's own: sentences to embed, scored pairs with their own column names, and training shards
    in the compressed and columnar formats `pretrain --streaming` reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sentences = _write(root / "sentences.txt", "".join(_book_sentence(rng) + "\n" for _ in range(50)))
    pairs = _write(root / "pairs.tsv", "a\tb\tgold\n" + "".join(
        f"{a}\t{b}\t{score:.2f}\n" for score, a, b in (_sentence_pair(rng) for _ in range(50))))
    (root / "shards").mkdir(parents=True, exist_ok=True)
    compressed = root / "shards" / "part-0.jsonl.zst"
    with pa.CompressedOutputStream(str(compressed), "zstd") as out:
        out.write(_jsonl([{"text": _book(rng, 3)} for _ in range(40)]).encode())
    table = root / "shards" / "part-1.parquet"
    pq.write_table(pa.table({"text": [_book(rng, 3) for _ in range(40)]}), table)
    return [sentences, pairs, compressed, table]
