"""A training with Deadline that a test signals from outside, at a gate: python or torchrun runs it.

Usage: ``[torchrun --nproc_per_node 2] deadline_script.py OUT [--gate MOMENT:STEP[:RANKS]] [--resume]
[--exit-code] [--mlflow URI]``

* ``--gate step:5`` (``evaluation:4``, ``save:8``; ranks ``0``, ``1`` or ``01``, default all): at that
  moment the rank writes its pid to ``OUT/ready-rank<R>`` and waits until its Deadline recorded a signal (the
  test sends it then) or ``OUT/go`` exists; then it writes ``OUT/got-rank<R>`` (fault injection: the
  signal lands exactly there). It gives up after 300 s (exit code 3).
* At the end each rank writes ``OUT/result-rank<R>.json`` (steps, the ending, the signals received);
  ``--exit-code`` exits with ``Deadline.exit_code`` (one process; under torchrun the workers exit 0
  and the status file ``OUT/run/status.json`` tells the job script).

The run is a stock ``transformers.Trainer`` wired with ``run_before_integrations`` (the logging window
travels), a ``JsonlLogger`` and optionally an ``MLflowLogger``, in ``OUT/run``; the in-process
`build` gives the tests the same trainer for the resume and the uninterrupted reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from tests.callbacks.deadline_helpers import ARGS, DISTRIBUTED  # noqa: E402

GATE_TIMEOUT_SECONDS = 300


def build(run_dir: Path, gate: Any = None, mlflow: Optional[str] = None, status: bool = True):
    """The trainer (and its Deadline) of this script, for ``run_dir``."""
    from hf_callbacks_plus import Deadline, JsonlLogger, run_before_integrations
    from tests.tiny_models import make_trainer

    deadline = Deadline(margin=0, status_file=run_dir / "status.json" if status else None)
    loggers: list = [JsonlLogger()]
    if mlflow:
        from hf_callbacks_plus import MLflowLogger

        loggers.append(MLflowLogger(tracking_uri=mlflow, experiment_name=run_dir.name))
    args = {**ARGS, **(DISTRIBUTED if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {})}
    trainer = make_trainer(run_dir, callbacks=[deadline, *([gate] if gate else []), *loggers], **args)
    run_before_integrations(trainer, deadline)
    return trainer, deadline


class Gate(TrainerCallback):
    """Fault injection: waits at a moment of a step until the test's signal was recorded (see the module)."""

    def __init__(self, out: Path, moment: str, step: int, rank: int) -> None:
        self.out, self.moment, self.step, self.rank = out, moment, step, rank
        self.deadline: Any = None
        self.done = False
        self._patched: Any = None

    def wait(self) -> None:
        if self.done:
            return
        self.done = True
        ready = self.out / f"ready-rank{self.rank}"  # whole when it appears: the test reads it at once
        ready.with_suffix(".partial").write_text(str(os.getpid()))
        os.replace(ready.with_suffix(".partial"), ready)
        end = time.monotonic() + GATE_TIMEOUT_SECONDS
        while self.deadline._flag.received is None and not (self.out / "go").exists():
            if time.monotonic() > end:
                sys.exit(3)
            time.sleep(0.01)
        (self.out / f"got-rank{self.rank}").touch()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.moment == "save":  # inside every rank's save: its RNG state is written by each rank
            from transformers import Trainer

            original, gate = Trainer._save_rng_state, self

            def save_rng_state(trainer, output_dir):
                if Path(output_dir).name == f"checkpoint-{gate.step}":
                    gate.wait()
                return original(trainer, output_dir)

            Trainer._save_rng_state, self._patched = save_rng_state, original

    def on_train_end(self, args, state, control, **kwargs):
        if self._patched is not None:
            from transformers import Trainer

            Trainer._save_rng_state, self._patched = self._patched, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.moment == "step" and state.global_step + 1 == self.step:
            self.wait()

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.moment == "evaluation" and state.global_step == self.step:
            self.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--gate", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--exit-code", action="store_true")
    parser.add_argument("--mlflow", default=None)
    options = parser.parse_args()
    out, rank = Path(options.out), int(os.environ.get("RANK", "0"))
    gate = None
    if options.gate:
        moment, step, *ranks = options.gate.split(":")
        if not ranks or str(rank) in ranks[0]:
            gate = Gate(out, moment, int(step), rank)
    trainer, deadline = build(out / "run", gate, options.mlflow)
    if gate is not None:
        gate.deadline = deadline
    trainer.train(resume_from_checkpoint=True if options.resume else None)
    result = {
        "global_step": trainer.state.global_step,
        "exit_code": deadline.exit_code,
        "label": deadline.ending.label,
        "received": deadline._flag.all_received,
        "signal_to_checkpoint": deadline.signal_to_checkpoint,
    }
    (out / f"result-rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # as docs/distributed.md says: gloo's threads can
        dist.destroy_process_group()  # abort a rank in the interpreter's teardown (pytorch#190489)
    if options.exit_code:
        sys.exit(deadline.exit_code)


if __name__ == "__main__":
    main()
