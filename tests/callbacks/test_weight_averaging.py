"""WeightAveraging in one process: the rules against their formulas, the average against a float64
reference computed here from the weights after each optimizer step, trl's BEMACallback side by side,
skipped steps, evaluation on the average leaving training bit-identical, checkpoints and resume,
restore_best on the average, the end, and bad input. The engines: test_weight_averaging_sharded.py."""

from __future__ import annotations

import json
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
        now = {n: p.detach().double().clone() for n, p in self.model.named_parameters()}
        self.after_step.append((applied, now))

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
                warm = 1 - (1 + (t - 1) / rule.warmup_gamma) ** -rule.warmup_power
                decay = 0.0 if t - 1 <= 0 else min(warm, rule.decay)
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


# -- a stock Trainer: evaluation on the average, checkpoints, resume, the end ---------------------


class StopAt(TrainerCallback):
    """Ends the run after the checkpoint of ``step`` (standing in for a crash after it)."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def lm_trainer(output_dir, callbacks=(), *, trainer_class=None, model=None, bind=True, **overrides):
    """A stock Trainer (or ``trainer_class``) on the tiny Llama with the local tokenizer."""
    from transformers import Trainer

    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests.sharded import lm_rows
    from tests.tiny_models import training_args
    from tests.trl_peft import tiny_lm

    values = {"max_steps": 6, "learning_rate": 5e-3, "per_device_train_batch_size": 4,
              "per_device_eval_batch_size": 4, "eval_strategy": "steps", "eval_steps": 2, "logging_steps": 1,
              "save_strategy": "steps", "save_steps": 2}
    values.update(overrides)
    trainer = (trainer_class or Trainer)(
        model=model if model is not None else tiny_lm.causal_lm(), args=training_args(output_dir, **values),
        train_dataset=lm_rows(0, 32), eval_dataset=lm_rows(1000, 8), processing_class=tiny_lm.tokenizer(),
        callbacks=list(callbacks))
    if bind:
        run_before_integrations(trainer)
    return trainer


def without_timing(history):
    timing = ("runtime", "per_second", "preparation_time")
    return [{k: v for k, v in record.items() if not any(t in k for t in timing)} for record in history]


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("evaluate_on", ["both", pytest.param("average", marks=pytest.mark.second_tier)])
def test_evaluating_on_the_average_trains_exactly_as_without_it(tmp_path, evaluate_on):
    """With TrainSubsetEvaluation and GenerationSamples beside it: the training records and weights
    of a run that evaluates on the average are bit-identical to a run without WeightAveraging; the
    raw evaluations too ("both"); the averaged ones are under ``eval_ema_`` / ``train_subset_ema_`` /
    ``step-N-ema.jsonl``, measured on the average (the weights at that evaluation equal a float64
    reference average of the weights after each optimizer step)."""
    from hf_callbacks_plus import GenerationSamples, TrainSubsetEvaluation
    from tests.sharded import prompts

    def run(folder, extra):
        model_recorder = []
        samples = GenerationSamples(prompts(2), max_new_tokens=3)
        trainer = lm_trainer(folder, [TrainSubsetEvaluation(size=4), samples, *extra, *model_recorder])
        return trainer

    baseline = run(tmp_path / "without", [])
    baseline.train()
    averaging = WeightAveraging(EMA(0.7), evaluate_on=evaluate_on)
    trainer = run(tmp_path / "with", [averaging])
    recorder = Recorder(trainer.model)
    trainer.add_callback(recorder)
    trainer.add_callback(Initial(recorder))
    trainer.train()
    ours, theirs = without_timing(trainer.state.log_history), without_timing(baseline.state.log_history)
    averaged = [r for r in ours if any(k.startswith(("eval_ema_", "train_subset_ema_")) for k in r)]
    raw = [r for r in ours if r not in averaged]
    if evaluate_on == "both":
        assert raw == theirs
    else:
        assert raw == [r for r in theirs if "eval_loss" not in r]
    assert weights(trainer.model).keys() == weights(baseline.model).keys()
    for name, tensor in weights(trainer.model).items():
        assert torch.equal(tensor, weights(baseline.model)[name]), name
    assert [r["step"] for r in averaged] == [2, 4, 6]
    for record in averaged:
        assert {"eval_ema_loss", "train_subset_ema_loss"} <= set(record)
    assert (tmp_path / "with" / "generations" / "step-4-ema.jsonl").is_file()
    assert (tmp_path / "with" / "generations" / "step-4.jsonl").is_file() == (evaluate_on == "both")
    # what was evaluated: the average, as computed here
    rule = averaging.rule
    steps = [w for applied, w in recorder.after_step if applied]
    for step in (2, 4, 6):
        recorder_cut = Recorder(None)
        recorder_cut.after_step, recorder_cut.initial = [(True, w) for w in steps[:step]], recorder.initial
        expected = reference(recorder_cut, rule)
        evaluated = recorder.at_eval[(step, "eval_ema_loss")]
        for name, tensor in evaluated.items():
            torch.testing.assert_close(tensor.double(), expected[name], rtol=1e-6, atol=1e-6)
    # the trained weights are not the average
    assert any(not torch.equal(evaluated[n], t) for n, t in weights(trainer.model).items())


@pytest.mark.parametrize("stop", [pytest.param(2, marks=pytest.mark.second_tier), 4])
def test_a_run_resumed_from_any_checkpoint_ends_bit_identical(tmp_path, stop):
    """A run stopped after checkpoint-``stop`` and resumed by a new trainer (new callbacks) ends
    with the same average, weights and records as the run that was not interrupted."""
    whole = WeightAveraging(BEMA(lag=2), update_every=2, update_after=1)
    uninterrupted = lm_trainer(tmp_path / "whole", [whole])
    uninterrupted.train()
    lm_trainer(tmp_path / "cut", [WeightAveraging(BEMA(lag=2), update_every=2, update_after=1),
                                  StopAt(stop)]).train()
    files = sorted(p.name for p in (tmp_path / "cut" / f"checkpoint-{stop}").iterdir())
    assert "weight_average-bema.safetensors" in files
    resumed = WeightAveraging(BEMA(lag=2), update_every=2, update_after=1)
    again = lm_trainer(tmp_path / "cut", [resumed])
    again.train(resume_from_checkpoint=str(tmp_path / "cut" / f"checkpoint-{stop}"))
    assert (resumed.steps, resumed.updates) == (whole.steps, whole.updates) == (6, 2)
    for buffer, tensors in whole.average.buffers.items():
        for name, tensor in tensors.items():
            assert torch.equal(resumed.average.buffers[buffer][name], tensor), (buffer, name)
    for name, tensor in weights(uninterrupted.model).items():
        assert torch.equal(weights(again.model)[name], tensor), name
    ours, theirs = without_timing(again.state.log_history), without_timing(uninterrupted.state.log_history)
    for record in (ours[-1], theirs[-1]):  # the mean loss of this train() call's own steps (transformers)
        record.pop("train_loss")
    assert ours == theirs


def test_restore_best_on_the_averaged_metric_restores_the_averaged_weights(tmp_path):
    """EarlyStopping(monitor="eval_ema_loss", restore_best=True): the weights at the end are the
    averaged weights of the best averaged evaluation (``mode="max"``: the first), not the training
    weights of that step's checkpoint."""
    from hf_callbacks_plus import EarlyStopping, KeepBestCheckpoints

    stopper = EarlyStopping("eval_ema_loss", mode="max", patience=100, restore_best=True, verbose=False)
    keeper = KeepBestCheckpoints("eval_ema_loss", mode="max", verbose=False)
    trainer = lm_trainer(tmp_path, [WeightAveraging(EMA(0.5)), stopper, keeper])
    recorder = Recorder(trainer.model)
    trainer.add_callback(recorder)
    trainer.train()
    assert stopper.best_step == 2
    kept = tmp_path / "best_checkpoints" / "checkpoint-2"  # KeepBestCheckpoints ranks the average too
    assert [entry.step for entry in keeper.entries] == [2]
    assert (kept / "weight_average-ema.safetensors").is_file()
    final, at_best = weights(trainer.model), recorder.at_eval[(2, "eval_ema_loss")]
    raw_at_best = recorder.at_eval[(2, "eval_loss")]
    for name, tensor in final.items():
        assert torch.equal(tensor, at_best[name]), name
    assert any(not torch.equal(at_best[n], raw_at_best[n]) for n in final)


