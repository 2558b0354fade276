"""The one place CPU kernels are compiled.

``cache=True`` keeps compiled machine code in ``__pycache__`` so only the first run on a machine
pays Numba's compile time; ``nogil`` lets a loader thread decode while Python runs, and lets
``ndp.engine.threads.parallel_for`` run one kernel's ranges on several threads at once. No kernel
uses ``parallel=True``: Numba's OpenMP workers spin while idle (see ``ndp.engine.threads``). Set
``NUMBA_DISABLE_JIT=1`` to run every kernel as plain Python for debugging. The cache of a kernel is
keyed on its own file only: after editing a kernel that another file's kernels call (``clmul.py``
under ``crc16.py``), delete ``kernels/__pycache__`` or set ``NUMBA_CACHE_DIR``, or the callers keep
the old code.
"""

from __future__ import annotations

import numba

#: a CPU kernel or helper (serial; ``ndp.engine.threads`` runs ranges of its work in parallel)
cpu_kernel = numba.njit(cache=True, nogil=True)
