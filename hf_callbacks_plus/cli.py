"""Command line: ``hf-callbacks-plus plot <run folder, trainer_state.json or metrics.jsonl>``,
``hf-callbacks-plus replay <write-ahead log or folder> [--dry-run]`` and
``hf-callbacks-plus stop-status <Deadline's status file>``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-callbacks-plus``."""
    parser = argparse.ArgumentParser(prog="hf-callbacks-plus", description="hf_callbacks_plus tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plot = commands.add_parser(
        "plot",
        help="plot learning curves from a trainer_state.json, a metrics.jsonl or a run directory",
        description="By default the loss and the monitored metric(s) (what EarlyStopping and "
        "KeepBestCheckpoints watched): training, train-subset and eval curves, the gap, the best step, "
        "the early-stopping point and the kept checkpoints. -m picks the panels, --all draws every curve.",
    )
    plot.add_argument("state", help="trainer_state.json, metrics.jsonl (JsonlLogger), or a run/checkpoint "
                                    "directory holding one")
    plot.add_argument("-o", "--output", default=None,
                      help="PNG to write (default: learning_curves.png in the run folder read: the folder "
                           "given or the file's, the run folder of a checkpoint)")
    choice = plot.add_mutually_exclusive_group()
    choice.add_argument("-m", "--metrics", nargs="+", default=None,
                        help="metrics to plot, in order: bare, prefixed or rendered names (accuracy, "
                             "eval_accuracy, eval/accuracy; throughput/tokens_per_second or "
                             "tokens_per_second)")
    choice.add_argument("--all", action="store_true", help="a panel for every curve")
    plot.add_argument("--title", default=None, help="figure title")
    plot.add_argument("--extras", action="store_true",
                      help="with --all or -m: also learning_rate, grad_norm and run counters (num_tokens)")
    plot.add_argument("--columns", type=int, default=2, help="panels per row (default: 2)")
    add_replay_command(commands)
    status = commands.add_parser(
        "stop-status",
        help="print how a training with Deadline(status_file=...) ended and exit with its code",
        description="Exit with the code Deadline recorded: 0 (completed, or stopped for good), 75 (stopped "
        "on a deadline or a signal with a complete checkpoint: resume it; Deadline's requeue_exit_code), 1 "
        "(no end recorded: it crashed or was killed). For job scripts behind torchrun or accelerate launch, "
        "which do not pass their workers' exit codes on.",
    )
    status.add_argument("file", help="the status_file given to Deadline")
    return parser


def add_replay_command(commands: Any) -> None:
    """Register ``replay``: send what MLflowLogger's write-ahead logs hold to their runs."""
    replay = commands.add_parser(
        "replay",
        help="send what MLflowLogger's write-ahead logs hold and the store has not acknowledged",
        description="Send every record of a write-ahead log (or of every log under a folder, such as "
        "<output_dir>/.mlflow_wal) past its acknowledged offset to its run, in order, and set the run's "
        "final status; a log sent to its end is removed. A log a running training holds is left to it. "
        "Each log goes to the store it names (printed before sending) unless --tracking-uri is given.",
    )
    replay.add_argument("path", help="a write-ahead log (<run key>.jsonl) or a folder holding them")
    replay.add_argument("--dry-run", action="store_true",
                        help="list what would be sent, and where; send nothing")
    replay.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI to send to instead of the one the log names (which has "
                        "credentials masked: their value comes from MLFLOW_TRACKING_URI when it matches)")


def describe_log(path: Path) -> tuple[str, Optional[str], Optional[str]]:
    """A line listing what a write-ahead log holds past its acknowledged offset (read, not locked), and
    its run's id (None while not known) and key."""
    from .loggers.wal import WriteAheadLog, describe_pending

    wal = WriteAheadLog(path)
    wal.inspect()
    try:
        acked, run_id, _ = wal.recover()
        counts = wal.pending(acked)
    finally:
        wal.close()
    run_key = wal.target.get("run_key")
    return f"{path}: run {run_id or f'(key {run_key})'}, {describe_pending(counts)}", run_id, run_key


def destination(backend: Any, run_id: Optional[str], run_key: Optional[str]) -> str:
    """Where a replay sends: store, experiment, run."""
    run = f"run {run_id}" if run_id else f"the run tagged with key {run_key} (created when missing)"
    return f"{backend.where}, experiment {backend.experiment_name or 'Default'}, {run}"


def run_replay(args: argparse.Namespace) -> int:
    """Run ``replay``; 0 when everything was sent (or listed), 1 otherwise."""
    from .loggers.mlflow import MLflowBackend, explain_mlflow_error
    from .loggers.wal import find_logs, read_target, replay

    def for_target(target: dict) -> MLflowBackend:
        return MLflowBackend.for_target(target, args.tracking_uri, helper=False)

    root = Path(args.path)
    paths = find_logs(root) if root.is_dir() else [root]
    not_a_log = root.is_file() and not read_target(root)
    problem = (f"{str(root)!r} does not exist" if not root.exists() else
               f"{str(root)!r} is not an MLflowLogger write-ahead log (its first line names no target; a "
               "metrics JSONL log is read with `hf-callbacks-plus plot`). They are in "
               "<output_dir>/.mlflow_wal/; pass that folder." if not_a_log else None)
    if problem:
        print(f"hf-callbacks-plus replay: {problem}", file=sys.stderr)
        return 1
    if not paths:
        print(f"nothing to replay in {args.path}")
    failed = 0
    for path in paths:
        target = read_target(path)
        try:
            line, run_id, run_key = describe_log(path)
            if args.dry_run:
                print(f"would send {line} to {destination(for_target(target), run_id, run_key)}")
                continue
            sender = replay(path, for_target, announce=lambda sender, line=line: print(
                f"sending {line} to {destination(sender.backend, sender.run_id, sender.run_key)}",
                flush=True))
            refused = f", {sender.dropped} refused" if sender.dropped else ""
            print(f"sent {path} to run {sender.run_id}{refused}")
        except Exception as error:  # the store's own errors too: the log is kept, the next one is tried
            cause = explain_mlflow_error(error, args.tracking_uri or target.get("tracking_uri"))[0]
            print(f"{path}: NOT sent: {cause}")
            failed += 1
    if not args.dry_run:
        print(f"replayed {len(paths) - failed} log(s)" + (f", {failed} not sent (kept)" if failed else ""))
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hf-callbacks-plus`` command.

    Args:
        argv: Arguments without the program name. Defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 on a user error (printed to stderr); ``stop-status``
        returns the recorded code.
    """
    args = build_parser().parse_args(argv)
    if args.command == "stop-status":
        from .callbacks.deadline.ending import read_status

        code, line = read_status(args.file)
        print(line)
        return code
    if args.command == "replay":
        return run_replay(args)
    if args.command == "plot":
        from .plotting import DEFAULT_PNG, plot_learning_curves, run_folder

        output = args.output if args.output is not None else run_folder(args.state) / DEFAULT_PNG
        try:
            plot_learning_curves(
                args.state, output, metrics="all" if args.all else args.metrics, title=args.title,
                include_training_extras=args.extras, columns=args.columns,
            )
        except (FileNotFoundError, ValueError, TypeError, ModuleNotFoundError) as error:
            print(f"hf-callbacks-plus plot: {error}", file=sys.stderr)
            return 1
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
