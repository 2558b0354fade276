"""The documentation site builds with ``mkdocs build --strict`` (a broken link or anchor, an API
object mkdocstrings cannot find, a docstring it cannot render or a results file a page cannot
show fails it), its generated pages show every results file, its quick start runs as written,
and the README's headline figures are the results files'."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ndp_test_helpers import markdown_blocks, run_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(config), "-d", str(site)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=config.parent)


def html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict_with_every_page_of_the_nav(site):
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert listed == on_disk, "a page missing from mkdocs.yml's nav, or a nav entry with no page"
    for page in listed:
        built = site / (page.removesuffix(".md").removesuffix("index") + "/index.html"
                        if page != "index.md" else "index.html")
        assert built.is_file(), page
        text = built.read_text(encoding="utf-8")
        assert "<!-- ndp:" not in text, f"{page}: a marker the hook left"
        assert "TODO" not in text, page


def test_the_api_reference_renders_the_public_api(site):
    for page, names in {
        "api/loader": ["ndp.Loader", "load_state_dict", "ndp.LoaderStats"],
        "api/dataset": ["ndp.NDPDataset", "set_epoch"],
        "api/decode": ["ndp.Decoder", "ndp.decode_padded", "ndp.decode_packed", "to_torch"],
        "api/store": ["ndp.Corpus", "ndp.ShardWriter", "ndp.load_index"],
        "api/convert": ["ndp.convert.convert", "ConvertOptions", "export_llmc"],
        "api/errors": ["LoaderStateError", "ManifestError", "RemoteError"],
    }.items():
        text = html(site, page)
        for name in names:
            assert name in text, f"{page}: {name}"


def test_the_performance_pages_show_every_results_file_with_its_command(site):
    index = html(site, "performance")
    for path in sorted(RESULTS.glob("*.json")):
        assert path.name in index, f"{path.name} is not in the list of results files"
        assert (site / "performance" / "results" / path.name).is_file()  # linked, published
    loaders = html(site, "performance/loaders")
    for path in sorted(RESULTS.glob("loaders-*.json")):
        assert path.name in loaders
    newest = json.loads((RESULTS / "loaders-20261124-195039.json").read_text())
    # the page names the script where it is now (benchmarks/ split into folders after this run)
    now = newest["command"].replace("benchmarks/bench_loaders.py",
                                    "benchmarks/loaders/bench_loaders.py")
    assert "--rounds 5 --seconds 10" in now and now in loaders
    assert "benchmarks/bench_loaders.py" not in loaders
    charts = sorted((site / "performance" / "charts").glob("*.png"))
    assert charts and all(c.stat().st_size > 1000 for c in charts)
    assert "ndp convert" in html(site, "cli") and "--max-skipped" in html(site, "cli")


@pytest.mark.parametrize("damage", ["a broken link", "a missing API object"])
def test_a_broken_link_or_a_missing_api_object_fails_the_build(damage, tmp_path):
    """What ``--strict`` is for: the test above would fail on either."""
    for name in ("mkdocs.yml",):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(DOCS, tmp_path / "docs")
    for name in ("ndp", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    page = tmp_path / "docs" / "api" / "index.md"
    page.write_text(page.read_text() + ("\n[gone](no-such-page.md)\n" if damage == "a broken link"
                                        else "\n::: ndp.NoSuchThing\n"))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert ("no-such-page.md" if damage == "a broken link" else "ndp.NoSuchThing") in done.stderr


@pytest.mark.slow
def test_the_quick_start_and_the_gpu_guide_run_as_written(tmp_path, monkeypatch):
    """docs/quickstart.md from an empty directory, then the decoder block of docs/guides/gpu.md
    on the data it made (on the CPU here; on a GPU machine on the device), and the loss-spike
    and telemetry guides on it."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    quick = markdown_blocks((DOCS / "quickstart.md").read_text(encoding="utf-8"))
    assert [lang for lang, _ in quick].count("python") >= 4
    run_markdown(quick, namespace, "docs/quickstart.md")
    gpu = markdown_blocks((DOCS / "guides" / "gpu.md").read_text(encoding="utf-8"),
                          "## The decoder underneath")
    run_markdown(gpu, namespace, "docs/guides/gpu.md")
    assert float(namespace["loss"].detach()) > 0  # trained on shifted labels
    attention = markdown_blocks((DOCS / "guides" / "pretraining.md").read_text(encoding="utf-8"),
                                "## Attention within documents")
    run_markdown(attention, namespace, "docs/guides/pretraining.md")
    assert namespace["out"].shape == (8, 4, 256, 16)
    for page in ("loss-spike", "telemetry"):  # on the quick start's data, as they say
        blocks = markdown_blocks((DOCS / "guides" / f"{page}.md").read_text(encoding="utf-8"))
        assert [lang for lang, _ in blocks].count("python") >= 2
        run_markdown(blocks, namespace, f"docs/guides/{page}.md")
    assert namespace["steps"] == [10, 11, 20, 21]  # the skip range left out steps 12-19


