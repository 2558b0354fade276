"""The Loader's pipeline, the hot path: ``ndp.Loader`` (``loader``; options in ``options``) plans
each epoch's order and every rank's share (``order``, ``shuffle``, ``share``, ``plan``,
``reach``, ``sources`` for mixing, ``epoch`` for CRC-Drop, ``elastic`` for a changed world),
counts each epoch's batches while it is delivered and shares that count across a node
(``count``, ``shared_count``), holds its own packets' index entries a window at a time
(``share_entries``, built ahead by ``warm``), stages bytes where the decoder reads them
(``stage`` on the host, ``device_shards`` on a GPU), decodes a chunk of batches at a time
(``chunks``, ``layout``, ``packing``) on a producer thread (``producer``, ``running``), and
serves them to the training loop (``serve``), with resume states (``state``, ``checkpoint``)
and what it delivered (``stats``, ``truncation``, ``taken``). Accountability: which packets
made any step (``explain``), steps left out (``skips``), and the figures a job watches
(``telemetry``, exported by ``metrics``).

Imports the engines, storage, the wire format and ``ndp.errors``; torch only in ``serve``,
through ``ndp.adapters.torch``, when batches are asked for as tensors.
"""
