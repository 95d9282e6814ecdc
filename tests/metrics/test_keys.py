"""The log-key grammar: every mapping of the issue, and properties over arbitrary keys."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_callbacks_plus.metrics.keys import (
    KeyGrammar,
    add_prefix,
    did_you_mean,
    flatten_metrics,
    grammar_for,
)


@pytest.mark.parametrize(
    ("raw", "rendered", "section", "name"),
    [
        ("eval_loss", "eval/loss", "eval", "loss"),
        ("eval_accuracy", "eval/accuracy", "eval", "accuracy"),
        ("test_f1", "test/f1", "test", "f1"),
        ("train_subset_accuracy", "train_subset/accuracy", "train_subset", "accuracy"),
        ("train_subset_loss", "train_subset/loss", "train_subset", "loss"),
        ("train_accuracy", "train_subset/accuracy", "train_subset", "accuracy"),  # 0.1.0's name
        ("loss", "train/loss", "train", "loss"),
        ("learning_rate", "train/learning_rate", "train", "learning_rate"),
        ("grad_norm", "train/grad_norm", "train", "grad_norm"),
        ("epoch", "train/epoch", "train", "epoch"),
        ("gap_accuracy", "gap/accuracy", "gap", "accuracy"),
        ("gap_rewards/margins", "gap/rewards/margins", "gap", "rewards/margins"),
        ("early_stopping/best_value", "early_stopping/best_value", "early_stopping", "best_value"),
        ("eval/loss", "eval/loss", "eval", "loss"),
        ("train/loss", "train/loss", "train", "loss"),
        ("custom/thing", "custom/thing", "custom", "thing"),
    ],
)
def test_builtin_mappings(raw, rendered, section, name):
    parsed = KeyGrammar().parse(raw)
    assert (parsed.rendered, parsed.section, parsed.name) == (rendered, section, name)


def test_train_subset_loss_does_not_collide_with_running_loss():
    grammar = KeyGrammar()
    curves, summary = grammar.render_logs({"loss": 1.0, "train_subset_loss": 2.0, "eval_loss": 3.0})
    assert curves == {"train/loss": 1.0, "train_subset/loss": 2.0, "eval/loss": 3.0}
    assert summary == {}


# trl 1.16: what SFTTrainer, DPOTrainer, RewardTrainer and GRPOTrainer log (read from their
# ``_metrics[mode][...]``): bare in training records, ``eval_`` in evaluation records.
TRL_KEYS = ["mean_token_accuracy", "entropy", "num_tokens", "aux_loss", "rewards/chosen", "rewards/rejected",
            "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen",
            "logits/rejected", "min_reward", "mean_reward", "max_reward", "accuracy", "margin", "reward",
            "reward_std", "frac_reward_zero_std", "kl", "completions/mean_length", "clip_ratio/low_mean",
            "rewards/format_reward/mean", "sampling/importance_sampling_ratio/min"]


@pytest.mark.parametrize("key", TRL_KEYS)
def test_trl_keys_in_train_eval_subset_and_gap_records(key):
    grammar = KeyGrammar()
    running = grammar.parse(key)
    assert (running.section, running.name, running.rendered) == ("train", key, f"train/{key}")
    assert running.is_running
    evaluated = grammar.parse(f"eval_{key}")
    assert (evaluated.section, evaluated.dataset, evaluated.name) == ("eval", None, key)
    assert evaluated.rendered == f"eval/{key}" and not evaluated.is_running
    subset = grammar.parse(f"train_subset_{key}")
    assert (subset.section, subset.name, subset.rendered) == ("train_subset", key, f"train_subset/{key}")
    assert grammar.parse(f"gap_{key}").rendered == f"gap/{key}"
    assert grammar.render(f"test_{key}") == f"test/{key}"
    for rendered in (running.rendered, evaluated.rendered, subset.rendered):  # idempotent, same name
        assert grammar.render(rendered) == rendered and grammar.parse(rendered).name == key


def test_trl_keys_with_several_eval_datasets():
    grammar = KeyGrammar(eval_datasets=["chat"])
    parsed = grammar.parse("eval_chat_rewards/chosen")
    assert (parsed.dataset, parsed.name) == ("chat", "rewards/chosen")
    assert parsed.rendered == "eval/chat/rewards/chosen"
    again = grammar.parse(parsed.rendered)
    assert (again.section, again.dataset, again.name) == ("eval", "chat", "rewards/chosen")


def test_no_rendered_name_means_two_things():
    """The train subset, the running loss and the run totals each have a name."""
    grammar = KeyGrammar()
    evaluation = {"eval_loss": 0.5, "train_subset_loss": 0.4, "gap_loss": -0.1, "early_stopping/wait": 1}
    running = {"loss": 0.45, "grad_norm": 1.0, "learning_rate": 0.1, "epoch": 1.0}
    final = {"train_runtime": 3.0, "train_samples_per_second": 10.0, "train_steps_per_second": 1.0,
             "total_flos": 0.0, "train_loss": 0.47, "epoch": 2.0}
    names: dict[str, set] = {}
    for kind, record in (("evaluation", evaluation), ("running", running), ("final", final)):
        curves, summary = grammar.render_logs(record)
        assert len(curves) + len(summary) == len(record)
        for raw in record:
            rendered = grammar.parse(raw, summary=grammar.is_summary_record(record)).rendered
            assert rendered in curves or rendered in summary
            names.setdefault(rendered, set()).add((kind, raw))
    assert all(len(raws) == 1 for raws in names.values()), names
    assert {"train/loss", "train_subset/loss", "train_summary/loss", "eval/loss", "gap/loss",
            "train_summary/runtime", "train_summary/epoch", "train/epoch"} <= set(names)


def test_several_eval_datasets_known_from_the_trainer():
    class FakeTrainer:  # only the attribute from_trainer reads
        eval_dataset = {"squad": [], "news_2024": []}

    grammar = KeyGrammar.from_trainer(FakeTrainer())
    assert set(grammar.eval_datasets) == {"squad", "news_2024"}
    assert grammar.render("eval_squad_accuracy") == "eval/squad/accuracy"
    assert grammar.render("eval_news_2024_loss") == "eval/news_2024/loss"
    parsed = grammar.parse("eval_squad_accuracy")
    assert (parsed.section, parsed.dataset, parsed.name) == ("eval", "squad", "accuracy")
    # not guessed: an unknown dataset stays a plain eval metric name
    assert KeyGrammar().render("eval_squad_accuracy") == "eval/squad_accuracy"


def test_grammar_for_attaches_one_grammar_per_trainer():
    class FakeTrainer:
        eval_dataset = {"a": []}

    trainer = FakeTrainer()
    grammar = grammar_for(trainer)
    assert grammar is grammar_for(trainer) is trainer.key_grammar
    assert grammar.eval_datasets == ("a",)
    assert isinstance(grammar_for(None), KeyGrammar)


def test_end_of_training_record_goes_to_summary():
    grammar = KeyGrammar()
    record = {
        "train_runtime": 1.5,
        "train_samples_per_second": 10.0,
        "train_steps_per_second": 2.0,
        "train_loss": 0.3,
        "total_flos": 12.0,
        "epoch": 2.0,
    }
    curves, summary = grammar.render_logs(record)
    assert summary == {"train_summary/runtime": 1.5, "train_summary/samples_per_second": 10.0,
                       "train_summary/steps_per_second": 2.0, "train_summary/loss": 0.3,
                       "train_summary/total_flos": 12.0, "train_summary/epoch": 2.0}
    assert curves == {}
    assert grammar.parse("train_runtime", summary=True).is_summary
    # transformers' PrinterCallback removes total_flos: still the final record
    assert grammar.is_summary_record({k: v for k, v in record.items() if k != "total_flos"})
    # an evaluation under the prefix "train" carries its metrics: not the final record
    assert not grammar.is_summary_record({"train_runtime": 1.0, "train_loss": 0.2, "train_accuracy": 0.9})


def test_custom_prefix_learned_from_evaluation_metrics():
    grammar = KeyGrammar()
    assert grammar.render("val_acc") == "train/val_acc"  # unknown prefix: not guessed
    grammar.learn_from_metrics({"val_acc": 1.0, "val_runtime": 0.1, "val_samples_per_second": 3.0})
    assert "val" in grammar.sections
    assert grammar.render("val_acc") == "val/acc"
    # learning "train" (a train-subset evaluation) never turns summary keys into a section
    grammar.learn_from_metrics({"train_runtime": 1.0})
    assert grammar.parse("train_runtime", summary=True).is_summary


def test_declared_prefix_and_eval_dataset_prefix():
    grammar = KeyGrammar(prefixes=["holdout"])
    assert grammar.render("holdout_f1") == "holdout/f1"
    grammar.declare_prefix("eval_wiki")
    assert grammar.render("eval_wiki_f1") == "eval/wiki/f1"
    with pytest.raises(ValueError, match="prefix"):
        grammar.declare_prefix("a/b")
    with pytest.raises(ValueError, match="name"):
        grammar.declare_dataset("")


def test_nested_dicts_are_flattened():
    grammar = KeyGrammar()
    curves, _ = grammar.render_logs({"eval_f1": {"macro": 0.5, "micro": {"x": 0.7}}, "loss": 1.0})
    assert curves == {"eval/f1.macro": 0.5, "eval/f1.micro.x": 0.7, "train/loss": 1.0}


def test_flatten_collision_is_kept_and_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        flat = flatten_metrics({"f1.macro": 1, "f1": {"macro": 2}})
    assert sorted(flat.values()) == [1, 2]
    assert "flatten to the same name" in caplog.text


def test_add_prefix_never_doubles():
    assert add_prefix({"eval_loss": 1.0, "accuracy": 0.5}, "eval") == {"eval_loss": 1.0, "eval_accuracy": 0.5}
    assert add_prefix({"f1": {"macro": 0.2}}, "train") == {"train_f1.macro": 0.2}
    assert "eval_eval_loss" not in add_prefix({"eval_loss": 1.0, "loss": 2.0}, "eval")


def test_resolve_and_explain_missing():
    grammar = KeyGrammar()
    keys = ["eval_loss", "eval_accuracy", "train_subset_accuracy", "gap_accuracy", "eval_rewards/chosen"]
    assert grammar.resolve("accuracy", keys) == "eval_accuracy"
    assert grammar.resolve("eval/accuracy", keys) == "eval_accuracy"
    assert grammar.resolve("train_subset_accuracy", keys) == "train_subset_accuracy"
    assert grammar.resolve("train_subset/accuracy", keys) == "train_subset_accuracy"
    assert grammar.resolve("rewards/chosen", keys) == "eval_rewards/chosen"  # like metric_for_best_model
    assert grammar.resolve("eval/rewards/chosen", keys) == "eval_rewards/chosen"
    assert grammar.resolve("gap_accuracy", keys) == "gap_accuracy"
    assert grammar.resolve("f1", keys) is None
    message = grammar.explain_missing("eval_acuracy", keys)
    assert "eval_acuracy" in message and "eval_accuracy" in message and "Did you mean" in message
    assert did_you_mean("eval_los", keys)[0] == "eval_loss"


def test_rendering_collisions_are_disambiguated_with_a_warning(caplog):
    grammar = KeyGrammar()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        curves, _ = grammar.render_logs({"eval/loss": 1.0, "eval_loss": 2.0})
    assert sorted(curves.values()) == [1.0, 2.0]
    assert len(curves) == 2
    assert "both render to" in caplog.text


def test_a_user_key_train_loss_never_becomes_train_train_loss(caplog):
    grammar = KeyGrammar()
    assert grammar.render_logs({"train/loss": 0.5}) == ({"train/loss": 0.5}, {})
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        curves, _ = grammar.render_logs({"loss": 1.0, "train/loss": 0.5})
    assert curves == {"train/loss": 1.0, "train/loss_": 0.5}
    assert "logging 'train/loss' as 'train/loss_'" in caplog.text  # the message names where it went


# -- properties over arbitrary keys -------------------------------------------------------

keys = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="eval_tsrnigpa/.x", max_size=20),
    st.sampled_from(["eval_loss", "eval/loss", "loss", "train_loss", "train_runtime", "gap_loss", "/",
                     "rewards/chosen", "eval_rewards/chosen", "train_subset_loss", "train/loss"]),
)
values = st.one_of(st.floats(allow_nan=True), st.integers(), st.text(max_size=3))
nested = st.recursive(values, lambda inner: st.dictionaries(keys, inner, max_size=3), max_leaves=8)
records = st.dictionaries(keys, nested, max_size=12)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.one_of(keys, st.integers(), st.none()), summary=st.booleans(),
       datasets=st.lists(st.text(min_size=1, max_size=6), max_size=3),
       prefixes=st.lists(st.text(alphabet="abcv_l", min_size=1, max_size=6), max_size=2))
def test_parse_never_raises(key, summary, datasets, prefixes):
    grammar = KeyGrammar(eval_datasets=datasets, prefixes=prefixes)
    parsed = grammar.parse(key, summary=summary)
    assert isinstance(parsed.rendered, str) and parsed.rendered
    assert parsed.raw == str(key)
    if isinstance(key, str) and "/" in key and key.split("/")[0] in grammar.sections:
        assert parsed.rendered == key  # pre-rendered keys are left alone
    if not parsed.is_summary:  # rendering is idempotent
        assert grammar.render(parsed.rendered) == parsed.rendered


@settings(max_examples=300, deadline=None)
@given(record=records, datasets=st.lists(st.sampled_from(["a", "b_c", "eval"]), max_size=2))
def test_render_logs_never_loses_or_merges_keys_silently(record, datasets):
    grammar = KeyGrammar(eval_datasets=datasets)
    handler = _Collect()
    logger = logging.getLogger("hf_callbacks_plus")
    logger.addHandler(handler)
    try:
        grammar._warned_collisions.clear()
        flat = flatten_metrics(record)
        curves, summary = grammar.render_logs(record)
    finally:
        logger.removeHandler(handler)
    # every flat input value has its own output name: nothing merged
    assert len(curves) + len(summary) == len(flat)
    assert not set(curves) & set(summary)
    natural = [grammar.parse(k, summary=grammar.is_summary_record(record)).rendered for k in flat]
    if len(set(natural)) < len(natural):  # a collision happened: it was reported
        assert any("render to" in m for m in handler.messages)


@settings(max_examples=200, deadline=None)
@given(metrics=st.dictionaries(keys, values, max_size=8), prefix=st.sampled_from(["eval", "train", "val"]))
def test_add_prefix_never_produces_a_doubled_prefix(metrics, prefix):
    out = add_prefix(metrics, prefix)
    for key in out:
        assert key.startswith(f"{prefix}_")
        if not any(k.startswith(f"{prefix}_{prefix}_") for k in flatten_metrics(metrics)):
            assert not key.startswith(f"{prefix}_{prefix}_")


def test_render_logs_reuses_the_names_of_a_key_set_only_while_nothing_changes():
    """`render_logs` keeps the names of the last key set (the hot path of every logger): the
    same keys give the same names, new values included; a prefix learned in between, the
    end-of-training record and another key set are rendered afresh."""
    grammar = KeyGrammar()
    render = grammar.render_logs
    assert render({"val_loss": 1.0, "loss": 2.0}) == ({"train/val_loss": 1.0, "train/loss": 2.0}, {})
    assert render({"val_loss": 3.0, "loss": 4.0}) == ({"train/val_loss": 3.0, "train/loss": 4.0}, {})
    grammar.declare_prefix("val")
    assert grammar.render_logs({"val_loss": 5.0, "loss": 6.0}) == ({"val/loss": 5.0, "train/loss": 6.0}, {})
    assert grammar.render_logs({"loss": 6.0, "val_loss": 5.0}) == ({"train/loss": 6.0, "val/loss": 5.0}, {})
    totals = {"train_runtime": 1.0, "train_loss": 0.5}
    curves, summary = grammar.render_logs(totals)
    assert not curves and set(summary) == {"train_summary/runtime", "train_summary/loss"}
