"""RULER-style synthetic tasks (NVIDIA/RULER ``synthetic.yaml``), written offline in kvpress's columns.

Every example is a dict ``context, question, answer_prefix, answer (list of str), max_new_tokens,
task, id``. The haystack size is fitted by binary search so that ``context + question +
answer_prefix`` measured with the model's tokenizer is at most ``tokens`` long (as RULER fits
``num_haystack``). All draws come from a ``random.Random`` seeded by (seed, kind, index): the same
arguments give the same examples.

Kinds (RULER's configurations):

- ``niah_single_1`` noise haystack, word key, 7-digit number; ``niah_single_2`` essay haystack
  (the built-in corpus), number; ``niah_single_3`` essay, uuid;
- ``niah_multikey_1`` essay, 4 keys (one asked); ``niah_multikey_2`` a haystack of other needles,
  number; ``niah_multikey_3`` needles haystack, uuid keys and values;
- ``niah_multivalue`` essay, one key with 4 values; ``niah_multiquery`` essay, 4 keys all asked;
- ``vt`` variable tracking (1 chain, 4 hops, noise haystack); ``cwe`` common words extraction
  (10 common words); ``fwe`` frequent (Zipf) coded words extraction (top 3).
"""

from __future__ import annotations

import random
import re
import uuid
import zlib
from dataclasses import dataclass
from typing import Callable

from forcedweight.deploy.tasks.words import ADJECTIVES, NOISE, NOUNS, VERBS
from forcedweight.dump.corpus import builtin_texts
from forcedweight.errors import InputError

NIAH_TEMPLATE = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_v} afterwards.\n{context}\n")
NIAH_QUESTION = "What are all the special magic {type_v} for {query} mentioned in the provided text?"
NIAH_PREFIX = "The special magic {type_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."


@dataclass(frozen=True)
class NiahConfig:
    haystack: str  # noise, essay, needle
    type_k: str  # words, numbers, uuids
    type_v: str
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1


NIAH = {
    "niah_single_1": NiahConfig("noise", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", num_k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", num_v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", num_q=4),
}
#: RULER's tokens_to_generate
MAX_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
KINDS = tuple(NIAH) + ("vt", "cwe", "fwe")


def _rng(seed: int, kind: str, index: int) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}/{kind}/{index}".encode()))


def _draw(rng: random.Random, kind: str, used: set) -> str:
    while True:
        if kind == "numbers":
            v = str(rng.randint(1_000_000, 9_999_999))
        elif kind == "uuids":
            v = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        else:
            v = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if v not in used:
            used.add(v)
            return v


def _essay_words() -> list[str]:
    return " ".join(t.replace("\n", " ") for t in builtin_texts()).split()


_SENT = re.compile(r"(?<=[.!?\"])\s+")


def _insert(rng: random.Random, pieces: list[str], needles: list[str]) -> list[str]:
    """Insert ``needles`` (in order) at random positions among ``pieces``."""
    idx = sorted(rng.randint(0, len(pieces)) for _ in needles)
    out, j = [], 0
    for i in range(len(pieces) + 1):
        while j < len(needles) and idx[j] == i:
            out.append(needles[j])
            j += 1
        if i < len(pieces):
            out.append(pieces[i])
    return out


def niah(kind: str, size: int, rng: random.Random) -> dict:
    """One needle-in-a-haystack example with a haystack of ``size`` units (noise blocks, essay words
    or distractor needles)."""
    cfg = NIAH[kind]
    used: set = set()
    keys = [_draw(rng, cfg.type_k, used) for _ in range(max(cfg.num_k, cfg.num_q))]
    values = [[_draw(rng, cfg.type_v, used) for _ in range(cfg.num_v)] for _ in keys]
    needles = [NEEDLE.format(type_v=cfg.type_v, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    if cfg.haystack == "noise":
        context = "\n".join(_insert(rng, [NOISE] * size, needles))
    elif cfg.haystack == "essay":
        words = _essay_words()
        text = " ".join(words[i % len(words)] for i in range(size))
        context = " ".join(_insert(rng, [s for s in _SENT.split(text) if s], needles))
    else:
        hay = [NEEDLE.format(type_v=cfg.type_v, key=_draw(rng, cfg.type_k, used), value=_draw(rng, cfg.type_v, used))
               for _ in range(size)]
        context = "\n".join(_insert(rng, hay, needles))
    queries = keys[: cfg.num_q]
    answers = [v for vs in values[: cfg.num_q] for v in vs]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    template, question, prefix, type_v = NIAH_TEMPLATE, NIAH_QUESTION, NIAH_PREFIX, cfg.type_v
    if cfg.num_q * cfg.num_v == 1:  # RULER's singular wording for one asked value (the needles stay plural)
        template, question, prefix = (_singular(t) for t in (template, question, prefix))
        type_v = type_v[:-1]
    return {
        "context": template.format(type_v=type_v, context=context),
        "question": question.format(type_v=type_v, query=query),
        "answer_prefix": prefix.format(type_v=type_v, query=query),
        "answer": answers,
        "max_new_tokens": MAX_NEW_TOKENS["niah"],
    }


def _singular(template: str) -> str:
    """RULER's replacements for a single asked value: Some -> A, are all -> is, are -> is."""
    return template.replace("Some", "A").replace("are all", "is").replace("are", "is")


def _var(rng: random.Random, used: set) -> str:
    while True:
        v = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if v not in used:
            used.add(v)
            return v


def variable_tracking(size: int, rng: random.Random, hops: int = 4) -> dict:
    """RULER's vt: one chain ``VAR A = 12345``, ``VAR B = VAR A``, ... in a noise haystack."""
    used: set = set()
    names = [_var(rng, used) for _ in range(hops + 1)]
    value = str(rng.randint(10_000, 99_999))
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i + 1]} = VAR {names[i]}." for i in range(hops)]
    context = "\n".join(_insert(rng, [NOISE] * size, chain))
    return {
        "context": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                    f"{context}\n"),
        "question": f"Question: Find all variables that are assigned the value {value} in the text above.",
        "answer_prefix": ("Answer: According to the chain(s) of variable assignment in the text above, "
                          f"{hops + 1} variables are assigned the value {value}, they are: "),
        "answer": names,
        "max_new_tokens": MAX_NEW_TOKENS["vt"],
    }


