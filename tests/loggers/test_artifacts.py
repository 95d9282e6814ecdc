"""A checkpoint staged for upload shares no bytes with the checkpoint: the trainer rewrites its
files in place (same inode) when it saves over a folder, and the upload runs later."""

from __future__ import annotations

import json
import os

from hf_callbacks_plus.loggers.artifacts import stage_folder
from hf_callbacks_plus.runtime.file_copies import copy_file


def test_staged_files_do_not_change_when_the_checkpoint_is_rewritten_in_place(tmp_path):
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / "optimizer.pt").write_bytes(b"step 4 state")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    staged = stage_folder(checkpoint, tmp_path / ".tracker_artifacts")
    for name in ("optimizer.pt", "trainer_state.json"):  # as transformers does: open, truncate, write
        with open(checkpoint / name, "r+b") as handle:
            handle.truncate(0)
            handle.write(b"a later run's bytes")
    assert (staged / "optimizer.pt").read_bytes() == b"step 4 state"
    assert json.loads((staged / "trainer_state.json").read_text()) == {"global_step": 4}
    assert os.stat(staged / "optimizer.pt").st_ino != os.stat(checkpoint / "optimizer.pt").st_ino


def test_copy_file_keeps_bytes_and_mtime_and_refuses_an_existing_target(tmp_path):
    source, target = tmp_path / "a.bin", tmp_path / "b.bin"
    source.write_bytes(os.urandom(1 << 20))
    os.utime(source, ns=(1_000_000_000, 2_000_000_000))
    copied = copy_file(str(source), str(target))
    assert target.read_bytes() == source.read_bytes() and os.stat(target).st_mtime_ns == 2_000_000_000
    assert (copied.files, copied.bytes) == (1, 1 << 20)
    try:
        copy_file(str(source), str(target))
    except FileExistsError:
        pass
    else:
        raise AssertionError("copy_file overwrote an existing target")