def test_the_readme_headline_is_read_from_the_results_files():
    sys.path.insert(0, str(DOCS / "plugins"))
    try:
        import headline
    finally:
        sys.path.remove(str(DOCS / "plugins"))
    block = headline.readme_block()
    assert block in (ROOT / "README.md").read_text(encoding="utf-8"), (
        "README.md's headline differs from the results files: run "
        "python docs/plugins/headline.py --write")
    assert "n/a" not in block


def test_every_quickstart_block_that_uses_ndp_imports_it():
    """A reader copies one block of the quick start, not the page: each block that calls
    ``ndp.`` imports it itself."""
    blocks = markdown_blocks((DOCS / "quickstart.md").read_text(encoding="utf-8"))
    lacking = [b.splitlines()[0] for b in blocks if "ndp." in b and "import ndp" not in b]
    assert not lacking, lacking


def test_every_results_file_a_page_cites_exists():
    """A figure quoted in a page names the results file it was read from: each such name, in
    the docs, the README and the notebooks' text, is a file in benchmarks/results/ (a page
    citing a file since removed is stale)."""
    import re

    cited = re.compile(r"\b([a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*-\d{8}-\d{6}(?:-[\w-]+)?\.json)")
    pages = [*DOCS.rglob("*.md"), ROOT / "README.md", *(ROOT / "notebooks").glob("*.ipynb")]
    have = {p.name for p in (ROOT / "benchmarks" / "results").iterdir()}
    missing = {(p.relative_to(ROOT).as_posix(), name) for p in pages
               for name in cited.findall(p.read_text(encoding="utf-8")) if name not in have}
    assert len(have) > 50 and not missing, sorted(missing)


def test_a_result_measured_on_uncommitted_code_says_so_where_it_is_shown():
    sys.path.insert(0, str(DOCS / "plugins"))
    try:
        from results import Result, provenance
    finally:
        sys.path.remove(str(DOCS / "plugins"))
    for commit, said in (("abc1234-dirty", True), ("abc1234", False)):
        text = provenance(Result("x-20261127-000000.json", {"machine": {"ndp_commit": commit}}),
                          None)
        assert ("not committed" in text) == said and "`abc1234" in text


def test_every_measured_figure_a_page_quotes_names_its_source():
    """A paragraph of the docs or the README that quotes a measured figure (a time or a rate
    with decimals, a range or thousands: ``1.14 s``, ``33-53 us``, ``192.2 M tokens/s``) names
    the results file it was read from, or is a table under a paragraph that does, or is made
    from the files at build time (an ``ndp:`` marker); a figure measured by hand says so and
    how (``<!-- measured by hand: ... -->``). Code blocks aside. Together with
    ``test_every_results_file_a_page_cites_exists``: no figure stands without its source."""
    import re

    figure = re.compile(r"(?<![\w.])(?:\d+\.\d+|\d+(?:\.\d+)?-\d+(?:\.\d+)?|\d{1,3}(?:,\d{3})+)"
                        r"\s?(?:us|ms|µs|s|G tokens/s|M tokens/s|GB/s|MB/s)(?![\w/])")
    source = re.compile(r"[a-z][a-z0-9-]*-\d{8}-\d{6}[\w-]*\.json|-\d{6}\.json|<!-- ndp:"
                        r"|<!-- measured by hand:")
    bare = []
    for page in sorted([*DOCS.rglob("*.md"), ROOT / "README.md"]):
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        paras = re.split(r"\n\s*\n", text)
        for i, para in enumerate(paras):
            table_under = i and para.lstrip().startswith("|") and source.search(paras[i - 1])
            found = figure.search(para)
            if found and not source.search(para) and not table_under:
                bare.append(f"{page.relative_to(ROOT)}: {found.group(0)!r} in {para[:80]!r}")
    assert not bare, "\n".join(bare)
