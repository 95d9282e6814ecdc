"""The scenario that trains under each sharding engine with ``WeightAveraging`` (tests/sharded.py
runs the engines; the test is test_weight_averaging_sharded.py).

Under ``engine`` and a trainer kind, on the 2 ranks of the suite's launch, the tiny Llama trains
``STEPS`` steps, evaluating and saving every ``EVERY`` steps:

* ``without``: no WeightAveraging (the training to match);
* ``with``: ``WeightAveraging(EMA(DECAY), evaluate_on="both")`` and a test-side `Reference`,
  independent of the callback: every parameter gathered whole at train begin and after each
  optimizer step (``sharded.full_weights``, a collective), averaged in float64; at each evaluation
  on the average it gathers the weights being evaluated;
* ``cut``: the same, stopped after checkpoint ``STOP_AT``, then a new trainer with a new callback
  resumes from it (``resumed``; ``average-read-rank<R>.pt``: what each rank read back).

Each rank writes ``outcome-rank<R>.json`` (records of every run, its average's size and kind) and
``average-<run>-rank<R>.pt`` (its buffers); rank 0 writes ``reference.pt`` (the float64 reference
after each step), ``evaluated.pt`` (the weights each averaged evaluation ran on), and the final
weights of each run (``final-<run>.pt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tests.callbacks.sharded_callbacks import StopAt

STEPS, EVERY, STOP_AT, DECAY = 6, 2, 4, 0.7


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


class Reference(TrainerCallback):
    """The float64 average of the gathered weights after each optimizer step; the gathered weights
    each averaged evaluation ran on."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.average: dict[str, Any] = {}
        self.after: dict[int, dict[str, Any]] = {}
        self.evaluated: dict[int, dict[str, Any]] = {}

    def _gather(self) -> dict[str, Any]:
        from tests import sharded

        return {name: tensor.double() for name, tensor in sharded.full_weights(self.trainer).items()}

    def on_train_begin(self, args, state, control, **kwargs):
        self.average = self._gather()

    def on_step_end(self, args, state, control, **kwargs):
        now = self._gather()
        self.average = {name: DECAY * self.average[name] + (1 - DECAY) * now[name] for name in now}
        self.after[state.global_step] = {name: tensor.clone() for name, tensor in self.average.items()}

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if any(key.startswith("eval_ema_") for key in metrics or {}):
            self.evaluated[state.global_step] = self._gather()


class AtTrainBegin(TrainerCallback):
    """Saves this rank's average as ``averaging`` holds it right after its train begin (after a
    resume: read back from the checkpoint)."""

    def __init__(self, averaging: Any, path: Path) -> None:
        self.averaging, self.path = averaging, path

    def on_train_begin(self, args, state, control, **kwargs):
        import torch

        torch.save(self.averaging.average.flat(), self.path)


def averaging_under_engine(out: Path, engine: str, trainer: str = "trainer") -> None:
    """See the module docstring."""
    import torch

    from hf_callbacks_plus.callbacks.weight_averaging import EMA, WeightAveraging
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests import sharded

    kwargs = {"max_steps": STEPS, "eval_strategy": "steps", "eval_steps": EVERY, "save_strategy": "steps",
              "save_steps": EVERY}
    outcome: dict[str, Any] = {}

    def build(folder: str, callbacks: list) -> Any:
        built = sharded.make_trainer(engine, out / folder, trainer=trainer, callbacks=callbacks, **kwargs)
        run_before_integrations(built)
        return built

    def finish(name: str, built: Any, averaging: Any = None) -> None:
        outcome[name] = sharded.records(built)
        final = sharded.full_weights(built)
        if averaging is not None:
            torch.save(averaging.average.flat(), out / f"average-{name}-rank{rank()}.pt")
            outcome[f"{name}_average"] = {"steps": averaging.steps, "updates": averaging.updates,
                                          "nbytes": averaging.average.nbytes,
                                          "keys": sorted(averaging.average.buffers["average"])}
        if rank() == 0:
            torch.save(final, out / f"final-{name}.pt")

    with sharded.sharded_on_cpu():
        without = build("without", [])
        without.train()
        finish("without", without)

        reference = Reference()
        averaging = WeightAveraging(EMA(DECAY))
        run = build("with", [averaging, reference])
        reference.trainer = run
        run.train()
        finish("with", run, averaging)
        outcome["files"] = sorted(str(path.relative_to(out / "with"))
                                  for path in (out / "with").glob("checkpoint-*/weight_average-*"))
        if rank() == 0:
            torch.save({"after": reference.after, "evaluated": reference.evaluated}, out / "reference.pt")

        build("cut", [WeightAveraging(EMA(DECAY)), StopAt(STOP_AT)]).train()
        averaging = WeightAveraging(EMA(DECAY))
        resumed = build("cut", [averaging, AtTrainBegin(averaging, out / f"average-read-rank{rank()}.pt")])
        resumed.train(resume_from_checkpoint=str(out / "cut" / f"checkpoint-{STOP_AT}"))
        finish("resumed", resumed, averaging)
    sharded.write_json(out, outcome)
