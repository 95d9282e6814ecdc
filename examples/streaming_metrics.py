"""Streaming metrics in a stock ``transformers.Trainer``: exact evaluation metrics without holding
the logits, training metrics from the batches already computed, predictions to a file.

    python examples/streaming_metrics.py [output_dir]      # needs the [metrics] extra (torchmetrics)

* ``StreamingMetrics(num_classes=2)``: accuracy, precision, recall, F1 (micro and macro) and the
  confusion counts, computed batch by batch through transformers' ``batch_eval_metrics`` (switched on
  for you: no ``compute_metrics`` of yours needs the logits), identical to scikit-learn on the same
  predictions; the same metrics of each logging window of training batches in ``train/``;
* ``TrainSubsetEvaluation`` gets them on 32 training examples (``train_subset_*``);
* ``EarlyStopping(monitor="eval_f1_macro")`` watches a streamed metric;
* each evaluation's predictions (id, label, prediction, score) in ``<output_dir>/predictions``;
* the learning curves (training, train subset and eval on one panel per metric) in ``curves.png``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_pipeline import (  # noqa: E402
    build_datasets,
    build_model,
    build_tokenizer,
    data_collator,
    example_sizes,
    output_dir_argument,
    training_arguments,
)
from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import (  # noqa: E402
    EarlyStopping,
    JsonlLogger,
    StreamingMetrics,
    TrainSubsetEvaluation,
    plot_learning_curves,
    run_before_integrations,
)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: ``argv`` is ``[output_dir]`` (a new temporary folder when empty)."""
    output_dir = output_dir_argument(argv, "streaming-metrics-", __doc__.split("\n")[0])
    sizes = example_sizes()
    tokenizer = build_tokenizer()
    train, evaluation = build_datasets(tokenizer, n_train=sizes["n_train"], n_eval=sizes["n_eval"])
    metrics = StreamingMetrics(num_classes=2, save_predictions=100)
    stopper = EarlyStopping(monitor="eval_f1_macro", patience=3)  # mode "max" from the name
    trainer = Trainer(
        model=build_model(tokenizer, hidden_size=sizes["hidden_size"]),
        args=training_arguments(output_dir, save_strategy="no"),
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=data_collator(tokenizer),
        callbacks=[
            metrics,
            TrainSubsetEvaluation(size=sizes["subset"]),
            stopper,
            JsonlLogger(f"{output_dir}/metrics.jsonl"),
        ],
    )
    run_before_integrations(trainer)  # binds StreamingMetrics: its compute_metrics, batch_eval_metrics=True
    trainer.train()

    history = trainer.state.log_history
    for record in history:
        if "eval_accuracy" in record:
            training = next(r for r in history if r["step"] == record["step"] and "loss" in r)
            print(
                f"step {record['step']:>4}: accuracy training {training['accuracy']:.3f}  "
                f"train subset {record['train_subset_accuracy']:.3f}  eval {record['eval_accuracy']:.3f}  "
                f"eval f1_macro {record['eval_f1_macro']:.3f}"
            )
    last = metrics.prediction_files[-1]
    rows = [json.loads(line) for line in last.read_text().splitlines()]
    print(
        f"{len(metrics.prediction_files)} predictions files; {last.name}: {len(rows)} rows, first {rows[0]}"
    )
    plot_learning_curves(history, Path(output_dir) / "curves.png", metrics=["loss", "accuracy", "f1_macro"])
    print(
        f"best eval_f1_macro {stopper.best_value:.3f} at step {stopper.best_step}; curves in "
        f"{output_dir}/curves.png"
    )


if __name__ == "__main__":
    main()
