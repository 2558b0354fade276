"""Storage: datasets at rest and how they are read and written. Shards (``shard``, read only
with pread: ``files``) and the writer that rolls them (``writer``); their sidecar indexes
(``index``; the framing scan a block at a time, ``framing``; read at the cost of their headers
and checked at first use, ``lazy``, ``columns``; split documents' pieces, ``pieces``; their
entries' digests, ``digests``); the manifest that commits a dataset (``manifest``, its fields
checked in ``manifest_fields``) and what paths name (``listing``); the corpus a loader reads
(``corpus``); atomic writes (``atomic``); and datasets in object storage: the remote reader
(``remote``, its shards ``remote_shard``), the node-shared cache (``cache``) and its readers
(``readers``), its prefetch thread (``prefetch``) and uploads (``upload``).

Imports the wire format, ``ndp.kernels`` (the framing scan), ``ndp.errors``, and the engines' host
thread pool (``ndp.engine.threads``) for parallel reads.
"""
