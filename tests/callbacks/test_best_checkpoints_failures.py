"""A failed keep never deletes the previous best (issue 32, item 2).

k=1, and the save of step 8 (a new best) cannot be kept: the disk refuses at each point of the
keep in turn (making its folder, each file's copy, syncing it, renaming it into place, writing
the manifest that lists it), with ENOSPC or EDQUOT from a fake disk named as such; then a real
full tmpfs; then, with no fault injected, transformers' rotation deleting the checkpoint just
saved (it sorts by step when folder mtimes are within 1 s, and a resumed run's checkpoint has
higher-numbered ones beside it). Every run ends with the previous best on disk, its bytes as
they were kept, and a warning that says what was not kept and why.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks import best_checkpoints as module
from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints, files
from tests.callbacks.best_checkpoints_helpers import (
    KEPT,
    WeightsAtSave,
    checkpoint_steps,
    kept_steps,
    kept_weights,
    manifest,
    scripted_run,
    tree_hashes,
)

pytestmark = [pytest.mark.transformers]

#: Step 8 is the new best (it would replace step 4); nothing after it beats step 4.
SCORE = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 6.0, 12: 4.5, 14: 7.0, 16: 3.5}


@pytest.fixture(autouse=True)
def _trusted_checkpoints(monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


class FaultInjectingDisk:
    """Makes one operation of the keep of checkpoint-8 fail with ``code`` (a full disk, a quota),
    as the disk would: the ``nth`` call of ``function`` (in ``files``, or the manifest writer in
    the callback's module) whose path belongs to that keep."""

    def __init__(self, monkeypatch, function, code, nth=1):
        owner = module if function == "write_manifest" else files
        original, self.calls = getattr(owner, function), 0

        def failing(*args, **kwargs):
            if self._concerns_step_8(function, args):
                self.calls += 1
                if self.calls == nth:
                    raise OSError(code, os.strerror(code), str(args[0]) if args else "")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, function, failing)

    @staticmethod
    def _concerns_step_8(function, args):
        if function == "write_manifest":
            return 8 in [entry["step"] for entry in args[1]["checkpoints"]]
        return any("building-checkpoint-8" in str(arg) for arg in args)


#: Each point of a keep: (function, which call).
POINTS = {"make the folder": ("_make_dir", 1), "copy the 1st file": ("copy_file", 1),
          "copy the 2nd file": ("copy_file", 2), "copy the last file": ("copy_file", 3),
          "sync the folder": ("_fsync_dir", 1), "rename it into place": ("_publish", 1),
          "write the manifest": ("write_manifest", 1)}


