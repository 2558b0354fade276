"""What runs in one measured process of ``bench_scale.py`` (``bench_scale.py --worker SPEC``):
open a Loader, take its first batch, resume near the end of epoch 0 from a state built from the
index and time ``next()`` across the epoch boundary; peak RSS from the process's ``VmHWM``.

**Measurements.** Each in a fresh process, so that peak RSS is that run's alone (its ``VmHWM``:
Linux carries the parent's high-water mark into a child's ``ru_maxrss`` over ``exec``, so that
one would count the driver too): ``ndp.Loader(mode=..., batch_size=16, seq_len=1024,
backend="cpu", output="arrays", rank=0, world_size=W)``; the open time is the constructor's, the
first batch the first ``next()`` after it. Peak RSS is the larger of the peak to the first batch
and the peak across the epoch boundary (below); the resume that gets there works out the
epoch's plan a second time to check the state, so the high-water mark is reset after it
(``/proc/self/clear_refs``) and its own peak recorded apart (``resume_peak_rss_mb``). Numba's
compiled kernels are loaded from its cache: a warm-up run on a small dataset fills it first, so
no row counts a compile.

**Across an epoch boundary.** Iterating to the end of an epoch of 1e8 documents would take hours
here, and the Loader's state format allows going there directly: a state is the epoch, a
(packet, token) position in this rank's order and the batch number (``ndp.loader.states.state``,
sealed
with the crc32 ``seal`` computes). The worker takes ``loader.state_dict()``, puts in it the
position after batch ``len(loader) - 64 - 8`` of epoch 0 (worked out from the index's token
counts the way each mode lays out its batches: ``padded`` B packets a batch, ``packed`` B*T
stream tokens a batch, ``packing`` each batch's candidates as ``Plan.candidates`` picks them),
seals it and ``load_state_dict``s it: the Loader checks it field by field as any resume. After 8
untimed batches (the restart's own ramp-up) it waits for what the Loader makes ahead of an
epoch's end on threads of its own: the next epoch's plan and count (``Plan.plan_ahead``) and
its first window's entry table (``ndp.loader.ordering.warm``; a real epoch lasts far longer than
they
take; a run resumed 72 batches before the end does not), records that wait
(``ahead_plan_wait_s``) and times every ``next()`` of the last 64 batches of
epoch 0 and the first 64 of epoch 1, the step across the boundary (the ``next()`` that ends
epoch 0, ``iter()`` and the first ``next()`` of epoch 1) counted as one: p99 of those 128 waits,
with their p50, max and the boundary step on its own (of 128 waits the p99 lies below the
largest one, so a single slow step at the boundary shows in the boundary step and the max, not
in the p99). With nothing to do between batches, the consumer waits on every chunk the producer
decodes: the p99 is a chunk's decode time more than a training loop would see. So the boundary
is crossed a second time from the same state (``paced``) by a consumer that takes twice the
producer's time a batch between calls (sleeping, as a host waits on a GPU step): its waits
(``paced_next_p99_ms``, ``paced_boundary_step_ms``) are stalls. Whether the built
state is the one iterating gives is checked by iterating to it where an epoch is short
(``--check-states``, up to 5,000 batches; after the run's peak RSS is read), and every run
checks it delivers exactly the batches left in the epoch, without a packet dropped.

ndp is imported inside ``worker``, where its import is timed, never at import of this module.
"""

from __future__ import annotations

import resource
import time

import numpy as np

#: a dataset whose epoch has at most this many batches has its resume state checked by
#: iterating to it (``--check-states auto``)
CHECK_STATES_BATCHES = 5000


