"""Shared by the mask-pattern tests (``dump.hook._check_pattern``): a stand-in attention module and
the causal (optionally sliding-window) boolean mask it is checked against."""

import torch


def attention_module(layer_idx: int) -> torch.nn.Module:
    """A causal attention module stand-in whose errors name layer ``layer_idx``."""
    module = torch.nn.Module()
    module.layer_idx = layer_idx
    module.is_causal = True
    return module


def causal(t, window=None):
    """(t, t) bool: query i sees keys j <= i (and j > i - window with a window)."""
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    ok = j <= i
    return ok & (j > i - window) if window is not None else ok
