"""``hf-callbacks-plus replay`` on a file that is not a spill file says so and exits 1 (issue 17)."""

from __future__ import annotations

import json

from hf_callbacks_plus.cli import main


def test_a_metrics_jsonl_log_is_not_replayed(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"event": "log", "step": step, "loss": 1.0 / step}) + "\n"
                           for step in range(1, 23)))
    assert main(["replay", str(log)]) == 1
    captured = capsys.readouterr()
    assert "is not a spill file" in captured.err and "metrics.jsonl" in captured.err
    assert "corrupt" not in captured.out + captured.err
    assert len(log.read_text().splitlines()) == 22  # untouched
