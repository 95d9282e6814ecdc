"""tests/trl_peft needs the [trl] extra. `make compat` passes this directory only to the venvs
whose pins install trl and peft (compat/run.sh); a module-level skip here would be a collection
error under pytest, so a venv without them ignores the directory instead."""

import importlib.util

if importlib.util.find_spec("trl") is None or importlib.util.find_spec("peft") is None:
    collect_ignore_glob = ["*.py"]
