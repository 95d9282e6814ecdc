"""The transformers integration (a runner layer, like ``loop``).

``transformers.py``: `TrainerPlus` / `TrainerPlusMixin`, a ``transformers.Trainer`` that fires
our events; ``ordering.py``: `run_before_integrations`, which gives a stock (or trl)
``transformers.Trainer`` our handler. See ``docs/architecture.md`` for the layers.
"""
