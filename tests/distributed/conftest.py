"""A local Ray instance (num_cpus=2, CPU only) shared by the distributed tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray", reason='ray is not installed (pip install "trace-gym[ray]")')
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
