"""``TensorBoardLogger``: real event files read back with TensorBoard's own reader."""

from __future__ import annotations

import pytest

from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
from tests.integrations.tensorboard_events import read_scalars
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers
pytest.importorskip("tensorboard")


def read_texts(directory) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    accumulator.Reload()
    texts: dict[str, list[str]] = {}
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            texts.setdefault(tag, []).extend(value.decode() for value in event.tensor_proto.string_val)
    return texts


def test_sections_config_and_status(tmp_path):
    logger = TensorBoardLogger()
    trainer = make_trainer(tmp_path, callbacks=[logger], max_steps=4, logging_steps=1, eval_strategy="steps",
                           eval_steps=2, run_name="http://u:TbPassw0rd@host/run")
    trainer.train()
    directory = tmp_path / "runs" / logger.run_id
    scalars = read_scalars(directory)
    assert set(scalars["train/loss"]) == {1, 2, 3, 4} and set(scalars["eval/loss"]) == {2, 4}
    assert {"train_summary/loss", "train_summary/runtime"} <= set(scalars)
    texts = read_texts(directory)
    assert "http://u:***@host/run" in texts["config/text_summary"][0]
    assert texts["status/text_summary"] == ["FINISHED"]
    assert not [path for path in directory.iterdir() if b"TbPassw0rd" in path.read_bytes()]


def test_resume_continues_the_directory_without_duplicate_steps(tmp_path):
    """A run killed after step 6 resumed from checkpoint-4: steps 5 and 6 are written again and
    TensorBoard shows each step once (the earlier events after the checkpoint are purged)."""
    first = TensorBoardLogger()
    trainer = make_trainer(tmp_path, callbacks=[first], max_steps=6, logging_steps=1, save_strategy="steps",
                           save_steps=4)
    trainer.train()
    run_id = first.run_id
    second = TensorBoardLogger()
    resumed = make_trainer(tmp_path, callbacks=[second], max_steps=6, logging_steps=1, save_strategy="steps",
                           save_steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert second.run_id == run_id
    assert len(list((tmp_path / "runs" / run_id).glob("events.out.tfevents.*"))) == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "runs" / run_id))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]


def test_log_dir_argument_and_validation(tmp_path):
    with pytest.raises(TypeError, match="log_dir must be a str"):
        TensorBoardLogger(log_dir=3)
    logger = TensorBoardLogger(log_dir=str(tmp_path / "tb"))
    make_trainer(tmp_path / "out", callbacks=[logger], max_steps=2, logging_steps=1).train()
    assert set(read_scalars(tmp_path / "tb")["train/loss"]) == {1, 2}


@pytest.mark.parametrize("after", ["evaluate", "predict"])
def test_evaluate_or_predict_after_a_resumed_train_erases_nothing(tmp_path, after):
    """The writer reopened for evaluate()/predict() after a resumed train() keeps every event the
    resumed training logged (no purge after the checkpoint step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4)
    make_trainer(tmp_path, callbacks=[TensorBoardLogger()], **args).train()
    logger = TensorBoardLogger()
    resumed = make_trainer(tmp_path, callbacks=[logger], **args)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    if after == "evaluate":
        resumed.evaluate()
    else:
        resumed.predict(resumed.eval_dataset)
    logger.flush(timeout=30)
    accumulator = EventAccumulator(str(tmp_path / "runs" / logger.run_id))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train/loss")] == list(range(1, 9))


def test_an_unwritable_log_dir_is_an_error_at_train_begin(tmp_path):
    """A folder that cannot be made is an ``OSError`` naming it when ``train()`` starts (what each
    checkpoint save keeps: ``test_tensorboard_events.py``)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError, match=r"TensorBoardLogger: cannot write the run to .*a_file/run"):
        make_trainer(tmp_path / "out", callbacks=[TensorBoardLogger(log_dir=str(blocker / "run"))],
                     max_steps=2).train()
