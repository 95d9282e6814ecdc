"""SelfRestoringState: keyed save/restore, and writing the current state into a checkpoint."""

import json

from hf_callbacks_plus._compat import trainer_saves_callback_states_per_checkpoint
from hf_callbacks_plus.core.state import TrainerState
from hf_callbacks_plus.core.stateful import SelfRestoringState
from hf_callbacks_plus.loop.arguments import LoopArguments


class Counter(SelfRestoringState):
    def __init__(self, name: str = "a"):
        self.name, self.count = name, 0

    @property
    def state_key(self):
        return f"Counter[{self.name}]"

    @state_key.setter
    def state_key(self, value):
        pass

    def state_args(self):
        return {"name": self.name}

    def state_attributes(self):
        return {"count": self.count}

    def load_state_attributes(self, attributes):
        self.count = attributes.get("count", 0)


def write_checkpoint(folder, stateful_callbacks):
    folder.mkdir(parents=True)
    state = TrainerState(global_step=4, stateful_callbacks=stateful_callbacks)
    state.save_to_json(folder / "trainer_state.json")


def saved(folder):
    return json.loads((folder / "trainer_state.json").read_text())["stateful_callbacks"]["Counter"]


def test_stale_entries_of_several_instances_are_replaced_by_key(tmp_path):
    a, b = Counter("a"), Counter("b")
    write_checkpoint(tmp_path / "checkpoint-4", [a, b])  # states of the start of the run: 0 and 0
    a.count, b.count = 3, 5
    assert b.write_state_into_checkpoint(str(tmp_path / "checkpoint-4"))
    assert a.write_state_into_checkpoint(str(tmp_path / "checkpoint-4"))
    entries = saved(tmp_path / "checkpoint-4")
    assert [(e["attributes"]["state_key"], e["attributes"]["count"]) for e in entries] == [
        ("Counter[a]", 3), ("Counter[b]", 5)]

    resumed_a, resumed_b = Counter("a"), Counter("b")
    state = TrainerState.load_from_json(tmp_path / "checkpoint-4" / "trainer_state.json")
    assert resumed_a.restore_from_trainer_state(state) and resumed_b.restore_from_trainer_state(state)
    assert (resumed_a.count, resumed_b.count) == (3, 5)


def test_single_entry_is_replaced_and_a_second_instance_is_added(tmp_path):
    a = Counter("a")
    write_checkpoint(tmp_path / "c", [a])
    a.count = 7
    a.write_state_into_checkpoint(str(tmp_path / "c"))
    assert saved(tmp_path / "c")["attributes"]["count"] == 7
    other = Counter("z")
    other.count = 1
    other.write_state_into_checkpoint(str(tmp_path / "c"))
    assert [e["attributes"]["count"] for e in saved(tmp_path / "c")] == [7, 1]
    assert not other.write_state_into_checkpoint(str(tmp_path / "missing"))


def test_only_old_transformers_trainers_need_the_patch():
    # our loop saves current states at every checkpoint; so does transformers >= 4.45
    assert trainer_saves_callback_states_per_checkpoint(LoopArguments(output_dir="x"))
