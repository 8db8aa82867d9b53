"""Put this folder on a process's PYTHONPATH to hide PyTorch in it and in every Python it starts that inherits the
environment (a notebook's kernel, the package tests): `import torch` then fails as on a machine without it, as
`pytest -p tests.support.no_torch` does inside one pytest."""
import os
import runpy

runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "no_torch.py"))
