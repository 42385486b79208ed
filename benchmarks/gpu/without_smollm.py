"""A pytest plugin that deselects the tests needing SmolLM2 (the `smollm_path` fixture).

benchmarks/gpu/run.sh loads it (`-p benchmarks.gpu.without_smollm`) when SmolLM2's wheel,
the last to be carried, has not arrived: the other real-model tests still run.
"""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    needing = [item for item in items if "smollm_path" in getattr(item, "fixturenames", ())]
    if needing:
        config.hook.pytest_deselected(items=needing)
        items[:] = [item for item in items if item not in needing]
