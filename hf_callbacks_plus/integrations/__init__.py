"""The transformers integration (a runner layer, like ``loop``).

``transformers.py``: `TrainerPlus` / `TrainerPlusMixin`, a ``transformers.Trainer`` that fires
our events; ``ordering.py``: `run_before_integrations` and the `PreLogBridge` for a stock
``transformers.Trainer``. See ``docs/architecture.md`` for the layers.
"""
