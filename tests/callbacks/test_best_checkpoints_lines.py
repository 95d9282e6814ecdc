"""A resume never deletes the kept checkpoints of another line of training (issue 32, item 3).

A resume from the newest save continues a line; a resume from an earlier save (a kept folder, as
the docs show, or an earlier ``checkpoint-N``), or from a save of another line, starts a new
line: the ranking at the resumed step goes on, and every kept folder of the line left behind is
set aside in a sibling folder, bytes unchanged, the user told where. The cases: the docs' own
example (resume from the best kept folder, then train on other data), the same kept folder
resumed twice, the line left behind resumed again; and the warnings name only steps that are
really gone, never the ones the left line evicted normally.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from tests.callbacks.best_checkpoints_helpers import KEPT, kept_steps, manifest, scripted_run, tree_hashes
from tests.tiny_models import RegressionDataset

pytestmark = [pytest.mark.transformers]

SCORE = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 6.0, 12: 1.0, 14: 7.0, 16: 2.5}  # run 1 keeps 12, 8, 16
OTHER = {2: 9.0, 4: 9.0, 6: 9.0, 8: 9.0, 10: 0.5, 12: 9.0, 14: 0.7, 16: 9.0}


@pytest.fixture(autouse=True)
def _trusted_checkpoints(monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


class ResumedFolderStays(TrainerCallback):
    """Listed after the keeper: at train begin the folder being resumed from still holds what the
    trainer reads after that event (the RNG state, at the first step)."""

    def __init__(self, folder):
        self.folder, self.seen = Path(folder), None

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen = sorted(os.listdir(self.folder)) if self.folder.is_dir() else None


def keeper(k=3):
    return KeepBestCheckpoints("eval_score", k=k, mode="min", resumable=True, verbose=False)


def kept_folders(output_dir):
    """Every kept folder under ``output_dir`` (kept or set aside): path -> bytes."""
    return {str(path.relative_to(output_dir)): tree_hashes(path)
            for path in sorted(Path(output_dir).glob(f"{KEPT}*/checkpoint-*"))}


def first_run(output_dir, k=3, score=SCORE, limit=2):
    first = keeper(k)
    scripted_run(output_dir, [first], score=score, save_total_limit=limit).train()
    return first


def resume(output_dir, folder, score=OTHER, k=3, caplog=None):
    """Resume from ``folder`` and train on other data (another dataset, other scores)."""
    second, watch = keeper(k), ResumedFolderStays(folder)
    trainer = scripted_run(output_dir, [second, watch], score=score, save_total_limit=2, learning_rate=0.05)
    trainer.train_dataset = RegressionDataset(64, seed=9)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train(resume_from_checkpoint=str(folder))
    assert watch.seen is not None and "rng_state.pth" in watch.seen and "optimizer.pt" in watch.seen
    return second


def assert_set_aside(output_dir, line, before, caplog):
    """Every kept folder of ``line`` as it was (``before``: its folder -> bytes) is in one sibling
    folder named after it, with its manifest, and the warning says where."""
    (aside,) = Path(output_dir).glob(f"{KEPT}.run-{line.run_id[:8]}-step-*")
    assert f"are set aside, not deleted: in {aside}" in caplog.text
    assert {name.replace(KEPT, aside.name, 1): digest for name, digest in before.items()} == \
        {name: digest for name, digest in kept_folders(output_dir).items() if name.startswith(aside.name)}
    assert manifest(output_dir, aside.name)["run_id"] == line.run_id
    return aside


def test_the_docs_example_resume_from_a_kept_folder_deletes_none_of_the_first_runs(tmp_path, caplog):
    first = first_run(tmp_path)
    assert kept_steps(tmp_path) == [8, 12, 16]
    before = kept_folders(tmp_path)
    second = resume(tmp_path, tmp_path / KEPT / "checkpoint-12", caplog=caplog)
    assert second.run_id != first.run_id
    aside = assert_set_aside(tmp_path, first, before, caplog)
    # the new line starts from the ranking at step 12 ([8, 12]) and ranks steps 14 and 16 on
    assert [entry.step for entry in second.ranking["eval_score"]] == [14, 12, 8]
    assert kept_steps(tmp_path) == [8, 12, 14]
    for step in (8, 12):  # shared with the first run: the same bytes in both folders
        assert tree_hashes(tmp_path / KEPT / f"checkpoint-{step}") == before[f"{KEPT}/checkpoint-{step}"]
    assert "gone" not in caplog.text
    assert aside.name.endswith("-step-16")


def test_warnings_never_name_steps_the_left_line_evicted_normally(tmp_path, caplog):
    """At step 4 run 1 keeps [4, 2]; step 6 evicts step 2 later, and rotation took checkpoint-2.
    Resuming from the kept folder of step 4: step 2 holds its place in the new line, marked
    missing, told as evicted after step 4, never as gone."""
    score = {2: 3.0, 4: 1.0, 6: 2.0, 8: 2.5, 10: 4.0, 12: 5.0, 14: 6.0, 16: 7.0}
    first = first_run(tmp_path, k=2, score=score, limit=1)
    assert kept_steps(tmp_path) == [4, 6]
    before = kept_folders(tmp_path)
    second = resume(tmp_path, tmp_path / KEPT / "checkpoint-4", k=2,
                    score={step: 10.0 + step for step in range(6, 17, 2)}, caplog=caplog)
    assert "gone" not in caplog.text
    assert "holds step 2 (eval_score=3, missing), which the later part of that run evicted (after step 4)" \
        in caplog.text
    assert [(e.step, e.missing) for e in second.ranking["eval_score"]] == [(4, False), (2, True)]
    assert kept_steps(tmp_path) == [4]
    assert_set_aside(tmp_path, first, before, caplog)


@pytest.mark.second_tier
def test_the_same_kept_folder_resumed_twice_and_the_left_line_resumed_again(tmp_path, caplog):
    first = first_run(tmp_path)
    resumed_from = tmp_path / KEPT / "checkpoint-12"
    second = resume(tmp_path, resumed_from, caplog=caplog)
    before = {name: digest for name, digest in kept_folders(tmp_path).items() if name.startswith(f"{KEPT}/")}
    caplog.clear()
    third = resume(tmp_path, resumed_from, caplog=caplog)  # the folder kept by the second line now
    assert len({first.run_id, second.run_id, third.run_id}) == 3
    assert_set_aside(tmp_path, second, before, caplog)
    # the first line's step 16, kept in its set-aside folder, resumed: the third line is set aside
    before = {name: digest for name, digest in kept_folders(tmp_path).items() if name.startswith(f"{KEPT}/")}
    (first_aside,) = tmp_path.glob(f"{KEPT}.run-{first.run_id[:8]}-step-*")
    caplog.clear()
    fourth = resume(tmp_path, first_aside / "checkpoint-16", caplog=caplog)
    assert_set_aside(tmp_path, third, before, caplog)
    assert 16 in [entry.step for entry in fourth.entries]  # made from the folder it resumed from
    assert len(list(tmp_path.glob(f"{KEPT}.run-*"))) == 3
