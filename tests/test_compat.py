"""``_compat``: the one version parser and the one on/off environment reader of the package."""

from __future__ import annotations

import types

import pytest

from hf_callbacks_plus._compat import env_flag, transformers_version, version_tuple


@pytest.mark.parametrize(
    ("text", "parts", "expected"),
    [
        ("4.46.3", 3, (4, 46, 3)),
        ("4.46.0rc1", 3, (4, 46, 0)),  # the digits of "0rc1" are not 01
        ("5.0.0.dev0", 3, (5, 0, 0)),
        ("0.19.11", 2, (0, 19)),
        ("2", 3, (2, 0, 0)),
        ("", 2, (0, 0)),
        ("unknown", 2, (0, 0)),
    ],
)
def test_version_tuple(text, parts, expected):
    assert version_tuple(text, parts) == expected


def test_version_tuple_reads_a_module_version():
    assert version_tuple(types.ModuleType("fake"), 2) == (0, 0)  # no __version__
    module = types.ModuleType("fake")
    module.__version__ = "0.31.0"
    assert version_tuple(module, 2) == (0, 31)


def test_transformers_version_uses_it():
    transformers = pytest.importorskip("transformers")
    assert transformers_version() == version_tuple(transformers.__version__)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), (" TRUE ", True), ("yes", True), ("on", True), ("0", False), ("off", False), ("", False)],
)
def test_env_flag(monkeypatch, value, expected):
    monkeypatch.setenv("HF_CALLBACKS_PLUS_TEST_FLAG", value)
    assert env_flag("HF_CALLBACKS_PLUS_TEST_FLAG") is expected
    monkeypatch.delenv("HF_CALLBACKS_PLUS_TEST_FLAG")
    assert env_flag("HF_CALLBACKS_PLUS_TEST_FLAG") is None
