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
