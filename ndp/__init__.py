"""ndp: the Neural Datagram Protocol data loader.

The wire format is specified in ``ndp.wire.format``. The core produces NumPy arrays; torch and other
DLPack consumers are adapted to elsewhere, so importing ndp does not import torch.
"""

from ndp.engine.reference import (
    DecodeStats,
    PackedBatch,
    PaddedBatch,
    PaddedBuffers,
    StreamExhausted,
    decode_packed,
    decode_padded,
    validate,
)
from ndp.engine.backend import resolve_backend
from ndp.store.corpus import Corpus
from ndp.adapters.dataset import NDPDataset, QubGPUDataset
from ndp.engine.decoder import CpuDecoder, Decoder
from ndp.errors import (
    CacheFullError,
    ConfigError,
    CountCacheError,
    DataError,
    IndexMismatchError,
    LoaderStateError,
    LoaderUsageError,
    ManifestError,
    NDPError,
    PacketError,
    RecordError,
    RemoteError,
    ShardFormatError,
    StepError,
    TokenizerError,
    UnsupportedVersionError,
)
from ndp.wire.format import DropReason, Dst, Src, Typ, max_tokens_per_packet
from ndp.store.index import Index, build_index, load_index, scan, scan_shard
from ndp.loader.loader import Loader, LoaderStats
from ndp.loader.planning.schedule import Schedule
from ndp.loader.metrics import serve_metrics, telemetry_scalars
from ndp.wire.packet import Packet, crc16_ccitt, decode_packet, encode_packet, encode_tokens
from ndp.store.remote import RemoteDataset
from ndp.store.shard import Shard
from ndp.store.writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "CacheFullError", "RemoteDataset", "RemoteError",
    "ConfigError", "Corpus", "CountCacheError", "DataError", "LoaderStateError", "LoaderUsageError",
    "ManifestError", "CpuDecoder", "Decoder", "Loader", "LoaderStats", "NDPDataset",
    "QubGPUDataset", "resolve_backend", "DecodeStats", "DropReason", "Dst", "Index", "IndexMismatchError",
    "NDPError", "PackedBatch", "Packet", "PacketError", "PaddedBatch", "PaddedBuffers",
    "RecordError", "Schedule", "Shard", "ShardFormatError", "ShardWriter", "Src", "StepError", "StreamExhausted",
    "TokenizerError", "Typ", "UnsupportedVersionError", "__version__", "build_index",
    "crc16_ccitt", "decode_packed", "decode_padded", "decode_packet", "encode_packet",
    "encode_tokens", "load_index", "max_tokens_per_packet", "scan", "scan_shard", "serve_metrics", "telemetry_scalars", "validate",
]
