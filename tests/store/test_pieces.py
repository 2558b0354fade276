"""Split documents as a shard and its index carry them (``ndp.store.pieces``): the writer keeps
a document's pieces in one shard and refuses a piece at a shard's start; the index header
counts the marked pieces, a rebuild keeps the count, and an index whose count is not its
entries' (one an older ndp wrote beside a newer shard) is refused at its first use."""

from __future__ import annotations

import numpy as np
import pytest

from ndp.errors import IndexMismatchError, ShardFormatError
from ndp.store.corpus import Corpus
from ndp.store.index import build_index, read_index, write_index
from ndp.store.pieces import count_continued, pieces_of, runs_after
from ndp.store.shard import Shard
from ndp.store.writer import ShardWriter
from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES, INDEX_HEADER_DTYPE
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp


def entries(flags, lengths=None):
    e = np.zeros(len(flags), INDEX_ENTRY_DTYPE)
    e["dst"] = np.where(flags, 0x81, 0x01)
    e["typ"] = 0x01  # int32 tokens: 4 bytes each
    e["length"] = 4 * np.asarray(lengths if lengths is not None else [3] * len(flags))
    return e


def test_runs_of_later_pieces_and_what_each_packet_is():
    #          0      1     2     3      4      5     6     7
    flags = [True, False, True, True, False, True, False, False]  # the first is no piece
    p = pieces_of(entries(flags, [1, 2, 3, 4, 5, 6, 7, 8]))
    assert p.first.tolist() == [2, 5] and p.count.tolist() == [2, 1]
    assert p.tokens.tolist() == [3 + 4, 6] and p.packets == 3
    inside, count, tokens = runs_after(p, np.arange(8))
    assert inside.tolist() == [False, False, True, True, False, True, False, False]
    assert count.tolist() == [0, 2, 0, 0, 1, 0, 0, 0]  # 1 starts a document of 3 packets
    assert tokens.tolist() == [0, 7, 0, 0, 6, 0, 0, 0]
    assert pieces_of(entries([False, False])) is None
    assert count_continued(entries(flags)) == 3


def _document(k, n, pieces):
    return [encode_tokens(ramp(k, n), continues=j > 0) for j in range(pieces)]


def test_the_writer_keeps_a_documents_pieces_in_one_shard(tmp_path):
    big = _document(1, 8000, 4)  # 4 x ~32 KB
    with ShardWriter(tmp_path, max_shard_bytes=70_000) as writer:
        for packet in _document(0, 12000, 1) + big + _document(2, 10, 1):
            writer.write(packet)
    sizes = [s.packets for s in writer.finished]
    assert sizes == [1, 4, 1]  # the document's pieces are one shard's, past its size
    heads = [np.frombuffer(s.path.with_name(s.path.name + ".idx").read_bytes()[
        :INDEX_HEADER_BYTES], INDEX_HEADER_DTYPE)[0]["continued"] for s in writer.finished]
    assert [int(h) for h in heads] == [0, 3, 0]
    with ShardWriter(tmp_path / "bad") as writer, pytest.raises(ShardFormatError,
                                                                match="first packet of a shard"):
        writer.write(encode_tokens(ramp(0, 5), continues=True))


def test_a_rebuilt_index_counts_the_pieces_too(tmp_path):
    with ShardWriter(tmp_path) as writer:
        for packet in _document(0, 5, 3) + _document(1, 5, 1):
            writer.write(packet)
    (shard,) = writer.finished
    written = shard.path.with_name(shard.path.name + ".idx").read_bytes()
    build_index(Shard(shard.path))
    assert shard.path.with_name(shard.path.name + ".idx").read_bytes() == written


def test_an_index_that_does_not_count_its_pieces_is_refused_at_first_use(tmp_path):
    with ShardWriter(tmp_path) as writer:
        for packet in _document(0, 5, 3) + _document(1, 5, 2):
            writer.write(packet)
    idx = writer.finished[0].path.with_name(writer.finished[0].path.name + ".idx")
    raw = bytearray(idx.read_bytes())
    head = np.frombuffer(bytes(raw[:INDEX_HEADER_BYTES]), INDEX_HEADER_DTYPE).copy()
    assert int(head[0]["continued"]) == 3
    head["continued"] = 0  # what an index written before the field says
    idx.write_bytes(head.tobytes() + bytes(raw[INDEX_HEADER_BYTES:]))
    corpus = Corpus(tmp_path)
    assert not corpus.has_pieces  # the header is all an open reads
    with pytest.raises(IndexMismatchError, match="header counts 0 packets that continue a "
                                                 "split document, its entries mark 3"):
        corpus.tokens[0:1]
    index = read_index(idx)
    write_index(idx, index.entries, index.shard_size, index.shard_crc32, index.data_offset)
    assert Corpus(tmp_path).has_pieces  # rewritten: counted
