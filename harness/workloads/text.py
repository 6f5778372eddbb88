"""Plain-English text for the workloads: a filler grammar, needle templates, held-out prose.

Everything here is text, not tokens, so it works with any tokenizer. The shipped needle model
(models/needle-tiny) was trained on exactly this distribution, and its word-level vocabulary is
built from ``LEXICON`` below; a real Qwen3 checkpoint reads the same sentences as ordinary English.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devices.files import read_text
from harness.errors import InputError

SUBJECTS = [
    "the farmer", "the old sailor", "a young teacher", "the baker", "the village", "a small dog",
    "the children", "the merchant", "the painter", "the doctor", "the wind", "the train",
    "the old clock", "a quiet student", "the fisherman", "the mayor", "a tall stranger",
    "the gardener", "the captain", "the library", "the little girl", "the shepherd", "the cook",
    "a grey cat", "the soldier", "the weaver", "the young poet", "the carpenter", "the nurse",
    "the old woman", "the driver", "the singer", "the priest", "the hunter", "the boy",
]
TRANSITIVE = [
    "carried", "painted", "watched", "found", "cleaned", "sold", "built", "opened", "followed",
    "repaired", "described", "counted", "visited", "borrowed", "dropped", "noticed", "packed",
    "lifted", "moved", "washed", "hid", "bought", "drew", "measured", "checked", "covered",
]
OBJECTS = [
    "a wooden boat", "the heavy basket", "the long letter", "a red lantern", "the garden gate",
    "an old map", "the narrow road", "a warm blanket", "the broken chair", "a bag of apples",
    "the blue door", "a silver spoon", "the tall ladder", "a jar of honey", "the small window",
    "a bundle of wood", "the green coat", "an empty bottle", "the stone wall", "a pair of boots",
    "the kitchen table", "a loaf of bread", "the iron kettle", "a box of nails", "the white horse",
]
PLACES = [
    "near the harbor", "in the market", "behind the mill", "across the valley", "under the bridge",
    "at the station", "beside the lake", "in the library", "on the hill", "by the river",
    "in the square", "at the farm", "near the church", "in the forest", "along the coast",
    "inside the barn", "outside the school", "at the inn", "on the island", "in the garden",
]
TIMES = [
    "in the morning", "after the storm", "before dinner", "during the festival", "at dawn",
    "late at night", "every spring", "on a cold day", "after lunch", "in the evening",
    "before the rain", "during the winter", "on most days", "at noon", "in the summer",
]
INTRANSITIVE = [
    "slept", "waited", "sang", "laughed", "worked", "rested", "walked", "listened", "danced",
    "stayed", "wandered", "prayed", "cried", "smiled", "read", "cooked", "whistled",
]
ADJECTIVES = [
    "quiet", "busy", "cold", "bright", "calm", "tired", "happy", "crowded", "old", "warm",
    "careful", "angry", "gentle", "late", "proud", "wet", "silent", "hungry", "clean", "brave",
]
FILLER_TEMPLATES = [
    "{S} {V} {O}.",
    "{S} {V} {O} {P}.",
    "{T}, {s} {V} {O} {P}.",
    "{S} {I} {P}.",
    "{S} was {A} {t}.",
    "{S} {I} {t} and {i} {P}.",
    "Nobody knew why {s} {V} {O}.",
    "{S} said that {s} was {A}.",
    "{T}, {s} {I}.",
    "{S} and {s} {V} {O} together.",
    "It was {A} {P}.",
    "{S} {V} {O} while {s} {I}.",
]
KEYS = [
    "Zara", "Leo", "Mina", "Omar", "Ivy", "Hugo", "Nadia", "Felix", "Rosa", "Tomas", "Elena",
    "Kenji", "Priya", "Oscar", "Lena", "Marco", "Sofia", "Arjun", "Clara", "Diego", "Hana",
    "Ivan", "Julia", "Karim", "Lucia", "Mateo", "Nora", "Pablo", "Quinn", "Ravi", "Selma",
    "Theo", "Uma", "Victor", "Wanda", "Yusuf", "Anya", "Bruno", "Celia", "Dmitri", "Esme",
    "Farah", "Gideon", "Helga", "Ines", "Jonas", "Kira", "Lars", "Maya", "Nils", "Olga", "Petra",
    "Rafael", "Sven", "Tara", "Ursula", "Vera", "Willem", "Xenia", "Yara", "Zeno", "Amir",
    "Bianca", "Cyrus",
]
DIGITS = "0123456789"

# Words the prompts use outside the grammar: the needle and question templates, the decode task.
EXTRA_WORDS = ["The", "secret", "code", "of", "is", "What", "Tell", "me", "a", "story", "about"]


def lexicon() -> list[str]:
    """Every word the built-in text can produce (both capitalisations), for vocabularies."""
    phrases = [*SUBJECTS, *TRANSITIVE, *OBJECTS, *PLACES, *TIMES, *INTRANSITIVE, *ADJECTIVES,
               *FILLER_TEMPLATES, *KEYS, *EXTRA_WORDS]
    words: set[str] = set()
    for phrase in phrases:
        for word in re.findall(r"[A-Za-z]+", phrase):
            if word in {"S", "V", "O", "P", "T", "I", "A", "s", "i", "t"}:
                continue  # template slots
            words.update({word, word.lower(), word.capitalize()})
    return sorted(words)


class GrammarFiller:
    """Endless varied sentences from a small grammar; deterministic for a given random source."""

    name = "grammar"

    def sentences(self, rng: random.Random) -> Iterator[str]:
        while True:
            template = rng.choice(FILLER_TEMPLATES)
            yield template.format(
                S=rng.choice(SUBJECTS).capitalize(), s=rng.choice(SUBJECTS),
                V=rng.choice(TRANSITIVE), O=rng.choice(OBJECTS), P=rng.choice(PLACES),
                T=rng.choice(TIMES).capitalize(), t=rng.choice(TIMES), I=rng.choice(INTRANSITIVE),
                i=rng.choice(INTRANSITIVE), A=rng.choice(ADJECTIVES),
            )


class TextFiller:
    """Sentences of a plain-text file, taken in order from a seeded start and cycled."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            text = read_text(self.path)
        except OSError as exc:
            raise InputError(
                f"filler file {self.path}: cannot read it ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise InputError(
                f"filler file {self.path}: cannot read it as UTF-8 text ({exc})") from exc
        self.items = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
        if not self.items:
            raise InputError(f"filler file {self.path}: holds no sentences")
        self.name = f"file:{self.path.name}"

    def sentences(self, rng: random.Random) -> Iterator[str]:
        index = rng.randrange(len(self.items))
        while True:
            yield self.items[index % len(self.items)]
            index += 1


