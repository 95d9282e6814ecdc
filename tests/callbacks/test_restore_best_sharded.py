"""restore_best refuses a model whose parameters are sharded across processes (FSDP2 DTensor
shards on 2 CPU ranks) with a clear error at train begin, instead of copying one rank's shard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("sharded_restore_script.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
ROOT = Path(__file__).resolve().parents[2]


def test_sharded_model_is_refused_on_every_rank(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(SCRIPT), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["local_numel"] < report["total_numel"]  # really sharded: each rank holds a part
        assert report["global_step"] == 0  # refused before any step
        assert "restore_best=True" in report["error"] and "DTensors" in report["error"]
        assert "load_best_model_at_end" in report["error"]
