"""How ndp installs: kernels/ as ndp.kernels (never a bare top-level 'kernels' module), the
distribution's own name, and a test set-up whose lock pins every requirement."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_kernels_are_inside_the_ndp_namespace(tmp_path):
    code = (
        "import importlib.util, ndp.kernels.crc16 as k; "
        "print(k.__name__, importlib.util.find_spec('kernels'))"
    )
    # run outside the checkout so the repository root is not on sys.path
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["ndp.kernels.crc16", "None"]


def test_public_api():
    import ndp

    assert ndp.crc16_ccitt(b"123456789") == 0x29B1
    for name in ("encode_packet", "decode_packet", "encode_tokens", "Src", "Dst", "Typ"):
        assert hasattr(ndp, name)


def test_importing_ndp_does_not_import_torch_or_transformers(tmp_path):
    code = "import sys, ndp; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def _registers_row_stack() -> bool:
    """Whether the installed numba-cuda registers ``np.row_stack`` (NumPy 2.5 removed it, and
    such a numba-cuda fails at its first kernel launch under NumPy 2.5)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("numba_cuda")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    return any("np.row_stack" in path.read_text(errors="replace")
               for path in root.rglob("*.py") if "tests" not in path.parts)


def test_cuda_installs_keep_numpy_below_2_5_while_numba_cuda_needs_it():
    import tomllib
    from pathlib import Path

    import pytest
    from packaging.requirements import Requirement

    if not _registers_row_stack():
        pytest.skip("the installed numba-cuda no longer registers np.row_stack: the numpy<2.5 "
                    "cap in pyproject.toml can be lifted")
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for extra in ("cuda12", "cuda13", "dev"):
        caps = [Requirement(r).specifier for r in extras[extra] if Requirement(r).name == "numpy"]
        assert caps and not any(c.contains("2.5.0") for c in caps), (
            f"neural-datagram[{extra}] admits numpy 2.5, with which numba-cuda's np.row_stack "
            f"breaks the first kernel launch")
        assert all(c.contains("2.4.6") for c in caps), \
            f"neural-datagram[{extra}] refuses numpy 2.4.6"


ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "tests" / "constraints-cpu.txt"
DIST = "neural-datagram"


def _lock_pins() -> dict[str, str]:
    """The lock's pins, by canonical name (``.ci/lock`` writes it)."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in version, f"{LOCK.name}: not a pin: {line!r}"
        pins[canonicalize_name(name)] = version
    return pins


def _requirements(extras: set[str]) -> list:
    """The project's dependencies with ``extras``, its own extras expanded."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo, seen, out = list(extras), set(), [Requirement(r) for r in project["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == DIST:
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def test_the_test_lock_pins_every_dev_requirement_within_its_range():
    """``pip install -c tests/constraints-cpu.txt -e ".[dev]"`` only resolves without
    backtracking while every requirement has its one pin: a dependency added to pyproject.toml
    without running ``.ci/lock`` fails here, not as a 48-minute resolver walk in a new venv."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = _lock_pins()
    env = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    problems = []
    for req in _requirements({"dev"}):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req} has no pin")
        elif not req.specifier.contains(Version(pin), prereleases=True):
            problems.append(f"{req} is pinned to {pin}, outside its range")
    assert not problems, f"run .ci/lock: {problems}"


def test_the_lock_keeps_torch_a_cpu_install():
    """torch is pinned without a +cpu label (the index picks the build) and none of the CUDA
    build's own dependencies (nvidia-cublas, triton, ...) is in the lock: those come only with
    the multi-GB CUDA build of torch."""
    pins = _lock_pins()
    assert "+" not in pins["torch"]
    assert not [n for n in pins if n.startswith(("nvidia-cublas", "nvidia-cudnn", "triton"))]


def test_the_distribution_is_not_pypis_ndp():
    """``ndp`` on PyPI is another project (neutron depth profiling): every install line this
    project prints or documents names our distribution."""
    import re
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == DIST
    def names_pypis_ndp(line: str) -> bool:
        if re.search(r"\bndp\[[a-z]", line):  # an extra of ndp, such as ndp[torch]
            return True
        for command in re.split(r"&&|;|\|", line):  # what each pip install asks for
            words = command.split()
            for i in range(len(words) - 1):
                if words[i] == "pip" and words[i + 1] == "install":
                    asked = (w.strip("'\"`),.") for w in words[i + 2:])
                    if any(w == "ndp" or w.startswith(("ndp[", "ndp=", "ndp>")) for w in asked):
                        return True
        return False

    found = []
    for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("ndp/**/*.py"),
                 *ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/[!.]*/*.py"),
                 *ROOT.glob("kernels/*.py"), *ROOT.glob("notebooks/*.ipynb")]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if names_pypis_ndp(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
