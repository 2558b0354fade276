"""Storage: datasets at rest and how they are read and written. Shards (``shard``) and the
writer that rolls them (``writer``), their sidecar indexes (``index``), the manifest that commits
a dataset (``manifest``), the corpus a loader reads (``corpus``), bounded pread access
(``files``), atomic writes (``atomic``), and datasets in object storage: the remote reader
(``remote``), the node-shared cache (``cache``), its prefetch thread (``prefetch``) and
uploads (``upload``).

Imports the wire format, ``ndp.kernels`` (the framing scan), ``ndp.errors``, and the engines' host
thread pool (``ndp.engine.threads``) for parallel reads.
"""
