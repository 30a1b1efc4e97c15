"""How repeated value rows (layer 0) slow the exact search: a row beside key sets of its token count, with and without copies.

    NUMBA_NUM_THREADS=2 .venv/bin/python benchmarks/bench_token_instances.py --real DUMP --rows 1,3,5
        [--s 8] [--time-limit 10] [--threads 2] [--seed 0] [--pool-start]

A layer-0 value is a function of the token alone, so a row of layer 0 repeats its value rows: keys of one
token (a *token*: a distinct value row) contribute parallel vectors ``a_i = p_i (v_tau - mu)`` and differ only
in mass. For each row (``row_id``s of a ``forcedweight dump``) this runs ``bnb.solve_bnb`` with the same time
limit on six instances, one after another:

- ``row``: the row itself, all N keys (what ``certify`` solves; from top-mass, or with ``--pool-start`` from
  the pool optimum, as ``certify`` starts it);
- ``heaviest``: the exact optimum over one key per token, its heaviest copy (``solve_bnb(..., A=)`` with the
  contributions of the full row, so ``mu`` is the row's: a restriction of the row's problem, whose value is
  at or above the row's); ``lightest``: the same with each token's lightest copy;
- ``heaviest_keys`` / ``random``: as many keys as there are tokens, the heaviest of the row / drawn at random
  (``--seed``), copies kept: restrictions of the same size with repeated value rows;
- ``merged``: one key per token carrying all its copies (their masses and contributions summed): a different
  instance (a set of its keys is a set of tokens, all copies kept), of the same size.

None is a relaxation of the row, so none bounds it: they measure how hard the same search finds sets of the
row's keys of one size with and without copies of one token. Output: one JSON line per instance (value,
lower bound / value, proved, seconds).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from forcedweight.certify.pool import pool_optimum
from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.certify.warmup import warm_up
from forcedweight.core.operator import centred_contributions
from forcedweight.rows import rows_by_id


def value_tokens(V: np.ndarray) -> tuple[np.ndarray, int]:
    """Each key's token, the index of its value row among the distinct ones (N,), and their number T."""
    _, token = np.unique(V, axis=0, return_inverse=True)
    token = token.ravel()
    return token, int(token.max()) + 1


def token_instances(p: np.ndarray, V: np.ndarray, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The instances beside a row: name -> (masses (T,), contributions (T, d)), T = its distinct value rows.

    ``heaviest`` / ``lightest``: each token's heaviest / lightest copy (ties: lower index);
    ``heaviest_keys`` / ``random``: the T heaviest keys (ties: lower index) / T keys drawn with ``seed``;
    ``merged``: each token's copies summed. Contributions are ``p_i (v_i - mu)`` with the full row's ``mu``.
    """
    A = centred_contributions(p, V)
    token, n_tokens = value_tokens(V)
    index = np.arange(p.shape[0])

    def one_per_token(sign: float) -> np.ndarray:
        order = np.lexsort((index, sign * p, token))
        return order[np.r_[True, token[order][1:] != token[order][:-1]]]

    merged_A = np.zeros((n_tokens, A.shape[1]))
    np.add.at(merged_A, token, A)
    subsets = {"heaviest": one_per_token(-1.0), "lightest": one_per_token(1.0),
               "heaviest_keys": np.sort(np.argsort(-p, kind="stable")[:n_tokens]),
               "random": np.sort(np.random.default_rng(seed).choice(p.shape[0], n_tokens, replace=False))}
    out = {name: (p[idx], A[idx]) for name, idx in subsets.items()}
    out["merged"] = (np.bincount(token, weights=p, minlength=n_tokens), merged_A)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", required=True, help="a dump directory")
    ap.add_argument("--rows", required=True, help="row_ids, comma-separated")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the random instance's draw")
    ap.add_argument("--pool-start", action="store_true",
                    help="start the row's search from the pool optimum, as certify does (default: top-mass)")
    a = ap.parse_args()
    ids = [int(x) for x in a.rows.split(",")]
    warm_up()
    rows = rows_by_id(a.real, set(ids))
    for rid in ids:
        r = rows[rid]
        runs = {"row": (r.p, None)}
        runs.update(token_instances(r.p, r.V, a.seed))
        for name, (p, A) in runs.items():
            t0 = time.perf_counter()
            start = pool_optimum(r.p, r.V, a.s)[2] if a.pool_start and name == "row" else None
            res = solve_bnb(p, r.V, a.s, incumbent=start, A=A, time_limit=a.time_limit, threads=a.threads)
            seconds = time.perf_counter() - t0
            print(json.dumps(dict(row=rid, instance=name, keys=int(p.shape[0]), value=res.value,
                                  bound_share=res.lower_bound / res.value, proved=bool(res.proved),
                                  seconds=round(seconds, 1))), flush=True)


if __name__ == "__main__":
    main()
