"""Shared test setup: Triton kernels run in interpreter mode on CPU; no hub access; hypothesis draws the same
examples on every run (profile "seeded"; ``HYPOTHESIS_PROFILE=explore`` draws new ones)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


import copy  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# the suite is deterministic (a property test's examples come from a fixed seed, so CI and the README's run
# see the same ones); "explore" draws fresh examples each run, to look for new failures
settings.register_profile("seeded", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))


@pytest.fixture(scope="session")
def _smollm2_session():
    from forcedweight.models import load_model

    return load_model()


@pytest.fixture(scope="module")
def smollm2(_smollm2_session):
    """The embedded SmolLM2-135M-Instruct, loaded once per session; each module gets its own copy
    of the model (tests may switch its attention implementation)."""
    from forcedweight.models import LoadedModel

    loaded = _smollm2_session
    return LoadedModel(copy.deepcopy(loaded.model), loaded.tokenizer, loaded.name, loaded.source)
