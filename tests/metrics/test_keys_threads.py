"""KeyGrammar shared between the training thread (declarations) and a logger worker (rendering)."""

import threading

from hf_callbacks_plus.metrics.keys import KeyGrammar


def test_declarations_during_rendering_never_leave_a_stale_rendering():
    grammar = KeyGrammar()
    prefixes = [f"custom{i}" for i in range(200)]
    keys = [f"{prefix}_acc" for prefix in prefixes]
    stop = threading.Event()

    def render_forever():
        while not stop.is_set():
            for key in keys:
                grammar.render(key)

    worker = threading.Thread(target=render_forever)
    worker.start()
    try:
        for prefix in prefixes:
            grammar.declare_prefix(prefix)
    finally:
        stop.set()
        worker.join()
    # every key rendered before its prefix was known must not stay cached as train/...
    assert [grammar.render(key) for key in keys] == [f"{prefix}/acc" for prefix in prefixes]
