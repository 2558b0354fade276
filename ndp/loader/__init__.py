"""The Loader's pipeline, the hot path: ``ndp.Loader`` (``loader``; its options in ``options``)
and the stages it runs, a sub-package each:

* ``ordering``: the order of an epoch and each rank's share of it (the shuffle, the share read
  place by place and its index entries, split documents as one place, mixing);
* ``planning``: an epoch's batches and the chunks that make them (the plan, the passes that count
  an epoch and share the count across a node, batch shapes and schedules, skipped steps);
* ``layouts``: how a chunk's verdicts become batches on the host (padded, packed and packing
  layouts, sequence packing, document boundaries, windows at documents, truncation);
* ``pipeline``: the running pipeline on a producer thread (decode a chunk, stage bytes on the
  host or a GPU, the next chunk staged ahead, the ring of outputs served, what was taken);
* ``states``: resume states (checked, saved, resumed, continued on another world size).

At the top: what a ``Loader`` delivered (``stats``), which packets made a step (``explain``,
``explanation``) and the figures a job watches (``telemetry``, exported by ``metrics``).

Imports the engines, storage, the wire format and ``ndp.errors``; torch only in
``pipeline.serve``, through ``ndp.adapters.torch``, when batches are asked for as tensors.
"""
