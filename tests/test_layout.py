"""The package's shape: folders by layer (the tree tells where the wire format, storage, the
engines, the Loader, conversion and the command line live), tests that mirror them, and no
import cycle among ndp's modules (lazy imports inside functions included: a cycle hidden in a
function is still two modules that cannot be understood apart)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"wire", "store", "engine", "loader", "convert", "cli", "adapters"}
LOOSE = {"__init__.py", "errors.py", "checks.py", "progress.py"}  # what may stand at the top of ndp/


def _module(path: Path) -> str:
    """``ndp.store.shard`` for ndp/store/shard.py; kernels/ installs as ``ndp.kernels``."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "kernels":
        parts.insert(0, "ndp")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> list[str]:
    """Every module name a file imports, anywhere in it (``from a import b``: ``a`` and
    ``a.b``, either of which may be a module)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each of ``modules`` -> those of them it imports (a package's ``__init__`` is imported
    with each of its modules: that is not an edge here)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = {t for t in _imported(path) if t in modules and t != name}
        graph[name] = {t for t in found if not name.startswith(t + ".")}
    return graph


def _imports() -> dict[str, set[str]]:
    """Each ndp module -> the ndp modules it imports, anywhere in the file."""
    files = [*ROOT.glob("ndp/**/*.py"), *ROOT.glob("kernels/*.py")]
    return _graph({_module(p): p for p in files})


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_ndps_modules():
    graph = _imports()
    assert len(graph) > 60  # the walk found the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_ndp_is_folders_by_layer_with_a_handful_of_modules_loose():
    top = {p.name for p in (ROOT / "ndp").iterdir() if not p.name.startswith("__pycache__")}
    folders = {n for n in top if (ROOT / "ndp" / n).is_dir()}
    assert folders == LAYERS
    assert top - folders == LOOSE
    for layer in LAYERS:  # each says what it owns and what it may import
        doc = ast.get_docstring(ast.parse((ROOT / "ndp" / layer / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"ndp/{layer}/__init__.py has no docstring for its layer"


def test_tests_mirror_the_package():
    """A test file lives in the folder of the layer it tests (tests/store/ for ndp/store/, ...);
    at the top only tests of the whole project (README, docs, notebooks, packaging, benchmarks)."""
    dirs = {p.name for p in (ROOT / "tests").iterdir()
            if p.is_dir() and not p.name.startswith((".", "__"))}
    assert dirs == LAYERS | {"kernels"}
    loose = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert loose == {"test_benchmarks.py", "test_docs.py", "test_layout.py", "test_notebooks.py",
                     "test_packaging.py", "test_readme.py"}
    # a layer with folders of its own: its tests in folders of the same names
    for layer in LAYERS:
        stages = {p.name for p in (ROOT / "ndp" / layer).iterdir() if (p / "__init__.py").exists()}
        if stages:
            tests = {p.name for p in (ROOT / "tests" / layer).iterdir()
                     if p.is_dir() and not p.name.startswith((".", "__"))}
            assert tests == stages, (f"tests/{layer}/ holds {sorted(tests)}, "
                                     f"ndp/{layer}/ {sorted(stages)}")


def test_every_package_folder_is_installed():
    """A sub-package missing from pyproject's ``packages`` would be left out of a wheel (and of
    a non-editable install): every folder of ndp/ with an ``__init__.py`` is listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("ndp/**/__init__.py")}
    assert found and found | {"ndp.kernels"} == listed


def test_the_repository_top_holds_the_design_cards_entries_and_nothing_else():
    """The design card's top level (pyproject.toml, README.md, ndp/, kernels/, tests/,
    benchmarks/, notebooks/), the docs site (docs/, mkdocs.yml) and CI (.ci/, .gitignore): a
    file committed there by mistake (a wheel once was) fails here."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    top = {path.split("/", 1)[0] for path in tracked}
    assert top == {"pyproject.toml", "README.md", "ndp", "kernels", "tests", "benchmarks",
                   "notebooks", "docs", "mkdocs.yml", ".ci", ".gitignore"}


def _benchmark_imports() -> tuple[dict[str, set[str]], list[str]]:
    """Each module of ``benchmarks/`` (``gpu.gpu_host``, ``harness``) -> the ones it imports,
    anywhere in the file, and each import of a script by its bare name (``import peers``), which
    would load a second copy of a module the scripts import as ``loaders.peers``."""
    bench = ROOT / "benchmarks"
    modules = {".".join(p.relative_to(bench).with_suffix("").parts).removesuffix(".__init__"): p
               for p in [*bench.glob("*.py"), *bench.glob("[!.]*/*.py")]}
    bare = {name.rsplit(".", 1)[-1] for name in modules if "." in name}
    loose = [f"{name} imports {t}" for name, path in modules.items()
             for t in _imported(path) if t in bare]
    return _graph(modules), loose


def test_benchmarks_are_folders_by_what_they_measure_with_one_harness_and_no_cycle():
    """Issue 37 item 5: ``benchmarks/`` split by what each script measures, each folder saying
    what it holds, one shared harness at the top, no import cycle (there were two: the bad-input
    case modules and their runner, the peers and their pipelines), and every script imported by
    its folder's name."""
    bench = ROOT / "benchmarks"
    assert {p.name for p in bench.glob("*.py")} == {"harness.py"}
    folders = sorted(p for p in bench.iterdir() if (p / "__init__.py").is_file())
    assert len(folders) >= 6 and all(len(list(f.glob("*.py"))) <= 11 for f in folders)
    for folder in folders:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 60, f"benchmarks/{folder.name}/__init__.py says nothing"
    graph, loose = _benchmark_imports()
    assert len(graph) > 30 and graph["gpu.gpu_host"] >= {"harness", "gpu.null_device"}
    assert _cycles(graph) == []
    assert loose == []
