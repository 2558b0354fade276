"""Every batch, state and stat of an epoch per configuration, against the digests written on the
code before issue 37's compiled plan (``tests/loader/golden.py`` says what each run is and how
to write them anew): both backends, the CUDA one under the simulator without a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402

WANT = json.loads(golden.DIGESTS.read_text())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("golden"))


def test_the_digests_cover_every_configuration():
    assert set(WANT) == {f"{m}/{r}" for m in golden.MODES for r in golden.RUNS}
    assert all(v["batches"] > 10 for v in WANT.values())


@pytest.mark.parametrize("overlap", [None, True], ids=["default", "ahead"])
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", golden.MODES)
def test_batches_states_and_stats_are_the_written_ones(datasets, backend, mode, overlap):
    """``ahead``: each chunk staged before the one ahead of it is laid out, as on a GPU
    (``ndp.loader.pipeline.ahead``; by default the CPU and the simulator stage one at a time)."""
    for name in golden.RUNS:
        got = golden.run(datasets, mode, name, backend, overlap)
        assert got == WANT[f"{mode}/{name}"], (
            f"{mode}/{name} on {backend} moved: if that was meant, write the digests anew "
            f"(python tests/loader/golden.py --write) and say why in the commit")
