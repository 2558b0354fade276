"""The results files of ``benchmarks/results/`` as Markdown: what the performance pages, the
concept pages that quote a measurement, and the README's headline show.

Nothing here measures or assumes a figure: every number is read from a results file, printed
with the file's name, the command that made it, its machine and its date, and a figure a file
lacks is printed as ``n/a``. A file is sorted into the kinds of result it holds by the same
rules as ``notebooks/benchmark.ipynb`` (a ``decode`` list, a ``loader`` list, ``pipelines``,
...), plus the kinds the notebook does not show (remote, shuffle, training A/B, bad inputs,
the simulator's accounting, scale). Standard library only: the hook imports it at every build,
and ``python docs/plugins/headline.py`` without ndp installed.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

#: where a page finds a results file: ``performance/results/<name>`` in the site (the hook
#: copies every file of benchmarks/results/ there)
SITE_RESULTS = "performance/results"

#: The runs each kind's page shows first, in full and charted, and the README's headline quotes:
#: a maintainer's choice, since the newest file is not always the newest code (a run of an older
#: checkout, made for comparison, can come after). The figures are still read from the files; a
#: kind missing here shows its newest file first. A name that is not in benchmarks/results/
#: fails the build.
FEATURED = {
    # the rounds after the carry-less CRC: 5 rounds each, batches of 16 and of 64 rows
    "loaders": ["loaders-20261124-195039.json", "loaders-20261124-200135.json"],
    "decode": ["cpu-decode-loader-20261124-193759.json"],
    "loader": ["cpu-decode-loader-20261124-193759.json"],
    # shards read per packet, then every shard read into memory first (resident=True)
    "breakdown": ["cpu-breakdown-20261124-193047.json", "cpu-breakdown-20261124-200826.json"],
    # the default corpus (2 KB documents) first; the run of 40-byte documents after it
    "shuffle": ["shuffle-20261126-124612.json", "shuffle-20261126-124754.json"],
    # compiled window tables, layouts and token counts, one token sum a chunk, every epoch
    # counted (harness), then the same command on the code before them (a66325b)
    "gpu-host": ["gpu-host-20261128-051950.json", "gpu-host-20261128-024924.json"],
    # the newest code (two chunks in flight, array layouts, compiled packing) on an H200, then
    # the same command on two fresh H100 machines of 2026-11-26: how far a run moves
    "gpu-loader": ["gpu-loader-20261127-141100.json", "gpu-loader-20261126-163058.json",
                   "gpu-loader-20261126-164336.json"],
    # the verdicts of several threads a long packet, then one thread a packet (before)
    "kernels": ["kernel-profile-20261127-071623.json", "kernel-profile-20261127-065339.json"],
    # the count's first bound and hold at 1e8 documents, then the code before it, run after
    "first-batch": ["first-batch-20261128-075605.json",
                    "first-batch-20261128-075812-at-3bc04c2.json"],
}


#: where each script of ``benchmarks/`` went when the folder was split by what each measures
#: (2026-11-28): a file made before names ``benchmarks/<name>.py``, or the bare name; the
#: pages print the path the script has now, so that a command runs as shown
MOVED = {
    **dict.fromkeys(["bench_cpu", "cpu_breakdown"], "cpu"),
    **dict.fromkeys(["accounting", "bench_gpu", "bench_gpu_loader", "gpu_check", "gpu_host",
                     "gpu_ranks", "gpu_threads", "kernel_profile", "null_device"], "gpu"),
    **dict.fromkeys(["bad_inputs", "bad_inputs_more", "bad_inputs_round3", "bad_inputs_round3b",
                     "bad_inputs_schedules"], "inputs"),
    **dict.fromkeys(["bench_loaders", "loaders_report", "peers", "peers_dali",
                     "peers_mosaicml"], "loaders"),
    **dict.fromkeys(["bench_explain", "bench_plan_change", "bench_schedule",
                     "shuffle_quality"], "plan"),
    **dict.fromkeys(["bench_scale", "first_batch", "scale_data", "scale_peers",
                     "scale_worker"], "scale"),
    **dict.fromkeys(["bench_remote"], "storage"),
    **dict.fromkeys(["train_ab", "train_gpt2"], "training"),
}


def moved(command: str) -> str:
    """``command`` with every ``benchmarks/<name>.py`` (or a bare ``<name>.py`` at its start)
    of a moved script as ``benchmarks/<folder>/<name>.py``."""
    def where(m: re.Match) -> str:
        name = m.group(2)
        return f"benchmarks/{MOVED[name]}/{name}.py" if name in MOVED else m.group(0)

    command = re.sub(r"(benchmarks/)(\w+)\.py", where, command)
    first = re.match(r"()(\w+)\.py\b", command)
    if first and first.group(2) in MOVED:
        command = "python " + where(first) + command[first.end():]
    return command

@dataclass(frozen=True)
class Result:
    """One results file: its name and what it holds."""

    name: str
    report: dict
    folder: Path | None = None  # where the file lies, for the figures beside it

    @property
    def when(self) -> str:
        """The date the file records (``date``, ``created`` or ``time``), else the one in its
        name (``-YYYYMMDD-HHMMSS``), said to be so."""
        for key in ("date", "created", "time"):
            if isinstance(self.report.get(key), str):
                return self.report[key].replace("T", " ")[:16]
        m = re.search(r"-(\d{4})(\d\d)(\d\d)-(\d\d)(\d\d)\d\d\.", self.name)
        if m:
            return f"{m[1]}-{m[2]}-{m[3]} {m[4]}:{m[5]} (from the file name)"
        return "date not recorded"

    @property
    def machine(self) -> str:
        machine = self.report.get("machine")
        if isinstance(machine, str):
            return machine
        if not isinstance(machine, dict):
            return "machine not recorded"
        parts = [f"{machine.get('cpu', 'CPU not recorded')}, {machine.get('cores', '?')} cores"]
        if is_number(machine.get("memory_gb")):
            parts[0] += f", {machine['memory_gb']:.0f} GB"
        device = self.report.get("device")
        if isinstance(device, dict) and device.get("name"):
            parts.append(f"GPU {device['name']}")
        versions = machine.get("versions") or {}
        named = [f"{k} {versions[k]}" for k in ("python", "numpy", "numba", "torch")
                 if k in versions]
        if named:
            parts.append(", ".join(named))
        if machine.get("ndp_threads"):
            parts.append(f"{machine['ndp_threads']} ndp thread(s)")
        return "; ".join(parts)

    @property
    def command(self) -> str:
        """The command that made the file, naming each script where it is now (``MOVED``)."""
        command = self.report.get("command") or (self.report.get("config") or {}).get("command")
        return moved(str(command).strip()) if command else "command not recorded"

    @property
    def sort_key(self) -> str:
        return self.when


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt(value, scale: float = 1.0, digits: int = 1) -> str:
    """``value / scale`` with thousands separators, or ``n/a`` for a missing figure."""
    return f"{value / scale:,.{digits}f}" if is_number(value) else "n/a"


def kinds_of(name: str, report: dict) -> list[str]:
    """The kinds of result a file holds (one file can hold several)."""
    if name.startswith("sim-"):  # under the CUDA simulator: counts mean something, times not
        return ["accounting"] if isinstance(report.get("accounting"), list) else []
    kinds = []
    for kind, key, typ in (("decode", "decode", list), ("crc", "crc", dict),
                           ("convert", "convert", dict), ("loader", "loader", list),
                           ("loaders", "pipelines", list)):
        if isinstance(report.get(key), typ):
            kinds.append(kind)
    if report.get("benchmark") == "cpu-breakdown" and isinstance(report.get("rows"), list):
        kinds.append("breakdown")
    if report.get("benchmark") == "gpu_host" and isinstance(report.get("results"), list):
        kinds.append("gpu-host")
    if name.startswith("gpu-loader-") and isinstance(report.get("results"), dict):
        kinds.append("gpu-loader")
    elif name.startswith("gpu-") and isinstance(report.get("results"), dict):
        kinds.append("gpu")
    for prefix, kind, key, typ in (("remote-", "remote", "rows", list),
                                   ("shuffle-", "shuffle", "rows", dict),
                                   ("train-ab-", "train", "runs", dict),
                                   ("train-gpt2-", "train-gpt2", "rows", list),
                                   ("bad-inputs-", "bad-inputs", "cases", list),
                                   ("scale-", "scale", "records", list),
                                   ("schedule-", "schedule", "modes", dict),
                                   ("kernel-profile-", "kernels", "modes", dict),
                                   ("plan-change-", "plan-change", "sizes", list),
                                   ("gpu-threads-", "gpu-threads", "results", list),
                                   ("explain-", "explain", "rows", list),
                                   ("first-batch-", "first-batch", "results", dict)):
        if name.startswith(prefix) and isinstance(report.get(key), typ):
            kinds.append(kind)
    return kinds


def load(folder: Path) -> tuple[list[Result], list[tuple[str, str]]]:
    """Every JSON file in ``folder``, newest first, and the (name, why) of those it cannot
    show."""
    results, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            skipped.append((path.name, f"unreadable: {err}"))
            continue
        if not isinstance(report, dict) or not kinds_of(path.name, report):
            skipped.append((path.name, "no section these pages know"))
            continue
        results.append(Result(path.name, report, folder))
    results.sort(key=lambda r: r.sort_key, reverse=True)
    return results, skipped


def of_kind(results: list[Result], kind: str) -> list[Result]:
    return [r for r in results if kind in kinds_of(r.name, r.report)]


def link(name: str, page: str | None) -> str:
    """A Markdown link to results file ``name`` from docs page ``page`` (its path under docs/),
    or, for ``page=None``, from the repository's root (the README)."""
    if page is None:
        return f"[`{name}`](benchmarks/results/{name})"
    target = posixpath.relpath(f"{SITE_RESULTS}/{name}", posixpath.dirname(page) or ".")
    return f"[`{name}`]({target})"


