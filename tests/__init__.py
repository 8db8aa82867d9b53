"""The course's test suite. A package so that `tests.support` (shared strategies, the comparison
helper and the reference table) imports the same way in the instructor and the student edition."""
