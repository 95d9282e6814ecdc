"""The invariants of KeepBestCheckpoints, over generated runs of a real transformers.Trainer:
metric sequences (NaN, Inf, ties) x k x save_total_limit x a crash (where, and how) then a
resume. Whatever the run, at the end:

1. the ranking is the top k of the saved steps' values, computed independently (finite values
   only, ties by the earlier step), for each of two metrics with their own k and mode;
2. the kept folders on disk are exactly the ranked steps, each holding the weights the model had
   when that step was saved; the manifest lists exactly them, with the same ranking;
3. at most k1 + k2 kept folders and at most ``save_total_limit`` checkpoint-N folders: the data
   of at most k + save_total_limit checkpoints on disk;
4. nothing is left half-made (no hidden folders), nothing is written outside ``output_dir``.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from hf_callbacks_plus.callbacks import best_checkpoints as module
from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints, TopK
from tests.callbacks import best_checkpoints_helpers as helpers
from tests.callbacks.test_best_checkpoints_resume import FaultInjectingCrash

pytestmark = [pytest.mark.transformers, pytest.mark.slow, pytest.mark.compat]

VALUES = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, math.nan, math.inf, -math.inf])


class InjectedKill(BaseException):
    """The process dying inside our own save (a fault injection)."""


def crash_callbacks(kind, step, monkeypatch):
    """Where the first run dies: between two steps after a save ("between steps"), after the
    trainer wrote checkpoint-<step> but before our on_save ("before ours", a callback listed before
    ours raises), or inside our on_save after the kept folder is made ("inside ours")."""
    if kind == "between steps":
        return [], [FaultInjectingCrash(step, "on_step_begin")]  # global_step is still <step> there
    if kind == "before ours":
        return [FaultInjectingCrash(step, "on_save")], []
    original = module.write_manifest

    def fault_injecting(directory, data):
        if data.get("last_step") == step:
            raise InjectedKill(f"injected crash inside our save of step {step}")
        return original(directory, data)

    monkeypatch.setattr(module, "write_manifest", fault_injecting)
    return [], []


#: A generated run: metric sequences x k x save_total_limit x where it crashes.
RUNS = given(data=st.data(), steps=st.integers(3, 6), k_score=st.integers(1, 3), k_acc=st.integers(1, 2),
             limit=st.sampled_from([None, 1, 2]),
             crash=st.sampled_from([None, "between steps", "before ours", "inside ours"]))
#: A run takes about 1 s: no shrinking (a failure prints the generated case as it is).
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]


def check_invariants(data, steps, k_score, k_acc, limit, crash):
    """Run the generated case and check the invariants of the module docstring."""
    score = {step: data.draw(VALUES, label=f"score@{step}") for step in range(1, steps + 1)}
    acc = {step: data.draw(VALUES, label=f"acc@{step}") for step in range(1, steps + 1)}
    crash_step = data.draw(st.integers(1, steps - 1), label="crash after save") if crash else None
    specs = [TopK("eval_score", k_score, "min"), TopK("eval_acc", k_acc, "max")]
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as environment, \
            pytest.MonkeyPatch.context() as faults:
        output_dir = Path(root) / "run"
        environment.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # transformers < 4.47, torch >= 2.6
        weights = helpers.WeightsAtSave()
        args = {"score": score, "acc": acc, "max_steps": steps, "eval_steps": 1, "save_steps": 1,
                "logging_steps": 1, "save_total_limit": limit}
        before, after = crash_callbacks(crash, crash_step, faults) if crash else ([], [])
        keeper = KeepBestCheckpoints(specs, verbose=False)
        first = helpers.scripted_run(output_dir, [weights, *before, keeper, *after], **args)
        if crash is None:
            first.train()
        else:
            with pytest.raises((RuntimeError, InjectedKill)):
                first.train()
            faults.undo()  # the fault injection dies with the first process
            keeper = KeepBestCheckpoints(specs, verbose=False)
            helpers.scripted_run(output_dir, [weights, keeper], **args).train(resume_from_checkpoint=True)

        saved = list(range(1, steps + 1))
        expected = helpers.expected_ranking({"score": score, "acc": acc}, [("score", k_score, "min"),
                                                                   ("acc", k_acc, "max")], saved)
        assert {name: [e.step for e in kept] for name, kept in keeper.ranking.items()} == expected  # 1
        ranked = sorted({step for kept in expected.values() for step in kept})
        assert helpers.kept_steps(output_dir) == ranked  # 2
        kept = output_dir / helpers.KEPT
        for step in ranked:
            assert helpers.kept_weights(kept / f"checkpoint-{step}") == weights.weights[step]
        written = helpers.manifest(output_dir)
        assert written["ranking"] == expected and [c["step"] for c in written["checkpoints"]] == ranked
        assert not any(c["missing"] for c in written["checkpoints"])
        assert len(ranked) <= k_score + k_acc  # 3
        assert len(helpers.checkpoint_steps(output_dir)) <= (limit or steps)
        assert not [name for name in os.listdir(kept) if name.startswith(".")]  # 4
        assert os.listdir(root) == ["run"]


test_invariants_hold_for_any_run_crash_and_resume = settings(
    max_examples=6, derandomize=True, deadline=None, phases=NO_SHRINK)(RUNS(check_invariants))
test_invariants_hold_over_many_more_runs = pytest.mark.second_tier(settings(
    max_examples=100, derandomize=True, deadline=None, phases=NO_SHRINK)(RUNS(check_invariants)))
