"""pytest setup. SDPA_TESTS_WITHOUT_TORCH=1 makes `import torch` fail, so one run proves
the numpy-only tests need no torch (the torch files then skip through importorskip).
SDPA_TESTS_REQUIRE_TORCH=1 (CI) makes a missing torch an error instead of a skip."""

import os
import sys

if os.environ.get("SDPA_TESTS_WITHOUT_TORCH") == "1":
    sys.modules["torch"] = None  # `import torch` now raises ImportError.
elif os.environ.get("SDPA_TESTS_REQUIRE_TORCH") == "1":
    # Fails the run when torch is missing.
    import torch  # noqa: F401

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
