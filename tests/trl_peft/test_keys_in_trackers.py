"""trl's own keys land in the right section of our trackers and of the plot.

A real tiny DPO and SFT run (trl 1.16) with ``TrainSubsetEvaluation(gap_metrics=True)`` and
``JsonlLogger``; the JSONL file is read back and plotted.
"""

from __future__ import annotations

import json

import pytest

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.integrations.transformers import run_before_integrations
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from hf_callbacks_plus.metrics.monitor import gap_is_meaningful
from hf_callbacks_plus.plotting import collect_curves, load_log_history
from tests.trl_peft import runs

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

#: per trainer: (a running metric with a "/" or not, what trl logs per evaluation)
CASES = {
    "dpo": ("rewards/accuracies", ("rewards/chosen", "rewards/margins", "logps/rejected", "logits/chosen")),
    "sft": ("mean_token_accuracy", ("mean_token_accuracy", "entropy")),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_trl_keys_in_the_jsonl_tracker_and_the_plot(tmp_path, kind):
    running, evaluated = CASES[kind]
    trainer = runs.trainer(kind, tmp_path / "out", with_subset_eval=False)
    run_before_integrations(trainer, TrainSubsetEvaluation(size=runs.SUBSET, gap_metrics=True),
                            JsonlLogger(str(tmp_path / "metrics.jsonl")))
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curves = {key for line in lines if line["event"] == "log" for key in line["curves"]}
    summary = {key for line in lines if line["event"] == "log" for key in line["summary"]}
    assert f"train/{running}" in curves and "train/loss" in curves  # the training batches
    for name in evaluated:
        assert {f"eval/{name}", f"train_subset/{name}"} <= curves, name
        # a gap only where it means something (rewards/margins yes; entropy, logps/rejected no)
        assert (f"gap/{name}" in curves) == gap_is_meaningful(name), name
    assert "train_subset/loss" in curves
    assert {"train_summary/loss", "train_summary/runtime"} <= summary
    # no section made of a trl family, no name meaning two things
    assert not {key.split("/")[0] for key in curves} & {"rewards", "logps", "logits", "eval_rewards"}
    assert not any(key.startswith(("train/train_", "train/subset_")) for key in curves)

    for source in (tmp_path / "metrics.jsonl", trainer.state.log_history):
        plotted = collect_curves(*load_log_history(source))
        assert set(plotted.series[running]) >= {"training", "eval", "train subset"}, source
        assert plotted.series["loss"].keys() >= {"training loss", "eval", "train subset"}
        steps = [step for step, _ in plotted.series[running]["train subset"]]
        assert steps == [step for step, _ in plotted.series[running]["eval"]] == [2, 4]