def test_the_end_keeps_or_puts_the_average_and_exports_a_peft_adapter(tmp_path):
    """A LoRA model: the average is the adapter's size; ``export_dir`` holds the averaged adapter,
    which ``PeftModel.from_pretrained`` loads; ``at_end="average"`` puts it in the model."""
    from peft import PeftModel, get_peft_model

    from tests.trl_peft import tiny_lm

    for at_end in ("keep", "average"):
        model = get_peft_model(tiny_lm.causal_lm(), tiny_lm.lora_config())
        averaging = WeightAveraging(EMA(0.6), evaluate_on="raw", at_end=at_end,
                                    export_dir=tmp_path / at_end / "averaged")
        trainer = lm_trainer(tmp_path / at_end, [averaging], model=model, eval_strategy="no",
                             save_strategy="no")
        trainer.train()
        trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
        average = averaging.average.buffers["average"]
        assert set(average) == set(trained)  # the adapter only
        assert averaging.average.nbytes == sum(4 * p.numel() for p in trained.values())
        loaded = PeftModel.from_pretrained(tiny_lm.causal_lm(), str(tmp_path / at_end / "averaged"))
        exported = dict(loaded.named_parameters())
        for name, tensor in average.items():
            assert torch.equal(exported[name].detach(), tensor), name
            assert torch.equal(trained[name].detach(), tensor) == (at_end == "average"), name


