"""ndp against the loaders teams use today, on the same tokens (``bench_loaders.py``): the
peers' pipelines (``peers.py``, ``peers_dali.py``, ``peers_mosaicml.py``, which share
``batches.py``) and the figures of a run (``loaders_report.py``)."""