def _hwm_mb() -> float:
    """This process's peak RSS so far (VmHWM), in MB."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def state_at(loader, batch: int) -> dict:
    """The Loader state after ``batch`` batches of epoch 0, from the index's token counts (see
    the module docstring), sealed as ``state_dict`` seals it."""
    from ndp.loader.states.state import seal

    plan = loader.plan
    share = plan.share(0)
    own = share.packets[:share.length]
    B, T = plan.batch_size, plan.seq_len
    if plan.mode == "padded":
        pos, tok = min(batch * B, own.shape[0]), 0
    elif plan.mode == "packed":
        run = np.cumsum(plan.corpus.tokens[own].astype(np.int64))
        end = batch * B * T
        pos = int(np.searchsorted(run, end, side="right"))
        tok = end - (int(run[pos - 1]) if pos else 0)
    else:
        pos = 0
        for _ in range(batch):
            pos = plan.candidates(share.packets, pos, plan.shapes.at(0))
        pos, tok = min(pos, own.shape[0]), 0
    state = {k: v for k, v in loader.state_dict().items() if k != "check"}
    state.update(epoch=0, pos=int(pos), tok=int(tok), batch=int(batch), step=int(batch))
    state.pop("elastic", None)
    return seal(state)


def worker(spec: dict) -> dict:
    """Open a Loader, take its first batch and, unless ``spec["boundary"]`` is 0, time
    ``next()`` across the end of epoch 0 (module docstring). Prints one JSON line."""
    t0 = time.perf_counter()
    import ndp

    import_s = time.perf_counter() - t0
    rss_import = _hwm_mb()
    t0 = time.perf_counter()
    loader = ndp.Loader(spec["data"], mode=spec["mode"], batch_size=spec["batch"],
                        seq_len=spec["seq"], backend="cpu", output="arrays", seed=0,
                        rank=spec["rank"], world_size=spec["world"])
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    first_s = time.perf_counter() - t0
    del batch
    rss_first = _hwm_mb()
    out = {"import_s": import_s, "open_s": open_s, "first_batch_s": first_s,
           "rss_after_import_mb": rss_import, "rss_after_first_batch_mb": rss_first,
           "ndp_file": ndp.__file__, "batches_per_epoch": len(loader),
           "packets": loader.corpus.n_packets}
    it.close()
    k = spec.get("boundary", 0)
    if not k:
        out["peak_rss_mb"] = _hwm_mb()
        loader.close()
        return out
    res, state = boundary(loader, k, spec.get("warm", 8))
    out.update(res)
    out.update(paced(loader, state, k, spec.get("warm", 8), res))
    # the run's peak: to the first batch, and across the boundary (without the resume's own)
    out["peak_rss_mb"] = max(rss_first, res["boundary_peak_rss_mb"])
    check = spec.get("check_state", False)
    if check is True or (check == "auto" and len(loader) <= CHECK_STATES_BATCHES):
        # after the peak was read: the second Loader's buffers are no part of the run
        out["state_checked_by_iterating"] = check_state_by_iterating(loader, state,
                                                                     res["resume_batch"])
    loader.close()
    return out


def _reset_hwm() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux 4.0 on); whether it could. The
    heap's free memory is given back first (glibc's ``malloc_trim``): the resume's own arrays
    (``state_at`` gathers the share's token counts, hundreds of MB at 1e8) are freed by then,
    but glibc keeps freed memory mapped, and it would count as the boundary's."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def boundary(loader, k: int, warm: int) -> tuple[dict, dict]:
    """``next()`` waits over the last ``k`` batches of epoch 0 and the first ``k`` of epoch 1
    (fewer where an epoch is shorter), resumed ``k + warm`` batches before epoch 0's end; and
    the state resumed from. The peak RSS of the resume itself (``load_state_dict`` works out
    the epoch's shares again to check the state) is reported apart: the high-water mark is
    reset after it where Linux allows, so ``boundary_peak_rss_mb`` is the boundary's."""
    n = len(loader)
    before = min(k, n)
    start = max(0, n - before - warm)
    warm = n - before - start
    t0 = time.perf_counter()
    state = state_at(loader, start)
    loader.load_state_dict(state)
    resume_s = time.perf_counter() - t0
    out = {"resume_batch": start, "resume_state_s": resume_s, "timed_before": before,
           "resume_peak_rss_mb": _hwm_mb(), "hwm_reset_after_resume": _reset_hwm()}
    it = iter(loader)
    for _ in range(warm):
        next(it)
    out["ahead_plan_wait_s"] = wait_ahead(loader)
    waits = []
    for _ in range(before):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
    t = time.perf_counter()
    try:
        next(it)
        raise SystemExit(f"epoch 0 went on past its {n} batches after a resume at {start}: "
                         "the built state is not the Loader's")
    except StopIteration:
        pass
    if loader.epoch != 1:
        raise SystemExit(f"after epoch 0's last batch the loader is at epoch {loader.epoch}")
    it = iter(loader)
    next(it)
    step = time.perf_counter() - t
    waits.append(step)
    after = min(k, len(loader))
    for _ in range(after - 1):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
    it.close()
    ms = np.array(waits) * 1e3
    out.update({"timed_after": after, "next_samples": len(waits),
                "next_mean_ms": float(ms.mean()), "next_p50_ms": float(np.percentile(ms, 50)),
                "next_p99_ms": float(np.percentile(ms, 99)), "next_max_ms": float(ms.max()),
                "boundary_step_ms": step * 1e3, "boundary_peak_rss_mb": _hwm_mb()})
    stats = loader.stats.as_dict()
    out["packets_read"] = stats["packets"]
    out["corrupt_packets"] = sum(stats["corrupt"].values())
    if out["corrupt_packets"] or stats["valid"] != stats["packets"]:
        raise SystemExit(f"the Loader dropped packets of the generated data: {stats['corrupt']}")
    return out, state


def wait_ahead(loader) -> float:
    """Wait for what the Loader makes ahead of an epoch's end, and return the seconds waited:
    the next epoch's plan and count (``Plan.plan_ahead``) and the entry table of its first
    window (``ndp.loader.ordering.warm``). A real epoch's last window lasts far longer than they
    take
    (seconds at 1e8 16-token documents); a run resumed 72 batches before its end does not."""
    t = time.perf_counter()
    ahead = getattr(loader.plan, "_ahead", None)
    if ahead is not None:
        ahead.join()
    warmer = getattr(getattr(loader, "_producer", None), "warmer", None)
    share = loader.plan.share(loader.epoch).packets
    if warmer is not None and getattr(share, "tables", None) is not None and len(share):
        warmer.join()
        warmer.ahead(share, share.length - 1, lambda: loader.plan.planned(loader.epoch + 1))
        warmer.join()
    return time.perf_counter() - t


def paced(loader, state: dict, k: int, warm: int, zero: dict) -> dict:
    """The boundary again from the same state, the consumer taking twice the producer's time
    a batch (measured by the run with nothing to do: its mean wait) between ``next()`` calls,
    in ``time.sleep`` (a training step's GPU work leaves the host's cores free): what waits
    now is a stall, not the decode a consumer with nothing to do waits for."""
    step = max(2 * zero["next_mean_ms"], 1.0) / 1e3
    loader.load_state_dict(state)
    warm = len(loader) - state["batch"] - zero["timed_before"]  # as ``boundary`` cut it
    it = iter(loader)
    for _ in range(warm):
        next(it)
        time.sleep(step)
    wait_ahead(loader)
    waits = []
    for _ in range(zero["timed_before"]):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
        time.sleep(step)
    t = time.perf_counter()
    for _ in it:
        raise SystemExit("the paced run went on past epoch 0's end")
    it = iter(loader)
    next(it)
    waits.append(time.perf_counter() - t)
    step_at = len(waits) - 1
    for _ in range(zero["timed_after"] - 1):
        time.sleep(step)
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
    it.close()
    ms = np.array(waits) * 1e3
    return {"paced_step_ms": step * 1e3, "paced_next_p50_ms": float(np.percentile(ms, 50)),
            "paced_next_p99_ms": float(np.percentile(ms, 99)),
            "paced_next_max_ms": float(ms.max()), "paced_boundary_step_ms": float(ms[step_at])}


def check_state_by_iterating(loader, state: dict, batch: int) -> bool:
    """Iterate a fresh epoch 0 to ``batch`` and compare its state with ``state``."""
    import ndp

    fresh = ndp.Loader(loader.corpus, mode=loader.mode, batch_size=loader.batch_size,
                       seq_len=loader.seq_len, backend="cpu", output="arrays", seed=0,
                       rank=loader.rank, world_size=loader.world_size)
    it = iter(fresh)
    for _ in range(batch):
        next(it)
    real = fresh.state_dict()
    it.close()
    fresh._stop_producer()
    keys = ("epoch", "pos", "tok", "batch")
    if batch and any(real[key] != state[key] for key in keys):
        raise SystemExit(f"the state built for batch {batch} ({[state[k] for k in keys]}) is "
                         f"not the one iterating gives ({[real[k] for k in keys]})")
    return True
