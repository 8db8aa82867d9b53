"""`python -m tito.nbgrader_run ARGS` is `nbgrader ARGS`, started through tito's package so that its quick
import of nbformat (see `tito/__init__.py`) applies to nbgrader's process too."""
from nbgrader.apps.nbgraderapp import main

if __name__ == "__main__":
    main()
