"""The CPU backend: decode, converter and loader throughput (``bench_cpu.py``) and where the
CPU Loader's host CPU goes, stage by stage (``cpu_breakdown.py``)."""
