"""The Loader's tests, in folders that mirror ``ndp/loader/`` (``ordering/``, ``planning/``,
``layouts/``, ``pipeline/``, ``states/``); the tests of the Loader as a whole (its options,
stats, explain, golden digests, ranks, training) at this level.

Shared datasets and checks are imported by module name from any folder here: ``golden``
(the golden runs' datasets and digests) and the helpers some test modules give others
(``test_units``' documents, ``test_explain``'s ``check_batch``, ``test_documents``' segments).
This puts ``tests/loader`` and its folders on ``sys.path`` for them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _folder in [HERE, *sorted(p for p in HERE.iterdir() if p.is_dir()
                              and not p.name.startswith(("__", ".")))]:
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
