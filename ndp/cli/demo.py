"""The embedded default job (``ndp demo``): a real corpus, a real tokenizer, no network.

1. Corpus: the Python standard library's own ``.py`` files (on every machine with Python):
   every file as a pretraining document (``code.jsonl``), and every documented function as an
   SFT pair (``sft.jsonl``: signature + docstring as the masked prompt, the body as completion).
2. Tokenizer: a byte-level BPE trained on part of that corpus with ``tokenizers`` and saved as a
   Hugging Face tokenizer directory (with a ChatML chat template), so the converter loads it
   the way it loads any local tokenizer.
3. Convert both sets, verify every shard, check the round trip record by record, and time the
   CPU decode of padded SFT batches and packed pretraining windows.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import shlex
import sysconfig
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ndp.store.atomic import atomic_file
from ndp.errors import ConfigError
from ndp.wire.format import Src

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def stdlib_files(max_files: int | None = None) -> list[Path]:
    """The standard library's ``.py`` files (no site-packages), sorted for a stable corpus."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    if max_files is not None and max_files < 1:
        raise ConfigError(f"`max_files` must be at least 1 (or None for every file), got "
                          f"{max_files}")
    return files[:max_files] if max_files is not None else files


def next_steps(workdir: Path) -> list[str]:
    """What the demo tells the user to run next: commands that work with what the main job's
    install has (``neural-datagram[tokenize]``: NumPy, no torch), so the batch comes as
    arrays, and where torch tensors come from."""
    code_dir = str(workdir / "shards" / "code")
    loader = (f"import ndp; loader = ndp.Loader({json.dumps(code_dir)}, mode=\"packed\", "
              f"batch_size=8, seq_len=1024, output=\"arrays\"); batch = next(iter(loader)); "
              f"print(len(loader), \"batches; the first:\", "
              f"{{k: (v.shape, v.dtype.name) for k, v in batch.items()}})")
    return [
        "Next:",
        f"  ndp inspect {shlex.quote(code_dir)}",
        f"  python -c {shlex.quote(loader)}",
        "  For torch tensors (the default output), pip install \"neural-datagram[torch]\" and "
        "drop output=\"arrays\" (docs/concepts/modes.md).",
        f"  Remove it all with: rm -rf {shlex.quote(str(workdir))}",
    ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def sft_pairs(source: str) -> list[dict[str, str]]:
    """(prompt, completion) pairs from documented functions: header+docstring -> body."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if len(body) < 2 or not (isinstance(body[0], ast.Expr)
                                 and isinstance(getattr(body[0], "value", None), ast.Constant)
                                 and isinstance(body[0].value.value, str)):
            continue
        start = node.lineno - 1
        split = body[0].end_lineno
        end = node.end_lineno
        prompt = "".join(lines[start:split])
        completion = "".join(lines[split:end])
        if prompt.strip() and completion.strip():
            pairs.append({"prompt": prompt, "completion": completion})
    return pairs


def build_corpus(workdir: Path, files: list[Path]) -> tuple[Path, Path, int]:
    """Write ``code.jsonl`` and ``sft.jsonl`` under ``workdir``; return them and the byte count."""
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    code, sft = corpus / "code.jsonl", corpus / "sft.jsonl"
    total = 0
    with atomic_file(code, "w") as fc, atomic_file(sft, "w") as fs:
        for path in files:
            text = _read(path)
            if not text or not text.strip():
                continue
            total += len(text)
            fc.write(json.dumps({"text": text, "id": path.name}) + "\n")
            for pair in sft_pairs(text):
                fs.write(json.dumps(pair) + "\n")
    return code, sft, total


def train_tokenizer(texts: list[str], out_dir: Path, *, vocab_size: int = 8192) -> Path:
    """Train a byte-level BPE on ``texts`` and save it as a Hugging Face tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ndp.convert.tokenizer import transformers_name

    PreTrainedTokenizerFast = transformers_name("PreTrainedTokenizerFast")

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out_dir)
    return out_dir


