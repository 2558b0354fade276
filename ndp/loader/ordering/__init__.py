"""The order of an epoch: which packet each rank reads, and when.

The shuffled order (``order``, ``window``, ``shuffle``: windows of shards permuted place by place
from the seed and the epoch), each rank's share of it (``share``, read place by place;
``share_entries``, its index entries a window at a time, built ahead by ``warm``; ``whole``,
built whole where a pass must see every rank), documents split over packets as one place (``units``), and mixing sources by weight
(``sources``, ``mix_schedule``). Imports storage and the wire format; nothing of the running
pipeline.
"""
