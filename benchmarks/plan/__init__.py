"""The plan of a run: a schedule's cost (``bench_schedule.py``), ``explain`` of a step
(``bench_explain.py``), a resume into a changed plan (``bench_plan_change.py``) and the shuffle's
quality against the peers' (``shuffle_quality.py``)."""
