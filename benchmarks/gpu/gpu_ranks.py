"""Two ranks of a node on its GPUs: run under torchrun by ``gpu_check.py``'s ``two-ranks`` step.
With two GPUs or more each rank has its own; with one (a lent single-GPU machine) both ranks
share it, which shows the multi-rank GPU path as far as one device can: two processes' Loaders,
kernels and rings side by side on one device, each rank's share equal to the CPU backend's.

    python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/gpu/gpu_ranks.py

Each rank does what a training script does first, ``torch.cuda.set_device(LOCAL_RANK % GPUs)``, then
builds an ``ndp.Loader(backend="cuda")`` with no ``device`` over a small dataset it writes (its
own temporary folder) and takes a few batches: the Loader must have chosen the rank's device
(``ndp.engine.gpu.choose_device``), and every batch's tensors must be on it, equal to the CPU
backend's. Prints ``rank R ok: device D, N batches`` per rank (``gpu_check.py`` looks for two).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's ndp


def main() -> int:
    import torch

    import ndp
    from ndp.store.writer import ShardWriter
    from ndp.wire.packet import encode_tokens

    rank = int(os.environ["LOCAL_RANK"])
    gpus = torch.cuda.device_count()
    device = rank % gpus
    torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        with ShardWriter(Path(tmp)) as writer:
            for k in range(2000):
                writer.write(encode_tokens(np.arange(k, k + 5 + k % 40, dtype=np.int64)))
        kw = dict(mode="packed", batch_size=4, seq_len=64, seed=1, rank=rank, world_size=2)
        gpu = ndp.Loader(tmp, backend="cuda", output="torch", **kw)
        cpu = ndp.Loader(tmp, backend="cpu", output="arrays", **kw)
        if gpu.device != device:
            print(f"rank {rank} FAILED: the Loader chose device {gpu.device}, not {device}")
            return 1
        n = 0
        for a, b in zip(gpu, cpu):
            if a["x"].device.index != device or not np.array_equal(a["x"].cpu().numpy(), b["x"]):
                print(f"rank {rank} FAILED: batch {n} on {a['x'].device} or not the CPU's")
                return 1
            n += 1
            if n == 20:
                break
        gpu.close()
        cpu.close()
    shared = " (shared by both ranks)" if gpus == 1 else ""
    print(f"rank {rank} ok: device {device}{shared}, {n} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
