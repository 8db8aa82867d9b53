"""tito: the course's command line (student loop, grading, guide, milestones).

Every tito process imports this first. nbformat imports jsonschema, and jsonschema imports
`rfc3987_syntax` when it is installed (jupyter-events asks for it); that module compiles an Earley
grammar at import, 1.9 s of every tito command's start and of every grading worker's (measured:
`python -X importtime -m tito.main --help`). It only checks the "iri" string formats, which no
notebook schema uses, so tito's processes do without it. A kernel never imports this package: student
code sees the environment as installed.
"""
import sys as _sys

_sys.modules.setdefault("rfc3987_syntax", None)  # None: `import rfc3987_syntax` raises ImportError, which jsonschema expects
