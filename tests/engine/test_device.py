"""ndp.engine.device helpers that need no GPU: how launchers are configured."""

from __future__ import annotations

import warnings

from numba.core.errors import NumbaPerformanceWarning

from ndp.engine.device import configure


class _Kernel:
    """Stands in for a Numba CUDA dispatcher, which warns when a small launch is configured."""

    def __getitem__(self, config):
        grid = config[0]
        if grid < 128:
            warnings.warn(NumbaPerformanceWarning(
                f"Grid size {grid} will likely result in GPU under-utilization due to low "
                f"occupancy."))
        return ("launcher", config)


def test_ndp_launchers_are_configured_without_the_low_occupancy_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert configure(_Kernel(), 1, 32, "stream") == ("launcher", (1, 32, "stream"))
    assert caught == []


def test_the_users_own_warnings_are_left_alone():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure(_Kernel(), 1, 32, None)
        _Kernel()[1, 32, None]  # the user's launch, outside ndp: still warned about
        warnings.warn(NumbaPerformanceWarning("something else"))
    assert len(caught) == 2
    assert "Grid size 1" in str(caught[0].message) and "something" in str(caught[1].message)
