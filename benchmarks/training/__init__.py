"""Training on ndp: a small GPT fed by ndp and by a JSONL baseline, same examples, same order
(``train_ab.py``), and a GPT-2-small-sized model pretrained on packed windows fed by ndp and by
the fastest peers (``train_gpt2.py``)."""
