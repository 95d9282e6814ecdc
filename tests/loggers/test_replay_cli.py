"""``hf-callbacks-plus replay`` on a file it cannot send says so and exits 1: a file that is not a spill file
(issue 17), a spill file an earlier version's logger wrote (issue 16)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hf_callbacks_plus.cli import main
from hf_callbacks_plus.loggers.records import LogRecord, record_to_json


def test_a_metrics_jsonl_log_is_not_replayed(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"event": "log", "step": step, "loss": 1.0 / step}) + "\n"
                           for step in range(1, 23)))
    assert main(["replay", str(log)]) == 1
    captured = capsys.readouterr()
    assert "is not a spill file" in captured.err and "metrics.jsonl" in captured.err
    assert "corrupt" not in captured.out + captured.err
    assert len(log.read_text().splitlines()) == 22  # untouched


@pytest.mark.parametrize("logger", ["WandbLogger", "JsonlLogger"])
def test_a_spill_file_of_an_earlier_versions_logger_says_how_to_replay_it(tmp_path, capsys, logger):
    """0.2.0's WandbLogger and JsonlLogger spilled; this version does not (they hand records to
    their library). Their leftover spill file is listed by --dry-run, and replay says which version
    sends it and how, leaving the file as it is (before: 'unknown logger')."""
    folder = tmp_path / ".tracker_spill"
    folder.mkdir()
    spill = folder / f"{logger}.jsonl"
    records = [dataclasses.replace(LogRecord(step, 0, {"train/loss": 0.5}, {}), session="s", run_id="r1")
               for step in (1, 2, 3)]
    spill.write_text("".join(json.dumps(record_to_json(record)) + "\n" for record in records))
    (folder / f"{logger}.target.json").write_text(json.dumps({"logger": logger, "project": "p"}))
    before = spill.read_text()

    assert main(["replay", str(folder), "--dry-run"]) == 0
    assert "3 log record(s)" in capsys.readouterr().out
    assert main(["replay", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"written by the {logger} of hf-callbacks-plus 0.2.0" in err
    extra = "[wandb]" if logger == "WandbLogger" else ""
    assert f"pip install 'hf-callbacks-plus{extra}==0.2.0' && hf-callbacks-plus replay" in err
    assert spill.read_text() == before
