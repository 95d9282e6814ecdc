"""WeightAveraging in one process: the rules against their formulas, the average against a float64
reference computed here from the weights after each optimizer step, trl's BEMACallback side by side,
skipped steps, evaluation on the average leaving training bit-identical, checkpoints and resume,
restore_best on the average, the end, and bad input. The engines: test_weight_averaging_sharded.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hf_callbacks_plus.callbacks.weight_averaging import BEMA, EMA, WeightAveraging
from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

pytestmark = pytest.mark.transformers


# -- the rules, against their formulas -----------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 3, 10, 1000])
def test_the_rules_follow_timm_and_trl(t):
    assert EMA(0.99).weight(t) == pytest.approx(0.01)
    timm_step = max(0, t - 1)  # timm ModelEmaV3.get_decay(step=t), update_after_step=0
    timm = 0.0 if timm_step <= 0 else max(min(1 - (1 + timm_step / 2.0) ** -0.75, 0.995), 0.0)
    assert EMA(0.995, warmup=True, warmup_gamma=2.0, warmup_power=0.75).weight(t) == 1.0 - timm
    bema = BEMA(ema_power=0.5, bias_power=0.2, lag=10, multiplier=1.0, min_ema_multiplier=0.05)
    assert bema.weight(t) == max((10 + t) ** -0.5, 0.05)  # trl's _ema_beta
    assert bema.correction(t) == (10 + t) ** -0.2  # trl's _bema_alpha
    assert BEMA(bias_power=None).correction(t) == 0.0


@pytest.mark.parametrize(("make", "message"), [
    (lambda: EMA(decay=1.0), "decay must be a number in (0, 1)"),
    (lambda: EMA(decay=0), "decay must be a number in (0, 1)"),
    (lambda: EMA(decay=float("nan")), "decay"),
    (lambda: BEMA(lag=0), "lag must be"),
    (lambda: BEMA(min_ema_multiplier=2), "min_ema_multiplier"),
    (lambda: WeightAveraging(update_every=0), "update_every must be an int >= 1, got 0"),
    (lambda: WeightAveraging(update_after=-1), "update_after must be an int >= 0"),
    (lambda: WeightAveraging(evaluate_on="ema"), "evaluate_on must be one of ('average', 'raw', 'both')"),
    (lambda: WeightAveraging(at_end="best"), "at_end must be one of"),
    (lambda: WeightAveraging("swa"), "method must be 'ema', 'bema'"),
    (lambda: WeightAveraging(label="my ema"), "label must be a word"),
    (lambda: WeightAveraging(device="cuda"), "device must be None"),
])
def test_bad_arguments_are_refused_at_construction(make, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_the_state_rebuilds_the_same_callback():
    averaging = WeightAveraging(BEMA(lag=5, bias_power=None), update_every=3, label="slow")
    again = WeightAveraging.from_state(json.loads(json.dumps(averaging.state())))
    assert again.rule == averaging.rule and again.state_args() == averaging.state_args()


# -- a LightweightTrainer run and a float64 reference ---------------------------------------------


class Recorder(TrainerCallback):
    """The trained weights after every optimizer step (float64), and at each evaluation."""

    def __init__(self, model):
        self.model, self.after_step, self.at_eval = model, [], {}

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        applied = not getattr(optimizer, "step_was_skipped", False)
        self.after_step.append((applied, {n: p.detach().double().clone() for n, p in self.model.named_parameters()}))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.at_eval[(state.global_step, next(iter(metrics)))] = {
            n: p.detach().clone() for n, p in self.model.named_parameters()}


class SkippingOptimizer:
    """Stands in for an optimizer whose step the trainer saw skipped (accelerate's
    ``step_was_skipped``: fp16 overflow, ZeRO overflow, a spike guard): on the steps listed it
    does not step and says so."""

    def __init__(self, optimizer, skip):
        self.optimizer, self.skip, self.calls, self.step_was_skipped = optimizer, set(skip), 0, False

    def step(self):
        self.calls += 1
        self.step_was_skipped = self.calls in self.skip
        if not self.step_was_skipped:
            self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()


def lightweight(tmp_path, callbacks, *, steps=8, skip=(), seed=0, **args):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model[0].bias.requires_grad_(False)  # frozen: never averaged
    optimizer = SkippingOptimizer(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                    lr=0.05), skip)
    generator = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(8, 4, generator=generator), "y": torch.randn(8, 1, generator=generator)}
            for _ in range(steps)]

    def train_step(batch):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        return float(loss.detach())

    def eval_fn(_):
        with torch.no_grad():
            return {"loss": sum(float(torch.nn.functional.mse_loss(model(b["x"]), b["y"])) for b in data)}

    values = {"output_dir": str(tmp_path), "max_steps": steps, "logging_steps": 2, "save_strategy": "no",
              "disable_tqdm": True}
    values.update(args)
    recorder = Recorder(model)
    trainer = LightweightTrainer(LoopArguments(**values), train_step=train_step, train_data=data, model=model,
                                 optimizer=optimizer, callbacks=[*callbacks, recorder], eval_fn=eval_fn)
    return trainer, model, recorder


def reference(recorder, rule, update_every=1, update_after=0):
    """The average computed here, in float64, from the weights after each applied step."""
    weights = [w for applied, w in recorder.after_step if applied]
    start = {n: w.clone() for n, w in recorder.initial.items()}
    ema, origin, average = dict(start), dict(start), dict(start)
    for n, now in enumerate(weights, start=1):
        if n <= update_after:
            ema, origin, average = dict(now), dict(now), dict(now)
            continue
        t = n - update_after
        if t % update_every:
            continue
        if isinstance(rule, EMA):
            decay = rule.decay
            if rule.warmup:
                decay = 0.0 if t - 1 <= 0 else min(1 - (1 + (t - 1) / rule.warmup_gamma) ** -rule.warmup_power,
                                                   rule.decay)
            average = {k: decay * average[k] + (1 - decay) * now[k] for k in now}
        else:
            beta = max((rule.lag + rule.multiplier * t) ** -rule.ema_power, rule.min_ema_multiplier)
            alpha = 0.0 if rule.bias_power is None else (rule.lag + rule.multiplier * t) ** -rule.bias_power
            ema = {k: (1 - beta) * ema[k] + beta * now[k] for k in now}
            average = {k: ema[k] + alpha * (now[k] - origin[k]) for k in now}
    return average


class Initial(TrainerCallback):
    def __init__(self, recorder):
        self.recorder = recorder

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.recorder.initial = {n: p.detach().double().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("rule", "every", "after", "skip"), [
    (EMA(0.9), 1, 0, ()),
    (EMA(0.99, warmup=True), 1, 0, (3, 4)),
    (EMA(0.8), 3, 2, (2,)),
    (BEMA(), 1, 0, ()),
    (BEMA(lag=3, min_ema_multiplier=0.2), 2, 1, (5,)),
    (BEMA(bias_power=None), 1, 0, (1,)),
])
def test_the_average_equals_a_float64_reference_and_skips_skipped_steps(tmp_path, rule, every, after, skip):
    averaging = WeightAveraging(rule, update_every=every, update_after=after, evaluate_on="raw")
    trainer, model, recorder = lightweight(tmp_path, [averaging], skip=skip)
    trainer.callback_handler.callbacks.insert(1, Initial(recorder))
    trainer.train()
    assert averaging.steps == 8 - len(skip)
    expected = reference(recorder, rule, every, after)
    got = averaging.average.buffers["average"]
    assert set(got) == {n for n, p in model.named_parameters() if p.requires_grad}  # trainable only
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor.double(), expected[name], rtol=1e-6, atol=1e-6)


# -- trl's BEMACallback, side by side -------------------------------------------------------------


def test_bema_gives_trl_bema_weights_for_the_same_arguments(tmp_path):
    """One stock Trainer, both callbacks: trl's ``running_model`` and our average hold the same
    weights (to float32 rounding: trl multiplies and adds, we ``lerp``)."""
    from transformers import Trainer
    from trl.trainer.callbacks import BEMACallback

    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests.tiny_models import lm_rows, tiny_causal_lm, training_args

    arguments = {"update_freq": 2, "ema_power": 0.4, "bias_power": 0.3, "lag": 5, "multiplier": 2.0,
                 "min_ema_multiplier": 0.01}
    theirs = BEMACallback(**arguments, update_after=0)
    ours = WeightAveraging(BEMA(**{k: v for k, v in arguments.items() if k != "update_freq"}),
                           update_every=arguments["update_freq"], evaluate_on="raw")
    trainer = Trainer(model=tiny_causal_lm(), args=training_args(tmp_path, max_steps=6, learning_rate=0.05),
                      train_dataset=lm_rows(48), callbacks=[theirs, ours])
    run_before_integrations(trainer)
    trainer.train()
    assert ours.updates == 3
    running = dict(theirs.running_model.named_parameters())
    for name, tensor in ours.average.buffers["average"].items():
        torch.testing.assert_close(tensor, running[name].detach().float(), rtol=2e-6, atol=2e-6)
    moved = [n for n, t in ours.average.buffers["average"].items()
             if not torch.equal(t, dict(trainer.model.named_parameters())[n].detach())]
    assert moved  # the average is not the weights
