"""Resume states: what a ``Loader`` saves and how it goes on from one.

``state`` (a state checked field by field), ``checkpoint`` (``state_dict`` and ``load_state_dict``),
``resume`` (where a state resumes, also after the dataset grew) and ``elastic`` (an epoch continued
on
another number of ranks or batch shape).
"""
