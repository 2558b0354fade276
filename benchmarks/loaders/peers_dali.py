"""NVIDIA DALI (``nvidia-dali-cuda120``, pinned in ``peers.ENVS``) as a ``bench_loaders.py``
pipeline, on the CPU.

* ``dali-cpu``: ``fn.readers.numpy`` over one ``.npy`` of the whole uint16 stream (the stream's
  bytes behind a NumPy 1.0 header: DALI reads no 2.0 files), one window of T+1 tokens per sample
  through per-sample ``roi_start`` / ``roi_shape`` (``cache_header_information=True``: every
  sample reads the same file), the window starts a new permutation of the multiples of T each
  epoch fed by ``fn.external_source``; cast to int64 in the pipeline (DALI's torch plugin has no
  uint16); ``device_id=None`` (no GPU), ``num_threads=2`` (the cores of this machine); batches
  through the torch plugin's ``DALIGenericIterator``.

The reader takes a per-sample ``roi_start`` as int32 (a float one fails in the reader: "requested
type: int32 current buffer type: float"), so the stream is at most 2**31 - 1 tokens.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders.batches import device_batch  # noqa: E402


def prepare(root: Path) -> dict:
    """``root/all.bin`` as ``root/dali/tokens.npy``; its time and size."""
    from ndp.store.atomic import atomic_file

    src = root / "all.bin"
    (root / "dali").mkdir(exist_ok=True)
    t = time.perf_counter()
    with atomic_file(root / "dali" / "tokens.npy") as f, open(src, "rb") as data:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<u2", "fortran_order": False, "shape": (src.stat().st_size // 2,)})
        shutil.copyfileobj(data, f, 16 << 20)
    size = (root / "dali" / "tokens.npy").stat().st_size
    return {"dali": {"convert_seconds": time.perf_counter() - t, "converted_bytes": size}}


class _Starts:
    """``external_source`` callable: a batch of window starts (int32, shape (1,)), a new
    permutation of the ``n`` windows each epoch."""

    def __init__(self, n: int, T: int, B: int, seed: int = 0) -> None:
        self.n, self.T, self.B = n, T, B
        self.rng = np.random.default_rng(seed)
        self.order = np.empty(0, np.int64)
        if n * T + 1 >= 1 << 31:
            raise ValueError(f"dali-cpu: {n * T + 1} tokens, more than int32 roi_start reaches")

    def __call__(self) -> list[np.ndarray]:
        while self.order.shape[0] < self.B:
            self.order = np.concatenate([self.order, self.rng.permutation(self.n)])
        take, self.order = self.order[: self.B], self.order[self.B:]
        return list((take * self.T).astype(np.int32).reshape(-1, 1))


def pipe_dali(root: Path, cfg: dict):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    B, T = cfg["B"], cfg["T"]
    path = root / "dali" / "tokens.npy"
    n_tokens = np.load(path, mmap_mode="r").shape[0]
    starts = _Starts((n_tokens - 1) // T, T, B)

    @pipeline_def(batch_size=B, num_threads=2, device_id=None, seed=0)
    def windows():
        start = fn.external_source(source=starts, batch=True, dtype=types.INT32)
        w = fn.readers.numpy(files=[str(path)], roi_start=start, roi_shape=[T + 1],
                             cache_header_information=True)
        return fn.cast(w, dtype=types.INT64)

    pipe = windows()
    pipe.build()
    while True:
        for out in DALIGenericIterator([pipe], ["w"]):
            w = out[0]["w"]
            yield device_batch(w[:, :-1], w[:, 1:])


if __name__ == "__main__":  # --prepare ROOT EOS T
    if sys.argv[1] == "--prepare":
        print(json.dumps(prepare(Path(sys.argv[2]))))
