"""Once kept, a checkpoint's bytes never change, whatever anyone writes under ``output_dir``.

transformers writes ``trainer_state.json``, ``training_args.bin``, ``optimizer.pt``,
``scheduler.pt``, ``rng_state.pth`` (and config/tokenizer files) in place when it saves a
``checkpoint-N`` that exists, so kept hard links changed with them (issue 32, item 1). The class
of second writers, each on a real Trainer: ``save_model`` into a checkpoint, a user writing every
file of every ``checkpoint-N`` in place, a callback writing into an earlier checkpoint later in
the run, a second run into the same ``output_dir`` under another ``dirname``, a resume from an
earlier ``checkpoint-N`` and a resume from a kept folder (both on other data). The ground truth:
the bytes of ``checkpoint-N`` when its save ended, hashed then (the kept copy must equal them
then), and every kept folder's bytes at the end, wherever its line's folders are (kept, or set
aside by a resume).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from tests.callbacks.best_checkpoints_helpers import KEPT, scripted_run, tree_hashes

pytestmark = [pytest.mark.transformers]

#: What only a resume needs in a one-process checkpoint: a model-only kept folder holds the rest.
RESUME_ONLY = {"optimizer.pt", "scheduler.pt", "rng_state.pth"}
SCORE = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 6.0, 12: 1.0, 14: 7.0, 16: 2.5}
OTHER = {step: 10.0 - value for step, value in SCORE.items()}  # "other data": another ranking


@pytest.fixture(autouse=True)
def _trusted_checkpoints(monkeypatch):
    """transformers < 4.47 loads rng_state.pth with torch.load's old default, refused by torch >= 2.6
    (weights_only); the checkpoints are this test's own."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


class BytesAtKeep(TrainerCallback):
    """Listed after the keeper: when a save ends, the bytes of ``checkpoint-N`` (what a kept copy of
    it must hold) and of its kept folder, registered by the save's ``trainer_state.json`` (unique
    to one save: it holds that run's logged times)."""

    def __init__(self, keeper, registry):
        self.keeper, self.registry = keeper, registry

    def on_save(self, args, state, control, **kwargs):
        self.register(args, state.global_step)

    def on_train_begin(self, args, state, control, **kwargs):
        """A resume makes the kept folder of the resumed step from its checkpoint."""
        for folder in Path(self.keeper.directory).glob("checkpoint-*"):
            self.register(args, int(folder.name.split("-")[1]))

    def register(self, args, step):
        folder = self.keeper.folder(step)
        if folder is None or not os.path.isdir(folder):
            return
        kept = tree_hashes(folder)
        source = Path(args.output_dir) / f"checkpoint-{step}"
        if source.is_dir() and (kept["trainer_state.json"], tuple(sorted(kept))) not in self.registry:
            skip = set() if self.keeper.resumable else RESUME_ONLY
            saved = tree_hashes(source)
            assert kept == {name: digest for name, digest in saved.items() if name not in skip}, step
        self.registry.setdefault((kept["trainer_state.json"], tuple(sorted(kept))), (step, kept))


class WritesIntoEarlierCheckpoints(TrainerCallback):
    """Another callback: at every step's end, rewrites every file of every earlier checkpoint-N
    in place (same inode), as a careless tool or callback would."""

    def on_step_end(self, args, state, control, **kwargs):
        for folder in Path(args.output_dir).glob("checkpoint-*"):
            if int(folder.name.split("-")[1]) < state.global_step:
                write_every_file_in_place(folder)


def write_every_file_in_place(folder):
    for path in Path(folder).rglob("*"):
        if path.is_file():
            with open(path, "r+b") as handle:
                head = handle.read(32)
                handle.seek(0)
                handle.write(bytes((byte + 1) % 256 for byte in head))  # never undone by a second write


def keeper(resumable=True, dirname=KEPT):
    return KeepBestCheckpoints("eval_score", k=3, mode="min", resumable=resumable, dirname=dirname,
                               verbose=False)


def train(output_dir, registry, score=SCORE, resume=None, resumable=True, dirname=KEPT, extra=(), **args):
    """A real Trainer keeping the 3 best, with the bytes of every keep registered."""
    kept = keeper(resumable, dirname)
    trainer = scripted_run(output_dir, [kept, BytesAtKeep(kept, registry), *extra], score=score, **args)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, kept


