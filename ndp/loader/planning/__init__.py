"""The plan of a run: an epoch's batches and the chunks that make them.

``plan`` (a rank's share of each epoch, cut into chunks), ``epoch`` (a pass over an epoch's windows
for CRC-Drop and counts), ``count`` and ``shared_count`` (each epoch's batch count, made on a thread
and shared across a node), ``shapes`` and ``schedule`` (batch shapes and values that change with the
step), ``steps`` (run steps across epochs), ``reach`` (where a chunk of batches ends, by the index)
and ``skips`` (steps and packets left out). Imports ``ndp.loader.ordering`` and
``ndp.loader.layouts``'
compiled counts.
"""
