"""to_float: the one conversion of logged values, with each caller's choice explicit."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest

from hf_callbacks_plus.metrics.numbers import to_float


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3.0), (0.5, 0.5), (Decimal("1.5"), 1.5), (Fraction(1, 4), 0.25), (True, None), (False, None),
     ("0.5", None), (b"1", None), (None, None), ([1.0], None), ({"a": 1}, None), (object(), None)],
)
def test_plain_python_values(value, expected):
    assert to_float(value) == expected


def test_numpy_and_torch_one_element_values_are_numbers():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert to_float(np.float32(0.5)) == 0.5
    assert to_float(np.array([2.0])) == 2.0
    assert to_float(torch.tensor(2.0)) == 2.0
    assert to_float(torch.tensor([1.5])) == 1.5  # one element: accepted like the loggers accept it
    assert to_float(torch.tensor([[7]])) == 7.0
    assert to_float(torch.tensor([1.0, 2.0])) is None
    assert to_float(np.array([])) is None
    assert to_float(torch.tensor(True)) is None
    assert to_float(torch.tensor(True), accept_bool=True) == 1.0


def test_non_finite_values_are_returned_as_they_are():
    assert math.isnan(to_float(float("nan")))
    assert to_float(float("-inf")) == -math.inf


def test_bools_only_when_asked():
    assert to_float(True, accept_bool=True) == 1.0 and to_float(False, accept_bool=True) == 0.0


def test_strict_raises_naming_the_value():
    assert to_float(2, strict=True) == 2.0
    expected = r"the loss returned by train_step must be a number .* got 'x' \(str\)"
    with pytest.raises(TypeError, match=expected):
        to_float("x", strict=True, what="the loss returned by train_step")
    with pytest.raises(TypeError, match=r"value must be a number .* got None \(NoneType\)"):
        to_float(None, strict=True)
