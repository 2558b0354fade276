"""kernels/ installs as ndp.kernels, never as a bare top-level 'kernels' module."""

from __future__ import annotations

import subprocess
import sys


def test_kernels_are_inside_the_ndp_namespace(tmp_path):
    code = (
        "import importlib.util, ndp.kernels.crc16 as k; "
        "print(k.__name__, importlib.util.find_spec('kernels'))"
    )
    # run outside the checkout so the repository root is not on sys.path
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["ndp.kernels.crc16", "None"]


def test_public_api():
    import ndp

    assert ndp.crc16_ccitt(b"123456789") == 0x29B1
    for name in ("encode_packet", "decode_packet", "encode_tokens", "Src", "Dst", "Typ"):
        assert hasattr(ndp, name)


def test_importing_ndp_does_not_import_torch_or_transformers(tmp_path):
    code = "import sys, ndp; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def _registers_row_stack() -> bool:
    """Whether the installed numba-cuda registers ``np.row_stack`` (NumPy 2.5 removed it, and
    such a numba-cuda fails at its first kernel launch under NumPy 2.5)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("numba_cuda")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    return any("np.row_stack" in path.read_text(errors="replace")
               for path in root.rglob("*.py") if "tests" not in path.parts)


def test_cuda_installs_keep_numpy_below_2_5_while_numba_cuda_needs_it():
    import tomllib
    from pathlib import Path

    import pytest
    from packaging.requirements import Requirement

    if not _registers_row_stack():
        pytest.skip("the installed numba-cuda no longer registers np.row_stack: the numpy<2.5 "
                    "cap in pyproject.toml can be lifted")
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for extra in ("cuda12", "cuda13", "dev"):
        caps = [Requirement(r).specifier for r in extras[extra] if Requirement(r).name == "numpy"]
        assert caps and not any(c.contains("2.5.0") for c in caps), (
            f"ndp[{extra}] admits numpy 2.5, with which numba-cuda's np.row_stack breaks the "
            f"first kernel launch")
        assert all(c.contains("2.4.6") for c in caps), f"ndp[{extra}] refuses numpy 2.4.6"
