"""The loaders teams choose today, as ``bench_loaders.py`` pipelines: each the way its
documentation recommends, on the same token stream and batch shape, in a process of its own.

* ``torchdata-<w>w``: torchdata's ``StatefulDataLoader`` (0.11.0, resumable) over a map-style
  dataset of fixed windows of T+1 tokens of an ``np.memmap`` of the uint16 stream,
  ``shuffle=True`` (a new permutation of the windows each epoch), ``num_workers`` w;
* ``litdata-<w>w``: litdata (0.2.76): ``optimize`` with ``TokensLoader`` (the documents' tokens
  in 64 MB of chunks), then ``StreamingDataset(item_loader=TokensLoader(block_size=T+1),
  shuffle=True)`` and ``StreamingDataLoader``, ``num_workers`` w;
* ``mosaicml-<w>w``: MosaicML streaming (0.13.0): ``MDSWriter`` with an ``ndarray:uint16`` column,
  one window of T+1 tokens per sample, ``StreamingDataset(local=..., shuffle=True,
  batch_size=B)`` and a torch ``DataLoader``, ``num_workers`` w (``peers_mosaicml.py``);
* ``dali-cpu``: NVIDIA DALI (``nvidia-dali-cuda120`` 2.4.0) on the CPU: ``fn.readers.numpy`` over
  one ``.npy`` of the stream, a window of T+1 tokens per sample by ``roi_start`` / ``roi_shape``
  at a new permutation of the window starts each epoch, cast to int64 in the pipeline,
  ``num_threads=2``, ``DALIGenericIterator`` (``peers_dali.py``);

with w = 0 (every loader's own default) and 2 (the cores of this machine, what the peers'
docs suggest for throughput); and SFT rows, one document per row cut at T and padded (the
``transformers`` convention: ``input_ids``, ``labels`` -100 at padding, ``attention_mask``), as
ndp's ``padded`` mode makes them:

* ``torchdata-sft-0w``: ``StatefulDataLoader`` over a map-style dataset of the documents of
  the memmapped stream (found by their EOS once), a padding ``collate_fn``;
* ``litdata-sft-0w``: ``optimize`` with one item per document, ``StreamingDataset`` +
  ``StreamingDataLoader`` with the same padding ``collate_fn``;
* ``mosaicml-sft-0w``: ``MDSWriter`` with one document per sample, ``StreamingDataset`` and a
  ``DataLoader`` with the same padding ``collate_fn``.

Every peer reads the same uint16 token stream (``all.bin``, EOS after each document) in its own
format; ``convert`` times each conversion and sizes what it wrote. On a GPU every batch goes to
the device with pinned memory and ``non_blocking`` copies. The peers are installed, pinned
(``ENVS``), in virtual environments of their own, made on first use: torchdata, litdata and DALI
in ``benchmarks/.peers/env`` (with the system's site packages, and torch and NumPy held at the
installed versions, so nothing replaces the CPU torch); MosaicML streaming, which requires
numpy<2.2 and imports torchvision on import (PyPI's torchvision next to the CPU torch fails:
``operator torchvision::nms does not exist``), in ``benchmarks/.peers/mosaicml-env``, without
the system's site packages, with torch 2.14.1 and torchvision 0.29.1 of their own (several GB).
Its children import no ndp.

Not run here: FFCV 1.0.2 does not install (it needs opencv4); DALI's GPU reader (it needs a GPU
and cuFile). ``shuffle_quality.py`` compares MosaicML's shuffle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, run as a script too
from loaders.batches import PadCollate, device_batch, to_device  # noqa: E402

HERE = Path(__file__).resolve().parent
#: the peers' environments and wheels: ``benchmarks/.peers`` (ignored by git)
PEERS_HOME = HERE.parent / ".peers"
#: what the pinned peers need beyond a GPU machine's usual packages (torch, requests, ...): with
#: ``NDP_PEER_WHEELS=<folder of wheels>`` (no package index there) these come from it too
DEPS = {"boto3", "botocore", "s3transfer", "jmespath", "obstore"}
#: the peers' environments, made on first use: folder, pinned packages, and whether it sees the
#: system's site packages (then torch and NumPy are held at the installed versions)
ENVS = {
    "peers": (PEERS_HOME / "env",
              ["torchdata==0.11.0", "litdata==0.2.76", "nvidia-dali-cuda120==2.4.0"], True),
    "mosaicml": (PEERS_HOME / "mosaicml-env",
                 ["torch==2.14.1", "torchvision==0.29.1", "numpy<2.2",
                  "mosaicml-streaming==0.13.0"], False),
}
PIPELINES = ["torchdata-0w", "torchdata-2w", "litdata-0w", "litdata-2w", "mosaicml-0w",
             "mosaicml-2w", "dali-cpu", "torchdata-sft-0w", "litdata-sft-0w", "mosaicml-sft-0w"]
#: how each pipeline cuts the token stream into training windows
SEMANTICS = {
    "torchdata": "a new permutation of fixed windows of the token stream each epoch",
    "litdata": "blocks of T+1 tokens of 64 MB chunks; chunks permuted, blocks shuffled in "
               "groups of 256 within a chunk",
    "mosaicml": "fixed windows of T+1 tokens, one MDS sample each, in 64 MB shards; a new "
                "py1e shuffle of the samples each epoch",
    "dali": "a new permutation of fixed windows of the token stream each epoch",
    "torchdata-sft": "one document per row, a new permutation of the documents each epoch",
    "litdata-sft": "one document per row; chunks permuted, documents shuffled in groups of 256 "
                   "within a chunk",
    "mosaicml-sft": "one document per row, one MDS sample each; a new py1e shuffle of the "
                    "documents each epoch",
}
#: each peer's conversion step: the environment it runs in and its script (``--prepare ROOT
#: EOS T`` prints the time and size of what it wrote, by pipeline kind)
CONVERTERS = {"litdata": ("peers", HERE / "peers.py"),
              "mosaicml": ("mosaicml", HERE / "peers_mosaicml.py"),
              "dali": ("peers", HERE / "peers_dali.py")}


def python(env: str = "peers") -> Path:
    """The interpreter of the peers' environment ``env``, made (venv + pinned installs) on first
    use."""
    folder, packages, system = ENVS[env]
    if os.environ.get("NDP_PEER_WHEELS") and system:
        return _offline(packages, Path(os.environ["NDP_PEER_WHEELS"]))
    exe = folder / "bin" / "python"
    marker = folder / "installed.json"
    if exe.exists() and marker.exists() and json.loads(marker.read_text()) == packages:
        return exe
    from ndp.store.atomic import atomic_write

    print(f"installing {' '.join(packages)} into {folder} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", *(["--system-site-packages"] if system else []),
                    str(folder)], check=True)
    pins = []
    if system:
        import numpy
        import torch

        pins = ["-c", str(atomic_write(folder / "constraints.txt",
                                       f"torch=={torch.__version__}\nnumpy=={numpy.__version__}\n"))]
    subprocess.run([str(exe), "-m", "pip", "install", "-q", *pins, *packages], check=True)
    atomic_write(marker, json.dumps(packages))
    return exe


def _offline(packages: list[str], wheels: Path) -> Path:
    """A machine that reaches no package index (the lent GPU, bare, given back after): the
    carried wheels of ``packages`` (and ``DEPS``), as they are, into this interpreter's own
    environment, whose torch is the machine's CUDA build; a package with no wheel there is named,
    and its pipelines fail."""
    def named(wheel: Path, package: str) -> bool:
        return wheel.name.lower().startswith(package.split("==")[0].replace("-", "_") + "-")

    found = [w for w in sorted(wheels.glob("*.whl"))
             if any(named(w, p) for p in packages) or w.name.split("-")[0].lower() in DEPS]
    missing = [p for p in packages if not any(named(w, p) for w in found)]
    print(f"offline: installing {' '.join(w.name for w in found)} from {wheels}; no wheel, so "
          f"their pipelines fail: {' '.join(missing) or 'none'}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    *map(str, found)], check=True)
    return Path(sys.executable)


def kind(name: str) -> str:
    """``torchdata-sft-0w`` -> ``torchdata-sft``, ``dali-cpu`` -> ``dali``: the key of SEMANTICS."""
    return name.rsplit("-", 1)[0]


def python_for(name: str) -> Path:
    """The interpreter pipeline ``name`` runs in."""
    return python("mosaicml" if name.startswith("mosaicml") else "peers")


def convert(pipelines: list[str], work: Path, cfg: dict) -> dict:
    """Run the conversions ``pipelines`` need on ``work`` and ``work/large``; the time and size
    of ``work``'s, by pipeline kind."""
    out = {}
    for peer, (env, script) in CONVERTERS.items():
        if not any(p in PIPELINES and p.startswith(peer) for p in pipelines):
            continue
        for where in (work, work / "large"):
            proc = subprocess.run([str(python(env)), str(script), "--prepare", str(where),
                                   str(cfg["eos"]), str(cfg["T"])],
                                  capture_output=True, text=True, timeout=3600)
            if proc.returncode:
                raise RuntimeError(f"{peer} conversion failed:\n{proc.stderr[-3000:]}")
            if where == work:
                out.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def finish(pipelines: list[str]) -> None:
    """Remove what the peers leave behind them (MosaicML's shared memory)."""
    if any(p.startswith("mosaicml") for p in pipelines):
        subprocess.run([str(python("mosaicml")), str(CONVERTERS["mosaicml"][1]), "--clean"],
                       check=True, capture_output=True, timeout=600)