def provenance(result: Result, page: str | None) -> str:
    lines = [f"{link(result.name, page)}: `{result.command}`", "",
             f"Machine: {result.machine}. Date: {result.when}."]
    code = (result.report.get("machine") or {}) if isinstance(result.report.get("machine"),
                                                              dict) else {}
    commit = code.get("ndp_commit")
    if commit:
        lines[-1] += f" ndp: `{commit}`."
        if str(commit).endswith("-dirty"):  # said where it is shown (issue 38 item 2)
            lines[-1] += (f" *Measured with changes to ndp's code that were not committed: "
                          f"the commit `{str(commit)[:-len('-dirty')]}` alone may not give "
                          f"these figures.*")
    if isinstance(result.report.get("note"), str):
        lines += ["", f"Note recorded in the file: {result.report['note']}"]
    return "\n".join(lines)


def featured(kind: str, results: list[Result]) -> list[Result]:
    """The runs of ``kind`` shown first: ``FEATURED[kind]``, else the newest file."""
    files = of_kind(results, kind)
    if kind not in FEATURED:
        return files[:1]
    by_name = {r.name: r for r in files}
    missing = [n for n in FEATURED[kind] if n not in by_name]
    if missing:
        raise LookupError(f"docs/plugins/results.py FEATURED[{kind!r}] names {missing}, which "
                          f"benchmarks/results/ does not hold as {kind} results")
    return [by_name[n] for n in FEATURED[kind]]
