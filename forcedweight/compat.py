"""Every difference between the transformers versions forcedweight supports (4.57 to the newest), in one place.

kvpress pins ``transformers<5.3``, so a researcher using it beside this toolkit has 4.57–5.2, while the
newest releases renamed and reshaped several APIs our cache and attention code relies on. Modules
import the names below instead of branching on the version themselves:

- :data:`CACHE_KWARG` / :func:`cache_kwargs`: the forward / ``generate`` keyword that takes the KV cache
  (``cache`` in the newest releases, ``past_key_values`` before; the old name is deprecated there).
- :class:`CacheLayerBase`: the base class of a custom cache layer, written against the newest layer API
  (``lazy_initialization(key_states, value_states)``, ``get_mask_sizes(query_length)``,
  ``get_max_length()``, ``crop(tokens_to_remove)``). On 4.57–5.2 it translates the old calls
  (``get_mask_sizes(cache_position)``, ``get_max_cache_shape()``, ``crop(max_length)``,
  ``lazy_initialization(key_states)``) into those.
- :func:`register_attention`: register an attention function with ``AttentionInterface`` and, when it
  should get the masks another implementation gets, its mask function with the mask interface.
- :func:`sdpa_drops_features`: on 4.57–5.2 Gemma 2 defaults to SDPA, which silently ignores its
  attention-logit soft-cap (newer releases mark Gemma 2 ``_supports_sdpa = False`` and run eager); the
  capture then runs such a model through eager, the attention the family defines.
- :func:`attention_configs` / :func:`attention_implementation`: the configs whose private
  ``_attn_implementation`` a forward reads (the model's and, for a multimodal family, its text config's),
  and a context manager that switches them all and restores them.
- :data:`ALL_ATTENTION_FUNCTIONS`, :data:`ALL_MASK_ATTENTION_FUNCTIONS`, :func:`sdpa_attention_forward`.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import transformers
from packaging.version import Version
from transformers import AttentionInterface
from transformers.cache_utils import CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaModel

TRANSFORMERS_VERSION = Version(transformers.__version__)
MIN_TRANSFORMERS = Version("4.57")

# The forward keyword taking the KV cache: read from a decoder's signature (the deprecation wrapper of
# the newest releases keeps the new name in its signature).
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"

#: True when cache layers follow the newest API (``get_mask_sizes(query_length)``).
NEW_LAYER_API = "query_length" in inspect.signature(CacheLayerMixin.get_mask_sizes).parameters


def cache_kwargs(cache) -> dict:
    """``{CACHE_KWARG: cache}``: pass a cache to ``model(...)`` or ``model.generate(...)`` on any version."""
    return {CACHE_KWARG: cache}


def output_cache(outputs):
    """The cache a model's forward / ``generate`` output carries (``cache`` or ``past_key_values``)."""
    for name in ("cache", "past_key_values"):
        value = getattr(outputs, name, None)
        if value is not None:
            return value
    return None


def _query_length(arg) -> int:
    """The query length from an old-API ``cache_position`` tensor (or an int already)."""
    return int(arg.shape[0]) if isinstance(arg, torch.Tensor) else int(arg)


if NEW_LAYER_API:
    CacheLayerBase = CacheLayerMixin
else:

    class CacheLayerBase(CacheLayerMixin):
        """A ``CacheLayerMixin`` whose subclasses implement the newest layer API (see the module docstring);
        the old entry points call them."""

        def __init__(self, **kwargs):  # the old mixin takes no options
            super().__init__()

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            own = cls.__dict__.get("get_mask_sizes")
            if own is not None and not getattr(own, "_forcedweight_compat", False):
                def get_mask_sizes(self, cache_position, _own=own):
                    return _own(self, _query_length(cache_position))
                get_mask_sizes._forcedweight_compat = True
                cls.get_mask_sizes = get_mask_sizes
            own_crop = cls.__dict__.get("crop")
            if own_crop is not None and not getattr(own_crop, "_forcedweight_compat", False):
                def crop(self, max_length, _own=own_crop):
                    # old: keep max_length tokens (negative: remove -max_length); new: remove tokens_to_remove
                    n = self.get_seq_length()
                    return _own(self, -max_length if max_length < 0 else max(n - max_length, 0))
                crop._forcedweight_compat = True
                cls.crop = crop
            own_lazy = cls.__dict__.get("lazy_initialization")
            if own_lazy is not None and not getattr(own_lazy, "_forcedweight_compat", False):
                def lazy_initialization(self, key_states, value_states=None, _own=own_lazy):
                    # the old Cache.early_initialization passes the (empty) keys only
                    return _own(self, key_states, key_states if value_states is None else value_states)
                lazy_initialization._forcedweight_compat = True
                cls.lazy_initialization = lazy_initialization

        def get_max_cache_shape(self) -> int:
            return self.get_max_length()

        def get_max_length(self) -> int:
            return -1


def text_config(config):
    """The config holding the language model's shape (layers, heads, window): ``config`` itself, or a
    multimodal config's text config (Gemma 3's ``text_config``)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def sdpa_drops_features(config) -> str | None:
    """The attention feature SDPA would silently drop for ``config`` (a model or text config), or None.

    transformers' SDPA attention takes no soft-cap: a model with ``attn_logit_softcapping`` (Gemma 2)
    computes its defined attention only under eager (what the newest releases force).
    """
    text = text_config(config)
    if getattr(text, "attn_logit_softcapping", None) is not None:
        return "attention-logit soft-capping"
    return None


def register_attention(name: str, function, mask_like: str | None = None) -> str:
    """Register ``function`` with ``AttentionInterface`` as ``name``; with ``mask_like`` (e.g. "sdpa",
    "eager") also register that implementation's mask function for ``name`` so the model builds the
    same masks for it. Without, transformers builds no mask for ``name``. Returns ``name``."""
    AttentionInterface.register(name, function)
    if mask_like is not None:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_like])
    return name


def attention_configs(model) -> list:
    """The configs whose ``_attn_implementation`` ``model``'s forward reads: its config and, when
    different (a multimodal family such as Gemma 3), its text config, last."""
    config = model.config
    text = text_config(config)
    return [config] if text is config else [config, text]


@contextlib.contextmanager
def attention_implementation(model, name: str | None, state: tuple | None = None):
    """Run ``model`` with its attention implementation set to ``name`` (registered with
    ``AttentionInterface``) in every :func:`attention_configs` entry, then restore each; ``None``
    leaves it as it is. ``state``: optional ``(ContextVar, value)``, the registered function's state
    for the run, set first and reset afterwards."""
    token = None if state is None else state[0].set(state[1])
    try:
        if name is None:
            yield
            return
        configs = attention_configs(model)
        previous = [c._attn_implementation for c in configs]
        for c in configs:
            c._attn_implementation = name
        try:
            yield
        finally:
            for c, p in zip(configs, previous):
                c._attn_implementation = p
    finally:
        if token is not None:
            state[0].reset(token)


__all__ = ["ALL_ATTENTION_FUNCTIONS", "ALL_MASK_ATTENTION_FUNCTIONS", "CACHE_KWARG", "CacheLayerBase",
           "MIN_TRANSFORMERS", "NEW_LAYER_API", "TRANSFORMERS_VERSION", "attention_configs",
           "attention_implementation", "cache_kwargs", "output_cache",
           "register_attention", "sdpa_attention_forward", "sdpa_drops_features", "text_config"]
