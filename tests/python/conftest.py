"""Shared pytest fixtures for the Python tests."""

import os
import random

import pytest
import torch

# The test machines' few cores are shared: tiny GEMMs lose far more to thread wake-ups than threads gain
# (measured 5 ms vs 0.05 ms per 24x64x48 matmul under load).
torch.set_num_threads(1)


@pytest.fixture
def seed():
    """A fresh seed every run (MOK_TEST_SEED=<n> replays one); torch's global RNG is seeded with it.

    The seed is printed, so a failing test shows it in its captured output.
    """
    value = int(os.environ.get("MOK_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"seed={value} (replay with MOK_TEST_SEED={value})")
    torch.manual_seed(value)
    return value
