"""The headline measurements: one table, read from the featured results files, shown by the
docs' performance page and by the README between its ``headline`` markers.

    python docs/plugins/headline.py           # print the README's block
    python docs/plugins/headline.py --write   # rewrite it in README.md (after a results change)

``tests/test_docs.py`` fails while the README's block differs from what this prints, so a
figure in the README is never typed by hand.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402
import tables  # noqa: E402
from results import Result, featured, fmt, link, of_kind  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
SHAPES = {"sft": "SFT rows (`padded`)", "windows": "pretraining windows (`packed`)"}


def _loader_rows(r: Result, page: str | None) -> list[list[str]]:
    rows = {p.get("name"): p for p in r.report["pipelines"] if isinstance(p, dict)}
    config = r.report.get("config") or {}
    out = []
    for shape, pair in (r.report.get("paired") or {}).items():
        ours = rows.get(pair.get("ndp"), {})
        peer_name = Counter(x.get("peer") for x in pair.get("per_round", [])).most_common(1)
        peer = rows.get(peer_name[0][0], {}) if peer_name else {}
        out.append([
            f"CPU Loader, {SHAPES.get(shape, shape)}, {config.get('B', '?')} x "
            f"{config.get('T', '?')}",
            f"{fmt(ours.get('tokens_per_s'), 1e6)} M tokens/s, "
            f"{fmt(ours.get('host_cpu_s_per_billion_tokens'))} CPU-s per 1e9 tokens",
            f"{peer.get('name', '?')}: {fmt(peer.get('tokens_per_s'), 1e6)} M tokens/s, "
            f"{fmt(peer.get('host_cpu_s_per_billion_tokens'))} CPU-s; ndp spends "
            f"{fmt(pair.get('median'), digits=2)}x less CPU per token (median of "
            f"{len(pair.get('per_round', []))} rounds)",
            link(r.name, page)])
    return out


def _decode_row(r: Result, page: str | None) -> list[str]:
    row = next((d for d in r.report["decode"]
                if d.get("token_width") == 4 and not d.get("masked")), {})
    return [f"CPU decode, CRC on, int32 tokens, {row.get('batch', '?')} x {row.get('seq', '?')}",
            f"validate {fmt(row.get('validate_tokens_per_s'), 1e6, 0)} M tokens/s; padded rows "
            f"{fmt(row.get('padded_tokens_per_s'), 1e6, 0)} M; packed windows "
            f"{fmt(row.get('packed_tokens_per_s'), 1e6, 0)} M", "", link(r.name, page)]


def _remote_row(r: Result, page: str | None) -> list[str]:
    rows = [d for d in r.report["rows"] if isinstance(d, dict)]
    ours = [d for d in rows if str(d.get("name", "")).startswith("s3")]
    local = [d for d in rows if not str(d.get("name", "")).startswith("s3")]
    return ["Object storage (S3 API on loopback), CPU Loader",
            "; ".join(f"{d.get('name')}: {fmt(d.get('tokens_per_s'), 1e6)} M tokens/s, first "
                      f"batch {fmt(d.get('time_to_first_batch_s'), digits=2)} s" for d in ours),
            "; ".join(f"{d.get('name')}: {fmt(d.get('tokens_per_s'), 1e6)} M tokens/s" for d in
                      local), link(r.name, page)]


def _gpu_row(r: Result, loader: bool, page: str | None) -> list[str]:
    results = {k: v for k, v in r.report["results"].items() if isinstance(v, dict)}
    device = (r.report.get("device") or {}).get("name", "GPU not recorded")
    if loader:  # ndp's GPU Loader, padded and packed; the ways people feed a GPU beside it
        def row(k: str, v: dict) -> str:
            return (f"{k.removeprefix('ndp_cuda_')}: {fmt(v.get('tokens_per_s'), 1e9, 2)} G "
                    f"tokens/s, next() p50 {fmt(v.get('next_p50_us'), digits=1)} us, "
                    f"{fmt(v.get('host_cpu_s_per_billion_tokens'), digits=2)} CPU-s per 1e9 "
                    f"tokens")
        ours = [row(k, v) for k, v in results.items() if k.startswith("ndp_cuda_")]
        theirs = [f"{k}: {fmt(v.get('tokens_per_s'), 1e9, 2)} G tokens/s"
                  for k, v in results.items() if not k.startswith("ndp_cuda_")]
        config = r.report.get("config") or {}
        return [f"GPU Loader, {config.get('batch')} x {config.get('seq')}, batches as torch "
                f"tensors on {device}", "; ".join(ours), "; ".join(theirs), link(r.name, page)]
    rows = {k: v for k, v in results.items() if "padded" in k}
    return [f"GPU decode calls, not the Loader, padded rows, {device}",
            "; ".join(f"{k}: {fmt(v.get('tokens_per_s'), 1e9, 2)} G tokens/s"
                      for k, v in rows.items()), "", link(r.name, page)]


def _gpu_host_row(r: Result, before: Result | None, page: str | None) -> list[str]:
    """The GPU Loader's host side on the null device (``gpu_host.py``), resident shards: each
    mode's median over the file's runs (``--repeat``)."""
    def per_mode(result: Result, key: str) -> dict:
        runs: dict = {}
        for d in result.report["results"]:
            if isinstance(d, dict) and d.get("source") == "resident" and results.is_number(
                    d.get(key)):
                runs.setdefault(d.get("mode"), []).append(d[key])
        return {m: sorted(v)[len(v) // 2] for m, v in runs.items()}

    c = r.report.get("config") or {}
    host, cpu = per_mode(r, "host_us_per_batch"), per_mode(r, "cpu_s_per_billion_tokens")
    within = per_mode(r, "within_epoch_us_per_batch")
    tokens = (c.get("batch") or 0) * (c.get("seq") or 0)
    ours = "; ".join(
        f"{m}: {fmt(us, digits=0)} us a batch ({fmt(tokens / us * 1e6, 1e9, 2)} G tokens/s)"
        + (f", {fmt(within[m], digits=0)} us within epochs" if m in within else "")
        + f", {fmt(cpu.get(m), digits=2)} CPU-s per 1e9 tokens"
        for m, us in host.items())
    then = ""
    if before is not None:
        then = "the same command on the code before: " + "; ".join(
            f"{m}: {fmt(us, digits=0)} us" for m, us in per_mode(before, "host_us_per_batch").items())
    return [f"GPU Loader's host side, device calls counted not made "
            f"(`benchmarks/gpu/gpu_host.py`), resident shards, {c.get('batch', '?')} x "
            f"{c.get('seq', '?')}, medians", ours, then,
            link(r.name, page)]


def _loss_difference(value) -> str:
    """The A/B's largest loss difference between the feeds, in words."""
    if not results.is_number(value):
        return "loss difference not recorded"
    return "identical loss curves" if value == 0 else f"loss curves differ by at most {value:g}"


