"""runtime/engines.py in one process, on models no engine shards (the engines themselves run in
the launch: tests/callbacks/test_generation_samples_sharded.py, test_restore_best_sharded.py)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from hf_callbacks_plus.callbacks.early_stopping.best_weights import BestWeights  # noqa: E402
from hf_callbacks_plus.runtime.distributed import all_gather_objects, distributed_rank  # noqa: E402
from hf_callbacks_plus.runtime.engines import (  # noqa: E402
    copy_local,
    generation_model,
    load_local,
    local_tensors,
    sharding_engine,
    zero_optimizer,
)


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    model[0].weight.requires_grad_(False)  # frozen: not part of the copy
    model.register_buffer("scratch", torch.zeros(2), persistent=False)  # not in a state dict: not copied
    return model


def test_an_unsharded_model():
    model = small_model()
    assert sharding_engine(model) is None and sharding_engine(object()) is None
    assert zero_optimizer(torch.optim.SGD(model.parameters(), lr=0.1)) is None
    assert zero_optimizer(None) is None
    with generation_model(model) as (module, every_rank):
        assert module is model and every_rank is False
    assert all_gather_objects({"a": 1}) == [{"a": 1}] and distributed_rank() == 0


def test_the_copy_holds_what_training_changes_and_goes_back_exactly():
    model = small_model()
    assert sorted(local_tensors(model)) == ["0.bias", "1.bias", "1.num_batches_tracked", "1.running_mean",
                                            "1.running_var", "1.weight", "2.bias", "2.weight"]
    kept = copy_local(model)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    model(torch.randn(5, 3))  # moves the running statistics
    load_local(model, None, kept)
    for name, tensor in model.state_dict().items():
        if name == "0.weight":  # frozen: never copied, changed above, left alone
            assert torch.equal(tensor, before[name] + 1.0)
        else:
            assert torch.equal(tensor, before[name]), name
    kept["2.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="does not fit this model on this rank"):
        load_local(model, None, kept)


class ZeroOptimizerStandIn:
    """Stands in for DeepSpeed's ZeRO-1/2 optimizer in one process (its fp32 master partition and
    ``update_lp_params``), to inject a resumed copy written under another world size."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.single_partition_of_fp32_groups = [torch.cat([p.detach().flatten() for p in model.parameters()])]

    def update_lp_params(self) -> None:
        """(The real one copies the masters into the parameters and gathers them.)"""


def test_a_copy_from_another_world_size_is_not_put_back(tmp_path, caplog):
    from safetensors.torch import save_file

    from hf_callbacks_plus.core.state import TrainerState

    model = small_model()
    optimizer = ZeroOptimizerStandIn(model)
    weights = BestWeights("key")
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    save_file(copy_local(model, optimizer), checkpoint / weights.rank_file_name(0),
              metadata={"step": "2", "key": "key", "rank": "0", "world_size": "2"})
    args = type("Args", (), {"output_dir": str(tmp_path)})()
    state = TrainerState()
    state.global_step = 4
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        assert weights.on_train_begin(args, state, model, 2, optimizer) is False
    assert weights.per_rank and weights.snapshot is None
    assert "written by 2 ranks" in caplog.text and "cannot be put back" in caplog.text
    save_file(copy_local(model, optimizer), checkpoint / weights.rank_file_name(0),
              metadata={"step": "2", "key": "key", "rank": "0", "world_size": "1"})
    assert weights.on_train_begin(args, state, model, 2, optimizer) is True
    assert sorted(weights.snapshot) == ["1.num_batches_tracked", "1.running_mean", "1.running_var",
                                        "zero_fp32_partition.0"]
