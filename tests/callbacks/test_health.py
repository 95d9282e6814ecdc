"""SpikeGuard and TrainingHealth in one process: the rule against an independent median/MAD, bad input
refused with the fix named, ``skip`` bit-identical to a bypassed step (schedule included), the host
reads counted, the state round trip, per-layer norms against norms computed by hand, memory against
``/proc``, TrainerPlus's pre-clip norm and event, the plot panel. Real sharding:
tests/callbacks/test_health_sharded.py."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from hf_callbacks_plus import LightweightTrainer, LoopArguments, SpikeGuard, TrainingHealth
from hf_callbacks_plus.callbacks.health.memory import OomSnapshot, host_resident_bytes
from hf_callbacks_plus.callbacks.health.norms import layer_of
from hf_callbacks_plus.callbacks.health.rule import MAD_TO_SIGMA, SpikeWindow

POISON = 9


def reference_judgement(history: list[float], x: float, warmup: int, threshold: float) -> bool:
    """The rule in plain Python (statistics.median_low: torch's median of an even count is the lower
    middle value): the ground truth for SpikeWindow."""
    if not math.isfinite(x):
        return True
    values = [v for v in history if math.isfinite(v)]
    if len(history) < warmup:
        return False
    median = statistics.median_low(values)
    mad = statistics.median_low([abs(v - median) for v in values])
    scale = max(MAD_TO_SIGMA * mad, 1e-3 * abs(median), 1e-12)
    return (x - median) / scale > threshold


def test_the_rule_matches_a_plain_median_and_mad():
    generator = torch.Generator().manual_seed(0)
    series = (torch.randn(200, generator=generator) * 0.1 + 3).tolist()
    series[50], series[120], series[121] = 9.0, float("nan"), 30.0
    rule, size, warmup, threshold = SpikeWindow(16, 5, 4.0), 16, 5, 4.0
    history: list[float] = []
    found, expected = [], []
    for step, value in enumerate(series):
        spike, _ = rule.judge(torch.tensor([value, 1.0]), torch.tensor([True, False]))
        found.append(bool(spike))
        expected.append(reference_judgement(history[-size:], value, warmup, threshold))
        history.append(value)
    assert found == expected and found[50] and found[120] and found[121]
    saved = rule.to_dict()
    again = SpikeWindow(16, 5, 4.0)
    again.load(saved)
    x, watched = torch.tensor([3.9, 1.0]), torch.tensor([True, False])
    assert bool(again.judge(x, watched)[0]) == bool(rule.judge(x, watched)[0])
    assert again.to_dict() == rule.to_dict()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"action": "explode"}, "one of ['log', 'skip', 'rollback', 'stop']"),
    ({"window": 8, "warmup": 16}, "window=8 is shorter than warmup=16"),
    ({"threshold": 0}, "threshold must be a number > 0"),
    ({"watch": ["loss", "accuracy"]}, "watch must name some of"),
    ({"rollback_every": 0}, "rollback_every must be an integer >= 1"),
])
def test_bad_guard_arguments_are_refused_at_construction(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SpikeGuard(**kwargs)


def test_bad_health_arguments_are_refused():
    with pytest.raises(TypeError, match="groups must be None or a non-empty dict"):
        TrainingHealth(groups=["attention"])
    with pytest.raises(ValueError, match="every must be None or an integer"):
        TrainingHealth(every=0)
    with pytest.raises(ValueError, match="nothing to do"):
        TrainingHealth(norms=False, memory=False)
    with pytest.raises(ValueError, match=r"group\(s\) \['attention'\] match no trained parameter"):
        run(tmp="/tmp/hcp-health-groups", callbacks=[TrainingHealth(groups={"attention": "*.self_attn.*"})])


class Bypass:
    """Test-only reference: an optimizer whose step at call ``at`` does nothing and reads as skipped."""

    def __init__(self, optimizer: torch.optim.Optimizer, at: int) -> None:
        self.optimizer, self.at, self.calls, self.step_was_skipped = optimizer, at, 0, False

    def step(self) -> None:
        self.calls += 1
        self.step_was_skipped = self.calls == self.at
        if not self.step_was_skipped:
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


def run(tmp: str, callbacks=(), bypass: int = 0, steps: int = 14, poison: int = POISON, **args):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator))
            for _ in range(steps)]
    holder = {}

    def train_step(batch):
        x, y = batch
        loss = ((model(x) - y) ** 2).mean()
        if holder["trainer"].state.global_step + 1 == poison:
            loss = loss * 1000
        loss.backward()
        return loss

    options = {"output_dir": tmp, "max_steps": steps, "logging_steps": 5, "save_strategy": "no",
               "disable_tqdm": True, **args}
    trainer = LightweightTrainer(LoopArguments(**options), train_step=train_step, train_data=data,
                                 model=model,
                                 optimizer=Bypass(optimizer, bypass) if bypass else optimizer,
                                 lr_scheduler=schedule, callbacks=list(callbacks))
    holder["trainer"] = trainer
    trainer.train()
    return model, optimizer, schedule, trainer


GUARD = {"window": 8, "warmup": 4, "threshold": 50.0}


def test_skip_is_bit_identical_to_a_bypassed_step_and_leaves_the_schedule(tmp_path):
    guard = SpikeGuard("skip", **GUARD)
    model, optimizer, schedule, _ = run(str(tmp_path / "a"), [guard])
    ref_model, ref_optimizer, ref_schedule, _ = run(str(tmp_path / "b"), bypass=POISON)
    assert guard.spike_steps == guard.skipped_steps == [POISON]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    for a, b in zip(model.parameters(), ref_model.parameters()):
        sa, sb = optimizer.state[a], ref_optimizer.state[b]
        assert all(torch.equal(sa[k], sb[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert schedule.last_epoch == ref_schedule.last_epoch == 14 - 1  # the skipped step did not advance it
    plain_model, *_ = run(str(tmp_path / "c"))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), plain_model.parameters()))


def test_rollback_puts_back_the_copy_and_stop_saves(tmp_path):
    guard = SpikeGuard("rollback", rollback_every=4, **GUARD)
    run(str(tmp_path / "a"), [guard])
    assert guard.rollbacks == [[POISON, 8]]
    stop = SpikeGuard("stop", **GUARD)
    _, _, _, trainer = run(str(tmp_path / "b"), [stop])
    assert trainer.state.global_step == POISON and (tmp_path / "b" / f"checkpoint-{POISON}").is_dir()


class Counting:
    """Counts the host reads of tensors (``item``, ``tolist``, ``__bool__``, ``__float__``)."""

    NAMES = ("item", "tolist", "__bool__", "__float__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize(("action", "per_step"), [("log", 0), ("skip", 1)])
def test_host_reads_are_counted(tmp_path, monkeypatch, action, per_step):
    counter = Counting(monkeypatch)
    run(str(tmp_path / "plain"), poison=0)
    plain = counter.count
    counter.count = 0
    run(str(tmp_path / "guarded"), [SpikeGuard(action, **GUARD)], poison=0)
    logging_steps = 14 // 5
    assert counter.count - plain == logging_steps + per_step * 14


def test_layer_norms_equal_norms_computed_by_hand(tmp_path):
    seen = {}

    class ByHand:
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            seen["before"] = [p.detach().clone() for p in model.parameters()]

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen["grads"] = [p.grad.detach().clone() for p in model.parameters()]

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 10:
                after = list(model.parameters())
                seen[10] = {"grad": seen["grads"], "param": [p.detach().clone() for p in after],
                            "update": [p.detach() - b for p, b in zip(after, seen["before"])]}

    from hf_callbacks_plus.core.callback import TrainerCallback

    class Hand(ByHand, TrainerCallback):
        pass

    health = TrainingHealth(groups={"first": "0.*", "all": "*"})
    _, _, _, trainer = run(str(tmp_path), [Hand(), health], poison=0)
    record = next(r for r in trainer.state.log_history if r.get("step") == 10)
    for kind in ("grad", "param", "update"):
        tensors = seen[10][kind]
        first = math.sqrt(sum(float(t.norm()) ** 2 for t in tensors[:2]))
        every = math.sqrt(sum(float(t.norm()) ** 2 for t in tensors))
        assert math.isclose(record[f"health/{kind}_norm/first"], first, rel_tol=1e-6)
        assert math.isclose(record[f"health/{kind}_norm/all"], every, rel_tol=1e-6)
    rss = record["health/memory/host_rss_gb/rank0"] * 1024 ** 3
    assert record["health/memory/host_rss_gb/max"] == record["health/memory/host_rss_gb/rank0"]
    assert abs(rss - host_resident_bytes()) < 64 * 1024 ** 2
    with open("/proc/self/status", encoding="ascii") as handle:
        vm_rss = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS"))
    assert abs(rss - vm_rss) < 64 * 1024 ** 2


def test_layers_are_named_by_their_number_or_module():
    assert layer_of("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert layer_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == \
        "base_model.model.model.layers.0"
    assert layer_of("lm_head.weight") == "lm_head" and layer_of("bias") == "bias"


def test_out_of_memory_snapshot_without_cuda(tmp_path, monkeypatch):
    snapshot = OomSnapshot(str(tmp_path / "snap.pickle"))
    assert snapshot.start() is False and snapshot.dump() is None  # nothing recorded without CUDA
    written = []
    # named fake: the CUDA dump itself needs a GPU (benchmarks/gpu_health.py runs the real one)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: written.append(path))
    snapshot._recording = True
    assert snapshot.dump() == str(tmp_path / "snap.pickle") and snapshot.dump() == written[0]
    assert len(written) == 1


def test_trainer_plus_keeps_the_norm_before_clipping(tmp_path):
    pytest.importorskip("transformers")
    from hf_callbacks_plus import TrainerPlus
    from hf_callbacks_plus.core.callback import TrainerCallback
    from tests.tiny_models import make_trainer

    seen = []

    class PreClip(TrainerCallback):
        def on_pre_clip(self, args, state, control, model=None, **kwargs):
            seen.append(math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters())))

    trainer = make_trainer(tmp_path, [PreClip(), TrainingHealth(memory=False, groups={"all": "*"})],
                           trainer_class=TrainerPlus, max_steps=3, logging_steps=1, max_grad_norm=1e-3)
    trainer.train()
    records = [r for r in trainer.state.log_history if "loss" in r]
    assert len(seen) == 3
    for record, norm in zip(records, seen):
        assert norm > 1e-3 and math.isclose(record["grad_norm"], norm, rel_tol=1e-5)  # before clipping
        assert math.isclose(record["health/grad_norm/all"], norm, rel_tol=1e-5)


def test_a_stock_trainer_needs_binding(tmp_path):
    pytest.importorskip("transformers")
    from tests.tiny_models import make_trainer

    trainer = make_trainer(tmp_path, [SpikeGuard()], max_steps=2)
    with pytest.raises(RuntimeError, match="run_before_integrations"):
        trainer.train()


def test_the_plot_draws_one_panel_per_kind():
    from hf_callbacks_plus.plotting import collect_curves

    history = [{"step": s, "loss": 1.0, "health/grad_norm/model.layers.0": 0.1 * s,
                "health/grad_norm/lm_head": 0.2, "health/memory/host_rss_gb/rank0": 1.0} for s in (1, 2)]
    curves = collect_curves(history)
    assert set(curves.series["health/grad_norm"]) == {"model.layers.0", "lm_head"}
    assert set(curves.series["health/memory/host_rss_gb"]) == {"rank0"}


def test_a_resumed_rollback_goes_back_to_the_same_copy(tmp_path):
    """TrainerPlus, one process: copies every 3 steps, checkpoint-4 holds the copy of step 3 in its own
    file (spike_guard-rank0.pt); a run resumed from it rolls back at the spike (step 6) to step 3, as the
    uninterrupted run does, and ends with the same weights. Without the file the copy would restart at
    step 4 (and the rollback go to step 4)."""
    pytest.importorskip("transformers")
    from hf_callbacks_plus import TrainerPlus
    from tests.tiny_models import make_trainer

    def poisoned(folder, guard, **args):
        trainer = make_trainer(folder, [guard], trainer_class=TrainerPlus, max_steps=8, logging_steps=1,
                               lr_scheduler_type="constant", **args)
        original = trainer.compute_loss

        def compute_loss(model, inputs, *a, **k):
            loss = original(model, inputs, *a, **k)
            return loss * 1000 if trainer.state.global_step + 1 == 6 else loss

        trainer.compute_loss = compute_loss
        return trainer

    settings = {**GUARD, "warmup": 3, "rollback_every": 3}
    guard = SpikeGuard("rollback", **settings)
    first = poisoned(tmp_path / "a", guard, save_strategy="steps", save_steps=4)
    first.train()
    assert guard.rollbacks == [[6, 3]]
    assert (tmp_path / "a" / "checkpoint-4" / "spike_guard-rank0.pt").is_file()
    resumed_guard = SpikeGuard("rollback", **settings)
    resumed = poisoned(tmp_path / "a", resumed_guard)  # the copy is read from checkpoint-N of output_dir
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    assert resumed_guard.rollbacks == [[6, 3]] and resumed_guard.spike_steps == [6]
    for a, b in zip(first.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
