"""Real scale, synthetic where the disk is small: 1e8 documents and 8 ranks (``bench_scale.py``,
its datasets ``scale_data.py``, its rank processes ``scale_worker.py``, the peers at the same
scale ``scale_peers.py``) and the first batch and ``len()`` in a fresh process
(``first_batch.py``)."""
