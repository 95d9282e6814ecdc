"""The train-subset evaluation shares no state with training.

The matrix is data (sampler) x collators x trainers, on one tiny causal LM built once:

* data: random sampling; ``group_by_length`` (transformers gives each eval loader a
  ``LengthGroupedSampler`` with a seeded generator of its own); a torch dataset whose
  ``__getitem__`` drops tokens with a generator of its own; a ``datasets.Dataset`` whose
  ``with_transform`` function drops tokens with a module-level NumPy generator;
* collators: one without randomness, and ``DataCollatorForLanguageModeling(mlm=True, seed=123)``,
  which creates a generator of its own at its first call (for ``SFTTrainer``, wrapped by a
  collator of the user's that keeps the token ids);
* trainers: a stock ``Trainer`` (``run_before_integrations``), ``TrainerPlus`` and trl's
  ``SFTTrainer`` (random and ``group_by_length`` only: it prepares its datasets itself).

In every cell (20), the trainer's own log records (loss, grad_norm and learning rate at every
step, eval_loss at every evaluation) are bit-identical to the stock ``Trainer`` (``SFTTrainer``)
run without the callback from the same weights. With ``group_by_length`` (stock ``Trainer`` and
``SFTTrainer``), the subset evaluated three times at the same weights gives three times what a
stock ``evaluate()`` of those rows gives (a fresh loader each time: its sampler's generator
starts from its seed at each pass).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.integrations.ordering import run_before_integrations
from tests.trl_peft import tiny_lm

pytestmark = pytest.mark.transformers

N_TRAIN, N_EVAL, SUBSET, MAX_LENGTH = 16, 4, 6, 20
TIMING = ("runtime", "per_second", "preparation_time")
#: Module-level generator of the ``with_transform`` dataset (what a user's script would hold).
TRANSFORM_RNG: Any = None


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    tok = tiny_lm.tokenizer()
    tok.mask_token = "<unk>"  # the word-level tokenizer has no mask token of its own
    return tok


@functools.lru_cache(maxsize=1)
def initial_weights() -> dict:
    """The one model build of the module: every run starts from these weights."""
    from tests.tiny_models import tiny_causal_lm

    return {k: v.clone() for k, v in tiny_causal_lm(vocab_size=len(tokenizer())).state_dict().items()}


def model() -> Any:
    from tests.tiny_models import tiny_causal_lm

    built = tiny_causal_lm(vocab_size=len(tokenizer()))
    built.load_state_dict(initial_weights())
    return built


@functools.lru_cache(maxsize=1)
def token_rows() -> Any:
    """Tokenized training rows of varied lengths (``group_by_length`` has lengths to sort)."""
    from datasets import Dataset

    tok = tokenizer()
    return Dataset.from_list([{"input_ids": tok(text)["input_ids"][:MAX_LENGTH]}
                              for text in tiny_lm.texts()[:N_TRAIN + N_EVAL]])


class DroppingDataset:
    """A torch-style dataset whose ``__getitem__`` replaces tokens by ``<unk>`` with a generator
    of its own: an augmentation the training observes."""

    def __init__(self, rows: Any, seed: int) -> None:
        import torch

        self.rows = rows
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        import torch

        ids = list(self.rows[index]["input_ids"])
        keep = torch.rand(len(ids), generator=self.generator) > 0.2
        return {"input_ids": [token if kept else 1 for token, kept in zip(ids, keep.tolist())]}


def drop_tokens(batch: dict) -> dict:
    """A ``with_transform`` function drawing from the module-level ``TRANSFORM_RNG``."""
    return {"input_ids": [[token if TRANSFORM_RNG.random() > 0.2 else 1 for token in ids]
                          for ids in batch["input_ids"]]}


def train_data(data: str) -> Any:
    global TRANSFORM_RNG
    rows = token_rows().select(range(N_TRAIN))
    if data == "dataset-generator":
        return DroppingDataset(rows, seed=5)
    if data == "transform-generator":
        import numpy

        TRANSFORM_RNG = numpy.random.default_rng(5)
        return rows.with_transform(drop_tokens)
    return rows


class InputIdsOnly:
    """A user's collator for SFT rows: keeps the token ids, masks them with an inner collator."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, features: list) -> Any:
        return self.inner([{"input_ids": feature["input_ids"]} for feature in features])


def collator(kind: str, trainer: str) -> Any:
    from transformers import DataCollatorForLanguageModeling

    if kind == "own-generator":
        masking = DataCollatorForLanguageModeling(tokenizer(), mlm=True, seed=123)
        return InputIdsOnly(masking) if trainer == "sft" else masking
    return None if trainer == "sft" else DataCollatorForLanguageModeling(tokenizer(), mlm=False)


def sampling(data: str) -> dict[str, Any]:
    if data != "group-by-length":
        return {}
    from transformers import TrainingArguments

    if "train_sampling_strategy" in TrainingArguments.__dataclass_fields__:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}


