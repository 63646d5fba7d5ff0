"""INSTRUCTORS ONLY: the reference solutions of the course labs.

Every module here has the same functions, with the same names and contracts, as the student
module it solves (``blink_edu/labs/labN_*.py``). ``BLINK_EDU_LAB_SOLUTIONS=1`` (or
``blink_edu.labs.use_solutions()``) makes every plug and test use these instead of the student's
code — that is how CI proves that the lab tests pass when the labs are done right, and fail
against the untouched stubs.

This folder lives inside the package so that the instructor repository imports it without any
path tricks (editable or not); ``python -m blink_edu.labs handout OUT_DIR`` leaves it out of the
student handout and then scans the handout for any line of it.
"""
