"""Errors a user can cause. Each names the file, the field and the value that are wrong."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: a malformed file, an unknown name, a value out of range.

    Raised before anything on the host changes; the CLI turns it into exit code 2.
    """

    def __init__(self, where: str, field: str, value: object, why: str):
        self.where, self.field, self.value, self.why = where, field, value, why
        shown = repr(value)
        super().__init__(f"{where}: {field} = {shown[:200] + '...' if len(shown) > 200 else shown}: {why}")


class ProfileError(InputError):
    """A host profile (or one of its settings) is invalid for this host."""


class DesiredStateError(InputError):
    """A desired-state file is invalid."""
