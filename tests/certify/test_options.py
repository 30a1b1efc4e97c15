"""CertifyOptions and the SOLVERS registry: every name dispatches, fallbacks leave a note."""

import numpy as np
import pytest

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.options import SOLVERS, CertifyOptions, run_solver
from forcedweight.core import operator as op
from forcedweight.errors import InputError

from tests.rowgen import make_row


def _integral(n, seed):
    rng = np.random.default_rng(seed)
    return np.full(n, 1.0 / n), rng.integers(-50, 50, size=(n, 1)).astype(np.float64)


def _peaked(n, seed):
    rng = np.random.default_rng(seed)
    p = np.exp(2.0 * rng.normal(size=n))
    return p / p.sum(), rng.normal(size=(n, 3))


def test_registry_names_are_the_options_names():
    assert list(SOLVERS) == ["auto", "bnb", "scip", "cpsat", "none"]
    for name in SOLVERS:
        assert CertifyOptions(solver=name).solver == name
    with pytest.raises(InputError, match="--solver must be one of auto, bnb, scip, cpsat, none"):
        CertifyOptions(solver="gurobi")
    with pytest.raises(ValueError, match="unknown solver 'none'"):
        run_solver("none", *_peaked(8, 0), 2, np.arange(2), 1.0)


@pytest.mark.parametrize("name, row, s, solver, note", [
    ("auto", _integral(12, 1), 4, "mitm", None),            # uniform 1-D integers: meet in the middle
    ("auto", _integral(50, 2), 3, "bnb", "mitm gave up"),    # N = 50: halves of 25 > 24, bnb takes over
    ("auto", _peaked(14, 3), 4, "bnb", None),
    ("bnb", _integral(12, 4), 4, "bnb", None),
    ("cpsat", _integral(12, 5), 4, "cpsat", None),
    ("cpsat", _peaked(14, 6), 4, "scip", "cpsat needs an integral row"),
    ("scip", _peaked(14, 7), 3, "scip", None),
])
def test_each_solver_proves_the_brute_force_optimum(name, row, s, solver, note):
    p, V = row
    ref, _ = brute_force_best(p, V, s)
    res, got_note = run_solver(name, p, V, s, op.top_mass_set(p, s), 30.0)
    assert res.solver == solver and res.proved
    assert (got_note is None) if note is None else (note in got_note)
    # every solver's proof is relative: bnb 1e-9, scip 1e-6, mitm/cpsat exact up to float64; absolute
    # slack 1e-12 max|v|: the round-off of E (an exact optimum 0 comes out as ~1e-15)
    slack = 1e-12 * np.abs(V).max()
    assert res.value == pytest.approx(op.forced_error(p, V, res.best_set), rel=1e-12, abs=1e-300)
    assert ref * (1 - 1e-12) - slack <= res.value <= ref / (1 - 1e-6) + slack


def test_scip_below_its_resolution_says_so():
    """A value SCIP cannot resolve (E = 4.8e-13 against ||a|| ~ 1: test_solvers) comes back unsolved with a
    note naming the reason, from --solver scip and from cpsat's fallback to scip; bnb proves it."""
    p, V = make_row(230, 6, 2, "peaked")
    ref, _ = brute_force_best(p, V, 5)
    for name in ("scip", "cpsat"):
        res, note = run_solver(name, p, V, 5, op.top_mass_set(p, 5), 20.0)
        assert res.solver == "scip" and not res.proved and "below SCIP's numerical resolution" in note
    res, note = run_solver("bnb", p, V, 5, op.top_mass_set(p, 5), 20.0)
    assert res.proved and note is None and res.value == pytest.approx(ref, rel=2e-9)


def test_bound_time_reaches_bnb_from_the_options_and_bad_values_are_refused(monkeypatch):
    """``CertifyOptions(bound_time=)`` (``--bound-time``) is the deadline of a stopped search's bound:
    certify_row hands it through the registry to bnb, whose info records it; None keeps bnb's default
    (no deadline with a node limit); a negative, infinite or NaN value is refused naming the option."""
    import forcedweight.certify.options as opt
    from forcedweight.certify.row import certify_row
    from forcedweight.rows import Row

    seen = []
    real = opt.solve_bnb
    monkeypatch.setattr(opt, "solve_bnb", lambda *a, **k: seen.append(k) or real(*a, **k))
    p, V = _peaked(60, 9)
    for bound_time in (0.25, None):
        seen.clear()
        certify_row(Row(0, p, V, {}), 5, CertifyOptions(pool_mass=1, pool_error=1, solver="bnb", node_limit=2,
                                                        bound_time=bound_time))
        assert [k["bound_time"] for k in seen] == [bound_time]
    res, _ = run_solver("bnb", p, V, 5, op.top_mass_set(p, 5), 60.0, node_limit=2, bound_time=0.0)
    assert not res.proved and res.info["bound_time"] == 0.0
    res, _ = run_solver("bnb", p, V, 5, op.top_mass_set(p, 5), 60.0, node_limit=2)
    assert res.info["bound_time"] == np.inf
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(InputError, match="--bound-time"):
            CertifyOptions(bound_time=bad)
