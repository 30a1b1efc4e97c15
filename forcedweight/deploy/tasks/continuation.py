"""Held-out continuation examples: a built-in text's first part is the context, its rest the
continuation, scored teacher-forced after eviction (cross-entropy in nats per token).

The built-in passages are short (about 240 tokens each), so example ``i`` reads the corpus as one
text starting at passage ``(seed + i) mod 12`` and cycling on; its first ``tokens`` tokens (measured
with the model's tokenizer) are the context and the next ``continuation_tokens`` the continuation.
Cuts are at token boundaries of the joint encoding, and the two parts are decoded back to text, so
``context + continuation`` is a prefix of the cycled corpus.
"""

from __future__ import annotations

from forcedweight.deploy.tasks.scoring import CONTINUATION_TASK
from forcedweight.dump.corpus import builtin_texts


def continuation(tokens: int, tokenizer, seed: int, index: int, continuation_tokens: int = 128) -> dict:
    """One continuation example (kvpress columns; ``answer`` = [continuation text], ``question`` empty)."""
    texts = builtin_texts()
    start = (seed + index) % len(texts)
    need = tokens + continuation_tokens
    parts, ids = [], []
    k = 0
    while len(ids) < need + 8:
        parts.append(texts[(start + k) % len(texts)])
        k += 1
        ids = tokenizer.encode("\n\n".join(parts), add_special_tokens=False)
    context = tokenizer.decode(ids[:tokens])
    cont = tokenizer.decode(ids[tokens:need])
    return {
        "context": context,
        "question": "",
        "answer_prefix": "",
        "answer": [cont],
        "max_new_tokens": 0,
        "task": CONTINUATION_TASK,
        "id": f"{CONTINUATION_TASK}-{index}",
    }
