#!/usr/bin/env bash
# Build .venv-compat-<version> (once) and run the compat-marked tests against it.
# Usage: compat/run.sh <transformers version>   (called by `make compat`)
set -euo pipefail
cd "$(dirname "$0")/.."
version="$1"
pins="compat/transformers-${version}.txt"
venv=".venv-compat-${version}"
[ -f "$pins" ] || { echo "no pin file $pins (known: $(ls compat/transformers-*.txt))" >&2; exit 2; }
python="${PYTHON:-python3}"
stamp="$venv/.compat-stamp"
if [ ! -f "$stamp" ] || [ "$pins" -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    test -x "$venv/bin/python" || "$python" -m venv "$venv"
    # torch 2.13.0 CPU build only (the +cpu local version exists only in the local wheel dir;
    # a plain torch==2.13.0 from PyPI would pull gigabytes of CUDA wheels).
    "$venv/bin/python" -m pip install -q 'torch==2.13.0+cpu'
    "$venv/bin/python" -m pip install -q -c "$pins" -r "$pins" \
        pytest pytest-timeout hypothesis tensorboard matplotlib torchmetrics scikit-learn -e .
    touch "$stamp"
fi
"$venv/bin/python" -c "import transformers, torch, accelerate; print('transformers', transformers.__version__, 'torch', torch.__version__, 'accelerate', accelerate.__version__)"
# the transformers-dependent tests of the integration (TrainerPlus, run_before_integrations,
# TrainSubsetEvaluation on a stock Trainer), selected by the `compat` marker; tests/trl_peft
# runs where the pins install trl and peft (5.23.0, 4.57.6)
trl_tests=()
if "$venv/bin/python" -c "import trl, peft" 2>/dev/null; then trl_tests=(tests/trl_peft); fi
"$venv/bin/python" -m pytest -q -m compat -p no:cacheprovider tests/integrations tests/callbacks/test_train_subset.py \
    tests/callbacks/test_streaming_metrics.py tests/loop/test_streaming_in_loop.py \
    tests/callbacks/test_best_checkpoints.py tests/callbacks/test_best_checkpoints_resume.py \
    tests/callbacks/test_best_checkpoints_properties.py \
    "${trl_tests[@]}"
