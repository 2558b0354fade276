"""The embedded default job, on a slice of the standard library."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ndp.cli.main import build_parser
from ndp.cli.demo import run_demo, sft_pairs, stdlib_files
from ndp.errors import ConfigError


def test_sft_pairs_split_docstring_from_body():
    src = 'def f(a):\n    """Add one."""\n    return a + 1\n\ndef g():\n    pass\n'
    assert sft_pairs(src) == [{"prompt": 'def f(a):\n    """Add one."""\n',
                               "completion": "    return a + 1\n"}]


def test_demo_runs_end_to_end(tmp_path):
    lines = []
    report = run_demo(tmp_path, max_files=12, vocab_size=600, progress=False, say=lines.append)
    assert report.files == 12
    assert report.roundtrip_packets == sum(s["packets"] for s in report.convert.values())
    assert report.convert["sft"]["examples"] > 0 and report.convert["code"]["tokens"] > 0
    assert report.decode["padded"]["tokens"] == report.convert["sft"]["tokens"]
    assert report.decode["packed"]["tokens"] > 0
    assert any("round trip OK" in line for line in lines)
    assert (tmp_path / "tokenizer" / "tokenizer.json").exists()
    # it ends saying where it wrote how much, and what to do next
    done = next(i for i, line in enumerate(lines) if line.startswith("done: "))
    assert f"under {tmp_path.resolve()}" in lines[done] and lines[done + 1] == "Next:"
    _run_next_steps_without_torch(lines[done + 2:], tmp_path)


def _run_next_steps_without_torch(lines: list[str], tmp_path: Path) -> None:
    """The commands the demo prints run as printed with what the main job's install has
    (neural-datagram[tokenize]: no torch), torch made unimportable here."""
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch is not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    commands = [shlex.split(line.strip()) for line in lines
                if line.strip().split(" ", 1)[0] in ("ndp", "python")]
    assert [c[0] for c in commands] == ["ndp", "python"]
    for argv in commands:
        argv = ([sys.executable, "-m", "ndp.cli"] if argv[0] == "ndp" else [sys.executable]) \
            + argv[1:]
        run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0, f"{lines}\n{run.stderr}"
        assert "Traceback" not in run.stderr
    assert "batches; the first:" in run.stdout and "'x': ((8, 1024), 'int64')" in run.stdout


def test_demo_max_files_zero_is_refused_not_all():
    with pytest.raises(ConfigError, match="at least 1"):
        stdlib_files(0)
    assert len(stdlib_files(3)) == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--max-files", "0"])


def test_the_demo_cuts_its_sft_examples_without_a_warning_meant_for_ones_own_data(caplog):
    """The demo truncates SFT examples on purpose (its summary says so); the converter's
    warning, with advice for one's own data, is left out there, and nothing else is."""
    import logging

    from ndp.cli.demo import _quiet_truncation

    log = logging.getLogger("ndp.convert")
    with caplog.at_level(logging.WARNING, logger="ndp.convert"):
        with _quiet_truncation(True):
            log.warning("truncation cut %.1f%% of the tokens", 4.9)
            log.warning("another warning")
        log.warning("truncation cut %.1f%% of the tokens", 4.9)  # outside: said
    assert [r.getMessage() for r in caplog.records] == [
        "another warning", "truncation cut 4.9% of the tokens"]


def test_an_install_without_torch_is_not_told_pytorch_was_not_found(tmp_path):
    """``[tokenize]`` installs transformers without torch, on purpose: loading and training a
    tokenizer does not print transformers' advice that PyTorch was not found (before: the
    demo's first lines). The child process is made to see no torch the way transformers looks
    for it (``importlib.util.find_spec``) and the way an import does."""
    hide = textwrap.dedent("""
        import importlib.abc, importlib.util, sys
        _find = importlib.util.find_spec
        importlib.util.find_spec = lambda name, package=None: (
            None if name.split(".")[0] == "torch" else _find(name, package))
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "torch":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoTorch())
        from pathlib import Path
        from ndp.cli.demo import train_tokenizer
        from ndp.convert.tokenizer import load_tokenizer
        d = train_tokenizer(["def f(x): return x"] * 50, Path(sys.argv[1]), vocab_size=300)
        print(load_tokenizer(str(d)).is_fast)
    """)
    run = subprocess.run([sys.executable, "-c", hide, str(tmp_path / "tok")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "True" and "PyTorch was not found" not in run.stderr
