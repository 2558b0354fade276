"""Every CUDA kernel signature compiles to PTX for sm_80 (A100) and sm_90 (H100/H200).

The simulator runs kernels as Python and ignores types; compiling for real targets catches what
it lets through (a wrong dtype, an untyped branch, a call the CUDA target does not support).
Each target compiles in its own process, outside the simulator (``ptx_compile.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import importlib

from ndp.kernels import CUDA_MODULES

SCRIPT = Path(__file__).with_name("ptx_compile.py")


@pytest.mark.parametrize("arch", ["80", "90"])
def test_every_kernel_signature_compiles_to_ptx(arch):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, str(SCRIPT), arch], capture_output=True, text=True,
                          env=env, timeout=600)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in records if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1) + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {
        f"{m.__name__}.{name}"
        for m in map(importlib.import_module, CUDA_MODULES)
        for name in m.SIGNATURES
    }
    assert {r["kernel"] for r in records} == expected
    assert expected == {
        "ndp.kernels.verdict_cuda.verdicts_cuda",
        "ndp.kernels.verdict_cuda.verdicts_lanes_cuda",
        "ndp.kernels.build_cuda.build_padded_cuda",
        "ndp.kernels.build_cuda.build_packed_cuda",
        "ndp.kernels.build_cuda.build_packing_cuda",
        "ndp.kernels.build_cuda.build_documents_cuda",
    }
