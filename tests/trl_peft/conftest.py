import pytest

pytest.importorskip("trl", reason="needs the [trl] extra (trl, peft)")
