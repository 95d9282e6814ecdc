"""EarlyStopping under ``torchrun --nproc_per_node 2`` (CPU, gloo): same decision, same step, no hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers, pytest.mark.distributed, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_every_rank_stops_at_rank0_step(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    script = Path(__file__).with_name("early_stopping_ddp_script.py")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(script), str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = [json.loads((tmp_path / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [o["rank"] for o in outcomes] == [0, 1]
    # rank 1's own metric would have stopped it at step 8 (and hung rank 0 in the next all-reduce)
    for outcome in outcomes:
        assert (outcome["global_step"], outcome["stopped_step"]) == (16, 16), outcome
        assert (outcome["best_step"], outcome["best_value"]) == (10, 2.5), outcome
    # verbose (the default): one stop line and one summary for the whole job, from rank 0 only
    output = result.stdout + result.stderr
    assert output.count("EarlyStopping stopped training at step 16") == 1, output[-3000:]
    summary = "EarlyStopping summary: stopped at step 16 (patience); best eval_score=2.5 at step 10."
    assert output.count(summary) == 1
