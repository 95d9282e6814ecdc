"""KeepBestCheckpoints across crashes and resumes: the state in the checkpoint is reconciled with
the disk. The peers' bugs are the cases: Lightning #5173 (more than k left after a resume),
#4911 (the top k forgotten), #11379 (a resume deleted another run's checkpoints)."""

from __future__ import annotations

import logging
import shutil

import pytest
from transformers import Trainer, TrainerCallback

from hf_callbacks_plus.callbacks import best_checkpoints as module
from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from hf_callbacks_plus.integrations.transformers import TrainerPlus
from tests.callbacks.best_checkpoints_helpers import (
    KEPT,
    WeightsAtSave,
    expected_ranking,
    kept_steps,
    kept_weights,
    manifest,
    scripted_run,
    tree_hashes,
    tree_snapshot,
)

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

SCORE = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 6.0, 12: 1.0, 14: 7.0, 16: 2.5}
SAVED = sorted(SCORE)
EXPECTED = expected_ranking({"score": SCORE}, [("score", 2, "min")], SAVED)["eval_score"]  # [12, 8]


@pytest.fixture(autouse=True)
def _trusted_checkpoints(monkeypatch):
    """transformers < 4.47 loads rng_state.pth with torch.load's old default, refused by torch >= 2.6
    (weights_only); the checkpoints are this test's own."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


class FaultInjectingCrash(TrainerCallback):
    """Injects a crash (the process dying) in ``event`` at ``step``."""

    def __init__(self, step, event="on_step_end"):
        self.step, self.event = step, event
        setattr(self, event, self._crash)

    def _crash(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"injected crash in {self.event} at step {self.step}")


def keeper():
    return KeepBestCheckpoints("eval_score", k=2, mode="min", verbose=False)


def crash_then_resume(output_dir, crash, weights, trainer_class=Trainer, order=("weights", "keeper", "crash"),
                      **args):
    """Train until the injected crash (callbacks in ``order``), then resume from the newest
    checkpoint to the end."""
    callbacks = {"keeper": keeper(), "weights": weights, "crash": crash}
    first = scripted_run(output_dir, [callbacks[name] for name in order], trainer_class=trainer_class,
                         score=SCORE, **args)
    with pytest.raises(RuntimeError, match="injected crash"):
        first.train()
    second = keeper()
    scripted_run(output_dir, [weights, second], trainer_class=trainer_class, score=SCORE,
                 **args).train(resume_from_checkpoint=True)
    return second


def assert_kept_as_uninterrupted(output_dir, kept, weights):
    assert [entry.step for entry in kept.ranking["eval_score"]] == EXPECTED
    assert kept_steps(output_dir) == sorted(EXPECTED)
    assert manifest(output_dir)["ranking"] == {"eval_score": EXPECTED}
    for step in EXPECTED:
        assert kept_weights(output_dir / KEPT / f"checkpoint-{step}") == weights.weights[step]


@pytest.mark.parametrize("trainer_class", [Trainer, TrainerPlus])
@pytest.mark.parametrize("crash_step", [9, 13])
def test_a_crash_then_resume_keeps_what_the_uninterrupted_run_keeps(tmp_path, trainer_class, crash_step):
    weights = WeightsAtSave()
    crash = FaultInjectingCrash(crash_step)
    kept = crash_then_resume(tmp_path, crash, weights, trainer_class, save_total_limit=1)
    assert_kept_as_uninterrupted(tmp_path, kept, weights)


def test_a_crash_between_the_trainers_save_and_ours_is_completed_on_resume(tmp_path, caplog):
    """Killed after checkpoint-12 is written (its state ranks step 12 and evicts step 4) but before
    our on_save made the kept folder: the resume makes it from checkpoint-12 and deletes step 4's."""
    weights = WeightsAtSave()
    crash = FaultInjectingCrash(12, "on_save")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        kept = crash_then_resume(tmp_path, crash, weights, order=("weights", "crash", "keeper"))
    assert_kept_as_uninterrupted(tmp_path, kept, weights)
    assert "gone from" not in caplog.text


#: Where the save of step 8 is interrupted: making its kept folder, writing the manifest that lists
#: it, deleting the folder it evicts (step 6's).
AT_STEP_8 = {"copy_entries": lambda args: str(args[1]).endswith("checkpoint-8"),
             "write_manifest": lambda args: args[1].get("last_step") == 8,
             "remove_folder": lambda args: args[1] == 6}


@pytest.mark.parametrize("fails", sorted(AT_STEP_8))
def test_a_crash_inside_our_save_is_repaired_on_resume(tmp_path, monkeypatch, fails):
    """The disk work of one save (link, manifest, delete the evicted) interrupted at each stage."""
    original = getattr(module, fails)

    def fault_injecting(*args, **kwargs):
        if AT_STEP_8[fails](args):
            raise KeyboardInterrupt("injected crash")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, fails, fault_injecting)
    weights = WeightsAtSave()
    with pytest.raises(KeyboardInterrupt):
        scripted_run(tmp_path, [weights, keeper()], score=SCORE, save_total_limit=1).train()
    monkeypatch.setattr(module, fails, original)
    kept = keeper()
    resumed = scripted_run(tmp_path, [weights, kept], score=SCORE, save_total_limit=1)
    resumed.train(resume_from_checkpoint=True)
    assert_kept_as_uninterrupted(tmp_path, kept, weights)
    assert not [path for path in (tmp_path / KEPT).iterdir() if path.name.startswith(".")]


