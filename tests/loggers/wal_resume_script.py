"""Resume ``OUTPUT_DIR/checkpoint-6`` of a `LightweightTrainer` with ``MLflowLogger`` up to step
``STEPS``; the user code waits at step 8 until the file ``GATE`` exists (at most 120 s).

Usage: python wal_resume_script.py OUTPUT_DIR TRACKING_URI STEPS GATE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.loggers.faults import train_in_loop  # noqa: E402
from tests.loggers.test_wal import AtStep  # noqa: E402


def wait_for(gate: Path) -> None:
    end = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < end:
        time.sleep(0.01)


if __name__ == "__main__":
    out, uri, steps, gate = sys.argv[1:5]
    train_in_loop(out, [AtStep(8, lambda: wait_for(Path(gate))), MLflowLogger(tracking_uri=uri)], int(steps),
                  save_steps=6, resume_from=str(Path(out) / "checkpoint-6"))
