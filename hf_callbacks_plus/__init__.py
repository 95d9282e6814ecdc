"""hf_callbacks_plus: better callbacks for ``transformers.Trainer``.

Public names are imported lazily, so ``import hf_callbacks_plus`` is cheap and works
without torch or transformers; importing a name pulls only the module that defines it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# public name -> module that defines it
_EXPORTS = {
    # the callback protocol
    "TrainerCallback": "hf_callbacks_plus.core.callback",
    "CallbackHandler": "hf_callbacks_plus.core.handler",
    "TrainerState": "hf_callbacks_plus.core.state",
    "TrainerControl": "hf_callbacks_plus.core.state",
    "ExportableState": "hf_callbacks_plus.core.state",
    "SelfRestoringState": "hf_callbacks_plus.core.stateful",
    # the lightweight loop
    "LoopArguments": "hf_callbacks_plus.loop.arguments",
    "DefaultFlowCallback": "hf_callbacks_plus.loop.default_callbacks",
    "ProgressCallback": "hf_callbacks_plus.loop.default_callbacks",
    "PrinterCallback": "hf_callbacks_plus.loop.default_callbacks",
    "LightweightTrainer": "hf_callbacks_plus.loop.trainer",
    # metrics
    "KeyGrammar": "hf_callbacks_plus.metrics.keys",
    "Monitor": "hf_callbacks_plus.metrics.monitor",
    # callbacks
    "EarlyStopping": "hf_callbacks_plus.callbacks.early_stopping",
    "StopReason": "hf_callbacks_plus.callbacks.early_stopping.policy",
    "TerminateOnNonFinite": "hf_callbacks_plus.callbacks.terminate_on_nonfinite",
    "TrainSubsetEvaluation": "hf_callbacks_plus.callbacks.train_subset",
    "SpikeGuard": "hf_callbacks_plus.callbacks.health.guard",
    "TrainingHealth": "hf_callbacks_plus.callbacks.health.monitor",
    "StreamingMetrics": "hf_callbacks_plus.callbacks.streaming_metrics",
    "GenerationSamples": "hf_callbacks_plus.callbacks.generation_samples",
    "KeepBestCheckpoints": "hf_callbacks_plus.callbacks.best_checkpoints",
    "TopK": "hf_callbacks_plus.callbacks.best_checkpoints.ranking",
    "ThroughputMonitor": "hf_callbacks_plus.callbacks.throughput",
    "Deadline": "hf_callbacks_plus.callbacks.deadline",
    "ConsoleSummary": "hf_callbacks_plus.callbacks.console_summary",
    "WeightAveraging": "hf_callbacks_plus.callbacks.weight_averaging",
    "EMA": "hf_callbacks_plus.callbacks.weight_averaging.rules",
    "BEMA": "hf_callbacks_plus.callbacks.weight_averaging.rules",
    "standard_metrics": "hf_callbacks_plus.metrics.streaming",
    # loggers
    "JsonlLogger": "hf_callbacks_plus.loggers.jsonl",
    "MLflowLogger": "hf_callbacks_plus.loggers.mlflow",
    "WandbLogger": "hf_callbacks_plus.loggers.wandb",
    "TensorBoardLogger": "hf_callbacks_plus.loggers.tensorboard",
    "TrackioLogger": "hf_callbacks_plus.loggers.trackio",
    "replace_report_to_callbacks": "hf_callbacks_plus.loggers.swap",
    # transformers integration
    "TrainerPlus": "hf_callbacks_plus.integrations.transformers",
    "TrainerPlusMixin": "hf_callbacks_plus.integrations.transformers",
    "run_before_integrations": "hf_callbacks_plus.integrations.ordering",
    # plotting
    "plot_learning_curves": "hf_callbacks_plus.plotting",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_callbacks_plus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