def test_a_deleted_kept_checkpoint_is_told_and_keeps_its_place(tmp_path, caplog):
    first = scripted_run(tmp_path, [keeper(), FaultInjectingCrash(15)], score=SCORE, save_total_limit=1)
    with pytest.raises(RuntimeError):
        first.train()
    assert kept_steps(tmp_path) == [8, 12]
    shutil.rmtree(tmp_path / KEPT / "checkpoint-12")  # the best so far; rotation removed checkpoint-12 too
    kept = keeper()
    resumed = scripted_run(tmp_path, [kept], score={**SCORE, 16: 0.5}, save_total_limit=1)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        resumed.train(resume_from_checkpoint=True)
    assert "kept checkpoint(s) of step 12 (eval_score=1, missing) are gone" in caplog.text
    # nothing worse takes its place; step 16 (0.5) ranks first and evicts step 8, by the ranking
    assert [(e.step, e.missing) for e in kept.ranking["eval_score"]] == [(16, False), (12, True)]
    assert kept_steps(tmp_path) == [16]
    assert [(c["step"], c["missing"]) for c in manifest(tmp_path)["checkpoints"]] == [(12, True), (16, False)]


def test_resuming_from_an_earlier_checkpoint_leaves_at_most_k_and_deletes_none(tmp_path, caplog):
    """Lightning #5173: the kept folders of steps after the resumed one belong to the line of
    training the resume leaves: they leave the folder (at most k remain), set aside with their
    bytes unchanged, and the user is told where."""
    weights = WeightsAtSave()
    scripted_run(tmp_path, [weights, keeper()], score=SCORE).train()
    assert kept_steps(tmp_path) == [8, 12]
    first = {step: tree_hashes(tmp_path / KEPT / f"checkpoint-{step}") for step in (8, 12)}
    resumed_from = tmp_path / "checkpoint-6"
    files = tree_snapshot(resumed_from)
    kept = keeper()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        scripted_run(tmp_path, [weights, kept], score=SCORE).train(resume_from_checkpoint=str(resumed_from))
    (aside,) = tmp_path.glob(f"{KEPT}.run-*-step-16")
    assert f"are set aside, not deleted: in {aside}" in caplog.text and "gone" not in caplog.text
    assert {step: tree_hashes(aside / f"checkpoint-{step}") for step in (8, 12)} == first
    assert manifest(tmp_path, aside.name)["ranking"] == {"eval_score": EXPECTED}  # the line set aside
    assert_kept_as_uninterrupted(tmp_path, kept, weights)
    assert tree_snapshot(resumed_from) == files  # never touched


def test_a_checkpoint_copied_to_another_output_dir_starts_a_fresh_ranking(tmp_path, caplog):
    """Lightning #11379: the resumed run keeps its hands off the first run's folder."""
    first = tmp_path / "first"
    scripted_run(first, [keeper()], score=SCORE).train()
    before = tree_snapshot(first)
    kept = keeper()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        second = scripted_run(tmp_path / "second", [kept], score=SCORE)
        second.train(resume_from_checkpoint=str(first / "checkpoint-10"))
    assert "was written in output_dir=" in caplog.text and "a fresh ranking starts here" in caplog.text
    assert tree_snapshot(first) == before
    assert [e.step for e in kept.ranking["eval_score"]] == [12, 16]  # only the steps trained here
    assert kept_steps(tmp_path / "second") == [12, 16]


def test_a_fresh_run_into_the_same_output_dir_sets_the_earlier_kept_checkpoints_aside(tmp_path, caplog):
    """A script run again into its output_dir (issue 41): the earlier run's kept folders move aside,
    untouched, with one warning naming where; the new run keeps its own. Before, it was refused."""
    first = keeper()
    scripted_run(tmp_path, [first], score=SCORE).train()
    before = tree_hashes(tmp_path / KEPT)
    again = keeper()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        scripted_run(tmp_path, [again], score=SCORE).train()
    aside = tmp_path / f"{KEPT}.run-{first.run_id[:8]}-step-{first.last_step}"
    assert f"are set aside, not deleted: in {aside}" in caplog.text and "earlier_runs='refuse'" in caplog.text
    assert tree_hashes(aside) == before  # the earlier run's folders and manifest, byte for byte
    assert again.run_id != first.run_id and kept_steps(tmp_path) == [e.step for e in again.entries]


def test_earlier_runs_refuse_refuses_a_folder_holding_another_runs_kept_checkpoints(tmp_path):
    scripted_run(tmp_path, [keeper()], score=SCORE).train()
    before = tree_snapshot(tmp_path / KEPT)
    refusing = KeepBestCheckpoints("eval_score", k=2, mode="min", earlier_runs="refuse")
    again = scripted_run(tmp_path, [refusing], score=SCORE)
    with pytest.raises(RuntimeError, match="holds kept checkpoints of run .*earlier_runs='refuse'"):
        again.train()
    assert again.state.global_step == 0 and tree_snapshot(tmp_path / KEPT) == before


def test_transformers_restore_flag_replaces_the_instance_and_it_still_reconciles(tmp_path):
    weights = WeightsAtSave()
    first = scripted_run(tmp_path, [weights, keeper(), FaultInjectingCrash(11)], score=SCORE,
                         save_total_limit=1, restore_callback_states_from_checkpoint=True)
    with pytest.raises(RuntimeError):
        first.train()
    trainer = scripted_run(tmp_path, [weights, keeper()], score=SCORE, save_total_limit=1,
                           restore_callback_states_from_checkpoint=True)
    trainer.train(resume_from_checkpoint=True)
    (kept,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, KeepBestCheckpoints)]
    assert_kept_as_uninterrupted(tmp_path, kept, weights)
