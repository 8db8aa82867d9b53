"""A pytest plugin that hides PyTorch, as in a student edition: `pytest -p tests.support.no_torch`.

`import torch` (and `import torch.nn...`) then raises ImportError, so every test takes the path it
takes where torch is not installed: the NumPy and finite-difference references of `tests/support`.
No second virtual environment is needed. `TINYTORCH_HIDE_TORCH=1` in the environment does the same
for any process that imports `tests.support` first.
"""
from __future__ import annotations

import sys


def hide_torch() -> None:
    "Make `import torch` fail in this process (a None entry in sys.modules stops the import)."
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        del sys.modules[name]
    sys.modules["torch"] = None  # type: ignore[assignment]


hide_torch()
