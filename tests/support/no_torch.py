"""A pytest plugin that hides PyTorch, as in a student edition: `pytest -p tests.support.no_torch`.

`import torch` (and `import torch.nn...`) then raises ModuleNotFoundError, so every test takes the
path it takes where torch is not installed: the NumPy and finite-difference references of
`tests/support`. No second virtual environment is needed.

A finder at the front of `sys.meta_path` refuses the import, rather than a None entry in
`sys.modules`: libraries that look torch up in `sys.modules` to see whether an array is a torch
tensor (SciPy's array-API layer, used by scikit-learn) then find no entry, as without torch.
"""
from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class HideTorch(MetaPathFinder):
    "Refuse `torch` and its submodules."

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by tests.support.no_torch)", name=fullname)
        return None


def hide_torch() -> None:
    "Make `import torch` fail in this process (idempotent)."
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        del sys.modules[name]
    if not any(isinstance(f, HideTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, HideTorch())


hide_torch()