def run(trainer_kind: str, data: str, collator_kind: str, output_dir: Any, with_subset: bool) -> tuple:
    """Train 4 steps (log every step, evaluate at 2 and 4), with or without the subset evaluation."""
    import transformers

    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    subset = TrainSubsetEvaluation(size=SUBSET)
    values: dict[str, Any] = {
        "output_dir": str(output_dir), "max_steps": 4, "eval_strategy": "steps", "eval_steps": 2,
        "logging_steps": 1, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 2,
        "learning_rate": 5e-3, "report_to": "none", "use_cpu": True, "disable_tqdm": True, "seed": 0,
        "save_strategy": "no", **sampling(data),
    }
    callbacks = [subset] if with_subset else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if trainer_kind == "sft":
            import trl

            trainer = trl.SFTTrainer(
                model=model(), args=trl.SFTConfig(**values, max_length=MAX_LENGTH),
                train_dataset=tiny_lm.sft_dataset(0, N_TRAIN),
                eval_dataset=tiny_lm.sft_dataset(1000, N_EVAL), processing_class=tokenizer(),
                data_collator=collator(collator_kind, "sft"), callbacks=callbacks)
        else:
            plus = trainer_kind == "trainerplus" and with_subset
            trainer_class = TrainerPlus if plus else transformers.Trainer
            trainer = trainer_class(
                model=model(), args=transformers.TrainingArguments(**values), train_dataset=train_data(data),
                eval_dataset=token_rows().select(range(N_TRAIN, N_TRAIN + N_EVAL)),
                data_collator=collator(collator_kind, trainer_kind), processing_class=tokenizer(),
                callbacks=callbacks)
    if with_subset and trainer_kind != "trainerplus":
        run_before_integrations(trainer)
    trainer.train()
    return trainer, subset


def own_records(trainer: Any) -> list[dict]:
    """The trainer's own log records: no timing keys, none of the subset's keys."""
    return [{k: v for k, v in record.items()
             if not any(t in k for t in TIMING) and not k.startswith("train_subset")}
            for record in trainer.state.log_history]


DATA = ("random", "group-by-length", "dataset-generator", "transform-generator")
COLLATORS = ("no-generator", "own-generator")
#: The first tier runs every data kind and collator with the stock Trainer, and two cells each of
#: TrainerPlus and SFT; the second tier, every cell.
FIRST_TIER_OTHERS = {("random", "no-generator"), ("group-by-length", "own-generator")}
CELLS = [pytest.param(trainer, data, collator, id=f"{trainer}-{data}-{collator}",
                      marks=() if trainer == "trainer" or (data, collator) in FIRST_TIER_OTHERS
                      else pytest.mark.second_tier)
         for trainer in ("trainer", "trainerplus", "sft") for data in DATA
         for collator in COLLATORS if trainer != "sft" or data in ("random", "group-by-length")]
_BASELINES: dict[tuple, list] = {}


@pytest.fixture(autouse=True)
def one_thread():
    from tests.tiny_models import one_torch_thread

    with one_torch_thread():
        yield


def baseline(trainer_kind: str, data: str, collator_kind: str, tmp_path_factory: Any) -> list[dict]:
    """The stock run without the callback (shared by the Trainer and TrainerPlus cells)."""
    kind = "sft" if trainer_kind == "sft" else "trainer"
    key = (kind, data, collator_kind)
    if key not in _BASELINES:
        trainer, _ = run(kind, data, collator_kind, tmp_path_factory.mktemp("baseline"), with_subset=False)
        _BASELINES[key] = own_records(trainer)
    return _BASELINES[key]


@pytest.mark.parametrize(("trainer_kind", "data", "collator_kind"), CELLS)
def test_training_is_bit_identical_with_and_without_the_subset_evaluation(
        tmp_path, tmp_path_factory, trainer_kind, data, collator_kind):
    expected = baseline(trainer_kind, data, collator_kind, tmp_path_factory)
    trainer, subset = run(trainer_kind, data, collator_kind, tmp_path, with_subset=True)
    subset_records = [r for r in trainer.state.log_history if "train_subset_loss" in r]
    assert [r["step"] for r in subset_records] == [2, 4]  # the subset was evaluated, twice
    records = own_records(trainer)
    assert len(records) == len(expected)
    for index, (ours, stock) in enumerate(zip(records, expected)):
        assert ours == stock, (index, ours, stock)  # loss, grad_norm, learning_rate, eval_loss: exact
    if data == "group-by-length" and trainer_kind != "trainerplus":
        # same weights (after training), three subset evaluations: each equals a stock evaluate()
        # of the rows, whose fresh loader draws the same LengthGroupedSampler order every time
        evaluations = [subset.compute()["train_subset_loss"] for _ in range(3)]
        trainer.eval_dataset = trainer.train_dataset.select(subset.indices)  # the rows as prepared
        vars(trainer).pop("_eval_dataloaders", None)
        stock = trainer.evaluate(metric_key_prefix="stock")["stock_loss"]  # advances a collator's generator
        assert evaluations == [stock] * 3
