"""Fixtures shared by the flywheel tests."""

import pytest
import torch


@pytest.fixture()
def one_thread():
    """Torch on one thread while the test runs: on a shared 2-core machine two threads oversubscribe
    and a tiny model's step gets several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
