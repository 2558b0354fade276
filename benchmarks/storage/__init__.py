"""A dataset read from object storage against the same dataset on local disk
(``bench_remote.py``)."""
