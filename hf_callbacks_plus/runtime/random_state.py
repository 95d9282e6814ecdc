"""Every random generator an extra evaluation could draw from, saved before and put back after.

A training run observes two kinds of generators: the global ones (Python's ``random``, NumPy's
legacy ``numpy.random``, torch's CPU and CUDA generators) and private ones held by the
objects that prepare its data: a collator with its own generator
(``DataCollatorForLanguageModeling(mlm=True, seed=...)`` creates ``self.generator`` at its first
call), a sampler with a ``generator``, a dataset whose ``__getitem__`` or ``with_transform``
function augments rows with a generator of its own. An evaluation of training rows between two
training steps (`TrainSubsetEvaluation`) goes through those same objects. `random_state_kept`
makes that invisible to the training: it finds every generator reachable from the given objects
(attributes, containers, function closures, defaults and the module globals they name, bound
methods, ``functools.partial``)
and, on exit, puts back each generator's state, and the attributes that held a generator or
None (a generator created lazily during the block is removed again), along with the global
generators. Training after the block draws exactly what it would have drawn without it.
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
import types
from collections.abc import Iterator
from typing import Any, Callable

__all__ = ["random_state_kept"]

#: Containers larger than this are data, not configuration: not searched.
_MAX_CONTAINER = 256
#: Objects visited at most (the search is over small configuration objects).
_MAX_OBJECTS = 5000
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type, types.ModuleType, range)
#: Modules whose objects hold no generator of the training's (threads, processes, arrow tables).
_OPAQUE_MODULES = ("threading", "multiprocessing", "queue", "_thread", "pyarrow", "tokenizers", "logging")


def _accessors(obj: Any) -> tuple[Callable[[], Any], Callable[[Any], Any]] | None:
    """(get state, set state) when ``obj`` is a random generator, else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Generator):
        return obj.get_state, obj.set_state
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(obj, numpy.random.Generator):
            bit_generator = obj.bit_generator
            return (lambda: bit_generator.state), (lambda state: setattr(bit_generator, "state", state))
        if isinstance(obj, numpy.random.RandomState):
            return obj.get_state, obj.set_state
    if isinstance(obj, random.Random):
        return obj.getstate, obj.setstate
    return None


def _global_generators() -> list[tuple[Callable[[Any], Any], Any]]:
    """(restore function, state) of the process-wide generators."""
    states: list[tuple[Callable[[Any], Any], Any]] = [(random.setstate, random.getstate())]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states.append((numpy.random.set_state, numpy.random.get_state()))
    torch = sys.modules.get("torch")
    if torch is not None:
        states.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
    return states


def _skipped(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return True
    return type(obj).__module__.split(".")[0] in _OPAQUE_MODULES


def _global_names(code: types.CodeType) -> set[str]:
    """The global names a function's code reads, its comprehensions and inner functions included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return list(obj.values()) if len(obj) <= _MAX_CONTAINER else []
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj) if len(obj) <= _MAX_CONTAINER else []
    children: list[Any] = []
    if isinstance(obj, functools.partial):
        children += [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, types.MethodType):
        children += [obj.__self__, obj.__func__]
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                children.append(cell.cell_contents)
        children += [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
        module_names = obj.__globals__
        children += [module_names[name] for name in _global_names(obj.__code__) if name in module_names]
        return children
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        children += attributes.values() if len(attributes) <= _MAX_CONTAINER else []
    for name in getattr(type(obj), "__slots__", ()):
        if isinstance(name, str) and hasattr(obj, name):
            children.append(getattr(obj, name))
    return children


def _search(roots: tuple[Any, ...]) -> tuple[list[Any], list[tuple[Any, dict[str, Any]]]]:
    """The generators reachable from ``roots``, and the objects whose attributes hold a generator
    or None, with those attributes as they are now."""
    generators: list[Any] = []
    holders: list[tuple[Any, dict[str, Any]]] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack and len(seen) < _MAX_OBJECTS:
        obj = stack.pop()
        if obj is None or isinstance(obj, _ATOMS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if _accessors(obj) is not None:
            generators.append(obj)
            continue
        if _skipped(obj):
            continue
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict) and not isinstance(obj, types.FunctionType):
            slots = {name: value for name, value in attributes.items()
                     if value is None or _accessors(value) is not None}
            holders.append((obj, slots))
        stack.extend(_children(obj))
    return generators, holders


def _put_back(holders: list[tuple[Any, dict[str, Any]]]) -> None:
    """Attributes that held a generator or None hold it again; generators that appeared are removed."""
    for obj, slots in holders:
        attributes = vars(obj)
        for name, value in list(attributes.items()):
            if name in slots:
                if value is not slots[name]:
                    setattr(obj, name, slots[name])
            elif _accessors(value) is not None:
                delattr(obj, name)


@contextlib.contextmanager
def random_state_kept(*roots: Any) -> Iterator[None]:
    """Within the block, draw from any generator; afterwards every one is as it was.

    Args:
        *roots: The objects whose generators the block may advance (a collator, datasets, a
            dataloader...); the global generators are always kept.
    """
    global_states = _global_generators()
    generators, holders = _search(roots)
    states = [(accessors[1], accessors[0]()) for accessors in map(_accessors, generators) if accessors]
    try:
        yield
    finally:
        _put_back(holders)
        for restore, state in states:
            restore(state)
        for restore, state in global_states:
            restore(state)
