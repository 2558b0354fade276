"""MosaicML streaming (0.13.0) as ``bench_loaders.py`` pipelines, run in an environment of its
own (``peers.ENVS["mosaicml"]``: it requires numpy<2.2 and imports torchvision, so it gets torch
2.14.1 with its own torchvision, without the system's site packages). Nothing here imports ndp.

* ``mosaicml-<w>w``: the stream cut into fixed windows of T+1 tokens, one MDS sample each
  (``MDSWriter`` with an ``ndarray:uint16`` column, as llm-foundry's ``convert_dataset_hf
  --concat_tokens`` writes its ``tokens`` column, in the writer's default 64 MB shards,
  uncompressed), read with ``StreamingDataset(local=..., shuffle=True, batch_size=B)`` and a
  torch ``DataLoader``, ``num_workers`` w;
* ``mosaicml-sft-0w``: one document per MDS sample, the same reader, padded with
  ``peers.PadCollate``.

Streaming keeps its state in shared memory and file locks: the locks go to a folder under the
data (``tempfile.tempdir``), so they leave with it; the shared memory of a process that exited
without closing is unlinked with ``streaming.base.util.clean_stale_shared_memory()`` before each
use and once at the end (``--clean``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders.batches import PadCollate, device_batch, to_device  # noqa: E402

COLUMNS = {"tokens": "ndarray:uint16"}


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prepare(root: Path, eos: int, T: int) -> dict:
    """Write ``root/mosaicml`` (windows of T+1 tokens) and ``root/mosaicml-sft`` (documents)
    from the uint16 stream ``root/all.bin``; the time and size of each."""
    from streaming import MDSWriter

    data = np.memmap(root / "all.bin", dtype=np.uint16, mode="r")
    out = {}
    t = time.perf_counter()
    with MDSWriter(out=str(root / "mosaicml"), columns=COLUMNS) as w:
        for i in range((data.shape[0] - 1) // T):
            w.write({"tokens": np.asarray(data[i * T: (i + 1) * T + 1])})
    out["mosaicml"] = {"convert_seconds": time.perf_counter() - t,
                       "converted_bytes": _size(root / "mosaicml")}
    t = time.perf_counter()
    ends = np.flatnonzero(data == eos) + 1
    with MDSWriter(out=str(root / "mosaicml-sft"), columns=COLUMNS) as w:
        begin = 0
        for end in ends.tolist():
            w.write({"tokens": np.asarray(data[begin:end])})
            begin = end
    out["mosaicml-sft"] = {"convert_seconds": time.perf_counter() - t,
                           "converted_bytes": _size(root / "mosaicml-sft")}
    return out


def _dataset(folder: Path, B: int):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    locks = folder.parent / ".mosaicml-locks"  # its *_filelock files, removed with the data
    locks.mkdir(exist_ok=True)
    tempfile.tempdir = str(locks)
    clean_stale_shared_memory()
    return StreamingDataset(local=str(folder), shuffle=True, batch_size=B)


def _windows(samples: list[dict]):
    import torch

    w = torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))
    return w[:, :-1], w[:, 1:]


class _Padded:
    """``PadCollate`` over the ``tokens`` of MDS samples."""

    def __init__(self, T: int, pad: int) -> None:
        self.pad = PadCollate(T, pad)

    def __call__(self, samples: list[dict]) -> dict:
        return self.pad([s["tokens"] for s in samples])


def pipe_mosaicml(root: Path, cfg: dict, *, workers: int):
    import torch

    loader = torch.utils.data.DataLoader(_dataset(root / "mosaicml", cfg["B"]),
                                         batch_size=cfg["B"], num_workers=workers,
                                         collate_fn=_windows, drop_last=True,
                                         persistent_workers=workers > 0)
    while True:
        for x, y in loader:
            yield device_batch(x, y)


def pipe_mosaicml_sft(root: Path, cfg: dict, *, workers: int):
    import torch

    loader = torch.utils.data.DataLoader(_dataset(root / "mosaicml-sft", cfg["B"]),
                                         batch_size=cfg["B"], num_workers=workers,
                                         collate_fn=_Padded(cfg["T"], cfg["pad"]),
                                         persistent_workers=workers > 0)
    while True:
        for batch in loader:
            yield to_device(batch)


def make(name: str, root: Path, cfg: dict):
    kind, workers = name.rsplit("-", 1)
    make_one = {"mosaicml": pipe_mosaicml, "mosaicml-sft": pipe_mosaicml_sft}[kind]
    return make_one(root, cfg, workers=int(workers.rstrip("w")))


if __name__ == "__main__":  # --prepare ROOT EOS T | --clean
    if sys.argv[1] == "--prepare":
        print(json.dumps(prepare(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    elif sys.argv[1] == "--clean":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
