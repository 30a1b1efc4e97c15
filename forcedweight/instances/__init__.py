"""NP-hard instance generators with proved answers (docs/instances.md).

- :mod:`.partition`: ZEROES rows from balanced partition (uniform masses, 1-D integer values, s = m/2).
- :mod:`.kveviction`: the PARTITION -> KVEVICTION construction of paper 000 (d = 1, all-ones K and q).
- :mod:`.proofs`: exact answers by signed-sum meet-in-the-middle, independent of every solver.
"""

from forcedweight.instances.kveviction import kveviction_row, write_kveviction
from forcedweight.instances.partition import (
    KINDS,
    default_bits,
    generate,
    make_instance,
    partition_row,
    write_partition,
)
from forcedweight.instances.proofs import BalancedProof, brute_force_balanced, prove_balanced, verify_witness

__all__ = [
    "KINDS",
    "BalancedProof",
    "brute_force_balanced",
    "default_bits",
    "generate",
    "kveviction_row",
    "make_instance",
    "partition_row",
    "prove_balanced",
    "verify_witness",
    "write_kveviction",
    "write_partition",
]
