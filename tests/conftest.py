"""Test setup: CPU runs use the Triton interpreter so the real kernels execute on tiny shapes."""

import os
import time

import torch

if not torch.cuda.is_available():
    # Must happen before tilewise (and its @triton.jit kernels) is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tilewise.runtime import alloc, plans  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs these)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _poisoned_outputs():
    """Every kernel output starts as NaN, so an element the kernel forgot to write fails."""
    with alloc.poison_outputs():
        yield


@pytest.fixture(autouse=True)
def _no_plans_from_other_tests():
    """Each test starts without the ops' per-problem launch plans (``runtime.plans``): a test
    that patches an op's internals (its autotuner, its launcher) must see them used."""
    plans.clear_all()
    yield


@pytest.fixture(autouse=True)
def rng_seed():
    """A fresh seed per test, so every run draws new inputs; failures print it
    (``TILEWISE_TEST_SEED=<seed>`` replays one)."""
    replay = os.environ.get("TILEWISE_TEST_SEED")
    seed = int(replay) if replay else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


# TILEWISE_TEST_TIMES=FILE (set per unit by scripts/gpu_check.sh): each test's start and end
# times, a line each as they happen, so a unit killed by its time limit still tells which test
# it was in and for how long (scripts/shard_tests.py --gather turns them into durations)
_TIMES = os.environ.get("TILEWISE_TEST_TIMES")


def _mark_time(event: str, nodeid: str) -> None:
    with open(_TIMES, "a") as fh:
        fh.write(f"{event} {time.time():.3f} {nodeid}\n")


if _TIMES:

    def pytest_runtest_logstart(nodeid, location):
        _mark_time("start", nodeid)

    def pytest_runtest_logfinish(nodeid, location):
        _mark_time("end", nodeid)
