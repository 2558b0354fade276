"""``ndp explain``: which packets made a training step (``Loader.explain``), from the run's
settings given as options or read from a state the run saved (``--state``).

    ndp explain data/ --mode packed --batch-size 8 --seq-len 1024 --seed 0 \\
        --rank 3 --world-size 8 --step 41000 [--tokenizer DIR] [--json]
    ndp explain code=data/code chat=data/chat --mix code=0.7 chat=0.3 ... --step 41000
    ndp explain data/ --state ckpt/loader-rank3.json --step 41000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ndp.errors import ConfigError
from ndp.wire.format import Dst, Src, Typ

#: what a state records that a Loader takes, by option name
_FROM_STATE = ("mode", "seed", "shuffle", "rank", "world_size", "batch_size", "seq_len",
               "batch_tokens", "crc_drop_rate", "mix_size", "shuffle_window", "vocab_size",
               "align")


def add(sub: Any) -> None:
    """The ``explain`` command's parser."""
    p = sub.add_parser("explain", help="which packets made a training step (shard, offset, "
                                       "tokens; what was dropped and why)")
    p.add_argument("data", nargs="+", help="the dataset: a directory or URL, or NAME=PATH for "
                                          "each group of a mix")
    p.add_argument("--step", type=int, required=True, help="the run's step (what the training "
                                                            "loop counts from 0, resumes included)")
    p.add_argument("--epoch", type=int, default=None,
                   help="read --step as the batch's number in this epoch")
    p.add_argument("--state", default=None,
                   help="a state the run saved (Loader.state_dict() as JSON): its settings and "
                        "where its epochs began are used, the options below are not")
    p.add_argument("--mode", default="padded", choices=("padded", "packed", "packing"))
    p.add_argument("--align", default=None, choices=("bos",),
                   help="packed windows that start at documents, as the run's align='bos'")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--batch-tokens", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--crc-drop-rate", type=float, default=0.0)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--shuffle-window", default=None, help="bytes, or 'all'")
    p.add_argument("--mix", nargs="+", default=None, metavar="NAME=WEIGHT",
                   help="mixing weights, by group (NAME=PATH data) or by SRC name")
    p.add_argument("--tokenizer", default=None,
                   help="a local tokenizer directory: print each row's text too")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_explain)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise ConfigError(f"{what} {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def _data(items: list[str]) -> Any:
    if len(items) == 1 and "=" not in items[0]:
        return items[0]
    return _pairs(items, "dataset group")


def _settings(args: argparse.Namespace) -> tuple[dict, dict | None]:
    """The Loader's options, and the state to load (or None)."""
    from ndp.loader.planning.shapes import from_setting
    from ndp.loader.ordering.sources import mix_from_spec

    if args.state is None:
        if args.seq_len is None:
            raise ConfigError("--seq-len is needed (or --state, a state the run saved)")
        kw: dict = dict(mode=args.mode, seq_len=args.seq_len, seed=args.seed, rank=args.rank,
                        world_size=args.world_size, crc_drop_rate=args.crc_drop_rate,
                        shuffle=not args.no_shuffle, align=args.align)
        if args.batch_tokens is not None:
            kw["batch_tokens"] = args.batch_tokens
        elif args.batch_size is not None:
            kw["batch_size"] = args.batch_size
        else:
            raise ConfigError("--batch-size (or --batch-tokens) is needed, as the run gave it "
                              "(or --state, a state the run saved)")
        if args.shuffle_window is not None:
            sw = args.shuffle_window
            kw["shuffle_window"] = sw if sw == "all" else int(sw)
        if args.mix:
            kw["mix"] = {n: float(w) for n, w in _pairs(args.mix, "--mix weight").items()}
            kw["mix_by"] = "group" if isinstance(_data(args.data), dict) else "src"
        return kw, None
    try:
        state = json.loads(Path(args.state).read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{args.state}: not a JSON loader state ({err})") from None
    if not isinstance(state, dict):
        raise ConfigError(f"{args.state}: not a loader state (a JSON object from "
                          f"Loader.state_dict())")
    kw = {k: state[k] for k in _FROM_STATE if state.get(k) is not None}
    for k in ("batch_size", "seq_len", "batch_tokens"):
        if k in kw:
            kw[k] = from_setting(kw[k])
    mix = mix_from_spec(state.get("mix"))
    if mix is not None:
        kw["mix"] = mix
        first = mix.phases[0][1] if hasattr(mix, "phases") else mix
        kw["mix_by"] = "src" if all(n in Src.__members__ for n in first) else "group"
    return kw, state


def _name(enum: Any, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def run_explain(args: argparse.Namespace) -> int:
    from ndp.loader.loader import Loader

    kw, state = _settings(args)
    tok = None
    if args.tokenizer:
        from ndp.convert.tokenizer import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
    with Loader(_data(args.data), backend="cpu", output="arrays", **kw) as loader:
        if state is not None:
            loader.load_state_dict(state)
        ex = loader.explain(args.step, epoch=args.epoch)
        rows = [[ex.tokens(p) for p in ex.row(r)] for r in range(ex.rows)] if tok else []
    if args.json:
        out = ex.to_dict()
        if tok is not None:
            out["text"] = [tok.decode([int(t) for part in row for t in part]) for row in rows]
        print(json.dumps(out, indent=1))
        return 0
    print(f"step {ex.step:,}: batch {ex.batch:,} of epoch {ex.epoch}, rank {ex.rank} of "
          f"{ex.world_size}, {ex.mode}, {ex.rows} rows of {ex.seq_len}"
          + (" (+1: a window's last target)" if ex.mode == "packed" else ""))
    for r in range(ex.rows):
        print(f"row {r}:")
        for p in ex.row(r):
            print(f"  col {p.col:>5}  tokens [{p.start}, {p.stop})  {p.shard} @ {p.offset:,}  "
                  f"packet {p.packet:,} (share place {p.position:,})  "
                  f"{_name(Src, p.src)}/{_name(Dst, p.dst & 0x7F)}/{_name(Typ, p.typ)}")
        if tok is not None:
            text = tok.decode([int(t) for part in rows[r] for t in part])
            print(f"  text: {text!r}")
    for d in ex.dropped:
        print(f"dropped: {d.reason}  {d.shard} @ {d.offset:,}  packet {d.packet:,} "
              f"(share place {d.position:,})")
    if not ex.dropped:
        print("dropped: none")
    return 0
