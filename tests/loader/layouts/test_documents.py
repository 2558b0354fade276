"""``documents=True`` (``ndp.loader.layouts.documents``): packed windows with their documents'
``position_ids``, ``document_ids`` and per-batch ``cu_seqlens``, the same from the CPU and the
CUDA kernels (the simulator without a GPU), as ``explain`` names each window's pieces, with
``x`` and ``y`` unchanged; a document mask built from them blocks attention across documents
exactly as attention run document by document (torch's SDPA on a tiny attention layer)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest


import golden  # noqa: E402
from test_explain import make  # noqa: E402
from test_units import documents, write  # noqa: E402

import ndp  # noqa: E402


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("documents"))


def host(value):
    return np.array(value if isinstance(value, np.ndarray) else value.copy_to_host())


def batches(loader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [{k: host(v) for k, v in b.items()} for b in loader]


def expected(ex, seq_len):
    """``position_ids`` and ``document_ids`` of each window of ``ex`` from its pieces: a piece
    at column 0 continues the document the window starts in; every other starts one."""
    pos = np.zeros((ex.rows, seq_len), np.int64)
    doc = np.zeros((ex.rows, seq_len), np.int64)
    for r in range(ex.rows):
        d = -1
        for p in ex.row(r):
            if p.col >= seq_len:
                continue  # the window's last target only
            d += p.col == 0 or p.start == 0
            n = min(p.stop - p.start, seq_len - p.col)
            first = pos[r, p.col - 1] + 1 if p.col and p.start else 0
            pos[r, p.col:p.col + n] = first + np.arange(n)
            doc[r, p.col:p.col + n] = d
    return pos, doc


def segments(document_ids):
    """``cu_seqlens`` of a batch as ``document_ids`` cut it: every window, and every document
    in a window, a segment of the flattened batch."""
    flat = (document_ids + 1000 * np.arange(document_ids.shape[0])[:, None]).ravel()
    return np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])


@pytest.mark.parametrize("name", ["rank1of3", "mix", "elastic3", "lazy"])
def test_documents_are_the_ones_explain_names_on_both_backends(datasets, name):
    got = {}
    for backend in ("cpu", "cuda"):
        with make(datasets, "packed", name, backend, documents=True) as loader:
            got[backend] = batches(loader)
    with make(datasets, "packed", name) as plain:
        without = batches(plain)
    assert len(got["cpu"]) == len(got["cuda"]) == len(without) > 10
    with make(datasets, "packed", name, documents=True) as loader:
        for step, (a, b, c) in enumerate(zip(got["cpu"], got["cuda"], without)):
            assert set(a) == {"x", "y", "position_ids", "document_ids", "cu_seqlens"}
            for key in a:
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key} at {step}")
            np.testing.assert_array_equal(a["x"], c["x"])  # x and y as without documents
            np.testing.assert_array_equal(a["y"], c["y"])
            assert a["document_ids"].dtype == np.int32 and a["cu_seqlens"].dtype == np.int32
            pos, doc = expected(loader.explain(loader.step + step), a["x"].shape[1])
            np.testing.assert_array_equal(a["position_ids"], pos, err_msg=f"step {step}")
            np.testing.assert_array_equal(a["document_ids"], doc, err_msg=f"step {step}")
            np.testing.assert_array_equal(a["cu_seqlens"], segments(a["document_ids"]))


def test_split_documents_are_one_document_each(tmp_path):
    """Documents split over packets (``ndp.loader.ordering.units``): a document's pieces are one
    document in ``document_ids``, its positions running on across them."""
    docs = documents(np.random.default_rng(5))
    d, _ = write(tmp_path, docs)
    kw = dict(mode="packed", batch_size=2, seq_len=12, output="arrays", seed=3,
              shuffle_window=1 << 17, documents=True)
    got = {b: batches(ndp.Loader(d, backend=b, **kw)) for b in ("cpu", "cuda")}
    for a, b in zip(got["cpu"], got["cuda"]):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    for batch in got["cpu"]:
        x, doc, pos = batch["x"], batch["document_ids"], batch["position_ids"]
        for r in range(x.shape[0]):
            for j in range(1, x.shape[1]):
                if doc[r, j] == doc[r, j - 1]:  # a document's tokens: one source document
                    assert x[r, j] // 1000 == x[r, j - 1] // 1000 or x[r, j] == 0 or (
                        x[r, j - 1] == 0)
                    assert pos[r, j] == pos[r, j - 1] + 1
                else:  # a new document begins after the one before ended (EOS = 0)
                    assert pos[r, j] == 0 and x[r, j - 1] == 0


def test_a_document_mask_blocks_attention_across_documents(datasets):
    """One causal self-attention layer over a batch, with the mask built from
    ``document_ids``, equals the same layer run on each ``cu_seqlens`` segment alone; without
    the mask it does not."""
    torch = pytest.importorskip("torch")
    with make(datasets, "packed", "lazy", documents=True) as loader:
        batch = next(b for b in batches(loader) if b["cu_seqlens"].shape[0] > 4)
    torch.manual_seed(0)
    emb, proj = torch.nn.Embedding(60000, 8), torch.nn.Linear(8, 24)
    x = torch.as_tensor(batch["x"])
    q, k, v = proj(emb(x)).chunk(3, dim=-1)  # (B, T, 8) each
    doc = torch.as_tensor(batch["document_ids"])
    T = x.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = (doc[:, :, None] == doc[:, None, :]) & causal  # FlexAttention's document mask
    with torch.no_grad():
        masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        flat_q, flat_k, flat_v = (t.reshape(-1, 8) for t in (q, k, v))
        cu = batch["cu_seqlens"].tolist()
        parts = [torch.nn.functional.scaled_dot_product_attention(
            flat_q[a:b][None], flat_k[a:b][None], flat_v[a:b][None], is_causal=True)[0]
            for a, b in zip(cu[:-1], cu[1:])]  # FlashAttention's varlen, segment by segment
    by_segment = torch.cat(parts).reshape(masked.shape)
    torch.testing.assert_close(masked, by_segment)
    assert not torch.allclose(plain, by_segment)  # the batch has documents to keep apart


def test_documents_are_for_packed_windows():
    with pytest.raises(ndp.ConfigError, match="documents=True"):
        ndp.Loader(golden.HERE, mode="padded", batch_size=2, seq_len=8, documents=True)


def test_cu_seqlens_of_random_chunks_equal_a_plain_merge():
    """The compiled pass against the definition, window by window in plain Python, for
    windows every ``T`` tokens and windows at documents (``align="bos"``), over 500 random
    chunks (documents of 1-29 tokens, shapes from 1 x 1)."""
    from ndp.loader.layouts.align import aligned_windows
    from ndp.loader.layouts.documents import _cu_seqlens

    rng = np.random.default_rng(3)
    for _ in range(500):
        B, T, n = (int(v) for v in rng.integers(1, [5, 20, 6]))
        lens = rng.integers(1, 30, int(rng.integers(1, 200)))
        doc_cum = np.concatenate([[0], np.cumsum(lens)])
        total, start = int(doc_cum[-1]), int(rng.integers(0, 10))
        doc_cum = doc_cum[:-1].astype(np.int64)
        wins, ends, _ = aligned_windows(doc_cum, total=total, tok=start, batch_size=B,
                                        seq_len=T, most=n)
        for starts in (start + T * np.arange(n * B), wins):
            given = wins if starts is wins else np.zeros(0, np.int64)
            got, at = _cu_seqlens(doc_cum, start, given, starts.shape[0] // B, B, T)
            want = []
            for b in range(starts.shape[0] // B):
                for w in range(B):
                    s = int(starts[b * B + w])
                    want += [w * T] + [w * T + int(d) - s for d in doc_cum if s < d < s + T]
                want.append(B * T)
            assert got.dtype == np.int32 and got.tolist() == want
            assert at[-1] == len(want)
