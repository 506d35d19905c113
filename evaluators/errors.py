"""Errors that carry a message meant for the person running the evaluation."""


class EvalInputError(Exception):
    """Bad input (a task, a data file, a config field): the message names the problem and the fix."""


class DataError(EvalInputError):
    """A dataset could not be read or has rows that do not fit the task."""
