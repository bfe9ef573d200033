"""A 2-CPU local Ray, started once per module and always shut down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_2_cpus() -> Iterator[None]:
    import ray

    from recsys.runtime.cluster import connect

    connect("local", num_cpus=2, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