def resolve_filler(filler: str | GrammarFiller | TextFiller) -> GrammarFiller | TextFiller:
    """``"grammar"`` (the default), a path to a text file, or a filler object."""
    if not isinstance(filler, str):
        return filler
    return GrammarFiller() if filler == "grammar" else TextFiller(filler)


@dataclass(frozen=True)
class NeedleTemplate:
    """The fact hidden in the haystack and the question that asks for it.

    ``needle`` and ``question`` must contain ``{key}``; ``needle`` must also contain ``{value}``.
    The value is ``value_digits`` random decimal digits, so it spans several tokens. Only those
    two placeholders are substituted; every other character, ``{`` and ``}`` included, is kept
    as written (the text is the user's, never a format string).
    """

    needle: str = "The secret code of {key} is {value}."
    question: str = "What is the secret code of {key}?"
    keys: tuple[str, ...] = field(default_factory=lambda: tuple(KEYS))
    value_digits: int = 5

    def __post_init__(self) -> None:
        if "{key}" not in self.needle or "{value}" not in self.needle:
            raise InputError(f"needle template {self.needle!r}: must contain {{key}} and {{value}}")
        if "{key}" not in self.question:
            raise InputError(f"question template {self.question!r}: must contain {{key}}")
        if not self.keys or self.value_digits < 1:
            raise InputError("needle template: needs at least one key and value_digits >= 1")

    def draw(self, rng: random.Random) -> tuple[str, str]:
        """A random (key, value) pair."""
        return rng.choice(self.keys), "".join(rng.choice(DIGITS) for _ in range(self.value_digits))

    def needle_text(self, key: str, value: str) -> str:
        return _substitute(self.needle, {"key": key, "value": value})

    def question_text(self, key: str) -> str:
        return _substitute(self.question, {"key": key})


PLACEHOLDER = re.compile(r"\{(key|value)\}")


def _substitute(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{key}`` / ``{value}`` named in ``values`` replaced, in one pass."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


DEFAULT_NEEDLE = NeedleTemplate()
DECODE_REQUEST = "Tell me a story about the village."
