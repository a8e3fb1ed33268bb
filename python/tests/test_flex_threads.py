"""sdpa.flex traces are per thread: two threads inside their mods at the same time each
get their own captured tensors."""

import threading

import numpy as np

from sdpa.flex._trace import trace


def test_concurrent_traces_keep_their_own_captures():
    tables = {"first": np.arange(8.0), "second": np.arange(8.0) * 2}
    first_inside, second_inside, first_read = (threading.Event() for _ in range(3))
    results, errors = {}, []

    def worker(name):
        table = tables[name]

        def mod(score, b, h, q_idx, kv_idx):
            # The second trace starts while the first is inside its mod, and the first
            # reads its table only then: a process-wide "current trace" would hand the
            # first mod's capture to the second trace.
            if name == "first":
                first_inside.set()
                assert second_inside.wait(20)
                value = score + table[q_idx]
                first_read.set()
                return value
            second_inside.set()
            assert first_read.wait(20)
            return score + table[q_idx]

        try:
            program, sources = trace(mod, is_mask=False)
            results[name] = (program.evaluate(0.0, 0, 0, 3, 0), sources)
        except Exception as e:  # noqa: BLE001 (reported below, on the main thread)
            errors.append(e)

    first = threading.Thread(target=worker, args=("first",))
    second = threading.Thread(target=worker, args=("second",))
    first.start()
    assert first_inside.wait(20)
    second.start()
    first.join()
    second.join()
    assert not errors, errors
    for name, table in tables.items():
        value, sources = results[name]
        assert value == table[3]
        assert list(sources.values()) == [table] and sources["table"] is table
