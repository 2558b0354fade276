"""The converter: JSON Lines, JSON, CSV/TSV, Parquet, Arrow, Hugging Face datasets, text and token
files to NDP shards (``ndp convert``)."""

from ndp.convert.pipeline import ConvertOptions, ConvertSummary, convert
from ndp.store.manifest import MANIFEST
from ndp.convert.records import Example, to_example
from ndp.convert.tokenizer import load_tokenizer

__all__ = [
    "MANIFEST",
    "ConvertOptions",
    "ConvertSummary",
    "Example",
    "convert",
    "load_tokenizer",
    "to_example",
]
