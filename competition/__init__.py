"""The kernels of `tito compete` (module 17's competition): the NumPy reference and the course's baselines that
every run times, and the example submissions `tito compete example DIR` writes. Each file defines the task's
function exactly as a student's submission does (see tito.competition). They live in the course, beside the
package they import (tinytorch): tito imports the package only through its probes."""
