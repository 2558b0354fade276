"""Ranks that agree: every rank delivers the same number of batches per epoch, in every mode,
whatever the packet, shard and corruption counts, and says what it left out or repeated to get
there (ndp.loader.planning.plan). Checked in-process for many shapes, and with real processes in a
torch.distributed (gloo) training loop that would hang if one rank ran out early.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from ndp.errors import DataError
from ndp.loader.loader import Loader
from ndp.loader.states.state import seal

from ndp_test_helpers import ramp_specs, write_shards

MODES = ("padded", "packed", "packing")


def dataset(directory: Path, lengths: list[int], cuts: list[int]) -> Path:
    """Ramp packets of ``lengths`` in shards cut at ``cuts`` (packet numbers)."""
    packets = [s.encode() for s in ramp_specs(lengths)]
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(packets))), len(packets)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        write_shards(directory, packets[a:b], prefix=f"s{i}")
    return directory


def corrupt_packets(directory: Path, which: list[int]) -> None:
    """Flip one payload bit of each packet in ``which`` (global numbers, shards in name order):
    sizes stay, so the index still matches and the packet's CRC catches it (BAD_CRC)."""
    from ndp.store.corpus import Corpus

    corpus = Corpus(directory)
    shard_of = corpus.shard_of(np.asarray(which))
    paths = corpus.paths
    corpus.close()
    for g, s in zip(which, shard_of.tolist()):
        raw = bytearray(paths[s].read_bytes())
        raw[int(corpus.offsets[g]) + 8] ^= 0x10
        paths[s].write_bytes(bytes(raw))


def epoch_of(loader: Loader) -> int:
    """The batches of the loader's next epoch; an epoch of none is said loudly (a DataError
    at its end, ``ndp.loader.options.no_batch``), and counted 0 here."""
    n = 0
    try:
        for _ in loader:
            n += 1
    except DataError as err:
        if "makes no batch" not in str(err):
            raise
        assert n == 0 and len(loader) == 0
    return n


def left_out(loader: Loader) -> int:
    s = loader.stats
    return (s.packets - s.repeated + s.rank_balance + s.dropped_on_purpose
            + sum(s.mix_unused.values()) - sum(s.mix_repeated.values()))


def loaders(directory: Path, world: int, mode: str, **kw) -> list[Loader]:
    kw.setdefault("batch_size", 5 if mode == "padded" else 2)
    return [Loader(directory, mode=mode, seq_len=8, backend="cpu", output="arrays",
                   rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("mode", MODES)
def test_the_issue_case_31_packets_batch_5_two_ranks(tmp_path, mode):
    """31 packets, batch 5, 2 ranks once gave 4 and 3 batches: a DDP loop then hung."""
    d = dataset(tmp_path, [3 + k % 11 for k in range(31)], cuts=[13])
    ls = loaders(d, 2, mode)
    for _ in range(2):
        assert len({epoch_of(loader) for loader in ls}) == 1
    assert sum(left_out(loader) for loader in ls) == 2 * 31  # every packet accounted for


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=45),
       cuts=st.lists(st.integers(1, 44), max_size=4), world=st.integers(2, 5),
       mode=st.sampled_from(MODES), batch=st.integers(1, 4), seed=st.integers(0, 3),
       drop=st.sampled_from([0.0, 0.2]))
def test_every_rank_the_same_batches_and_every_packet_counted(tmp_path_factory, lengths, cuts,
                                                               world, mode, batch, seed, drop):
    d = dataset(tmp_path_factory.mktemp("r"), lengths, cuts)
    if world > len(lengths):  # no rank would get a packet: refused at once
        with pytest.raises(DataError, match=f"{len(lengths)} packets for world_size={world}"):
            loaders(d, world, mode, batch_size=batch, seed=seed, crc_drop_rate=drop)
        return
    ls = loaders(d, world, mode, batch_size=batch, seed=seed, crc_drop_rate=drop)
    counts = [epoch_of(loader) for loader in ls]
    assert len(set(counts)) == 1, counts
    assert sum(left_out(loader) for loader in ls) == len(lengths)
    assert all(loader.stats.repeated == 0 for loader in ls)  # nothing corrupt: no repeats


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 40), min_size=12, max_size=45),
       damaged=st.lists(st.integers(0, 44), max_size=8), world=st.integers(1, 3),
       mode=st.sampled_from(MODES), batch=st.integers(1, 3), cut=st.integers(1, 5))
def test_len_is_the_exact_batch_count_of_each_epoch(tmp_path_factory, lengths, damaged, world,
                                                    mode, batch, cut):
    """``len(loader)`` before an epoch is what it delivers, whatever is corrupt, on every rank,
    and after a resume mid-epoch the rest is ``len - state["batch"]``."""
    d = dataset(tmp_path_factory.mktemp("n"), lengths, [])
    damaged = sorted({k for k in damaged if k < len(lengths) and lengths[k]})
    corrupt_packets(d, damaged)
    ls = loaders(d, world, mode, batch_size=batch, seed=2, crc_drop_rate=0.1)
    for _ in range(2):
        for loader in ls:
            promised = len(loader)
            try:
                assert epoch_of(loader) == promised
            except DataError:  # packed: too little valid data to deliver it, said loudly
                assert mode == "packed" and damaged
                event("too little valid data")
                return
    loader = ls[-1]
    promised = len(loader)
    it = iter(loader)
    for _ in range(min(cut, promised)):
        next(it)
    state = loader.state_dict()
    loader.close()
    again = loaders(d, world, mode, batch_size=batch, seed=2, crc_drop_rate=0.1)[-1]
    again.load_state_dict(state)
    assert len(again) == promised
    assert again.remaining == promised - state["batch"]
    assert epoch_of(again) == promised - state["batch"]
    event(f"{mode}, {'damaged' if damaged else 'intact'}, resumed at {state['batch']} of "
          f"{promised}" if 0 < state["batch"] < promised else "resumed at an end")


