"""Importing a callback with the standalone switch loads neither torch nor transformers
(docs/testing.md: what "milliseconds" means), in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = ("import json, sys; from hf_callbacks_plus import EarlyStopping, TrainSubsetEvaluation, "
        "ThroughputMonitor, LightweightTrainer; "
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)))")


def loaded(standalone: bool) -> list[str]:
    env = {**os.environ, "HF_CALLBACKS_PLUS_STANDALONE": "1" if standalone else "0"}
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                            check=True, timeout=300)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_standalone_switch_keeps_heavy_modules_out():
    assert loaded(standalone=True) == []
