"""``align="bos"`` (``ndp.loader.layouts.align``): packed windows that start at documents.

The reference is independent of the code under test: the unaligned Loader with the same
settings reads the same stream of documents (the order does not depend on alignment), so its
windows laid end to end are the stream, and the ramp data marks each document's first token
(packet ``k`` holds ``k*1000 + i``, so only a first token is a multiple of 1000). A greedy in
plain Python over that stream gives every aligned window; the Loader must deliver exactly
those, on both backends, count the tokens it passes over, agree with ``len()`` and
``explain``, and resume to the same batches."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest


import golden  # noqa: E402
from test_documents import batches, segments  # noqa: E402
from test_explain import check_batch, make  # noqa: E402

import ndp  # noqa: E402
from ndp.errors import ConfigError, LoaderStateError  # noqa: E402

B, T = golden.SHAPES["packed"]["batch_size"], golden.SHAPES["packed"]["seq_len"]
#: one run of each way an epoch is planned: walked with CRC-Drop (``rank1of3``), read place
#: by place and counted on the plan's thread (``lazy``), built whole (``mix``)
CONFIGS = ("rank1of3", "lazy", "mix")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("align"))


def stream_of(unaligned):
    """The stream of tokens (and of labels: ``labels[p]`` is the target read at ``p``'s
    successor) that the unaligned batches cover."""
    x = np.concatenate([b["x"] for b in unaligned]).ravel()
    y = np.concatenate([b["y"] for b in unaligned]).ravel()
    return x, y


def greedy(x, seq_len, batch_size):
    """Aligned windows over stream ``x`` by the module docstring's rule, in plain Python:
    each window's start, and the tokens passed over, for the batches whose windows all lie
    inside ``x`` (the unaligned stream ends where its last window does)."""
    starts = [p for p in range(x.shape[0]) if x[p] % 1000 == 0]
    wins, left, point, k = [], [], 0, 0
    while True:
        batch, passed = [], 0
        for _ in range(batch_size):
            while k < len(starts) and starts[k] < point:
                k += 1
            if k == len(starts) or starts[k] + seq_len + 1 > x.shape[0]:
                return wins, left
            batch.append(starts[k])
            passed += starts[k] - point
            point = starts[k] + seq_len
        wins += batch
        left.append(passed)


@pytest.mark.parametrize("name", CONFIGS)
def test_windows_start_at_documents_as_a_plain_greedy_over_the_stream_says(datasets, name):
    with make(datasets, "packed", name) as plain:
        x, y = stream_of(batches(plain))
    got = {}
    for backend in ("cpu", "cuda"):  # the CUDA kernels under the simulator without a GPU
        with make(datasets, "packed", name, backend, align="bos") as loader:
            want_len = len(loader)
            got[backend] = batches(loader)
            stats = loader.stats
        assert len(got[backend]) == want_len > 5
    for a, b in zip(got["cpu"], got["cuda"]):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    wins, left = greedy(x, T, B)
    rows = np.concatenate([b["x"] for b in got["cpu"]])
    labels = np.concatenate([b["y"] for b in got["cpu"]])
    n = min(len(wins), rows.shape[0])
    assert n >= rows.shape[0] - 2 * B  # the unaligned stream covers all but its end
    for w in range(n):
        s = wins[w]
        np.testing.assert_array_equal(rows[w], x[s:s + T], err_msg=f"window {w}")
        np.testing.assert_array_equal(labels[w], y[s:s + T], err_msg=f"labels of window {w}")
    assert (rows[:, 0] % 1000 == 0).all()
    if n == rows.shape[0]:  # the reference covers every batch: what each passed over
        assert stats.left_over_tokens == sum(left[:len(got["cpu"])])
    assert stats.tokens == len(got["cpu"]) * B * T
    assert stats.as_dict()["left_over_tokens"] == stats.left_over_tokens > 0


@pytest.mark.parametrize("rank", range(3))
def test_every_stream_token_is_an_input_passed_over_or_unused(datasets, rank):
    """Data with no damaged packet, no CRC-Drop: the stream is the rank's share's packets,
    each of its tokens counted once."""
    with ndp.Loader(datasets["extra"], mode="packed", align="bos", seed=3, rank=rank,
                    world_size=3, output="arrays", **golden.SHAPES["packed"]) as loader:
        assert len(batches(loader)) > 5
        s = loader.stats
        share = loader.plan.share(0)
        stream = int(np.asarray(loader.corpus.tokens[share.packets[:share.length]]).sum())
    assert not s.corrupt and s.left_over_tokens > 0
    assert stream == s.tokens + s.left_over_tokens + s.unused_tokens


def test_every_rank_takes_len_batches(datasets):
    n = set()
    for rank in range(3):
        with ndp.Loader(datasets["main"], mode="packed", align="bos", seed=3, rank=rank,
                        world_size=3, output="arrays", **golden.SHAPES["packed"]) as loader:
            n.add((len(loader), len(batches(loader))))
    assert len(n) == 1 and n.pop()[0] > 5


@pytest.mark.parametrize("name", ("rank1of3", "mix", "elastic3"))
def test_explain_names_each_aligned_window(datasets, name):
    """Also after an elastic resume (2 ranks to 3), whose remainder starts from the old
    ranks' search points."""
    n = 0
    with make(datasets, "packed", name, align="bos") as loader, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        want = loader.remaining
        for batch in loader:
            ex = loader.explain(loader.step - 1)
            check_batch(ex, batch, "packed")
            assert all(ex.row(r)[0].start == 0 for r in range(ex.rows))  # at a document
            n += 1
    assert n == want > 5