class _Windows:
    """Window ``i``: tokens ``[i*T, (i+1)*T]`` of the memmapped stream (map-style)."""

    def __init__(self, path: Path, T: int) -> None:
        self.path, self.T = path, T
        self.n = (path.stat().st_size // 2 - 1) // T
        self.data = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if self.data is None:  # opened in each worker
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        T = self.T
        return torch.from_numpy(self.data[i * T: (i + 1) * T + 1].astype(np.int64))


def _collate(windows):
    import torch

    w = torch.stack(windows)
    return w[:, :-1], w[:, 1:]


def pipe_torchdata(root: Path, cfg: dict, *, workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(_Windows(root / "all.bin", cfg["T"]), batch_size=cfg["B"],
                                shuffle=True, num_workers=workers, collate_fn=_collate,
                                drop_last=True, persistent_workers=workers > 0)
    while True:
        for x, y in loader:
            yield device_batch(x, y)


def _documents(args: tuple[str, int, int, int]):
    """litdata's ``optimize`` function (top level: it runs in spawned workers): the documents
    of one slice of the stream, cut after each EOS."""
    import torch

    path, eos, start, stop = args
    data = np.memmap(path, dtype=np.uint16, mode="r")[start:stop]
    ends = np.flatnonzero(data == eos) + 1
    begin = 0
    for end in ends.tolist():
        yield torch.from_numpy(data[begin:end].astype(np.int32))
        begin = end


def prepare_litdata(root: Path, eos: int, block: int) -> dict:
    """``optimize`` the stream of ``root/all.bin`` into ``root/litdata``; its time and size."""
    from litdata import TokensLoader, optimize

    stream = root / "all.bin"
    n = stream.stat().st_size // 2
    data = np.memmap(stream, dtype=np.uint16, mode="r")
    cuts = [0]
    for k in range(1, 16):  # 16 inputs, each cut just after an EOS
        at = n * k // 16
        after = np.flatnonzero(data[at: at + 1_000_000] == eos)
        cuts.append(at + int(after[0]) + 1 if after.shape[0] else at)
    cuts.append(n)
    inputs = [(str(stream), eos, a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    t = time.perf_counter()
    optimize(fn=_documents, inputs=inputs, output_dir=str(root / "litdata"),
             chunk_size=(64_000_000 // 4 // block) * block,  # TokensLoader: in tokens (int32)
             item_loader=TokensLoader(), num_workers=2, mode="overwrite")
    seconds = time.perf_counter() - t
    size = sum(f.stat().st_size for f in (root / "litdata").rglob("*") if f.is_file())
    return {"convert_seconds": seconds, "converted_bytes": size}


def pipe_litdata(root: Path, cfg: dict, *, workers: int):
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(input_dir=str(root / "litdata"),
                          item_loader=TokensLoader(block_size=cfg["T"] + 1), shuffle=True,
                          drop_last=True)
    loader = StreamingDataLoader(ds, batch_size=cfg["B"], num_workers=workers,
                                 pin_memory=torch.cuda.is_available())
    while True:
        for w in loader:
            w = w.long()
            yield device_batch(w[:, :-1], w[:, 1:])


class _Documents:
    """Document ``i`` of the memmapped stream, cut at ``T`` tokens (map-style)."""

    def __init__(self, path: Path, eos: int, T: int) -> None:
        data = np.memmap(path, dtype=np.uint16, mode="r")
        self.ends = np.flatnonzero(data == eos) + 1
        self.starts = np.concatenate([[0], self.ends[:-1]])
        self.path, self.T, self.data = path, T, None

    def __len__(self) -> int:
        return self.ends.shape[0]

    def __getitem__(self, i: int) -> np.ndarray:
        if self.data is None:
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        a = int(self.starts[i])
        return np.asarray(self.data[a: min(int(self.ends[i]), a + self.T)])


def pipe_torchdata_sft(root: Path, cfg: dict, *, workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(_Documents(root / "all.bin", cfg["eos"], cfg["T"]),
                                batch_size=cfg["B"], shuffle=True, num_workers=workers,
                                collate_fn=PadCollate(cfg["T"], cfg["pad"]),
                                persistent_workers=workers > 0)
    while True:
        for batch in loader:
            yield to_device(batch)


def _one_document(args: tuple[str, int, int, int]):
    """litdata's ``optimize`` function for SFT rows: one item per document."""
    for doc in _documents(args):
        yield doc.numpy().astype(np.uint16)


def prepare_litdata_sft(root: Path, eos: int) -> dict:
    """``optimize`` the documents of ``root/all.bin`` into ``root/litdata-sft``, one item each."""
    from litdata import optimize

    stream = root / "all.bin"
    n = stream.stat().st_size // 2
    data = np.memmap(stream, dtype=np.uint16, mode="r")
    ends = np.flatnonzero(data == eos) + 1
    cuts = [0] + [int(ends[len(ends) * k // 16]) for k in range(1, 16)] + [n]
    inputs = [(str(stream), eos, a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    t = time.perf_counter()
    optimize(fn=_one_document, inputs=inputs, output_dir=str(root / "litdata-sft"),
             chunk_bytes="64MB", num_workers=2, mode="overwrite")
    seconds = time.perf_counter() - t
    size = sum(f.stat().st_size for f in (root / "litdata-sft").rglob("*") if f.is_file())
    return {"convert_seconds": seconds, "converted_bytes": size}


def pipe_litdata_sft(root: Path, cfg: dict, *, workers: int):
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(input_dir=str(root / "litdata-sft"), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=cfg["B"], num_workers=workers,
                                 collate_fn=PadCollate(cfg["T"], cfg["pad"]))
    while True:
        for batch in loader:
            yield to_device(batch)


def make(name: str, root: Path, cfg: dict):
    if name.startswith("mosaicml"):
        from loaders import peers_mosaicml

        return peers_mosaicml.make(name, root, cfg)
    if name.startswith("dali"):
        from loaders import peers_dali

        return peers_dali.pipe_dali(root, cfg)
    kind, workers = name.rsplit("-", 1)
    make_one = {"torchdata": pipe_torchdata, "litdata": pipe_litdata,
                "torchdata-sft": pipe_torchdata_sft, "litdata-sft": pipe_litdata_sft}[kind]
    return make_one(root, cfg, workers=int(workers.rstrip("w")))


if __name__ == "__main__":  # python benchmarks/loaders/peers.py --prepare ROOT EOS T (litdata's)
    if sys.argv[1] == "--prepare":
        root, eos, T = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        print(json.dumps({"litdata": prepare_litdata(root, eos, T + 1),
                          "litdata-sft": prepare_litdata_sft(root, eos)}))
