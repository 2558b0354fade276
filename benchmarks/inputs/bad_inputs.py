"""Bad inputs and misuse, tried as a hostile user would: how many ndp handles.

    python benchmarks/inputs/bad_inputs.py        # about a minute; JSON into $NDP_RESULTS_DIR, else
                                           #  ./ndp-results
    python benchmarks/inputs/bad_inputs.py --out benchmarks/results   # adds to the project's record

Each case damages a small ramp dataset (packet ``k`` holds ``k * 1000 + 0..n-1``), or misuses
the API or the command line, the way issue 12 lists them: indexes, partial datasets, ranks,
resume states, files changed under a reader, values a model cannot take, misuse, command-line
mistakes, damaged shards; issue 28's (in ``bad_inputs_more.py``, with the groups "files" to
"command line"): elastic resume, a FIFO shard, zero lengths, a padded batch of no row, named
errors, a full disk, remote datasets (where moto and s3fs are installed); and issue 39's (in
``bad_inputs_round3.py``): the count cache against damaged indexes, a foreign shard, options
and manifest fields of a wrong type, an epoch of no batch, tokenizers mixed, split documents,
a Loader across threads and forks. A case is **handled**
when ndp does one of the two things it promises:

* refuses with a named error (an ``ndp.errors`` class; on the command line one message, exit
  status 1 or 2, no traceback), or
* delivers exactly the intact dataset's batches (what was dropped counted by reason).

Anything else (other batches, a crash, a hang, a bare Python exception) is **not handled**.
Cases that could kill the process (a shard cut under a reader) run in a child process.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402
from harness import add_out_argument, machine, write_report  # noqa: E402

from inputs.cases import (CASES, LENGTHS, NotHandled, batches, case, command,  # noqa: E402
                          dataset, exact_or_refused, flip_index_field, loader, ramp_packets,
                          refused, set_entries)
from ndp.loader.states.state import seal  # noqa: E402

# ------------------------------------------------------------------------------------ indexes
for _mode in ("packed", "padded"):
    for _verify in ("size", "full"):
        def _length_flip(tmp: Path, mode=_mode, verify=_verify) -> str:
            ref = batches(loader(dataset(tmp / "ref"), mode))
            d = dataset(tmp / "d")
            flip_index_field(d, "length", 3)
            return exact_or_refused(lambda: batches(loader(d, mode, verify=verify)), ref)
        case("indexes", f"one index length bit flipped, {_mode}, verify={_verify}")(_length_flip)


@case("indexes", "an index listing one offset six times")
def _repeated(tmp):
    ref = batches(loader(dataset(tmp / "ref"), "padded"))
    d = dataset(tmp / "d")
    set_entries(d, lambda e: np.concatenate([e[:2], np.repeat(e[2:3], 6), e[3:]]))
    return exact_or_refused(lambda: batches(loader(d, "padded")), ref)


@case("indexes", "an index listing a subset of the packets")
def _subset(tmp):
    ref = batches(loader(dataset(tmp / "ref"), "padded"))
    d = dataset(tmp / "d")
    set_entries(d, lambda e: e[::2].copy())
    return exact_or_refused(lambda: batches(loader(d, "padded", verify="full")), ref)


@case("indexes", "an index with no entries")
def _empty_index(tmp):
    ref = batches(loader(dataset(tmp / "ref"), "packed"))
    d = dataset(tmp / "d")
    set_entries(d, lambda e: e[:0].copy())
    return exact_or_refused(lambda: batches(loader(d, "packed")), ref)


@case("indexes", "a stale index beside a same-size rewrite of its shard")
def _stale(tmp):
    d = dataset(tmp / "d")
    shard = sorted(d.glob("*.ndp"))[0]
    idx = shard.with_name(shard.name + ".idx").read_bytes()
    lengths = list(LENGTHS)
    lengths[1], lengths[2] = lengths[2], lengths[1]  # same bytes in all, other boundaries
    fresh = dataset(tmp / "fresh", ramp_packets(lengths))
    shutil.copy(sorted(fresh.glob("*.ndp"))[0], shard)
    shard.with_name(shard.name + ".idx").write_bytes(idx)
    ref = batches(loader(fresh, "packed", manifest="ignore"))
    return exact_or_refused(lambda: batches(loader(d, "packed", manifest="ignore")), ref)


@case("indexes", "an index cut short")
def _cut_index(tmp):
    ref = batches(loader(dataset(tmp / "ref"), "packed"))
    d = dataset(tmp / "d")
    idx = sorted(d.glob("*.idx"))[0]
    idx.write_bytes(idx.read_bytes()[:50])
    return exact_or_refused(lambda: batches(loader(d, "packed")), ref)


@case("indexes", "ndp verify on an index with a flipped length")
def _verify_flip(tmp):
    d = dataset(tmp / "d")
    flip_index_field(d, "length", 3)
    return command(["verify", str(d)], codes=(1,))


# ---------------------------------------------------------------------------- partial datasets
@case("partial datasets", "shards without ndp.json (a killed conversion)")
def _no_manifest(tmp):
    d = dataset(tmp / "d")
    (d / "ndp.json").unlink()
    return refused(lambda: loader(d))


@case("partial datasets", "ndp verify on shards without ndp.json")
def _verify_no_manifest(tmp):
    d = dataset(tmp / "d")
    (d / "ndp.json").unlink()
    return command(["verify", str(d)], codes=(1,))


@case("partial datasets", "a shard the manifest lists is missing")
def _missing(tmp):
    d = dataset(tmp / "d")
    sorted(d.glob("*.ndp"))[1].unlink()
    return refused(lambda: loader(d))


@case("partial datasets", "a shard the manifest does not list")
def _extra(tmp):
    d = dataset(tmp / "d")
    shutil.copy(sorted(d.glob("*.ndp"))[0], d / "zz-00000.ndp")
    return refused(lambda: loader(d))


@case("partial datasets", "a shard shorter than the manifest says")
def _short(tmp):
    d = dataset(tmp / "d")
    shard = sorted(d.glob("*.ndp"))[0]
    shard.write_bytes(shard.read_bytes()[:-30])
    return refused(lambda: loader(d))


@case("partial datasets", "a manifest that is not JSON")
def _bad_json(tmp):
    d = dataset(tmp / "d")
    (d / "ndp.json").write_text('{"shards": [')
    return refused(lambda: loader(d))


# ------------------------------------------------------------------------------------- ranks
for _mode in ("padded", "packed", "packing"):
    for _world in (2, 3):
        def _ranks(tmp, mode=_mode, world=_world) -> str:
            d = dataset(tmp / "d")
            counts = [len(batches(loader(d, mode, rank=r, world_size=world)))
                      for r in range(world)]
            if len(set(counts)) != 1:
                raise NotHandled(f"batch counts per rank {counts}")
            return f"every rank {counts[0]} batches"
        case("ranks", f"31 packets over {_world} ranks, {_mode}")(_ranks)


# ----------------------------------------------------------------------------- resume states
def _state(d: Path, mode: str = "packed") -> dict:
    ld = loader(d, mode)
    it = iter(ld)
    next(it)
    next(it)
    state = json.loads(json.dumps(ld.state_dict()))
    ld.close()
    return state


for _field, _value in (("pos", -5), ("pos", 10**9), ("tok", -1), ("epoch", -1),
                       ("batch", 10**6), ("version", 99)):
    def _bad_state(tmp, field=_field, value=_value) -> str:
        d = dataset(tmp / "d")
        state = seal(dict(_state(d), **{field: value}))
        return refused(lambda: loader(d, "packed").load_state_dict(state))
    case("resume states", f"state with {_field}={_value}")(_bad_state)


@case("resume states", "a state moved to another valid position (damaged in storage)")
def _moved(tmp):
    d = dataset(tmp / "d")
    state = _state(d, "padded")
    state["pos"] -= 1
    return refused(lambda: loader(d, "padded").load_state_dict(state))


@case("resume states", "a state from another dataset with as many packets")
def _other_dataset(tmp):
    d = dataset(tmp / "d")
    other = dataset(tmp / "o", ramp_packets([n + 1 for n in LENGTHS]))
    state = _state(d)
    return refused(lambda: loader(other, "packed").load_state_dict(state))


@case("resume states", "a state that is not a dict")
def _not_dict(tmp):
    d = dataset(tmp / "d")
    return refused(lambda: loader(d).load_state_dict([1, 2]))


# ------------------------------------------------------------------ more cases, in their module
# files, values, misuse, the command line, then issue 28's classes: registered into CASES when
# imported, after the groups above (it imports its helpers from this module); the shards after
from inputs import bad_inputs_more  # noqa: E402,F401
from inputs import bad_inputs_round3  # noqa: E402,F401
from inputs import bad_inputs_schedules  # noqa: E402,F401


# --------------------------------------------------------------------------------- the shards
@case("shards", "a payload bit flipped (same size)")
def _payload(tmp):
    d = dataset(tmp / "d")
    shard = sorted(d.glob("*.ndp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[60] ^= 0x04
    shard.write_bytes(bytes(raw))
    ld = loader(d)
    batches(ld)
    if not ld.stats.corrupt:
        raise NotHandled("nothing counted")
    return f"dropped, counted: {ld.stats.corrupt}"


@case("shards", "random bytes appended to a shard, read on purpose (manifest='ignore')")
def _garbage(tmp):
    d = dataset(tmp / "d")
    ref = batches(loader(dataset(tmp / "ref"), shuffle=False))
    shard = sorted(d.glob("*.ndp"))[-1]
    shard.write_bytes(shard.read_bytes() + np.random.default_rng(0).bytes(500))
    return exact_or_refused(lambda: batches(loader(d, shuffle=False, manifest="ignore")), ref)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ndp-bad-inputs-") as root:
        for i, (group, name, fn) in enumerate(CASES):
            tmp = Path(root) / f"c{i:02d}"
            tmp.mkdir()
            try:
                detail, handled = fn(tmp), True
            except NotHandled as exc:
                detail, handled = str(exc), False
            except Exception as exc:  # noqa: BLE001 - a bare exception is a finding
                detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
                handled = False
            rows.append({"group": group, "case": name, "handled": handled, "detail": detail})
            print(f"{'ok  ' if handled else 'FAIL'} [{group}] {name}: {detail.splitlines()[0]}")
    tried, handled = len(rows), sum(r["handled"] for r in rows)
    print(f"\n{tried} tried, {handled} handled")
    write_report(args.out, "bad-inputs", {
        "command": harness.command(__file__, argv), "machine": machine(),
        "tried": tried, "handled": handled, "cases": rows})
    return 0 if handled == tried else 1


if __name__ == "__main__":
    sys.exit(main())
