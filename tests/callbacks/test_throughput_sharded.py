"""ThroughputMonitor's FLOPs under DeepSpeed ZeRO-3 and FSDP (issue 31), at world size 1.

Each engine replaces the weights it shards even with one rank: FSDP2 makes them DTensors, FSDP1
flattens them into one 1-D ``FlatParameter`` per wrapper, ZeRO-3 leaves placeholders of shape
``[0]`` (``ds_shape`` holds the real one). Before, ZeRO-3 and FSDP1 gave no FLOP keys and no
warning; ``measure`` under FSDP2 counted the forward only (a third). The counts must equal those
of the unsharded model, which equal ``torch.utils.flop_counter`` (tests/callbacks/test_flops.py);
``measure`` is refused under FSDP at train begin. Under ZeRO-2 and ZeRO-3 a stock Trainer's
records (loss, grad norm) are bit-identical with and without the monitor, and ``measure`` equals
the counter on the unsharded model. The runs are in a subprocess (tests/callbacks/
throughput_sharded.py): the process group it starts stays up until the process ends. Second tier
(about 30 s): the first tier runs ZeRO-3 and FSDP1 on 2 ranks, in tests/distributed.py's launch
(tests/callbacks/test_throughput_engines.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.transformers

ROOT = Path(__file__).resolve().parents[2]
B, S = 3, 10  # tests/callbacks/test_flops.py's batch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_script(tmp_path: Path, what: str, port: int) -> dict:
    pytest.importorskip("deepspeed")
    out = tmp_path / f"{what}.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, "-m", "tests.callbacks.throughput_sharded", str(out), what],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def counts(tmp_path_factory) -> dict:
    return run_script(tmp_path_factory.mktemp("sharded_counts"), "counts", free_port())


@pytest.mark.second_tier  # the first tier has ZeRO-3 and FSDP1 on 2 ranks: test_throughput_engines.py
def test_flops_come_from_the_full_shapes_under_every_engine(counts):
    engines = ("fsdp2", "fsdp1", "fsdp1-orig-params", "zero3")
    assert set(counts["sharded"]) == {f"{engine}/{model}" for engine in engines
                                      for model in ("full", "tied", "frozen")} - {"fsdp1/frozen"}
    for key, outcome in counts["sharded"].items():
        engine, model = key.split("/")
        assert outcome["engine"] == engine.split("-")[0], key
        assert outcome["flops"] == counts["unsharded"][model], key  # P, P_t, per token, attention
    # what the engines did to the weights: flat 1-D shards (FSDP1), placeholders (ZeRO-3)
    assert all(len(shape) == 1 for shape in counts["sharded"]["fsdp1/full"]["local_shapes"])
    assert counts["sharded"]["zero3/full"]["local_shapes"] == [[0]]
    # and the unsharded count is torch.utils.flop_counter's (full fine-tuning, tied head)
    for model in ("full", "tied"):
        flops = counts["unsharded"][model]
        by_formula = flops["per_token"] * B * S + flops["per_squared_length"] * B * S * S
        assert by_formula == counts["flop_counter"][model]


@pytest.mark.second_tier
def test_measure_is_refused_under_fsdp_and_allowed_under_zero3(counts):
    for key, outcome in counts["sharded"].items():
        if key.startswith("zero3"):
            assert outcome["refusal"] is None, key
            continue
        words = ("flops_per_token='measure'", "FSDP", "forward only", "flops_per_token='auto'")
        assert all(word in outcome["refusal"] for word in words), (key, outcome["refusal"])
        assert ("FSDP2" in outcome["refusal"]) == key.startswith("fsdp2")


@pytest.mark.second_tier
def test_zero3_trainer_records_are_unchanged_and_the_flops_right(tmp_path):
    result = run_script(tmp_path, "zero3-trainer", free_port())
    assert result["none"]["placeholder"] == [0]  # sharded for real

    def records(run):
        return [{k: r.get(k) for k in ("loss", "grad_norm", "learning_rate", "step")}
                for r in result[run]["history"] if "loss" in r]

    assert records("auto") == records("none") == records("measure")  # bit-identical (dropout 0.3)
    assert records("zero2-auto") == records("zero2-none")
    assert result["auto"]["flops"] == result["zero2-auto"]["flops"] == result["unsharded"]
    assert result["measure"]["flops"]["per_token"] == result["measured_by_hand"]
    for run in ("auto", "measure", "zero2-auto"):
        windows = [r for r in result[run]["history"] if "throughput/window_seconds" in r]
        assert windows
        assert all(r["throughput/tflops_per_second"] > 0 and r["throughput/mfu"] > 0 for r in windows)
