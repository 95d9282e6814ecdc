"""BatchCounts: what one micro-batch holds, by each of its rules, and never a read of a device
value while counting (meta tensors, which have no values, count fine until `totals`)."""

from __future__ import annotations

import pytest
import torch

from hf_callbacks_plus.callbacks.throughput.batch_counts import COUNTS, BatchCounts

pytestmark = pytest.mark.transformers


def totals(counts: BatchCounts) -> dict[str, float]:
    return dict(zip(COUNTS, counts.totals()))


def test_padded_causal_batch():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0], [9, 0, 0, 0]])
    mask = (ids != 0).long()
    labels = torch.tensor([[-100, 6, 7, 8], [-100, 6, -100, -100], [9, -100, -100, -100]])
    counts = BatchCounts(shifts_labels=True)
    counts.add({"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert totals(counts) == {"micro_batches": 1, "sequences": 3, "token_batches": 1, "tokens": 12,
                              "non_padding_tokens": 7, "label_batches": 1,
                              "loss_tokens": 4,  # positions 1.. only: [6, 7, 8], [6], []
                              "squared_lengths": 16 + 4 + 1}
    unshifted = BatchCounts(shifts_labels=False)
    unshifted.add({"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert totals(unshifted)["loss_tokens"] == 5


def test_given_shift_labels_are_counted_as_they_are():
    ids = torch.ones(2, 4, dtype=torch.long)
    counts = BatchCounts(shifts_labels=True)
    shift_labels = torch.tensor([[1, 1, 1, -100], [1, -100, -100, -100]])
    counts.add({"input_ids": ids, "labels": ids, "shift_labels": shift_labels})
    assert totals(counts)["loss_tokens"] == 4


def test_packed_sequences_without_mask():
    """A padding-free batch: one row of sequences of 3, 2 and 4 tokens told apart by position_ids."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    counts = BatchCounts()
    counts.add({"input_ids": torch.ones(1, 9, dtype=torch.long), "position_ids": positions})
    result = totals(counts)
    assert (result["tokens"], result["non_padding_tokens"], result["squared_lengths"]) == (9, 9, 9 + 4 + 16)
    assert result["sequences"] == 3
    assert result["label_batches"] == 0


@pytest.mark.parametrize("start", [0, 2])
def test_packed_sequences_start_anywhere(start):
    """``DataCollatorWithFlattening(position_ids_start=2)`` (models whose positions start after the
    padding index): a sequence starts where a position is not the previous one plus 1; two rows
    of 2 and 1 sequences."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]]) + start
    counts = BatchCounts()
    counts.add({"input_ids": torch.ones(2, 7, dtype=torch.long), "position_ids": positions})
    result = totals(counts)
    assert (result["sequences"], result["squared_lengths"]) == (3, 9 + 16 + 49)


def test_cumulative_lengths_name_the_sequences():
    """trl's padding-free collator and DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    say where each sequence ends (``cu_seq_lens_q``): counted from its shape, no device read."""
    meta = torch.device("meta")
    counts = BatchCounts()
    counts.add({"input_ids": torch.ones(1, 9, dtype=torch.long, device=meta),
                "cu_seq_lens_q": torch.tensor([0, 3, 5, 9], dtype=torch.int32, device=meta)})
    assert counts._host["sequences"] == 3  # a Python int from the shape
    counts = BatchCounts()
    counts.add({"input_ids": torch.ones(1, 9, dtype=torch.long),
                "cu_seq_lens_q": torch.tensor([0, 3, 5, 9], dtype=torch.int32),
                "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])})
    assert (totals(counts)["sequences"], totals(counts)["squared_lengths"]) == (3, 9 + 4 + 16)


def test_a_mask_makes_rows_the_sequences_whatever_the_positions():
    """trl's ``return_position_ids`` (sequence parallelism) gives positions with a padded mask:
    each row is one sequence, its padding positions (0) start none."""
    ids = torch.ones(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    counts = BatchCounts()
    positions = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 0]])
    counts.add({"input_ids": ids, "attention_mask": mask, "position_ids": positions})
    assert (totals(counts)["sequences"], totals(counts)["squared_lengths"]) == (2, 16 + 4)


def test_unpadded_batch_without_mask_is_all_tokens():
    counts = BatchCounts()
    counts.add({"input_ids": torch.ones(3, 5, dtype=torch.long)})
    result = totals(counts)
    assert (result["tokens"], result["non_padding_tokens"], result["squared_lengths"]) == (15, 15, 3 * 25)


def test_positional_token_ids_float_labels_and_embeddings():
    counts = BatchCounts()
    counts.add({}, (torch.ones(2, 3, dtype=torch.long),))
    counts.add({"inputs_embeds": torch.zeros(4, 3, 8), "labels": torch.zeros(4)})
    result = totals(counts)
    assert (result["micro_batches"], result["sequences"], result["tokens"]) == (2, 6, 6 + 12)
    assert (result["label_batches"], result["loss_tokens"]) == (1, 4)  # regression labels all count


def test_inputs_that_are_no_tokens_count_rows_only_and_say_what_they_got():
    counts = BatchCounts()
    counts.add({"features": torch.zeros(5, 4), "labels": torch.tensor([0, 1, 2, -100, 1])})
    result = totals(counts)
    assert (result["sequences"], result["token_batches"], result["tokens"]) == (5, 0, 0)
    assert result["loss_tokens"] == 4
    assert counts.untokenized == ("features", "labels") and counts.unlabelled is None
    counts.add({"pixel_values": torch.zeros(2, 3, 4, 4)})
    assert counts.untokenized == ("features", "labels")  # the first pass without tokens
    assert counts.unlabelled == ("pixel_values",)
    counts.reset()
    assert counts.untokenized is None and counts.unlabelled is None


def test_counting_never_reads_a_device_value():
    meta = torch.device("meta")
    counts = BatchCounts(shifts_labels=True)
    for _ in range(3):
        counts.add({"input_ids": torch.ones(2, 6, dtype=torch.long, device=meta),
                    "attention_mask": torch.ones(2, 6, dtype=torch.long, device=meta),
                    "labels": torch.ones(2, 6, dtype=torch.long, device=meta)})
    with pytest.raises((RuntimeError, NotImplementedError)):
        counts.totals()  # reading is the one place that needs the values
    counts.reset()
    assert counts.totals() == [0.0] * len(COUNTS)


def flattening_batches():
    """The same 5 examples (lengths 3, 5, 2, 4, 6) flattened by transformers' collator (trl's:
    tests/trl_peft/test_throughput_sft.py)."""
    from transformers import DataCollatorWithFlattening

    return {
        "default": DataCollatorWithFlattening()(EXAMPLES),
        "offset-2": DataCollatorWithFlattening(position_ids_start=2)(EXAMPLES),
        "flash": DataCollatorWithFlattening(return_flash_attn_kwargs=True,
                                            return_position_ids=False)(EXAMPLES),
    }


def _examples() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(1, 40, (n,), generator=generator).tolist()} for n in (3, 5, 2, 4, 6)]


EXAMPLES = _examples()


def assert_counts_the_examples(batch: dict) -> None:
    """The batch counts the 5 examples it was built from, and ``Σ S²`` of their lengths (the
    ground truth: the examples themselves)."""
    counts = BatchCounts(shifts_labels=True)
    counts.add({k: v for k, v in batch.items() if isinstance(v, torch.Tensor)})
    result = totals(counts)
    lengths = [len(example["input_ids"]) for example in EXAMPLES]
    assert result["sequences"] == len(EXAMPLES)
    assert result["tokens"] == result["non_padding_tokens"] == sum(lengths)
    assert result["squared_lengths"] == sum(n * n for n in lengths)


@pytest.mark.parametrize("variant", ["default", "offset-2", "flash"])
def test_transformers_flattening_collator_counts_its_examples(variant):
    assert_counts_the_examples(flattening_batches()[variant])
