"""The running pipeline: plan, stage, decode, serve, on a producer thread.

``chunks`` (decode a chunk: stage, verdicts, layout, build), ``stage`` and ``device_shards`` (bytes
where the decoder reads them: host memory or a GPU), ``producer`` and ``running`` (the producer
thread
and its queue), ``ahead`` (the next chunk staged while this one is laid out), ``serve`` (the ring of
output slots and the batches handed out) and ``taken`` (what the consumer took: its state and stats,
made when read).
"""
