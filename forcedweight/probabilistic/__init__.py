"""Probabilistic KV eviction with decode-time importance-sampling correction (paper 000; docs/probabilistic.md).

- :mod:`.proposals`: proposals pi from eviction scores (H2O, SnapKV, K-norm, StreamingLLM, uniform),
  temperature, uniform mixing, the GQA-shared mixture, validation;
- :mod:`.sampling`: ``expected_unique``, Algorithm 2 (``sample_count``), the global soft constraint
  (``global_sample_count``), ``sample``;
- :mod:`.correction`: the logit bias ``b_i = log(c_i / (m pi_i)) / tau`` and the corrected estimator;
- :mod:`.study`: the bias–variance study on dumped trajectories and the effective-compression table.
"""

from forcedweight.probabilistic.correction import corrected_output, correction_bias, two_interval_output
from forcedweight.probabilistic.proposals import (
    PROPOSALS,
    gqa_mixture,
    make_proposal,
    min_mass_mixture,
    proposal_from_scores,
    streaming_proposal,
    uniform_proposal,
    validate_proposal,
)
from forcedweight.probabilistic.sampling import expected_unique, global_sample_count, sample, sample_count

__all__ = [
    "PROPOSALS",
    "corrected_output",
    "correction_bias",
    "expected_unique",
    "global_sample_count",
    "gqa_mixture",
    "make_proposal",
    "min_mass_mixture",
    "proposal_from_scores",
    "sample",
    "sample_count",
    "streaming_proposal",
    "two_interval_output",
    "uniform_proposal",
    "validate_proposal",
]