def test_mixing_ranks_get_equal_batches(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    specs = ramp_specs([4 + k % 9 for k in range(70)])
    write_shards(tmp_path / "a", [s.encode() for s in specs[:50]])
    write_shards(tmp_path / "b", [s.encode() for s in specs[50:]])
    for mode in MODES:
        for size in ("shortest", "longest", 100):
            ls = [Loader({"a": tmp_path / "a", "b": tmp_path / "b"}, mode=mode, batch_size=3,
                         seq_len=8, backend="cpu", output="arrays", rank=r, world_size=3,
                         mix={"a": 0.6, "b": 0.4}, mix_size=size) for r in range(3)]
            for _ in range(2):
                assert len({epoch_of(loader) for loader in ls}) == 1
            assert sum(left_out(loader) for loader in ls) == 2 * 70


def test_packed_rank_left_short_by_corruption_repeats_its_share_counted(tmp_path):
    d = dataset(tmp_path, [10] * 40, cuts=[20])
    corrupt_packets(d, list(range(0, 16, 2)))  # 8 of rank 0's 20 packets (shuffle off)
    ls = loaders(d, 2, "packed", shuffle=False)
    assert epoch_of(ls[0]) == epoch_of(ls[1]) == (200 - 1) // 16
    assert ls[0].stats.corrupt == {"BAD_CRC": 16}  # 8, and the same 8 again in the repeat
    assert ls[0].stats.repeated > 0 and ls[1].stats.repeated == 0
    # resumed in the middle of the repeat, rank 0 goes on exactly
    again = loaders(d, 2, "packed", shuffle=False)[0]
    it = iter(again)
    head = [next(it)["x"].copy() for _ in range(10)]
    state = json.loads(json.dumps(again.state_dict()))
    again.close()
    resumed = loaders(d, 2, "packed", shuffle=False)[0]
    resumed.load_state_dict(state)
    tail = [b["x"].copy() for b in resumed]
    full = [b["x"].copy() for b in loaders(d, 2, "packed", shuffle=False)[0]]
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full):
        np.testing.assert_array_equal(a, b)


def test_a_rank_with_almost_nothing_valid_says_so(tmp_path):
    d = dataset(tmp_path, [10] * 20, cuts=[])
    corrupt_packets(d, list(range(0, 20, 2)))  # all of rank 0's packets
    with pytest.raises(DataError, match="rank 0.*too few valid tokens.*ndp verify"):
        epoch_of(loaders(d, 2, "packed", shuffle=False)[0])


def test_a_state_names_a_batch_inside_the_epoch(tmp_path):
    from ndp.errors import LoaderStateError

    d = dataset(tmp_path, [6] * 31, cuts=[])
    loader = loaders(d, 2, "padded", shuffle=False)[0]
    state = loader.state_dict()
    for bad in (-1, 10**6):
        with pytest.raises(LoaderStateError, match="batch"):
            loader.load_state_dict(seal(state | {"batch": bad}))
    with pytest.raises(LoaderStateError, match="every rank delivered the same number"):
        loader.load_state_dict(state | {"version": 2, "pos": 5})


# --- real processes, torch.distributed over gloo -------------------------------------------
WORKER = textwrap.dedent("""
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    from ndp.loader.loader import Loader

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(40000, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counts = {}
    for mode in ("padded", "packed", "packing"):
        loader = Loader(sys.argv[1], mode=mode, batch_size=5 if mode == "padded" else 2,
                        seq_len=8, backend="cpu", seed=3)  # RANK / WORLD_SIZE from torchrun
        counts[mode] = []
        for epoch in range(2):
            n = 0
            for batch in loader:
                ids = batch["input_ids" if mode != "packed" else "x"]
                loss = model(ids).float().pow(2).mean()
                opt.zero_grad()
                loss.backward()  # an all-reduce: every rank must take part, batch for batch
                opt.step()
                n += 1
            counts[mode].append(n)
        loader.close()
    dist.barrier()
    print("COUNTS", json.dumps(counts), flush=True)
    dist.destroy_process_group()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", rc -6; 1 run in ~10 here): the work is done and printed, leave now
    sys.stdout.flush()
    os._exit(0)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_a_gloo_training_loop_over_uneven_shares_finishes(tmp_path, world):
    pytest.importorskip("torch.distributed")
    d = dataset(tmp_path / "data", [3 + k % 11 for k in range(31)], cuts=[13, 20])
    corrupt_packets(d, [0, 4, 6])  # and a few corrupt packets on top
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NDP_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(d)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outs.append(out)
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    counts = [json.loads(out.split("COUNTS", 1)[1]) for out in outs]
    assert all(c == counts[0] for c in counts)
    assert all(n > 0 for ns in counts[0].values() for n in ns)


def test_the_progress_bar_shows_the_epoch_length_and_a_resumed_start(tmp_path, capsys):
    d = dataset(tmp_path, [3 + k % 11 for k in range(31)], cuts=[13])
    loader = loaders(d, 1, "padded", progress=True)[0]
    n = len(loader)
    assert epoch_of(loader) == n == 7
    assert f"{n}/{n}" in capsys.readouterr().err
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    loader.close()
    capsys.readouterr()
    again = loaders(d, 1, "padded", progress=True)[0]
    again.load_state_dict(state)
    assert epoch_of(again) == n - 2
    err = capsys.readouterr().err
    assert "ndp epoch 1" in err and f"{n}/{n}" in err  # starts at 2 of 7, ends at 7 of 7
