"""Certification tests: compile every Numba kernel once before the first test, so that no
solver's wall-clock time limit pays for a compile (``certify.warmup.warm_up``)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _kernels_compiled():
    from forcedweight.certify.warmup import warm_up

    warm_up()
