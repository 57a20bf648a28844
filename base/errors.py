"""Errors that every layer of the pipeline raises for bad input or failed work.

The CLI turns them into one line on stderr and the error's exit code.
"""


class DeployError(Exception):
    """A failure the user should see as one line (exit code 1)."""

    exit_code = 1


class UsageError(DeployError):
    """Bad input from the user: op, attribute, shape, dtype, file (exit code 2)."""

    exit_code = 2


def first_line(text: str) -> str:
    """The first non-blank line of an error message (compiler errors run to pages)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
