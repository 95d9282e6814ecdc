"""Our callbacks in a stock ``transformers.Trainer``: pass them in ``callbacks=[...]``.

    python examples/stock_trainer.py [output_dir]

Nothing to subclass: every callback goes in ``callbacks=[...]``, then one line,
``run_before_integrations(trainer)``, gives the stock Trainer the handler that fires our
``on_pre_log`` event (train-subset, gap and early-stopping values reach every logger and the
console), binds ``TrainSubsetEvaluation`` to the trainer and puts ours ahead of the loggers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_pipeline import (  # noqa: E402
    build_datasets,
    build_model,
    build_tokenizer,
    compute_metrics,
    data_collator,
    example_sizes,
    output_dir_argument,
    training_arguments,
)
from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import (  # noqa: E402
    EarlyStopping,
    JsonlLogger,
    MLflowLogger,
    TerminateOnNonFinite,
    TrainSubsetEvaluation,
    run_before_integrations,
)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: ``argv`` is ``[output_dir]`` (a new temporary folder when empty)."""
    output_dir = output_dir_argument(argv, "stock-trainer-", __doc__.split("\n")[0])
    sizes = example_sizes()
    tokenizer = build_tokenizer()
    train, evaluation = build_datasets(tokenizer, n_train=sizes["n_train"], n_eval=sizes["n_eval"])
    stopper = EarlyStopping(monitor="eval_accuracy", patience=3)  # mode "max" from the name
    trainer = Trainer(
        model=build_model(tokenizer, hidden_size=sizes["hidden_size"]),
        args=training_arguments(output_dir),
        train_dataset=train, eval_dataset=evaluation, data_collator=data_collator(tokenizer),
        compute_metrics=compute_metrics,
        callbacks=[TrainSubsetEvaluation(size=sizes["subset"], gap_metrics=True), stopper,
                   TerminateOnNonFinite(),
                   MLflowLogger(tracking_uri=f"sqlite:///{output_dir}/mlflow.db", experiment_name="stock"),
                   JsonlLogger(f"{output_dir}/metrics.jsonl")],
    )
    run_before_integrations(trainer)
    trainer.train()

    for record in trainer.state.log_history:
        if "eval_accuracy" in record:
            print(f"step {record['step']:>4}: eval_accuracy {record['eval_accuracy']:.3f}  "
                  f"train_subset_accuracy {record['train_subset_accuracy']:.3f}  "
                  f"gap_loss {record['gap_loss']:+.3f}")
    print(f"stopped: {stopper.stopped} ({stopper.reason.name}); best eval_accuracy {stopper.best_value:.3f} "
          f"at step {stopper.best_step}; logs in {output_dir}/metrics.jsonl and {output_dir}/mlflow.db")


if __name__ == "__main__":
    main()