def test_checkpoint_files_are_written_inside_the_save(tmp_path):
    """The average's file is in the checkpoint before its trainer_state.json: a save killed between
    the two leaves a folder without the state file (incomplete), never one without the average."""
    from transformers import Trainer

    order = []
    original = Trainer._save_rng_state

    def save_rng_state(self, output_dir):
        order.append(sorted(p.name for p in Path(output_dir).iterdir()))
        return original(self, output_dir)

    Trainer._save_rng_state = save_rng_state
    try:
        lm_trainer(tmp_path, [WeightAveraging()], max_steps=2, eval_strategy="no").train()
    finally:
        Trainer._save_rng_state = original
    assert order and all("weight_average-ema.safetensors" in names and "trainer_state.json" not in names
                         for names in order)


# -- bad input at train begin -------------------------------------------------------------------


def test_a_stock_trainer_that_did_not_bind_it_is_refused(tmp_path):
    trainer = lm_trainer(tmp_path, [WeightAveraging()], bind=False, max_steps=1)
    with pytest.raises(RuntimeError, match=r"run_before_integrations\(trainer\)"):
        trainer.train()


@pytest.mark.parametrize(("averaging", "args", "message"), [
    (WeightAveraging(at_end="average"), {"load_best_model_at_end": True, "metric_for_best_model": "loss",
                                         "save_strategy": "steps", "eval_strategy": "steps"},
     "both set the final weights"),
    (WeightAveraging(), {"load_best_model_at_end": True, "metric_for_best_model": "ema_loss",
                         "save_strategy": "steps", "eval_strategy": "steps"}, "restore_best=True"),
    (WeightAveraging(evaluate_on="average"), {"metric_for_best_model": "loss"}, "use 'ema_loss'"),
])
def test_settings_that_cannot_hold_are_refused_at_train_begin(tmp_path, averaging, args, message):
    values = {"output_dir": str(tmp_path), "max_steps": 2, "disable_tqdm": True, "eval_steps": 1,
              "save_steps": 1}
    values.update(args)
    trainer, _, _ = lightweight(tmp_path, [averaging], **values)
    with pytest.raises(ValueError, match=message):
        trainer.train()


def test_nothing_trainable_two_instances_and_restore_best_with_the_average_in_the_end(tmp_path):
    from hf_callbacks_plus import EarlyStopping

    trainer, model, _ = lightweight(tmp_path, [WeightAveraging()])
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        trainer.train()
    trainer, _, _ = lightweight(tmp_path, [WeightAveraging(), WeightAveraging(label="other")])
    with pytest.raises(ValueError, match="one average per trainer"):
        trainer.train()
    trainer, _, _ = lightweight(tmp_path, [WeightAveraging(at_end="average"),
                                           EarlyStopping("eval_loss", restore_best=True)],
                                eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError, match="EarlyStopping"):
        trainer.train()


