"""``random_state_kept``: every generator reachable from the given objects, and the global ones,
is as it was after the block. Each case draws inside the block and
compares the next draws after it with an untouched twin."""

from __future__ import annotations

import functools
import random

import numpy
import pytest
import torch

from hf_callbacks_plus.runtime.random_state import random_state_kept

MODULE_RNG = numpy.random.default_rng(3)


class LazyCollator:
    """Creates its generator at the first call, like ``DataCollatorForLanguageModeling(seed=...)``."""

    def __init__(self, seed):
        self.seed = seed
        self.generator = None

    def __call__(self):
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)
        return float(torch.rand(1, generator=self.generator))


class Slotted:
    __slots__ = ("rng",)

    def __init__(self):
        self.rng = random.Random(4)


class Sampler:
    """A training sampler whose generator an eval sampler shares."""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(7)


def draw_module_rng():
    return [MODULE_RNG.random() for _ in range(2)]


def cases():
    """name: (object, draw); every call builds fresh generators (the module global too)."""
    global MODULE_RNG
    MODULE_RNG = numpy.random.default_rng(3)
    nested = {"inner": [functools.partial(lambda generator: float(torch.rand(1, generator=generator)),
                                          torch.Generator().manual_seed(9))]}
    return {
        "lazily created generator": (LazyCollator(123), lambda c: [c(), c()]),
        "shared sampler generator": (Sampler(), lambda s: torch.randperm(5, generator=s.generator).tolist()),
        "partial in a dict in a list": (nested, lambda n: n["inner"][0]()),
        "slots": (Slotted(), lambda s: s.rng.random()),
        "module global read by a function": (draw_module_rng, lambda f: f()),
        "numpy legacy RandomState": (numpy.random.RandomState(2), lambda r: r.rand()),
        "numpy Generator": (numpy.random.default_rng(8), lambda r: r.random()),
    }


@pytest.mark.parametrize("case", sorted(cases()))
def test_the_next_draws_are_those_without_the_block(case):
    untouched, draw = cases()[case]
    expected = draw(untouched)
    obj, draw = cases()[case]  # a twin, drawn from inside the block first
    with random_state_kept(obj):
        draw(obj)
        draw(obj)
    assert draw(obj) == expected


def test_a_generator_created_in_the_block_is_removed():
    collator = LazyCollator(5)
    with random_state_kept(collator):
        collator()
    assert collator.generator is None  # the training creates it at its own first call, as without


def test_global_generators_are_kept():
    random.seed(1), numpy.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), numpy.random.rand(), float(torch.rand(1)))
    random.seed(1), numpy.random.seed(1), torch.manual_seed(1)
    with random_state_kept():
        random.random(), numpy.random.rand(), torch.rand(3)
    assert (random.random(), numpy.random.rand(), float(torch.rand(1))) == expected


def test_large_data_and_tensors_are_not_searched():
    """A dataset's rows are data: a list of 10 000 rows or a tensor is not walked (the search stays cheap)."""
    from hf_callbacks_plus.runtime.random_state import _search

    rows = [{"row": i, "rng": random.Random(i)} for i in range(10_000)]
    generators, _ = _search(({"rows": rows, "tensor": torch.zeros(3), "seed": torch.Generator()},))
    assert len(generators) == 1