@dataclass
class DemoReport:
    """What ``run_demo`` measured (also printed)."""

    files: int
    corpus_bytes: int
    tokenizer_seconds: float
    convert: dict
    roundtrip_packets: int
    decode: dict


def _time_padded(shard_dir: Path, max_len: int, batch: int, pad_id: int) -> dict:
    from ndp.engine.reference import PaddedBuffers, decode_padded
    from ndp.store.index import load_index
    from ndp.store.shard import Shard

    buffers = PaddedBuffers.allocate(batch, max_len)
    tokens = rows = 0
    elapsed = 0.0
    for path in sorted(shard_dir.glob("*.ndp")):
        shard = Shard(path)
        offsets = load_index(shard, on_stale="error").offsets
        decode_padded(shard.data, offsets[:batch], seq_len=max_len, out=buffers)  # warm
        start = time.perf_counter()
        for i in range(0, len(offsets), batch):
            b = decode_padded(shard.data, offsets[i: i + batch], seq_len=max_len,
                              pad_token_id=pad_id, out=buffers)
            tokens += b.stats.tokens
            rows += b.input_ids.shape[0]
        elapsed += time.perf_counter() - start
    return {"rows": rows, "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}


def _time_packed(shard_dir: Path, seq: int, max_tokens: int, chunk: int = 256) -> dict:
    """Windows of ``seq + 1`` tokens cut from chunks of ``chunk`` packets (a chunk's leftover
    tokens are not carried over: the loader does that; this times the decode)."""
    from ndp.engine.reference import StreamExhausted, decode_packed
    from ndp.store.index import load_index
    from ndp.store.shard import Shard

    rows = chunk * max_tokens // seq + 1
    x = np.empty((rows, seq), np.int64)
    y = np.empty((rows, seq), np.int64)
    tokens = 0
    elapsed = 0.0
    for path in sorted(shard_dir.glob("*.ndp")):
        shard = Shard(path)
        offsets = load_index(shard, on_stale="error").offsets
        start = time.perf_counter()
        for i in range(0, len(offsets), chunk):
            try:
                b = decode_packed(shard.data, offsets[i: i + chunk], batch_size=None,
                                  seq_len=seq, out=(x, y))
            except StreamExhausted:  # a last chunk shorter than one window
                continue
            tokens += b.stats.tokens
        elapsed += time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / max(elapsed, 1e-9)}


