"""``kvpress:<PressClassName>``: any kvpress ``ScorerPress`` as a policy of ours (issue 18).

kvpress (the optional ``peers`` extra, ``pip install 'forcedweight[peers]'``) prunes a dense cache
inside its forward hook: ``ScorerPress.compress`` calls ``press.score(module, hidden_states, keys,
values, attentions, kwargs)`` -> (B, H_kv, N) and keeps each head's top ``int(N * (1 - ratio))``.
:class:`KvpressPolicy` calls the same ``score`` with the same arguments and hands the scores to our
allocators and the ragged cache instead, so the peer's scoring rule runs with the budget physically
enforced (entries evicted from a :class:`~forcedweight.deploy.ragged_cache.RaggedKVCache`) and the
bytes measured.

How the arguments are obtained: one forward pass of the model's decoder over the Prefill's context
(with a fresh ``DynamicCache``), a forward hook on every attention module (kvpress's own mechanism,
``register_forward_hook(..., with_kwargs=True)``) that reads the module's input ``hidden_states``
(B, N, hidden), the keyword arguments of the attention call (``position_embeddings``,
``cache_position``, the cache), the layer's post-RoPE keys and values from the cache
(B, H_kv, N, d), and the attention weights the module returns (``None`` under SDPA; presses that
need them, such as ``ObservedAttentionPress``, run the pass with eager attention:
``attentions=True``). The pass costs one more forward over the context; it is reported in
``last_cost``. Scores come back per layer as (H_kv, N) float64 (batch 1).

kvpress is imported when a policy is built (function-level import: an optional heavy package);
without it :func:`make_kvpress_policy` raises an InputError saying how to install it.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from forcedweight.compat import attention_implementation, cache_kwargs
from forcedweight.deploy.policies.base import Policy
from forcedweight.errors import InputError

PREFIX = "kvpress:"
#: presses whose ``score`` reads the attention weights (run the scoring pass with eager attention)
NEEDS_ATTENTIONS = frozenset({"ObservedAttentionPress"})


def _import_kvpress():
    try:
        import kvpress  # optional peer toolkit (the ``peers`` extra)
    except ImportError as exc:
        raise InputError(
            f"--policy {PREFIX}...: kvpress is not installed (pip install 'forcedweight[peers]', "
            f"i.e. kvpress==0.5.5): {exc}"
        ) from None
    return kvpress


def _attention_modules(model) -> list[torch.nn.Module]:
    """The decoder's attention modules in layer order (kvpress: ``model.model[.language_model].layers``)."""
    body = getattr(model, "model", model)
    body = getattr(body, "language_model", body)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise InputError(f"--policy {PREFIX}...: the model has no decoder layers (model.model.layers)")
    mods = [getattr(layer, "self_attn", None) for layer in layers]
    if any(m is None for m in mods):
        raise InputError(f"--policy {PREFIX}...: a decoder layer has no self_attn module")
    return mods


