"""Command line: ``hf-callbacks-plus plot <trainer_state.json> -o curves.png``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-callbacks-plus``."""
    parser = argparse.ArgumentParser(prog="hf-callbacks-plus", description="hf_callbacks_plus tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plot = commands.add_parser(
        "plot",
        help="plot learning curves from a trainer_state.json, a metrics.jsonl or a run directory",
        description="One panel per metric: train-subset and eval curves, training loss, the gap, "
        "the best step and the early-stopping point.",
    )
    plot.add_argument("state", help="trainer_state.json, metrics.jsonl (JsonlLogger), or a run/checkpoint "
                                    "directory holding one")
    plot.add_argument("-o", "--output", default="curves.png", help="PNG to write (default: curves.png)")
    plot.add_argument("-m", "--metrics", nargs="+", default=None,
                      help="metrics to plot, in order: bare, prefixed or rendered names (accuracy, "
                           "eval_accuracy, eval/accuracy)")
    plot.add_argument("--title", default=None, help="figure title")
    plot.add_argument("--extras", action="store_true", help="also plot learning_rate and grad_norm")
    plot.add_argument("--columns", type=int, default=2, help="panels per row (default: 2)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hf-callbacks-plus`` command.

    Args:
        argv: Arguments without the program name. Defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 on a user error (printed to stderr).
    """
    args = build_parser().parse_args(argv)
    if args.command == "plot":
        from .plotting import plot_learning_curves

        try:
            plot_learning_curves(
                args.state, args.output, metrics=args.metrics, title=args.title,
                include_training_extras=args.extras, columns=args.columns,
            )
        except (FileNotFoundError, ValueError, TypeError, ModuleNotFoundError) as error:
            print(f"hf-callbacks-plus plot: {error}", file=sys.stderr)
            return 1
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