def run_demo(
    workdir: str | Path = "ndp-demo",
    *,
    max_files: int | None = None,
    vocab_size: int = 8192,
    progress: bool = True,
    say=print,
) -> DemoReport:
    """Run the whole embedded job in ``workdir``; ``say`` receives each line of the report."""
    from ndp.convert import ConvertOptions, convert
    from ndp.convert.roundtrip import check_roundtrip
    from ndp.store.index import scan_shard
    from ndp.store.shard import Shard

    workdir = Path(workdir)
    files = stdlib_files(max_files)
    say(f"[1/5] corpus: {len(files)} standard-library files from {files[0].parent if files else '-'}")
    code, sft, corpus_bytes = build_corpus(workdir, files)
    n_sft = sum(1 for _ in open(sft))
    say(f"      {corpus_bytes / 1e6:.1f} MB of code -> {code}; {n_sft:,} documented functions -> {sft}")

    t0 = time.perf_counter()
    texts = [json.loads(line)["text"] for line in open(code)]
    sample, size = [], 0
    for text in texts:  # a few MB train a BPE as well as the whole corpus for a demo
        sample.append(text)
        size += len(text)
        if size > 6_000_000:
            break
    tok_dir = train_tokenizer(sample, workdir / "tokenizer", vocab_size=vocab_size)
    tok_seconds = time.perf_counter() - t0
    say(f"[2/5] tokenizer: byte-level BPE, {vocab_size} ids, trained on {size / 1e6:.1f} MB in "
        f"{tok_seconds:.1f} s -> {tok_dir}")

    runs = {
        "code": ([code], ConvertOptions(max_tokens=2048, overflow="split", src=Src.CODE_REPO,
                                        progress=progress)),
        "sft": ([sft], ConvertOptions(max_tokens=1024, overflow="truncate", src=Src.CODE_REPO,
                                      progress=progress)),
    }
    summaries = {}
    for name, (inputs, opts) in runs.items():
        out = workdir / "shards" / name
        # the SFT examples are cut at 1,024 tokens on purpose, to show the rule (the summary
        # counts them): the warning with advice for one's own data is not shown here
        with _quiet_truncation(name == "sft"):
            summary = convert(inputs, out, tokenizer=str(tok_dir),
                              options=replace(opts, overwrite=True))
        summaries[name] = summary
        say(f"[3/5] convert {name}: " + summary.describe().replace("\n", "\n      ")
            + ("\n      (cut on purpose: the demo shows the truncation rule)"
               if name == "sft" and summary.truncated else ""))

    checked = 0
    for name, (inputs, _) in runs.items():
        out = workdir / "shards" / name
        for path in sorted(out.glob("*.ndp")):
            result = scan_shard(Shard(path))
            if result.corrupt:
                raise RuntimeError(f"{path}: {len(result.corrupt)} corrupt regions after convert")
        checked += check_roundtrip(inputs, out, tokenizer=str(tok_dir))
    say(f"[4/5] verify: every shard scans clean; round trip OK for {checked:,} packets "
        "(decoded tokens and labels == the tokenizer's output, truncation rule applied)")

    pad_id = json.loads((workdir / "shards" / "sft" / "ndp.json").read_text())["tokenizer"]["pad_token_id"]
    # one untimed pass first (it loads or compiles the kernels: a first run once printed 2 M
    # tokens/s for that), then the best of 3: a pass right after tokenizing shares the cores
    # with the tokenizer's idle-spinning worker threads and runs several times slower
    sft_dir, code_dir = workdir / "shards" / "sft", workdir / "shards" / "code"
    _time_padded(sft_dir, 1024, 64, pad_id or 0)
    padded = max((_time_padded(sft_dir, 1024, 64, pad_id or 0)
                  for _ in range(3)), key=lambda r: r["tokens_per_s"])
    _time_packed(code_dir, 1024, runs["code"][1].max_tokens)
    packed = max((_time_packed(code_dir, 1024, runs["code"][1].max_tokens)
                  for _ in range(3)), key=lambda r: r["tokens_per_s"])
    say(f"[5/5] CPU decode (CRC on): padded SFT 64x1024: {padded['tokens_per_s'] / 1e6:.0f} M tokens/s "
        f"of real tokens ({padded['rows']:,} rows, {padded['tokens'] / (padded['rows'] * 1024):.0%} "
        f"filled); packed 1024-token windows: {packed['tokens_per_s'] / 1e6:.0f} M tokens/s "
        "(best of 3 passes after a warm-up)")
    written = sum(p.stat().st_size for p in workdir.rglob("*") if p.is_file())
    say(f"done: {written / 1e6:.0f} MB written under {workdir.resolve()}.")
    for line in next_steps(workdir):
        say(line)
    return DemoReport(
        files=len(files),
        corpus_bytes=corpus_bytes,
        tokenizer_seconds=tok_seconds,
        convert={k: {**v.__dict__} for k, v in summaries.items()},
        roundtrip_packets=checked,
        decode={"padded": padded, "packed": packed},
    )


@contextlib.contextmanager
def _quiet_truncation(quiet: bool):
    """``ndp.convert``'s truncation warning left out while ``quiet`` (its other messages not)."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("truncation cut")

    log = logging.getLogger("ndp.convert")
    if quiet:
        log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)