def common_words(size: int, rng: random.Random, num_cw: int = 10, freq_cw: int = 6, freq_ucw: int = 1) -> dict:
    """RULER's cwe: a numbered word list; ``num_cw`` words appear ``freq_cw`` times, ``size`` others
    ``freq_ucw`` times (frequencies scaled down for short contexts)."""
    pool = list(dict.fromkeys(list(NOUNS) + list(VERBS) + list(ADJECTIVES)))
    rng.shuffle(pool)
    size = min(size, len(pool) - num_cw)
    common, rare = pool[:num_cw], pool[num_cw:num_cw + size]
    words = common * freq_cw + rare * freq_ucw
    rng.shuffle(words)
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
    return {
        "context": ("Below is a numbered list of words. In these words, some appear more often than others. "
                    f"Memorize the ones that appear most often.\n{context}\n"),
        "question": f"Question: What are the {num_cw} most common words in the above list?",
        "answer_prefix": f"Answer: The top {num_cw} words that appear most often in the list are:",
        "answer": common,
        "max_new_tokens": MAX_NEW_TOKENS["cwe"],
    }


def frequent_words(size: int, rng: random.Random, alpha: float = 2.0, vocab: int = 40, top: int = 3) -> dict:
    """RULER's fwe: ``size`` coded words drawn with Zipf counts (rank ``r`` ∝ ``r**-alpha``) over
    ``vocab`` random coded words; the answer is the ``top`` most frequent."""
    used: set = set()
    coded = []
    while len(coded) < vocab:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
        if w not in used:
            used.add(w)
            coded.append(w)
    weights = [(r + 1) ** -alpha for r in range(vocab)]
    total = sum(weights)
    counts = [max(1, round(size * w / total)) for w in weights]
    words = [w for w, c in zip(coded, counts) for _ in range(c)]
    rng.shuffle(words)
    context = " .... ".join(words)
    return {
        "context": ("Read the following coded text and track the frequency of each coded word. Find the three "
                    f"most frequently appeared coded words. {context}\n"),
        "question": ("Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                     "most frequently appeared words in the above coded text?"),
        "answer_prefix": "Answer: According to the coded text above, the three most frequently appeared words are:",
        "answer": coded[:top],
        "max_new_tokens": MAX_NEW_TOKENS["fwe"],
    }


def builder(kind: str) -> Callable[[int, random.Random], dict]:
    """``build(size, rng) -> example`` for a task kind; InputError naming an unknown kind."""
    if kind in NIAH:
        return lambda size, rng: niah(kind, size, rng)
    if kind == "vt":
        return variable_tracking
    if kind == "cwe":
        return common_words
    if kind == "fwe":
        return frequent_words
    raise InputError(f"--kinds: unknown task kind {kind!r} (known: {', '.join(KINDS)}, continuation)")


def count_tokens(tokenizer, example: dict) -> int:
    """Tokens of ``context + question + answer_prefix`` (no special tokens, no chat template)."""
    text = example["context"] + example["question"] + example["answer_prefix"]
    return len(tokenizer.encode(text, add_special_tokens=False))


def fit(kind: str, tokens: int, tokenizer, seed: int, index: int) -> dict:
    """The example of ``kind`` with the largest haystack whose length is at most ``tokens`` (binary
    search over the haystack size; the draws depend only on (seed, kind, index, size))."""
    build = builder(kind)

    def make(size: int) -> dict:
        return build(size, _rng(seed, kind, index))

    if count_tokens(tokenizer, make(1)) > tokens:
        raise InputError(f"--tokens {tokens}: too short for a {kind} example (its template alone is longer)")
    lo, hi = 1, 2
    while count_tokens(tokenizer, make(hi)) <= tokens:
        lo, hi = hi, hi * 2
        if hi > 1 << 22:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_tokens(tokenizer, make(mid)) <= tokens:
            lo = mid
        else:
            hi = mid
    example = make(lo)
    example["task"] = kind
    example["id"] = f"{kind}-{index}"
    return example
