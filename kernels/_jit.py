"""The one place CPU kernels are compiled.

``cache=True`` keeps compiled machine code in ``__pycache__`` so only the first run on a machine
pays Numba's compile time (seconds per parallel kernel); ``nogil`` lets a loader thread decode
while Python runs. Set ``NUMBA_DISABLE_JIT=1`` to run every kernel as plain Python for debugging.
"""

from __future__ import annotations

import numba

#: a serial CPU kernel or helper
cpu_kernel = numba.njit(cache=True, nogil=True)
#: a CPU kernel whose outer ``prange`` loop runs on every core
cpu_parallel_kernel = numba.njit(cache=True, nogil=True, parallel=True)
