"""Read back TensorBoard event files written by a stock ``TensorBoardCallback``."""

from __future__ import annotations

from pathlib import Path


def read_scalars(output_dir: str | Path) -> dict[str, dict[int, float]]:
    """All scalars under ``output_dir`` (any run directory): ``{tag: {step: value}}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    run_dirs = {path.parent for path in Path(output_dir).rglob("events.out.tfevents.*")}
    for run_dir in sorted(run_dirs):
        accumulator = EventAccumulator(str(run_dir))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            for event in accumulator.Scalars(tag):
                scalars.setdefault(tag, {})[event.step] = event.value
    return scalars
