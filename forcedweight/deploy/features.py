"""Attention features the deploy path (the context Prefill, the ragged cache's attention) does not
implement, refused with one line naming them rather than computed wrong (issue 18, item 2).

Both compute plain causal softmax attention of ``q . k * scaling`` over every key held. A layer whose
attention call (the keyword arguments transformers' attention modules pass to the attention
function, or the module itself) asks for more is refused:

- ``softcap`` (Gemma 2's attention-logit soft-capping ``c * tanh(s / c)``);
- learned sinks (gpt-oss: ``s_aux`` / a ``sinks`` parameter on the module);
- a ``sliding_window`` shorter than the tokens processed so far (Mistral, Gemma 2/3, Phi-3, Qwen2
  with ``use_sliding_window``). A window the sequence never outgrows changes nothing and is allowed.
"""

from __future__ import annotations

import torch

from forcedweight.errors import InputError


def refuse_unsupported(module, kwargs: dict, n_tokens: int, where: str = "the ragged cache") -> None:
    """Raise InputError if layer ``module``'s attention call needs a feature ``where`` lacks.

    Parameters
    ----------
    module : the attention module (its ``layer_idx`` and class name go into the message).
    kwargs : the keyword arguments of the attention call.
    n_tokens : tokens processed by the layer including this call (positions 0 .. n_tokens - 1).
    """
    name = f"layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"
    if kwargs.get("softcap") is not None:
        raise InputError(f"--model: {name}: attention-logit soft-capping ({kwargs['softcap']}) is not supported by {where}")
    if kwargs.get("s_aux") is not None or isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
        raise InputError(f"--model: {name}: learned attention sinks are not supported by {where}")
    window = kwargs.get("sliding_window")
    if window is not None and int(n_tokens) > int(window):
        raise InputError(
            f"--model: {name}: a sliding window of {int(window)} tokens shorter than the {int(n_tokens)} tokens "
            f"processed is not supported by {where}"
        )


__all__ = ["refuse_unsupported"]
