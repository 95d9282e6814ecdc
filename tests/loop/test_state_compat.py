"""Our TrainerState/TrainerControl match transformers' field for field, and their JSON files."""

import dataclasses

import pytest

from hf_callbacks_plus.core.state import TrainerControl, TrainerState

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.transformers


@pytest.mark.parametrize("ours, theirs", [(TrainerState, transformers.TrainerState),
                                          (TrainerControl, transformers.TrainerControl)])
def test_same_fields_and_defaults(ours, theirs):
    def fields(cls):
        return [(f.name, f.default, f.default_factory) for f in dataclasses.fields(cls)]

    assert fields(ours) == fields(theirs)


def test_state_json_round_trips_both_ways(tmp_path):
    theirs = transformers.TrainerState(global_step=7, epoch=1.5, max_steps=20, best_metric=0.25,
                                       best_global_step=6, log_history=[{"loss": 1.0, "step": 5}],
                                       stateful_callbacks=[transformers.TrainerControl(should_log=True)])
    theirs.save_to_json(tmp_path / "theirs.json")
    ours = TrainerState.load_from_json(tmp_path / "theirs.json")
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)

    ours.save_to_json(tmp_path / "ours.json")
    assert (tmp_path / "ours.json").read_text() == (tmp_path / "theirs.json").read_text()
    back = transformers.TrainerState.load_from_json(str(tmp_path / "ours.json"))
    assert dataclasses.asdict(back) == dataclasses.asdict(theirs)


def test_unknown_keys_from_other_releases_are_ignored(tmp_path):
    (tmp_path / "s.json").write_text('{"global_step": 3, "some_future_field": 1}')
    assert TrainerState.load_from_json(tmp_path / "s.json").global_step == 3
