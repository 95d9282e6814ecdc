"""``trainer_state.json`` is replaced atomically: never truncated, and its folder is dated by the save."""

from __future__ import annotations

import json
import os

import pytest

from hf_callbacks_plus.core.state import TrainerState, write_json_atomically


def test_a_rewrite_dates_the_folder_and_leaves_no_partial_file(tmp_path):
    folder = tmp_path / "checkpoint-8"
    folder.mkdir()
    TrainerState(global_step=8).save_to_json(folder / "trainer_state.json")
    os.utime(folder, (1_000_000, 1_000_000))  # written long ago
    TrainerState(global_step=8, epoch=2.0).save_to_json(folder / "trainer_state.json")
    assert os.path.getmtime(folder) > 1_000_000  # rotation by mtime sees the re-save
    assert sorted(os.listdir(folder)) == ["trainer_state.json"]
    assert TrainerState.load_from_json(folder / "trainer_state.json").epoch == 2.0


def test_a_failed_write_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "trainer_state.json"
    write_json_atomically(path, {"global_step": 3})
    with pytest.raises(TypeError):
        write_json_atomically(path, {"global_step": object()})  # not serializable

    def failing_replace(source, target):  # fault injection: the disk fills up at the rename
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomically(path, {"global_step": 4})
    assert json.loads(path.read_text(encoding="utf-8")) == {"global_step": 3}
    assert os.listdir(tmp_path) == ["trainer_state.json"]  # the partial file was removed
