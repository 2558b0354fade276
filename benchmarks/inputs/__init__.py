"""Damaged, stale, cut and misused inputs, tried as a hostile user would (``bad_inputs.py``
runs every case; ``cases.py`` holds the registry and the helpers the case modules share)."""