@pytest.mark.second_tier
def test_a_resume_from_a_model_only_checkpoint_is_refused(tmp_path):
    lm_trainer(tmp_path, [WeightAveraging()], max_steps=2, eval_strategy="no", save_only_model=True).train()
    again = lm_trainer(tmp_path, [WeightAveraging()], max_steps=4, eval_strategy="no", save_only_model=True)
    with pytest.raises(ValueError, match="save_only_model=True"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


# -- every trainer the package runs in ------------------------------------------------------------


def reward_words(completions, **kwargs):
    return [float(len(completion.split())) for completion in completions]


def trainer_of(kind, output_dir, callbacks):
    """A short run of ``kind`` on the tiny LM, bound with ``run_before_integrations``."""
    from hf_callbacks_plus import TrainerPlus
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests.trl_peft import runs

    if kind == "trainer_plus":
        return lm_trainer(output_dir, callbacks, trainer_class=TrainerPlus, max_steps=4, save_strategy="no")
    if kind == "grpo":
        import trl
        from datasets import Dataset

        prompts = [" ".join(text.split()[:3]) for text in runs.tiny_lm.texts()]
        args = trl.GRPOConfig(output_dir=str(output_dir), max_steps=4, eval_strategy="steps", eval_steps=2,
                              logging_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                              num_generations=2, num_generations_eval=2, max_completion_length=4,
                              learning_rate=1e-2, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
                              save_strategy="no")
        trainer = trl.GRPOTrainer(model=runs.tiny_lm.causal_lm(), reward_funcs=reward_words, args=args,
                                  train_dataset=Dataset.from_list([{"prompt": p} for p in prompts[:16]]),
                                  eval_dataset=Dataset.from_list([{"prompt": p} for p in prompts[1000:1004]]),
                                  processing_class=runs.tiny_lm.tokenizer(), callbacks=list(callbacks))
    else:
        trainer = runs.trainer(kind.removesuffix("_lora"), output_dir, callbacks=callbacks,
                               peft=kind.endswith("_lora"))
    run_before_integrations(trainer)
    return trainer


@pytest.mark.second_tier
@pytest.mark.parametrize("kind", ["trainer_plus", "sft_lora", "dpo", "grpo"])
def test_every_trainer_trains_as_without_and_evaluates_the_average(tmp_path, kind):
    """TrainerPlus, trl's SFT (LoRA), DPO and GRPO (which samples at each evaluation): the records
    of the training and of the raw evaluations are those of the run without WeightAveraging; each
    evaluation set gets an averaged evaluation whose every eval key carries the label (trl's own
    ``eval_`` metrics too)."""
    from tests.trl_peft import runs

    baseline = trainer_of(kind, tmp_path / "without", [])
    baseline.train()
    averaging = WeightAveraging(EMA(0.5))
    trainer = trainer_of(kind, tmp_path / "with", [averaging])
    trainer.train()
    def history(run):  # GRPO's step_time is a timing too
        return [{k: v for k, v in record.items() if k != "step_time"} for record in runs.history(run)]

    ours = history(trainer)
    averaged = [r for r in ours if any("ema_" in k for k in r if k.startswith("eval_"))]
    assert [r for r in ours if r not in averaged] == history(baseline)
    assert averaged and averaging.updates == 4
    for record in trainer.state.log_history:
        if not any("ema_" in k for k in record if k.startswith("eval_")):
            continue
        labelled = [k for k in record if k.startswith("eval_")]
        prefix = next(k for k in labelled if k.endswith("_runtime"))[: -len("_runtime")]
        assert prefix.endswith("_ema") and all(k.startswith(prefix + "_") for k in labelled), record


@pytest.mark.second_tier
def test_a_run_killed_inside_a_save_resumes_from_the_last_complete_checkpoint_bit_identical(tmp_path):
    """A real SIGKILL of the training process inside the save of checkpoint-4 (its model and the
    average's file written, not its trainer_state.json): the folder is incomplete, TrainerPlus
    resumes from checkpoint-2, and the run ends with the average, weights and records of the
    uninterrupted one."""
    from tests.callbacks.weight_averaging_kill_script import run
    from tests.kill_at_pause import kill_when_paused

    script = str(Path(__file__).with_name("weight_averaging_kill_script.py"))
    killed = tmp_path / "killed"
    killed.mkdir()
    kill_when_paused(script, [str(killed), "4"], killed / "paused", tmp_path / "stderr.txt")
    half = sorted(p.name for p in (killed / "checkpoint-4").iterdir())
    assert "weight_average-bema.safetensors" in half and "trainer_state.json" not in half
    resumed, averaging = run(str(killed), resume=True)
    whole, uninterrupted = run(str(tmp_path / "whole"))
    assert averaging.steps == uninterrupted.steps == 6
    for buffer, tensors in uninterrupted.average.buffers.items():
        for name, tensor in tensors.items():
            assert torch.equal(averaging.average.buffers[buffer][name], tensor), (buffer, name)
    for name, tensor in weights(whole.model).items():
        assert torch.equal(weights(resumed.model)[name], tensor), name
    ours, theirs = without_timing(resumed.state.log_history), without_timing(whole.state.log_history)
    for record in (ours[-1], theirs[-1]):
        record.pop("train_loss")
    assert ours == theirs
