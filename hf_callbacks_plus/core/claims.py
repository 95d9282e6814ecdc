"""Which instance claimed each ``state_key`` at train begin: two instances with one key (or
one instance listed twice) are refused before any step, whatever the trainer."""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["TrainBeginClaims"]

#: Where the claims live: on the run's ``TrainerState`` (one per ``train()``, shared by all its
#: callbacks; not a dataclass field, so never saved).
CLAIMS = "hf_callbacks_plus_claims"


class TrainBeginClaims:
    """The ``state_key`` claims of one ``train()`` call, kept on its ``TrainerState``.

    A stateful callback (``EarlyStopping``, ``Deadline``) claims its key in ``on_train_begin`` (no
    trainer object needed, so it works in a stock Trainer too); all callbacks of one ``train()``
    share one ``TrainerState`` object, so a second claim of a key on the same state is either a
    second instance with the same key or the same instance listed twice.
    """

    def claim(self, state: Any, key: str, instance: Any, conflict: str) -> None:
        """Claim ``key`` for ``instance`` in the run whose state is ``state``.

        Args:
            state: The ``TrainerState`` of the run (shared by all its callbacks).
            key: The instance's ``state_key``.
            instance: The claiming callback.
            conflict: The end of the error when another instance holds the key: why they clash
                and what to do.

        Raises:
            ValueError: The key is already claimed in this run: by ``instance`` (listed twice
                in ``callbacks``) or by another instance.
        """
        claims = vars(state).setdefault(CLAIMS, {})
        owner = claims[key]() if key in claims else None
        name = type(instance).__name__
        if owner is instance:
            raise ValueError(
                f"{name}: the same instance ({key}) is listed twice in the trainer's callbacks; it would "
                f"count every evaluation twice. Pass it once (check callbacks=[...] and add_callback)."
            )
        if owner is not None:
            raise ValueError(f"{name}: 2 instances share state_key={key!r}, {conflict}")
        claims[key] = weakref.ref(instance)

    def release(self, state: Any, key: str, instance: Any) -> None:
        """Forget ``instance``'s claim (at train end: a later ``train()`` may reuse the state)."""
        claims = vars(state).get(CLAIMS, {})
        if key in claims and claims[key]() is instance:
            del claims[key]
