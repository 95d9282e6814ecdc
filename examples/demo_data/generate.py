"""Generate the demo corpus: short movie-review-like sentences with sentiment labels.

The corpus is deterministic (seeded ``random.Random``) and shipped as ``reviews.jsonl`` next
to this file with the WordPiece vocabulary trained on it (``vocab.txt``), so the demo needs
no network. Regenerate both with::

    python examples/demo_data/generate.py

The label follows a learnable rule (the polarity of the adjective in the last clause,
flipped by "not"; "but" makes the second clause decide), and a fraction of the labels is
flipped at random (label noise). A small model learns the rule, then starts memorising the
noisy training labels: its accuracy on a train subset keeps rising while the eval accuracy
stalls and the eval loss climbs, which is what the demo's learning curves show.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SUBJECTS = [
    "the movie", "the film", "this show", "the plot", "the acting", "the soundtrack", "the ending",
    "the script", "the cast", "the director", "the pacing", "the dialogue", "the sequel", "the story",
    "the camera work", "the lead actor", "the villain", "the finale", "the first act", "the humour",
]
POSITIVE = [
    "great", "wonderful", "brilliant", "moving", "funny", "clever", "beautiful", "gripping",
    "charming", "superb", "delightful", "fresh", "stunning", "memorable", "sharp", "touching",
]
NEGATIVE = [
    "boring", "awful", "dull", "clumsy", "predictable", "terrible", "messy", "flat", "tedious",
    "silly", "bland", "weak", "confusing", "forgettable", "painful", "lazy",
]
INTENSIFIERS = ["", "", "very", "really", "quite", "truly", "rather", "so", "incredibly"]
OPENERS = [
    "", "", "honestly", "overall", "i think", "in my opinion", "to be fair", "sadly", "frankly",
    "my friend said", "on sunday", "at the festival", "last night",
]
NAMES = [
    "anna", "bruno", "chloe", "dmitri", "elena", "farid", "greta", "hugo", "ines", "jonas", "kofi",
    "lena", "mateo", "nadia", "omar", "petra", "quinn", "rosa", "sven", "tara", "umar", "vera",
]
PLACES = ["in paris", "in lagos", "in oslo", "in lima", "in osaka", "in cairo", "in rome", "at home"]


def _clause(rng: random.Random) -> tuple[str, int]:
    positive = rng.random() < 0.5
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    negated = rng.random() < 0.2
    words = [rng.choice(SUBJECTS), "was"]
    if negated:
        words.append("not")
    intensifier = rng.choice(INTENSIFIERS)
    if intensifier:
        words.append(intensifier)
    words.append(adjective)
    return " ".join(words), int(positive != negated)


def make_example(rng: random.Random) -> tuple[str, int]:
    """One sentence and its clean label (1 = positive)."""
    first, label = _clause(rng)
    parts = [rng.choice(OPENERS), first]
    if rng.random() < 0.1:
        second, label = _clause(rng)
        parts += ["but", second]
    if rng.random() < 0.5:
        parts += ["said", rng.choice(NAMES), rng.choice(PLACES)]
    return " ".join(p for p in parts if p), label


def generate(n: int, seed: int = 0, label_noise: float = 0.1) -> list[dict]:
    """``n`` examples ``{"text", "label"}``; ``label_noise`` of them get the wrong label."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text, label = make_example(rng)
        if rng.random() < label_noise:
            label = 1 - label
        rows.append({"text": text, "label": label})
    return rows


def main() -> None:
    path = Path(__file__).with_name("reviews.jsonl")
    rows = generate(4000, seed=0)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} examples to {path}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from demo_pipeline import VOCAB_PATH, train_vocabulary

    tokens = train_vocabulary(path=path)
    VOCAB_PATH.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    print(f"wrote a WordPiece vocabulary of {len(tokens)} tokens to {VOCAB_PATH}")


if __name__ == "__main__":
    main()
