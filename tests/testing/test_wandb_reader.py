"""``read_wandb_run`` against real W&B offline runs, plus hand-built logs for the block edge cases."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from hf_callbacks_plus.loggers.wandb_files import HistoryTail, split_records
from hf_callbacks_plus.testing import read_wandb_run
from hf_callbacks_plus.testing.wandb_reader import (
    BLOCK_LEN,
    WandbLogFormatError,
    find_wandb_runs,
    iter_wandb_records,
)

wandb = pytest.importorskip("wandb")
pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

pytestmark = pytest.mark.wandb

BIG = "x" * 100_000  # > 3 blocks: one first, two middle and one last chunk


def _settings():
    return wandb.Settings(
        mode="offline", silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True,
        x_save_requirements=False, disable_git=True, save_code=False,
    )


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> Path:
    """One real offline run with history, config, summary, tags, a huge value and exit code 3."""
    root = tmp_path_factory.mktemp("wandb_reader")
    run = wandb.init(
        dir=str(root), project="reader", id="reader1", name="display", group="grp", job_type="train",
        tags=["a", "b"], config={"lr": 0.1, "nested": {"depth": 2}, "name": "tiny"}, settings=_settings(),
    )
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step")
    for step in (1, 2, 3):
        run.log({"train/loss": 1.0 / step, "train/global_step": step}, step=step)
    run.log({"eval/loss": 0.25, "train/global_step": 3}, step=3)
    run.log({"blob": BIG, "train/global_step": 4}, step=4)
    run.config.update({"late": True})
    run.summary["train_runtime"] = 1.5
    run.summary["nested"] = {"a": {"b": 1}}
    run.finish(exit_code=3)
    return root


def test_reads_history_config_summary_and_identity(offline_run: Path) -> None:
    run = read_wandb_run(offline_run, wait=10)
    assert run.run_id == "reader1"
    assert (run.project, run.name, run.group, run.job_type) == ("reader", "display", "grp", "train")
    assert run.tags == ["a", "b"]
    assert run.config == {"lr": 0.1, "nested": {"depth": 2}, "name": "tiny", "late": True}
    assert run.exit_code == 3 and run.finished and not run.truncated
    assert run.steps() == [1, 2, 3, 4]
    assert run.series("train/loss") == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert run.series("eval/loss") == [(3, 0.25)]  # same step: merged into one row
    assert run.history[2] == {"_step": 3, "train/loss": pytest.approx(1 / 3), "eval/loss": 0.25,
                              "train/global_step": 3}
    assert run.summary["train_runtime"] == 1.5
    assert run.summary["nested"] == {"a": {"b": 1}}
    assert run.summary["eval/loss"] == 0.25
    assert "_runtime" not in run.summary and "_wandb" not in run.config
    assert any(m.get("glob_name") == "*" and m.get("step_metric") == "train/global_step" for m in run.metrics)


def test_record_spanning_several_blocks(offline_run: Path) -> None:
    run = read_wandb_run(offline_run, wait=10)
    assert run.series("blob") == [(4, BIG)]
    assert run.path.stat().st_size > 3 * BLOCK_LEN
    kinds = _chunk_kinds(run.path.read_bytes())
    assert {2, 3, 4} <= set(kinds)  # first, middle and last chunks really occur


def test_internal_keys_on_request(offline_run: Path) -> None:
    run = read_wandb_run(offline_run, internal_keys=True, wait=10)
    assert all("_timestamp" in row and "_runtime" in row for row in run.history)
    assert "_wandb" in run.config


def test_corrupted_byte_is_reported(offline_run: Path, tmp_path: Path) -> None:
    data = bytearray(read_wandb_run(offline_run, wait=10).path.read_bytes())
    data[40] ^= 0xFF  # inside the first record's payload
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(WandbLogFormatError, match="checksum mismatch"):
        read_wandb_run(bad)


def test_truncated_file_keeps_what_was_complete(offline_run: Path, tmp_path: Path) -> None:
    data = read_wandb_run(offline_run, wait=10).path.read_bytes()
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[: BLOCK_LEN + 100])  # in the middle of the 100 KB record
    run = read_wandb_run(cut)
    assert run.truncated
    assert run.run_id == "reader1" and run.exit_code is None and not run.finished


def test_not_a_wandb_file(tmp_path: Path) -> None:
    other = tmp_path / "run-x.wandb"
    other.write_bytes(b"LEVELDB" + b"\0" * 20)
    with pytest.raises(WandbLogFormatError, match="not a W&B run log"):
        read_wandb_run(other)
    with pytest.raises(FileNotFoundError):
        read_wandb_run(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no run-"):
        read_wandb_run(empty)


# -- hand-built logs: the writer below follows the format the reader documents ------------


def _write_log(payloads: list[bytes], first_offset_padding: int = 0) -> bytes:
    """A LevelDB-style W&B log (test-only writer; mirrors LevelDB's ``log_writer``)."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for payload in payloads:
        rest, first = payload, True
        while True:
            left = BLOCK_LEN - len(out) % BLOCK_LEN
            if left < 7:
                out += b"\0" * left
                left = BLOCK_LEN
            room = left - 7
            piece, rest = rest[:room], rest[room:]
            last = not rest
            kind = (1 if last else 2) if first else (4 if last else 3)
            out += struct.pack("<IHB", zlib.crc32(bytes((kind,)) + piece), len(piece), kind) + piece
            first = False
            if last:
                break
    return bytes(out)


def _chunk_kinds(data: bytes) -> list[int]:
    kinds, pos = [], 7
    while pos + 7 <= len(data):
        if BLOCK_LEN - pos % BLOCK_LEN < 7:
            pos += BLOCK_LEN - pos % BLOCK_LEN
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        kinds.append(kind)
        pos += 7 + length
    return kinds


def _history(step: int, size: int) -> bytes:
    record = pb.Record()
    item = record.history.item.add()
    item.key, item.value_json = "v", f'"{"y" * size}"'
    step_item = record.history.item.add()
    step_item.key, step_item.value_json = "_step", str(step)
    record.history.step.num = step  # W&B's service sets both
    return record.SerializeToString()


@pytest.mark.parametrize("gap", [0, 1, 6, 7, 8])
def test_block_boundaries(tmp_path: Path, gap: int) -> None:
    # The first record leaves exactly ``gap`` bytes in block 0: 0-6 means zero padding,
    # 7 means a zero-length first chunk, 8 a one-byte first chunk.
    wanted = BLOCK_LEN - 7 - 7 - gap  # file header, chunk header
    size = wanted - len(_history(0, 0))
    while len(_history(0, size)) > wanted:  # protobuf length varints grow with the size
        size -= 1
    payloads = [_history(0, size), _history(1, 50_000), _history(2, 10)]
    assert len(payloads[0]) == wanted
    path = tmp_path / "run-synthetic.wandb"
    path.write_bytes(_write_log(payloads))
    assert list(iter_wandb_records(path)) == payloads
    run = read_wandb_run(path)
    assert run.steps() == [0, 1, 2]
    assert len(run.history[1]["v"]) == 50_000


@pytest.mark.parametrize("gap", [0, 1, 6, 7, 8])
def test_history_tail_reads_a_growing_file_on_from_where_it_stopped(tmp_path: Path, gap: int) -> None:
    # WandbLogger asks for the last whole row at every checkpoint of a run whose file grows to gigabytes:
    # each read must cost only what was written since, and agree with reading the whole file at every cut
    # (inside a chunk header, a payload, a block's zero padding, a record spanning blocks).
    wanted = BLOCK_LEN - 7 - 7 - gap
    size = wanted - len(_history(0, 0))
    while len(_history(0, size)) > wanted:
        size -= 1
    payloads = [_history(0, size), _history(1, 50_000), _history(2, 10), _history(3, 70_000), _history(4, 5)]
    data = _write_log(payloads)
    path = tmp_path / "run-growing.wandb"
    path.write_bytes(b"")
    tail = HistoryTail(path)
    assert HistoryTail(tmp_path / "run-missing.wandb").read() is None
    written = 0
    for cut in sorted({*range(0, len(data), 997), *range(BLOCK_LEN - 20, BLOCK_LEN + 20),
                       *range(2 * BLOCK_LEN - 20, 2 * BLOCK_LEN + 20), len(data)}):
        with path.open("ab") as file:
            file.write(data[written:cut])
        # what the read takes from the file: the bytes written since, plus a chunk it had seen cut
        assert cut - tail._chunks.position <= cut - written + BLOCK_LEN
        written = cut
        whole = split_records(data[:cut], "cut")[0] if cut >= 7 else []
        expected = max((pb.Record.FromString(r).history.step.num for r in whole), default=None)
        assert tail.read() == expected, cut
    assert tail.read() == 4


def test_history_tail_reads_on_past_space_preallocated_then_written(tmp_path: Path) -> None:
    # zeros where the next chunk starts are space not written yet, not the end of the run
    first, both = _write_log([_history(0, 10)]), _write_log([_history(0, 10), _history(1, 10)])
    path = tmp_path / "run-prealloc.wandb"
    path.write_bytes(first + b"\0" * 64)
    tail = HistoryTail(path)
    assert tail.read() == 0
    path.write_bytes(both + b"\0" * 64)
    assert tail.read() == 1


def test_middle_chunk_without_first_is_an_error(tmp_path: Path) -> None:
    data = bytearray(_write_log([]))
    data += struct.pack("<IHB", zlib.crc32(bytes((3,)) + b"ab"), 2, 3) + b"ab"
    path = tmp_path / "run-orphan.wandb"
    path.write_bytes(bytes(data))
    with pytest.raises(WandbLogFormatError, match="never started"):
        read_wandb_run(path)


def test_several_runs_need_a_choice(tmp_path: Path) -> None:
    for name, step in (("offline-run-20250101_000000-r1", 0), ("offline-run-20250101_000001-r2", 1)):
        folder = tmp_path / "wandb" / name
        folder.mkdir(parents=True)
        (folder / f"run-{name[-2:]}.wandb").write_bytes(_write_log([_history(step, 1)]))
    with pytest.raises(ValueError, match="holds 2 runs"):
        read_wandb_run(tmp_path)
    runs = find_wandb_runs(tmp_path)
    assert [read_wandb_run(p).steps() for p in runs] == [[0], [1]]
    assert read_wandb_run(runs[0].parent).steps() == [0]
