"""Compile every CUDA kernel signature of ``ndp.kernels`` to PTX for one target; no GPU needed.

Run in its own process (the test suite itself runs under Numba's CUDA simulator, which cannot
compile): ``python tests/kernels/ptx_compile.py 90`` prints one JSON line per kernel and
signature, and exits non-zero if any of them fails to compile.

numba-cuda compiles the device functions a kernel calls for "the current device", which it asks
the driver for; with no driver that fails, so the device query is answered with the target's
compute capability (the value numba would get on such a GPU).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"


class _TargetDevice:
    def __init__(self, cc: tuple[int, int]) -> None:
        self.compute_capability = cc


def main(arch: str) -> int:
    cc = (int(arch[:-1]), int(arch[-1]))
    from numba import cuda
    from numba.cuda import dispatcher

    dispatcher.get_current_device = lambda: _TargetDevice(cc)
    import importlib

    from ndp.kernels import CUDA_MODULES

    failed = 0
    for module in map(importlib.import_module, CUDA_MODULES):
        for name, (kernel, signatures) in module.SIGNATURES.items():
            for sig in signatures:
                record = {"kernel": f"{module.__name__}.{name}", "sig": sig, "cc": arch}
                try:
                    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
                    record["ok"] = f".target sm_{arch}" in ptx
                    record["ptx_bytes"] = len(ptx)
                except Exception:  # noqa: BLE001 - reported, and the exit code says it failed
                    record["ok"] = False
                    record["error"] = traceback.format_exc(limit=3)
                failed += not record["ok"]
                print(json.dumps(record), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
