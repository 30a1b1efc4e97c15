"""Eviction policies: one small class per rule scoring every (layer, KV head, entry) of a Prefill.

``POLICIES`` maps a policy's name to its class; ``make_policy(name, **options)`` builds one (InputError
naming the policy when unknown). See docs/policies.md for every definition and its kvpress twin.
"""

from __future__ import annotations

from forcedweight.deploy.policies.attention import H2OPolicy, SnapKVPolicy, TOVAPolicy
from forcedweight.deploy.policies.base import Policy
from forcedweight.deploy.policies.compactor import CompactorPolicy
from forcedweight.deploy.policies.expected_attention import ExpectedAttentionPolicy
from forcedweight.deploy.policies.kvpress_adapter import PREFIX as KVPRESS_PREFIX
from forcedweight.deploy.policies.kvpress_adapter import KvpressPolicy, make_kvpress_policy
from forcedweight.deploy.policies.kvzip import KVzipPolicy
from forcedweight.deploy.policies.sampled import SAMPLED_POLICIES
from forcedweight.deploy.policies.simple import KnormPolicy, RandomPolicy, StreamingLLMPolicy
from forcedweight.errors import InputError

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (RandomPolicy, StreamingLLMPolicy, KnormPolicy, TOVAPolicy, H2OPolicy, SnapKVPolicy,
                ExpectedAttentionPolicy, KVzipPolicy, CompactorPolicy)
} | SAMPLED_POLICIES  # sampled-<proposal> / topk-<proposal> (issue 14)


def make_policy(name: str, **options) -> Policy:
    """The policy ``name`` built with ``options`` (sinks, recent, seed and its own);
    ``kvpress:<PressClassName>`` adapts a kvpress ScorerPress (the ``peers`` extra)."""
    if name.startswith(KVPRESS_PREFIX):
        return make_kvpress_policy(name, **options)
    cls = POLICIES.get(name)
    if cls is None:
        raise InputError(f"--policy: unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    return cls(**options)


__all__ = ["POLICIES", "CompactorPolicy", "ExpectedAttentionPolicy", "H2OPolicy", "KVzipPolicy", "KnormPolicy", "KvpressPolicy", "Policy", "RandomPolicy", "SnapKVPolicy", "StreamingLLMPolicy",
           "TOVAPolicy", "make_policy"]