class KvpressPolicy(Policy):
    """A kvpress ``ScorerPress`` (by class name) scoring the Prefill's context.

    Parameters
    ----------
    press : the kvpress class name (``"KnormPress"``, ``"SnapKVPress"``, ...) or a ScorerPress instance.
    attentions : run the scoring pass with eager attention so ``score`` receives the attention weights
        (B, H_q, N, N); default: only for the presses in :data:`NEEDS_ATTENTIONS`.
    sinks, recent, seed : as every policy (sinks / recent padded to +inf; seed sets torch's seed before
        scoring, for presses that draw random numbers).
    **press_options : the press's own fields (e.g. ``window_size=8`` for SnapKVPress).
    """

    name = "kvpress"
    query_agnostic = True

    def __init__(self, press, attentions: bool | None = None, sinks: int = 0, recent: int = 0, seed: int = 0,
                 **press_options):
        super().__init__(sinks=sinks, recent=recent, seed=seed)
        kvpress = _import_kvpress()
        if isinstance(press, str):
            cls = getattr(kvpress, press, None)
            if not isinstance(cls, type) or not issubclass(cls, kvpress.ScorerPress):
                known = sorted(n for n in dir(kvpress) if isinstance(getattr(kvpress, n), type)
                               and issubclass(getattr(kvpress, n), kvpress.ScorerPress))
                raise InputError(f"--policy {PREFIX}{press}: not a kvpress ScorerPress (known: {', '.join(known)})")
            try:
                press = cls(**press_options)
            except (TypeError, AssertionError, ValueError) as exc:
                raise InputError(f"--policy {PREFIX}{cls.__name__}: bad option(s) {press_options}: {exc}") from None
        elif not isinstance(press, kvpress.ScorerPress):
            raise InputError(f"--policy {PREFIX}...: {type(press).__name__} is not a kvpress ScorerPress")
        elif press_options:
            raise InputError(f"--policy {PREFIX}{type(press).__name__}: options given with a press instance")
        self.press = press
        self.name = PREFIX + type(press).__name__
        self.attentions = type(press).__name__ in NEEDS_ATTENTIONS if attentions is None else bool(attentions)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        """Per layer (H_kv, N) float64: ``press.score(...)`` of every attention layer (batch 1)."""
        model = prefill.model
        modules = _attention_modules(model)
        out: list[np.ndarray | None] = [None] * len(modules)
        cache = None

        def hook(module, args, kwargs, output, layer):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            kw = dict(kwargs)
            kw.setdefault("past_key_values", kw.get("cache", cache))  # kvpress reads this name
            cl = cache.layers[layer]
            attn = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            s = self.press.score(module, hidden, cl.keys, cl.values, attn, kw)
            if s.dim() != 3 or s.shape[0] != 1 or tuple(s.shape[1:]) != tuple(cl.keys.shape[1:3]):
                raise InputError(f"--policy {self.name}: score returned {tuple(s.shape)}, expected "
                                 f"(1, {cl.keys.shape[1]}, {cl.keys.shape[2]})")
            out[layer] = s[0].detach().double().cpu().numpy()

        cache = DynamicCache(config=model.config)
        if hasattr(self.press, "post_init_from_model"):
            self.press.post_init_from_model(model)
        handles = [m.register_forward_hook(lambda mod, a, k, o, i=i: hook(mod, a, k, o, i), with_kwargs=True)
                   for i, m in enumerate(modules)]
        # kvpress's press(model) gives every attention module the decoder's rotary embedding
        # (ExpectedAttentionPress reads module.rotary_emb); do the same for the pass, then undo it
        rotary = getattr(getattr(getattr(model, "model", model), "language_model", getattr(model, "model", model)),
                         "rotary_emb", None)
        lent = [m for m in modules if rotary is not None and "rotary_emb" not in m._modules and not hasattr(m, "rotary_emb")]
        for m in lent:
            m.rotary_emb = rotary
        body = getattr(model, "base_model", model)
        t0 = time.perf_counter()
        torch.manual_seed(self.seed)
        try:
            with attention_implementation(model, "eager" if self.attentions else None), torch.inference_mode():
                body(input_ids=prefill.context_ids, use_cache=True, **cache_kwargs(cache))
        finally:
            for h in handles:
                h.remove()
            for m in lent:
                del m.rotary_emb
        self.last_cost = {"seconds": time.perf_counter() - t0, "forward_tokens": int(prefill.n_tokens)}
        missing = [i for i, s in enumerate(out) if s is None]
        if missing:
            raise InputError(f"--policy {self.name}: layers {missing} were never scored")
        return out

    def __repr__(self) -> str:
        return f"KvpressPolicy({self.press!r}, sinks={self.sinks}, recent={self.recent})"


def make_kvpress_policy(name: str, **options) -> KvpressPolicy:
    """``kvpress:<PressClassName>`` → :class:`KvpressPolicy` (InputError when kvpress is absent)."""
    if not name.startswith(PREFIX) or len(name) == len(PREFIX):
        raise InputError(f"--policy {name!r}: expected {PREFIX}<PressClassName>, e.g. {PREFIX}KnormPress")
    return KvpressPolicy(name[len(PREFIX):], **options)


__all__ = ["NEEDS_ATTENTIONS", "PREFIX", "KvpressPolicy", "make_kvpress_policy"]
