"""Kernels of `tito compete`: the reference and course baselines each task times every run, and the
example submissions `tito compete example DIR` writes. Each file defines the task's function exactly
as a student's submission does (see tito.competition)."""
