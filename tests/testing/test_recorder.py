"""EventRecorder and diff_traces: what users rely on to test their callbacks."""

from __future__ import annotations

from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments, TrainerCallback
from hf_callbacks_plus.testing import EventRecorder, TraceEvent, diff_traces


def run(tmp_path, *callbacks, **args):
    LightweightTrainer(
        LoopArguments(output_dir=str(tmp_path), disable_tqdm=True, save_strategy="no", **args),
        train_step=lambda batch: 1.0,
        train_data=[[1.0]] * 4,
        eval_fn=lambda data: {"acc": 1.0},
        callbacks=list(callbacks),
    ).train()


def test_records_flags_keys_and_values(tmp_path):
    recorder = EventRecorder(skip=["on_pre_optimizer_step", "on_optimizer_step"])
    run(tmp_path, recorder, max_steps=2, logging_steps=2, eval_strategy="steps", eval_steps=2)
    step_end = recorder.of("on_step_end")[-1]
    assert step_end.flags == ("should_training_stop", "should_evaluate", "should_log")
    evaluate = recorder.of("on_evaluate")[0]
    assert evaluate.keys == (
        "epoch",
        "eval_acc",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
    )
    assert evaluate.values["eval_acc"] == 1.0
    assert recorder.count("on_optimizer_step") == 0
    assert recorder.steps("on_log") == [2, 2, 2]
    assert recorder.logs()[0]["loss"] == 1.0
    assert "on_evaluate" in recorder.format()


def test_custom_events_are_recorded_when_asked(tmp_path):
    recorder = EventRecorder(custom_events=["on_training_loss", "on_pre_log"])
    run(tmp_path, recorder, max_steps=2, logging_steps=1)
    assert recorder.count("on_training_loss") == 2
    assert recorder.of("on_training_loss")[0].keys == ("loss",)
    assert recorder.count("on_pre_log") == recorder.count("on_log")


def test_identical_traces_have_no_diff(tmp_path):
    first, second = EventRecorder(), EventRecorder()
    run(tmp_path / "a", first, max_steps=3, logging_steps=1)
    run(tmp_path / "b", second, max_steps=3, logging_steps=1)
    assert diff_traces(first, second) is None
    second.clear()
    assert second.events == []


def test_diff_points_at_first_difference_with_context(tmp_path):
    class StopEarly(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                control.should_training_stop = True

    expected, actual = EventRecorder(), EventRecorder()
    run(tmp_path / "a", expected, max_steps=3, logging_steps=1)
    run(tmp_path / "b", StopEarly(), actual, max_steps=3, logging_steps=1)
    report = diff_traces(expected, actual, names=("reference", "mine"), context=2)
    assert report.startswith("traces differ at event #")
    assert "flags: ('should_log',) != ('should_training_stop', 'should_log')" in report
    assert "--- reference" in report and "--- mine" in report and ">>" in report


def test_diff_reports_length_and_honours_ignores():
    a = [TraceEvent("on_log", 1, 0.5, keys=("loss", "total_flos"))]
    b = [TraceEvent("on_log", 1, 0.5, keys=("loss",)), TraceEvent("on_train_end", 1, 0.5)]
    shorter = diff_traces(b[:1], b)
    assert "expected has 1 events, actual has 2" in shorter and "<end of trace>" in shorter
    assert diff_traces(a, b[:1], ignore_keys={"total_flos"}) is None
    assert diff_traces(a, b, ignore_keys={"total_flos"}, ignore_events={"on_train_end"}) is None
    assert "keys:" in diff_traces(a, b[:1])


def test_custom_events_record_their_own_arguments_and_the_history_length(tmp_path):
    class FailAtStep2(TrainerCallback):  # injects the failure
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("boom")

    recorder = EventRecorder(custom_events=["on_pre_log", "on_exception"])
    try:
        run(tmp_path, recorder, FailAtStep2(), max_steps=4, logging_steps=1)
    except RuntimeError:
        pass
    failure = recorder.of("on_exception")[0]
    assert failure.keys == ("exception",) and str(failure.values["exception"]) == "boom"
    assert "model" not in failure.values  # the arguments every event gets are not recorded
    pre, log = recorder.of("on_pre_log")[0], recorder.of("on_log")[0]
    assert (pre.history_length, log.history_length) == (1, 1)  # on_pre_log fires from the handler's on_log
    assert pre == TraceEvent("on_pre_log", pre.global_step, pre.epoch, pre.flags, pre.keys)  # not compared