def _train_row(r: Result, page: str | None) -> list[str]:
    runs = {k: v for k, v in r.report["runs"].items() if isinstance(v, dict)}
    config = r.report.get("config") or {}
    return [f"Training A/B, small GPT, {config.get('steps', '?')} steps on "
            f"{r.report.get('device', '?')}",
            _loss_difference(r.report.get("max_abs_loss_difference"))
            + "".join(f"; {k}: {_step(v)}" for k, v in runs.items() if k == "ndp"),
            "; ".join(f"{k}: {_step(v)}" for k, v in runs.items() if k != "ndp"),
            link(r.name, page)]


def _waiting(run: dict) -> str:
    """The share of a training run's steps spent waiting for data, in per cent."""
    wait = run.get("wait_fraction")
    return f"{fmt(100 * wait, digits=1) if results.is_number(wait) else 'n/a'}%"


def _step(run: dict) -> str:
    """A training run's step time, mean and median, and its share waiting for data."""
    return (f"{fmt(run.get('step_s_mean'), 1e-3, 1)} ms per step (p50 "
            f"{fmt(run.get('step_s_p50'), 1e-3, 1)}), {_waiting(run)} waiting")


def _train_gpt2_row(r: Result, page: str | None) -> list[str]:
    rows = [d for d in r.report["rows"] if isinstance(d, dict)]
    config = r.report.get("config") or {}
    first = rows[0] if rows else {}
    device = first.get("device_name") or {"cuda": "a CUDA GPU"}.get(first.get("device"),
                                                                    first.get("device", "?"))

    def step(d: dict) -> str:
        return (f"{d.get('name', '?')}: {fmt(d.get('step_ms_mean'), digits=1)} ms per step, "
                f"{_waiting(d)} of it waiting for data")

    ours = [step(d) for d in rows if str(d.get("name", "")).startswith("ndp-gpu")]
    theirs = [step(d) for d in rows if not str(d.get("name", "")).startswith("ndp-gpu")]
    return [f"Training, GPT-2-small shape ({fmt(first.get('parameters'), 1e6, 0)} M parameters), "
            f"{config.get('B', '?')} x {config.get('T', '?')}, {config.get('steps', '?')} steps "
            f"on {device}", "; ".join(ours), "; ".join(theirs),
            link(r.name, page)]


