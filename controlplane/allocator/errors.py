"""Errors a user can cause. Each names the request field that is wrong, so the front end can turn
it into a 4xx with that field and the message. And the one a bug causes: AllocatorInconsistency."""

from __future__ import annotations


class AllocationError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class InvalidRequest(AllocationError):
    """A malformed request, an unknown entitlement, a machine type the entitlement cannot hold."""


class NoPlacement(AllocationError):
    """No machine passes the hard requirements. `survivors` lists (filter, machines it left) in
    the order the filters ran, starting from ("all", total)."""

    def __init__(self, job: str, task: int, survivors: tuple[tuple[str, int], ...], field: str) -> None:
        total = survivors[0][1]
        steps = "; ".join(f"{name} left {left:,}" for name, left in survivors[1:])
        super().__init__(field, f"no placement for {job} task {task}: {total:,} machines; {steps}")
        self.job = job
        self.task = task
        self.survivors = survivors

    def left(self, filter_name: str) -> int:
        return dict(self.survivors)[filter_name]


class QuotaExceeded(AllocationError):
    """Free machines would fit, but the entitlement already holds its quota of machines."""

    def __init__(self, job: str, task: int, entitlement: str, quota: int, held: int) -> None:
        super().__init__(
            "count",
            f"quota exceeded for {job} task {task}: entitlement {entitlement} holds {held:,} of its "
            f"quota of {quota:,} machines, none of them has room, and it may not take another",
        )
        self.job = job
        self.task = task
        self.entitlement = entitlement
        self.quota = quota
        self.held = held


class ReserveKept(AllocationError):
    """Free machines would fit, but they are the region's reserve, which this (opportunistic)
    entitlement leaves free."""

    def __init__(self, job: str, task: int, entitlement: str, reserve: int) -> None:
        super().__init__(
            "reserve",
            f"no placement for {job} task {task}: the free machines that would fit are the region's reserve "
            f"({reserve:,} free machines per machine type and dc kept for guaranteed entitlements' growth: "
            f"`twinectl capacity reserve`), which entitlement {entitlement} leaves free",
        )
        self.job = job
        self.task = task


class AllocatorInconsistency(Exception):
    """A bug, not a user's error: the machine index disagrees with the filters (the definition it
    must agree with) or with the machines it indexes. Not an AllocationError, so never a 4xx: the
    front end answers 500 naming the job. A check that raises, not an assert: it holds under -O."""

    def __init__(self, what: str, job: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.job = job  # None where no job is in sight (the index's update); a caller may name it

    def __str__(self) -> str:
        return f"allocator inconsistency placing {self.job}: {self.what}" if self.job else \
            f"allocator inconsistency: {self.what}"
