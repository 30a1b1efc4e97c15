"""``kvzip`` (Kim et al., snu-mllab/KVzip; kvpress KVzipPress): importance by context reconstruction.

After the shared prefill, the model is asked to repeat the context, on a COPY of the context's cache
(the Prefill's cache is never touched): the context (after an optional chat-template prefix of
``prefix_length`` tokens) is cut into chunks of ``chunk_size`` tokens; chunk c is fed as

    "\\n\\nRepeat the previous context exactly."                                  (c = 0)
    "\\n\\nRepeat the part of the previous context exactly, starting with" + the previous chunk's last 8 tokens
    + the chat template's assistant-turn suffix + the chunk's tokens

at positions continuing from N (the copy is cut back to the N context entries after every chunk).
In every layer, each reconstruction query's attention is a softmax over the first ``min(n_sink, start)``
entries, the chunk's entries and the reconstruction tokens themselves (causal among them), scaled by
``1/sqrt(d)`` (kvpress's subsampled softmax); an entry's score is the maximum of that attention over
the reconstruction queries and over the G query heads of its KV group. Entries never reconstructed
(the prefix) score 0; the first ``n_sink = 4`` entries are padded with the max over all layers + 1.
KVzip cuts all layers and heads at one threshold: pair it with the ``global`` allocator.

Query-agnostic. Cost: one forward pass over about N + 20 tokens per chunk (recorded in ``last_cost``).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from forcedweight.compat import cache_kwargs
from forcedweight.deploy.policies.base import Policy
from forcedweight.deploy.prefill import capturing_attention, copy_dense_cache
from forcedweight.errors import InputError

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
LATER_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"


def template_parts(tokenizer) -> tuple[str, str]:
    """kvpress's chat-template split: (prefix before the user's content, suffix after it up to the
    assistant turn); ``("", "\\n")`` without a chat template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return "", "\n"
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}],
                                         add_generation_prompt=True, tokenize=False, enable_thinking=False)
    context, suffix = text.split(separator)
    return context.split(dummy)[0], suffix


def chunk_ids(ids: torch.Tensor, chunk_size: int) -> list[torch.Tensor]:
    """(1, M) ids cut into consecutive chunks of ``chunk_size`` (the last shorter)."""
    return [ids[:, s: s + chunk_size] for s in range(0, ids.shape[1], chunk_size)]


def reconstruction_inputs(tokenizer, ctx: torch.Tensor, chunk_size: int, postfix: int = 8):
    """kvpress KVzipPress.prepare: list of (chunk (1, c), repeat ids (1, q)) for context ids ``ctx``."""
    _, suffix = template_parts(tokenizer)
    suffix_ids = tokenizer.encode(suffix, return_tensors="pt", add_special_tokens=False)
    chunks = chunk_ids(ctx, chunk_size)
    pairs = []
    for i, a in enumerate(chunks):
        if i == 0:
            q = tokenizer.encode(FIRST_PROMPT, return_tensors="pt", add_special_tokens=False)
        else:
            q = tokenizer.encode(LATER_PROMPT, return_tensors="pt", add_special_tokens=False)
            q = torch.cat([q, chunks[i - 1][:, -postfix:]], dim=1)
        pairs.append((a, torch.cat([q.to(a.device), suffix_ids.to(a.device), a], dim=1)))
    return pairs


def _detect_prefix(tokenizer, context_ids: torch.Tensor) -> int:
    """Length of the chat-template prefix when the context starts with it, else 0."""
    prefix, _ = template_parts(tokenizer)
    if not prefix:
        return 0
    p = tokenizer.encode(prefix, return_tensors="pt", add_special_tokens=False)[0].to(context_ids.device)
    n = p.shape[0]
    return n if context_ids.shape[1] > n and torch.equal(context_ids[0, :n], p) else 0


class KVzipPolicy(Policy):
    """Max attention received during context reconstruction (kvpress KVzipPress; chunk 2048, 4 sinks)."""

    name = "kvzip"

    def __init__(self, chunk_size: int = 2048, n_sink: int = 4, prefix_length: int | None = None, **kw):
        super().__init__(**kw)
        if int(chunk_size) < 1 or int(n_sink) < 0:
            raise InputError("policy kvzip: chunk_size >= 1 and n_sink >= 0 needed")
        self.chunk_size, self.n_sink = int(chunk_size), int(n_sink)
        self.prefix_length = None if prefix_length is None else int(prefix_length)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        tok = prefill.tokenizer
        if tok is None:
            raise InputError("policy kvzip: needs the model's tokenizer (the reconstruction prompt)")
        t0 = time.perf_counter()
        model, n = prefill.model, prefill.n_tokens
        ids = prefill.context_ids
        prefix = _detect_prefix(tok, ids) if self.prefix_length is None else self.prefix_length
        if not 0 <= prefix < n:
            raise InputError(f"policy kvzip: prefix_length {prefix} outside [0, {n})")
        score = np.zeros((prefill.n_layers, prefill.n_kv_heads, n))
        g = prefill.group_size
        state = {}

        def record(layer, module, query, key, value, scale):
            start, end = state["start"], state["end"]
            q_len = query.shape[2]
            sink = min(self.n_sink, start)
            k = torch.cat([key[0, :, :sink], key[0, :, start:end], key[0, :, -q_len:]], dim=1).double()
            d = query.shape[-1]
            mask = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).triu(1)  # future repeats
            for h in range(k.shape[0]):
                q = query[0, h * g:(h + 1) * g].double()  # (G, q_len, d)
                logits = torch.matmul(q, k[h].T) / math.sqrt(d)  # (G, q_len, sink + c + q_len)
                logits[:, :, -q_len:] = logits[:, :, -q_len:].masked_fill(mask, float("-inf"))
                attn = torch.softmax(logits, dim=-1)[:, :, sink: sink + end - start]
                score[layer, h, start:end] = attn.amax(dim=(0, 1)).cpu().numpy()

        cache = copy_dense_cache(prefill.cache, model)
        body = getattr(model, "base_model", model)
        tokens = 0
        state["start"] = prefix
        with capturing_attention(model, record), torch.inference_mode():
            for chunk, repeat in reconstruction_inputs(tok, ids[:, prefix:], self.chunk_size):
                state["end"] = state["start"] + chunk.shape[1]
                body(input_ids=repeat.to(ids.device), use_cache=True, **cache_kwargs(cache))
                cache.crop(-repeat.shape[1])  # back to the N context entries
                tokens += repeat.shape[1]
                state["start"] = state["end"]
        del cache
        score[..., : min(self.n_sink, n)] = score.max() + 1.0
        self.last_cost = {"seconds": time.perf_counter() - t0, "forward_tokens": int(tokens),
                          "prefill_multiple": tokens / n}
        return [score[layer] for layer in range(prefill.n_layers)]
