"""MkDocs hook (``hooks:`` in mkdocs.yml): the pages' generated parts, made at every build.

A page asks for a generated block with an HTML comment on a line of its own:

* ``<!-- ndp:results KIND -->``: every results file of KIND in ``benchmarks/results/`` (``decode``,
  ``crc``, ``convert``, ``loader``, ``breakdown``, ``loaders``, ``gpu``, ``gpu-loader``,
  ``accounting``, ``remote``, ``shuffle``, ``train``, ``train-gpt2``, ``bad-inputs``, ``scale``,
  ``schedule``, ``kernels``, ``plan-change``, ``gpu-threads``, ``explain``:
  ``results.kinds_of``),
  as tables with each file's command, machine and date, the featured runs charted;
* ``<!-- ndp:files -->``: the list of every results file;
* ``<!-- ndp:headline -->``: the headline measurements (``headline.py``, as in the README);
* ``<!-- ndp:cli -->``: ``ndp --help`` and each command's ``--help``, from the parser itself.

Every results file (JSON and the PNGs beside them) is published under ``performance/results/``
so that the tables link to it. An unknown marker or kind fails the build.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # mkdocs loads this file by its path

import charts  # noqa: E402
import headline  # noqa: E402
import results  # noqa: E402
import tables  # noqa: E402

from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

MARKER = re.compile(r"^<!-- ndp:(\w[\w-]*)(?: ([\w-]+))? -->$", re.M)
CHART_DIR = "performance/charts"

_state: dict = {}


def on_config(config, **kwargs):
    folder = Path(config["config_file_path"]).resolve().parent / "benchmarks" / "results"
    loaded, skipped = results.load(folder)
    _state.update(folder=folder, results=loaded, skipped=skipped, charts={})
    return config


def on_files(files, config, **kwargs):
    folder = _state["folder"]
    for path in sorted(folder.iterdir()):
        if path.suffix in (".json", ".png"):
            files.append(File.generated(config, f"{results.SITE_RESULTS}/{path.name}",
                                        abs_src_path=str(path)))
    for kind, draw in charts.CHARTS.items():
        if not results.of_kind(_state["results"], kind):
            continue
        try:
            chosen = results.featured(kind, _state["results"])
        except LookupError as err:
            raise PluginError(str(err)) from None
        for result in chosen:
            name = f"{CHART_DIR}/{Path(result.name).stem}-{kind}.png"
            files.append(File.generated(config, name, content=draw(result)))
            _state["charts"].setdefault(kind, {})[result.name] = name
    return files


def _image(page: str, kind: str) -> dict[str, str]:
    """Markdown images of ``kind``'s charts, relative to ``page``, by results file name."""
    out = {}
    for name, src in _state["charts"].get(kind, {}).items():
        rel = os.path.relpath(src, os.path.dirname(page) or ".")
        result = next(r for r in _state["results"] if r.name == name)
        out[name] = (f"![{kind} chart of {name}]({rel})\n\n"
                     f"*Drawn at build time from `{name}`: {result.machine.split(';')[0]}, "
                     f"{result.when}.*")
    return out


def _cli_help() -> str:
    from ndp.cli.main import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    try:
        parser = build_parser()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        out = ["```text", parser.format_help().rstrip(), "```"]
        for name, command in sub.choices.items():
            out += ["", f"### ndp {name}", "", "```text", command.format_help().rstrip(), "```"]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(out) + "\n"


def on_page_markdown(markdown, page, config, files, **kwargs):
    src = page.file.src_uri

    def replace(match: re.Match) -> str:
        what, arg = match.groups()
        try:
            if what == "results" and (arg in tables.TABLES or arg == "train"):
                return tables.section(arg, _state["results"], src, _image(src, arg))
            if what == "files" and arg is None:
                return tables.files_table(_state["results"], _state["skipped"], src)
            if what == "headline" and arg is None:
                return headline.markdown(_state["results"], src)
            if what == "cli" and arg is None:
                return _cli_help()
        except LookupError as err:
            raise PluginError(f"{src}: {err}") from None
        raise PluginError(f"{src}: unknown marker {match.group(0)!r} (see docs/plugins/hooks.py)")

    return MARKER.sub(replace, markdown)
