"""Packed mode reads documents, not packets (``ndp.loader.ordering.units``): a document the converter
split over packets reaches a rank's stream whole and in order, wherever the shuffle puts it, on
every rank split and both backends; every packet is counted once; a resume mid-document is
exact. The held-out trial's case: none of 17 split documents of the quick start kept its
pieces together (a piece followed by another document's piece, no EOS between them).

Data: document ``d`` holds the tokens ``d * 1000 + 1 .. d * 1000 + L - 1`` and EOS (0), cut
into pieces of at most ``PIECE`` tokens, the later ones marked; so a token names its document
and its place in it, and any piece out of place shows as a jump.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.packet import encode_tokens

EOS, PIECE = 0, 8


def documents(rng, n=70):
    return [np.concatenate([1000 * (d + 1) + np.arange(1, int(rng.integers(3, 45))), [EOS]])
            for d in range(n)]


def write(directory, docs, *, marked=True, shard_bytes=66_000):
    packets = 0
    with ShardWriter(directory, max_shard_bytes=shard_bytes) as writer:
        for doc in docs:
            for j, lo in enumerate(range(0, len(doc), PIECE)):
                writer.write(encode_tokens(doc[lo:lo + PIECE], continues=marked and j > 0))
                packets += 1
    return directory, packets


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    docs = documents(np.random.default_rng(5))
    d, packets = write(tmp_path_factory.mktemp("split"), docs)
    return d, docs, packets


KW = dict(mode="packed", batch_size=2, seq_len=12, backend="cpu", output="arrays", seed=3,
          shuffle_window=1 << 17)


def stream(loader):
    """The rank's token stream, as its batches' windows lay it out (x rows are consecutive)."""
    return np.concatenate([b["x"].ravel() for b in loader]) if len(loader) else np.zeros(0)


def jumps(tokens):
    """Adjacent tokens that are no step within one document (EOS aside)."""
    a, b = tokens[:-1], tokens[1:]
    both = (a != EOS) & (b != EOS)
    return int(((a // 1000 != b // 1000) & both).sum() + ((a // 1000 == b // 1000) & both
                                                           & (b != a + 1)).sum())


def left_out(stats):
    return (stats.packets - stats.repeated + stats.rank_balance + stats.dropped_on_purpose
            + sum(stats.mix_unused.values()) - sum(stats.mix_repeated.values()))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_split_documents_pieces_travel_together_on_every_rank(split, world, shuffle):
    d, docs, packets = split
    loaders = [Loader(d, rank=r, world_size=world, shuffle=shuffle, **KW) for r in range(world)]
    streams = [stream(ld) for ld in loaders]
    assert all(jumps(s) == 0 for s in streams)  # every document whole and in order
    where = {}  # a document is one rank's: never split across ranks
    for r, s in enumerate(streams):
        for doc in np.unique(s[s != EOS] // 1000).tolist():
            assert where.setdefault(doc, r) == r
    assert len({len(ld) for ld in loaders}) == 1  # every rank as many batches
    assert sum(left_out(ld.stats) for ld in loaders) == packets  # every packet counted once


def test_unmarked_pieces_are_shuffled_apart_as_packets(tmp_path):
    """The same data without the marks (a dataset converted before them): its pieces are
    packets of their own, as they always were."""
    docs = documents(np.random.default_rng(5))
    d, _ = write(tmp_path, docs, marked=False)
    assert jumps(stream(Loader(d, **KW))) > 10


def test_the_batch_count_is_exact_and_the_ranks_agree_with_crc_drop(split):
    d, _, packets = split
    loaders = [Loader(d, rank=r, world_size=2, crc_drop_rate=0.2, **KW) for r in range(2)]
    counts = [len(ld) for ld in loaders]
    got = [stream(ld) for ld in loaders]
    assert counts[0] == counts[1] == len(got[0]) // (KW["batch_size"] * KW["seq_len"])
    assert all(jumps(s) == 0 for s in got)
    assert sum(left_out(ld.stats) for ld in loaders) == packets


@pytest.mark.parametrize("cut", [1, 4, 9, 15])
def test_a_resume_mid_document_is_exact(split, cut):
    d, _, _ = split
    whole = [b["x"].copy() for b in Loader(d, rank=1, world_size=2, **KW)]
    first = Loader(d, rank=1, world_size=2, **KW)
    it = iter(first)
    for _ in range(cut):
        next(it)
    state = first.state_dict()
    first.close()
    again = Loader(d, rank=1, world_size=2, **KW)
    again.load_state_dict(state)
    rest = [b["x"].copy() for b in again]
    assert len(rest) == len(whole) - cut
    assert all(np.array_equal(a, b) for a, b in zip(rest, whole[cut:]))


def test_the_cuda_kernels_build_the_same_documents(split):
    d, _, _ = split
    cpu = [b["x"].copy() for b in Loader(d, **KW)]
    gpu = Loader(d, **{**KW, "backend": "cuda", "chunk_batches": 8})
    got = [np.asarray(b["x"].copy_to_host() if hasattr(b["x"], "copy_to_host") else b["x"])
           for b in gpu]
    assert len(got) == len(cpu) and all(np.array_equal(a, b) for a, b in zip(got, cpu))


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_padded_and_packing_rows_take_a_piece_each(split, mode):
    """A row holds one packet in these modes: a piece is an example of its own there, and
    every packet is delivered once."""
    d, docs, packets = split
    loader = Loader(d, **{**KW, "mode": mode, "seq_len": PIECE})
    ids = np.concatenate([b["input_ids"].ravel() for b in loader])
    assert loader.stats.packets == packets
    assert sorted(ids[ids > 0].tolist()) == sorted(
        t for doc in docs for t in doc.tolist() if t != EOS)


def test_an_elastic_resume_keeps_documents_whole(split):
    """3 ranks stop after 4 batches; their states continue on 2: the document an old rank was
    inside of is given again whole (counted as repeated), and every new rank's stream holds
    whole documents."""
    d, _, _ = split
    olds = [Loader(d, rank=r, world_size=3, **KW) for r in range(3)]
    for ld in olds:
        it = iter(ld)
        for _ in range(4):
            next(it)
    states = [ld.state_dict() for ld in olds]
    for ld in olds:
        ld.close()
    news = [Loader(d, rank=r, world_size=2, **KW) for r in range(2)]
    for ld in news:
        ld.load_state_dict(states)
    assert len({len(ld) for ld in news}) == 1
    assert all(jumps(stream(ld)) == 0 for ld in news)


def test_mixed_sources_keep_their_documents_whole_and_counted(tmp_path):
    rng = np.random.default_rng(11)
    a, na = write(tmp_path / "a", documents(rng, 40))
    b, nb = write(tmp_path / "b", [doc + 500 * (doc != EOS) for doc in documents(rng, 30)])
    loaders = [Loader({"a": a, "b": b}, mix={"a": 2.0, "b": 1.0}, mix_size="longest",
                      rank=r, world_size=2, **KW) for r in range(2)]
    assert all(jumps(stream(ld)) == 0 for ld in loaders)
    assert sum(left_out(ld.stats) for ld in loaders) == na + nb
