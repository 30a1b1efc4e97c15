"""What the repeated value rows of a layer-0 row cost the exact search: the row beside two twin-free instances.

    NUMBA_NUM_THREADS=2 .venv/bin/python benchmarks/bench_token_instances.py --real DUMP --rows 1,3,5
        [--s 8] [--time-limit 10] [--threads 2]

A layer-0 value is a function of the token alone, so a row of layer 0 repeats its value rows: keys of one
token (a *token*: a distinct value row) contribute parallel vectors ``a_i = p_i (v_tau - mu)`` and differ only
in mass. For each row (``row_id``s of a ``forcedweight dump``) this runs ``bnb.solve_bnb`` with the same time
limit on three instances, one after another:

- ``row``: the row itself, all N keys (what ``certify`` solves);
- ``heaviest``: the exact optimum over one key per token, its heaviest copy (``solve_bnb(..., A=)`` with the
  contributions of the full row, so ``mu`` is the row's: a restriction of the row's problem, whose value is
  at or above the row's);
- ``merged``: one key per token carrying all its copies (their masses and contributions summed): a different
  instance (a set of its keys is a set of tokens, all copies kept), of the same size as ``heaviest``.

The two twin-free instances have about a quarter of the keys and no near-twins (copies of one token that
a key-by-key search refutes one by one). Neither is a relaxation of the row, so neither bounds it: they
measure how hard the same search finds the row's tokens without the copies. Output: one JSON line per
instance (value, lower bound / value, proved, seconds).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.certify.warmup import warm_up
from forcedweight.core.operator import centred_contributions
from forcedweight.rows import rows_by_id


def token_instances(p: np.ndarray, V: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The twin-free instances of a row: name -> (masses (T,), contributions (T, d)), T = distinct value rows.

    ``heaviest``: each token's heaviest copy (ties: lower index); ``merged``: each token's copies summed.
    Contributions are ``p_i (v_i - mu)`` with the full row's ``mu``.
    """
    A = centred_contributions(p, V)
    _, token = np.unique(V, axis=0, return_inverse=True)
    token = token.ravel()
    n_tokens = int(token.max()) + 1
    by_token_then_mass = np.lexsort((np.arange(p.shape[0]), -p, token))
    first_of_token = np.r_[True, token[by_token_then_mass][1:] != token[by_token_then_mass][:-1]]
    heaviest = by_token_then_mass[first_of_token]
    merged_A = np.zeros((n_tokens, A.shape[1]))
    np.add.at(merged_A, token, A)
    return {"heaviest": (p[heaviest], A[heaviest]),
            "merged": (np.bincount(token, weights=p, minlength=n_tokens), merged_A)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", required=True, help="a dump directory")
    ap.add_argument("--rows", required=True, help="row_ids, comma-separated")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    ids = [int(x) for x in a.rows.split(",")]
    warm_up()
    rows = rows_by_id(a.real, set(ids))
    for rid in ids:
        r = rows[rid]
        runs = {"row": (r.p, None)}
        runs.update(token_instances(r.p, r.V))
        for name, (p, A) in runs.items():
            t0 = time.perf_counter()
            res = solve_bnb(p, r.V, a.s, A=A, time_limit=a.time_limit, threads=a.threads)
            seconds = time.perf_counter() - t0
            print(json.dumps(dict(row=rid, instance=name, keys=int(p.shape[0]), value=res.value,
                                  bound_share=res.lower_bound / res.value, proved=bool(res.proved),
                                  seconds=round(seconds, 1))), flush=True)


if __name__ == "__main__":
    main()
