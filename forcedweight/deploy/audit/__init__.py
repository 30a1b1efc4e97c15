"""``forcedweight audit`` (issue 13): what an eviction method really holds, how much of its score comes
from seeing the question, and how far it is from the best selection at the same budget.

- :mod:`.memory`: physical bytes per policy x allocator x compression ratio, ragged vs masked vs nominal;
- :mod:`.leak`: the same policy ranked with and without the question visible (paired margins);
- :mod:`.ceiling`: attention restricted to s entries of the full cache chosen with the true query
  (top-mass, balancing, the certified best forced-weight set, the targeted switch) inside generation;
- :mod:`.report`: ``DIR/report.md`` and the figure.
"""