def markdown(all_results: list[Result], page: str | None) -> str:
    """The headline table and the commands behind it; links from ``page`` (None: the README)."""
    rows, used = [], []
    for r in featured("loaders", all_results) if of_kind(all_results, "loaders") else []:
        rows += _loader_rows(r, page)
        used.append(r)
    for kind, row in (("decode", _decode_row), ("remote", _remote_row), ("train", _train_row)):
        for r in featured(kind, all_results) if of_kind(all_results, kind) else []:
            rows.append(row(r, page))
            used.append(r)
    gpu_loader = featured("gpu-loader", all_results) if of_kind(all_results, "gpu-loader") else []
    gpu = gpu_loader or (featured("gpu", all_results) if of_kind(all_results, "gpu") else [])
    for r in gpu:
        rows.append(_gpu_row(r, bool(gpu_loader), page))
        used.append(r)
    for r in featured("train-gpt2", all_results) if of_kind(all_results, "train-gpt2") else []:
        rows.append(_train_gpt2_row(r, page))
        used.append(r)
    host = featured("gpu-host", all_results) if of_kind(all_results, "gpu-host") else []
    if host:
        rows.append(_gpu_host_row(host[0], host[1] if len(host) > 1 else None, page))
        used.append(host[0])
    for r in featured("bad-inputs", all_results) if of_kind(all_results, "bad-inputs") else []:
        rows.append(["Damaged, stale, cut and misused inputs (`benchmarks/inputs/bad_inputs.py`)",
                     f"{r.report.get('handled', '?')} of {r.report.get('tried', '?')} cases "
                     "refused with a named error or served exactly", "", link(r.name, page)])
        used.append(r)
    out = [tables.table(["measurement", "ndp", "compared with", "results file"], rows,
                         numbers=False), ""]
    if not gpu_loader:
        out += ["The Loader's GPU pipeline has no results file yet "
                "(`python benchmarks/gpu/gpu_check.py --out benchmarks/results` makes one on a GPU "
                "machine).", ""]
    out += ["Each file records its command, machine and date:", ""]
    seen = set()
    for r in used:
        if r.name not in seen:
            seen.add(r.name)
            out.append(f"* `{r.name}`: `{r.command}`; {r.machine.split(';')[0]}, {r.when}")
    return "\n".join(out) + "\n"


def readme_block() -> str:
    loaded, _ = results.load(ROOT / "benchmarks" / "results")
    return f"{START}\n{markdown(loaded, None)}{END}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the block in README.md")
    args = ap.parse_args(argv)
    block = readme_block()
    if not args.write:
        print(block)
        return 0
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"README.md has no {START} ... {END} block", file=sys.stderr)
        return 2
    head, rest = text.split(START, 1)
    readme.write_text(head + block + rest.split(END, 1)[1], encoding="utf-8")
    print("README.md: headline block rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