def assert_every_kept_folder_unchanged(output_dir, registry):
    """Every kept folder under ``output_dir`` (kept, or set aside) holds the bytes it had when its
    save ended."""
    folders = [path for path in Path(output_dir).glob(f"{KEPT}*/checkpoint-*") if path.is_dir()]
    assert folders
    for folder in folders:
        now = tree_hashes(folder)
        key = (now.get("trainer_state.json"), tuple(sorted(now)))
        assert key in registry, f"{folder}: changed since it was kept"
        step, then = registry[key]
        assert folder.name == f"checkpoint-{step}" and now == then, folder


def save_model_into_checkpoints(output_dir, trainer):
    """``trainer.save_model`` into every checkpoint-N, with other weights."""
    with __import__("torch").no_grad():
        trainer.model.a.add_(1.0)
    for folder in Path(output_dir).glob("checkpoint-*"):
        trainer.save_model(str(folder))


def user_writes_in_place(output_dir, trainer):
    for folder in Path(output_dir).glob("checkpoint-*"):
        write_every_file_in_place(folder)


def second_run_another_dirname(output_dir, trainer, registry):
    train(output_dir, registry, score=OTHER, dirname="best_by_other", learning_rate=0.05, seed=7)


def resume_from_an_earlier_checkpoint(output_dir, trainer, registry):
    train(output_dir, registry, score=OTHER, resume=str(output_dir / "checkpoint-6"), learning_rate=0.05)


def resume_from_a_kept_folder(output_dir, trainer, registry):
    """The docs' example: resume from the best kept folder, then train on other data."""
    best = json.loads((output_dir / KEPT / "manifest.json").read_text())["ranking"]["eval_score"][0]
    train(output_dir, registry, score=OTHER, resume=str(output_dir / KEPT / f"checkpoint-{best}"),
          learning_rate=0.05)


#: In an order where each leaves checkpoints the next can resume from (the user's in-place writes,
#: which corrupt them, last).
WRITERS = {"save_model": save_model_into_checkpoints,
           "a second run, another dirname": second_run_another_dirname,
           "a resume from an earlier checkpoint": resume_from_an_earlier_checkpoint,
           "a resume from a kept folder": resume_from_a_kept_folder,
           "a user, in place": user_writes_in_place}


def apply(name, output_dir, trainer, registry):
    writer = WRITERS[name]
    if writer.__code__.co_argcount == 3:
        writer(output_dir, trainer, registry)
    else:
        writer(output_dir, trainer)


def test_kept_bytes_never_change_whoever_writes_after(tmp_path):
    """Every second writer in turn on one output_dir (first tier), after a run whose checkpoints are
    all still there (no save_total_limit); every kept folder of every run is checked after each."""
    registry = {}
    trainer, _ = train(tmp_path, registry)
    assert_every_kept_folder_unchanged(tmp_path, registry)
    for name in WRITERS:
        apply(name, tmp_path, trainer, registry)
        assert_every_kept_folder_unchanged(tmp_path, registry)
    # two lines set aside by the resumes, the second run's folder, and the active one
    assert len([path for path in tmp_path.glob(f"{KEPT}*") if path.is_dir()]) == 3
    assert (tmp_path / "best_by_other").is_dir()


def test_a_callback_writing_into_earlier_checkpoints_during_the_run(tmp_path):
    registry = {}
    train(tmp_path, registry, extra=[WritesIntoEarlierCheckpoints()])
    assert_every_kept_folder_unchanged(tmp_path, registry)


def test_a_user_writing_a_kept_file_leaves_the_checkpoint_unchanged(tmp_path):
    registry = {}
    train(tmp_path, registry)
    before = {folder.name: tree_hashes(folder) for folder in tmp_path.glob("checkpoint-*")}
    for folder in (tmp_path / KEPT).glob("checkpoint-*"):
        write_every_file_in_place(folder)
    assert {folder.name: tree_hashes(folder) for folder in tmp_path.glob("checkpoint-*")} == before


#: Every writer with and without a save limit and resumable folders, except where it cannot write:
#: a resume from checkpoint-6 needs it not rotated away (no limit); from a kept folder, a resumable one.
EACH_WRITER = [(name, resumable, limit) for name in sorted(WRITERS) for resumable in (False, True)
               for limit in (None, 2)
               if not (name == "a resume from an earlier checkpoint" and limit is not None)
               and not (name == "a resume from a kept folder" and not resumable)]


@pytest.mark.second_tier
@pytest.mark.parametrize(("name", "resumable", "limit"), EACH_WRITER)
def test_each_writer_alone(tmp_path, name, resumable, limit):
    registry = {}
    trainer, _ = train(tmp_path, registry, resumable=resumable, save_total_limit=limit)
    apply(name, tmp_path, trainer, registry)
    assert_every_kept_folder_unchanged(tmp_path, registry)
