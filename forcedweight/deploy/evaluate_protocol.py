"""The protocol of one (example, method) run, as kvpress's pipeline does it, with the budget enforced.

- :func:`prompt_ids` splits an example as kvpress 0.5.5's ``KVPressTextGenerationPipeline.preprocess``:
  the chat template is applied to ``context + separator`` in a user turn with the generation prompt;
  the text before the separator is the context, the rest (end of turn + assistant header) the
  question suffix; the question ids are ``question + suffix + answer_prefix``. Without a chat
  template the context is ``bos + context`` and the suffix ``"\\n"``. Both are tokenized separately
  without special tokens. Query-aware (kvpress's ``compress_questions``): the question is appended to
  the context and the question becomes empty (so the policy scores context + question).
  A continuation example has no template: ``bos + context``, continuation = ``answer[0]``.
- :func:`greedy_answer` feeds the question with positions continuing from the original context
  length, then decodes greedily one token at a time through the (evicted) cache until an EOS token
  or ``max_new_tokens`` (kvpress's ``generate_answer``; the EOS token is part of the ids, dropped by
  ``skip_special_tokens`` when decoded).
- :func:`continuation_nll` scores a continuation teacher-forced through the cache: its first token
  from the prefill's last logits (the same for every method), the others from one forward pass of
  the continuation over the cache; mean negative log-likelihood in nats per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from forcedweight.compat import cache_kwargs
from forcedweight.deploy.tasks import CONTINUATION_TASK


@dataclass
class Prompt:
    """An example's token ids: ``context`` (1, N) and ``question`` (1, Lq) long (or, for a
    continuation example, ``continuation`` (1, C))."""

    context: torch.Tensor
    question: torch.Tensor
    continuation: torch.Tensor | None = None

    @property
    def n_context(self) -> int:
        return int(self.context.shape[1])

    def total_tokens(self, max_new_tokens: int) -> int:
        extra = self.continuation.shape[1] if self.continuation is not None else self.question.shape[1] + max_new_tokens
        return self.n_context + int(extra)


def _encode(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text, add_special_tokens=False)], dtype=torch.long).reshape(1, -1)


def prompt_ids(tokenizer, example: dict, query_aware: bool = False) -> Prompt:
    """Token ids of an example, split as kvpress's pipeline does (see the module docstring)."""
    context, question = example["context"], example["question"]
    bos = getattr(tokenizer, "bos_token", None) or ""
    if example.get("task") == CONTINUATION_TASK:
        cont = example["answer"][0] if example["answer"] else ""
        return Prompt(_encode(tokenizer, bos + context), _encode(tokenizer, ""), _encode(tokenizer, cont))
    if query_aware:
        context, question = context + question, ""
    if getattr(tokenizer, "chat_template", None) is None:
        context = bos + context
        suffix = "\n"
    else:
        separator = "#" * (len(context) + 10)
        templated = tokenizer.apply_chat_template([{"role": "user", "content": context + separator}],
                                                  add_generation_prompt=True, tokenize=False)
        context, suffix = templated.split(separator)
    return Prompt(_encode(tokenizer, context), _encode(tokenizer, question + suffix + example["answer_prefix"]))


def eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


@torch.inference_mode()
def greedy_answer(model, cache, question: torch.Tensor, context_length: int, max_new_tokens: int) -> list[int]:
    """Greedy answer ids after feeding ``question`` (1, Lq) at positions ``context_length + i``.

    ``cache`` is extended in place (question and answer tokens appended).
    """
    if max_new_tokens <= 0:
        return []
    device = next(model.parameters()).device
    question = question.to(device)
    pos = torch.arange(context_length, context_length + question.shape[1], device=device)[None]
    out = model(input_ids=question, position_ids=pos, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))
    stop = eos_ids(model)
    ids = [int(out.logits[0, -1].argmax())]
    nxt = int(pos[0, -1]) + 1
    for i in range(max_new_tokens - 1):
        if ids[-1] in stop:
            break
        out = model(input_ids=torch.tensor([[ids[-1]]], device=device), **cache_kwargs(cache),
                    position_ids=torch.tensor([[nxt + i]], device=device), use_cache=True)
        ids.append(int(out.logits[0, -1].argmax()))
    return ids


@torch.inference_mode()
def continuation_nll(model, cache, logits_last: torch.Tensor, continuation: torch.Tensor,
                     context_length: int) -> float:
    """Mean NLL (nats/token) of ``continuation`` (1, C) after the context held in ``cache``."""
    device = next(model.parameters()).device
    cont = continuation.to(device)[0]
    if cont.numel() == 0:
        return float("nan")
    nll = [F.cross_entropy(logits_last.float()[None].to(device), cont[:1], reduction="sum")]
    if cont.numel() > 1:
        feed = cont[:-1][None]
        pos = torch.arange(context_length, context_length + feed.shape[1], device=device)[None]
        out = model(input_ids=feed, position_ids=pos, use_cache=True, **cache_kwargs(cache))
        nll.append(F.cross_entropy(out.logits[0].float(), cont[1:], reduction="sum"))
    return float(sum(nll)) / int(cont.numel())