@pytest.mark.parametrize("name", ("rank1of3", "lazy"))
def test_a_resume_mid_epoch_delivers_the_rest_of_the_run(datasets, name):
    with make(datasets, "packed", name, align="bos") as loader:
        whole = batches(loader)
    with make(datasets, "packed", name, align="bos") as loader:
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["align"] == "bos"
    with make(datasets, "packed", name, align="bos") as loader:
        loader.load_state_dict(state)
        rest = batches(loader)
    assert len(rest) == len(whole) - 7
    for a, b in zip(rest, whole[7:]):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    with make(datasets, "packed", name) as unaligned, pytest.raises(LoaderStateError,
                                                                    match="align"):
        unaligned.load_state_dict(state)


def test_documents_of_aligned_windows(datasets):
    """Each window starts a document: position and document id 0 at its first token; the
    ``cu_seqlens`` are the segments its document ids cut, as unaligned."""
    with make(datasets, "packed", "rank1of3", align="bos", documents=True) as loader:
        got = batches(loader)
    with make(datasets, "packed", "rank1of3", align="bos") as loader:
        plain = batches(loader)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a["x"], b["x"])
        assert (a["position_ids"][:, 0] == 0).all() and (a["document_ids"][:, 0] == 0).all()
        np.testing.assert_array_equal(a["cu_seqlens"], segments(a["document_ids"]))
        starts = a["x"] % 1000 == 0  # where documents start in the window
        np.testing.assert_array_equal(a["position_ids"] == 0, starts)


def test_a_seq_len_schedule_counts_and_lays_out_each_phase(datasets):
    seq = ndp.Schedule([(0, 16), (20, 24)])
    with make(datasets, "packed", "rank1of3", align="bos", seq_len=seq) as loader:
        n = len(loader)
        got = batches(loader)
    assert len(got) == n > 20
    assert {b["x"].shape[1] for b in got[:20]} == {16} and {b["x"].shape[1]
                                                            for b in got[20:]} == {24}
    assert all((b["x"][:, 0] % 1000 == 0).all() for b in got)


@pytest.mark.parametrize("over,match", [
    ({"align": "eos"}, "align must be one of"),
    ({"align": "bos", "mode": "padded", "batch_size": 2, "seq_len": 16}, "starts packed"),
    ({"align": "bos", "mix": ndp.Schedule([(0, {"a": 1.0}), (5, {"a": 1.0})])},
     "mix Schedule"),
])
def test_bad_settings_are_named(datasets, over, match):
    kw = dict(mode="packed", output="arrays", **golden.SHAPES["packed"]) | over
    with pytest.raises(ConfigError, match=match):
        ndp.Loader(datasets["main"], **kw)


@pytest.mark.parametrize("backend", ("cpu", "cuda"))
def test_documents_split_over_packets_start_windows_only_at_their_first_piece(tmp_path,
                                                                              backend):
    """Data whose documents the converter split over packets (``ndp.loader.ordering.units``): a
    window starts at a document's first token (``d*1000 + 1`` there), never at a later
    piece's; a resume mid-epoch goes on with the same windows."""
    from test_units import KW, documents, write

    data, _ = write(tmp_path / "split", documents(np.random.default_rng(5)))
    kw = KW | dict(backend=backend, align="bos", rank=1, world_size=2, crc_drop_rate=0.05)
    with ndp.Loader(data, **kw) as loader:
        n = len(loader)
        whole = batches(loader)
        assert loader.stats.left_over_tokens > 0
    assert len(whole) == n > 5
    assert all((b["x"][:, 0] % 1000 == 1).all() for b in whole)
    with ndp.Loader(data, **kw) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
    with ndp.Loader(data, **kw) as loader:
        loader.load_state_dict(state)
        rest = batches(loader)
    assert [b["x"].tolist() for b in rest] == [b["x"].tolist() for b in whole[3:]]