def kept_bytes_recorder(keeper, record):
    class Recorder(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = keeper.folder(state.global_step)
            if folder is not None and os.path.isdir(folder):
                record[state.global_step] = tree_hashes(folder)

    return Recorder()


def run_with(tmp_path, caplog, before=(), after=(), **args):
    keeper = KeepBestCheckpoints("eval_score", k=1, mode="min", verbose=False)
    weights, hashes = WeightsAtSave(), {}
    trainer = scripted_run(tmp_path, [weights, *before, keeper, kept_bytes_recorder(keeper, hashes), *after],
                           score=SCORE, save_total_limit=1, **args)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    return keeper, weights, hashes


def assert_previous_best_kept(tmp_path, caplog, keeper, weights, hashes, why):
    assert [entry.step for entry in keeper.ranking["eval_score"]] == [4]
    assert kept_steps(tmp_path) == [4] and checkpoint_steps(tmp_path) == [16]  # rotation took checkpoint-4
    assert tree_hashes(tmp_path / KEPT / "checkpoint-4") == hashes[4]
    assert kept_weights(tmp_path / KEPT / "checkpoint-4") == weights.weights[4]
    written = manifest(tmp_path)
    assert written["ranking"] == {"eval_score": [4]}
    assert [(entry["step"], entry["ranks"]) for entry in written["not_kept"]] == [(8, {"eval_score": 1})]
    assert why in written["not_kept"][0]["reason"]
    assert "could not keep step 8 (eval_score=2), which would rank {'eval_score': 1}" in caplog.text
    assert "Nothing was deleted: the kept checkpoints stay as they were (eval_score: steps [4])" \
        in caplog.text
    assert "1 checkpoint(s) that ranked could not be kept (steps 8" in caplog.text
    assert not [name for name in os.listdir(tmp_path / KEPT) if name.startswith(".")]


def test_without_a_fault_step_8_replaces_step_4(tmp_path, caplog):
    keeper, _, _ = run_with(tmp_path, caplog)
    assert kept_steps(tmp_path) == [8] and keeper.not_kept == []


@pytest.mark.parametrize("point", sorted(POINTS))
@pytest.mark.parametrize(("error", "message"), [
    pytest.param(errno.ENOSPC, "No space left on device", id="full disk"),
    pytest.param(errno.EDQUOT, "Disk quota exceeded", id="quota", marks=pytest.mark.second_tier),
])
def test_a_full_disk_or_quota_at_any_point_of_a_keep_deletes_nothing(tmp_path, caplog, monkeypatch, point,
                                                                    error, message):
    function, nth = POINTS[point]
    FaultInjectingDisk(monkeypatch, function, error, nth)
    keeper, weights, hashes = run_with(tmp_path, caplog)
    assert_previous_best_kept(tmp_path, caplog, keeper, weights, hashes, message)


# -- a real full file system ------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmpfs):
    """A real 16 MiB file system."""
    return tmpfs("16m")


class FillsTheDisk(TrainerCallback):
    """Before our on_save of step 8, fills the file system (leaving ``room`` bytes); another
    instance after ours frees it, so the trainer's next saves find room again."""

    def __init__(self, ballast, room=0, release=False):
        self.ballast, self.room, self.release = ballast, room, release

    def on_save(self, args, state, control, **kwargs):
        if state.global_step != 8:
            return
        if self.release:
            self.ballast.unlink()
            return
        with open(self.ballast, "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC
            os.ftruncate(handle.fileno(), max(0, handle.tell() - self.room))


@pytest.mark.parametrize("room", [0, 4096], ids=["full", "room for one file"])
def test_a_real_full_disk_deletes_nothing(small_tmpfs, caplog, room):
    output_dir, ballast = small_tmpfs / "out", small_tmpfs / "ballast"
    keeper, weights, hashes = run_with(output_dir, caplog, before=[FillsTheDisk(ballast, room)],
                                       after=[FillsTheDisk(ballast, release=True)])
    assert_previous_best_kept(output_dir, caplog, keeper, weights, hashes, "No space left on device")


# -- no fault injected: transformers' rotation takes the checkpoint just saved ----------------------
class UnreliableMtimes(TrainerCallback):
    """A file system whose folder mtimes are all alike (cloud FUSE mounts, the case transformers'
    rotation falls back to step order for): before each save, every checkpoint-N folder gets the
    current time."""

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        for folder in Path(args.output_dir).glob("checkpoint-*"):
            os.utime(folder, (now, now))


def test_rotation_deleting_the_new_best_before_our_save_deletes_nothing(tmp_path, caplog):
    """The docs' resume from a kept folder: checkpoint-14 and -16 of the first run are still in
    output_dir, so rotation (save_total_limit=2, by step) deletes the resumed run's checkpoint-12,
    a new best, before on_save: step 10 stays kept."""
    first = KeepBestCheckpoints("eval_score", k=1, mode="min", resumable=True, verbose=False)
    scripted_run(tmp_path, [first], score={**SCORE, 10: 1.5}, save_total_limit=2).train()
    assert kept_steps(tmp_path) == [10] and checkpoint_steps(tmp_path) == [14, 16]
    kept_10 = tree_hashes(tmp_path / KEPT / "checkpoint-10")
    second = KeepBestCheckpoints("eval_score", k=1, mode="min", resumable=True, verbose=False)
    resumed = scripted_run(tmp_path, [UnreliableMtimes(), second], score={12: 1.0, 14: 8.0, 16: 9.0},
                           save_total_limit=2, learning_rate=0.05)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        resumed.train(resume_from_checkpoint=str(tmp_path / KEPT / "checkpoint-10"))
    assert "could not keep step 12 (eval_score=1)" in caplog.text
    assert "was gone at on_save: transformers' save_total_limit rotation deleted it" in caplog.text
    assert [entry.step for entry in second.ranking["eval_score"]] == [10]
    assert kept_steps(tmp_path) == [10] and tree_hashes(tmp_path / KEPT / "checkpoint-10") == kept_10
