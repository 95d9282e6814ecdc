"""Metric-key grammar and monitoring logic shared by callbacks, loggers and plotting."""

from .keys import KeyGrammar, MetricKey, add_prefix, did_you_mean, flatten_metrics

__all__ = ["KeyGrammar", "MetricKey", "add_prefix", "did_you_mean", "flatten_metrics"]
