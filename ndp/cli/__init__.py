"""The ``ndp`` command line: argument parsing and exit statuses (``main``), each command's work
(``commands``), the embedded default job (``demo``) and what a shard holds (``inspect``).

Imports every layer below it; nothing imports it.
"""
