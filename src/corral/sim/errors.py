"""What the simulator raises: bad input (with where it is) and plans it cannot apply."""

from __future__ import annotations

from corral.core.errors import CorralError, InvalidSpec


class SimInputError(InvalidSpec):
    """A scenario or trace that cannot be read.

    ``field`` is the dotted path of the culprit (``jobs[3].gpus``), ``where``
    says where it is in the file (``line 14``, ``row 7``) when that is known.
    """

    def __init__(self, field: str, message: str, where: str = "") -> None:
        super().__init__(field, message)
        self.where = where
        if where:
            self.args = (f"{where}: {field}: {message}",)

    def __str__(self) -> str:
        return str(self.args[0])


class PlanRejected(CorralError):
    """The scheduler returned a plan that cannot be applied: a bug in the scheduler.

    The simulator applies plans as the server would after verifying them, so a
    plan that over-commits a GPU, places a job twice or splits a gang is
    reported loudly instead of being half applied.
    """
