"""Each task's figures held by the other replicas (issue #35). A machine's report stays with the
replica its heartbeats reach; the partials the replicas relay every second hold sums per job and
cell only (their size follows the jobs, not the tasks). So a replica that wants tasks' own
figures (a job's usage answer with ?tasks=1, a ReBalancer plan) asks every other member at once,
`GET /v1/internal/usage/tasks`, each answering from its book (frontend/usage.py).

A member that does not answer within `timeout` adds nothing: its machines' tasks show as not
measured (the ReBalancer then takes its job's mean for them), and the failure is logged once and
counted."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Collection

import aiohttp
import msgspec

from controlplane.frontend.answers_usage import TaskFigures
from controlplane.frontend.forward import FORWARDED
from controlplane.usage.book import TaskUsage, chosen, in_slices

if TYPE_CHECKING:
    from controlplane.coordination.coordinator import Coordinator

log = logging.getLogger("twine.controld.usage")
PATH = "/v1/internal/usage/tasks"
MAX_NAMES = 32  # jobs or entitlements one ask names (a query string is bounded); more: every job's, kept here
TIMEOUT = 2.0  # seconds a member has to answer (it answers from memory)


def query(jobs: Collection[str] | None, entitlements: Collection[str] | None) -> list[tuple[str, str]]:
    """The ask's query parameters; none asks for every job's tasks (also when there are too many
    names for one ask: book.chosen then keeps those asked for)."""
    if len(jobs or ()) > MAX_NAMES or len(entitlements or ()) > MAX_NAMES:
        return []
    return [("job", h) for h in sorted(jobs or ())] + [("entitlement", e) for e in sorted(entitlements or ())]


class PeerTasks:
    """RegionUsage.peer_tasks of a member of the region's replicas."""

    def __init__(self, coordinator: "Coordinator", http: Callable[[], aiohttp.ClientSession], token: str,
                 timeout: float = TIMEOUT):
        self.coordinator = coordinator
        self.http = http  # the daemon's session to the other replicas (it verifies them with --tls-ca)
        self.token = token  # an API token of this region's: the other replicas' API takes it
        self.timeout = timeout
        self.counters = {"asked": 0, "failures": 0}
        self._failing: dict[str, str] = {}

    async def __call__(self, jobs: Collection[str] | None, entitlements: Collection[str] | None) -> list[TaskUsage]:
        coord = self.coordinator
        others = [m for m in sorted(coord.state.members) if m != coord.id]
        params = query(jobs, entitlements)
        answers = await asyncio.gather(*(self._ask(m, params) for m in others))
        return [t for ts in answers for t in ts if chosen(t.job, jobs, entitlements)]

    async def _ask(self, member: str, params: list[tuple[str, str]]) -> list[TaskUsage]:
        url = self.coordinator.member_url(member)
        if url is None:
            return []
        self.counters["asked"] += 1
        # marked forwarded: a member without the frontend role answers it too (middleware.py)
        headers = {"Authorization": f"Bearer {self.token}", FORWARDED: self.coordinator.id}
        try:
            async with self.http().get(url + PATH, params=params, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                if r.status != 200:
                    raise ValueError(f"HTTP {r.status}: {(await r.text())[:200]}")
                body = msgspec.json.decode(await r.read(), type=TaskFigures)
            if self._failing.pop(member, None):
                log.info("member %s answers for its tasks' usage again", member)
            out = []
            async for some in in_slices(body.tasks):
                out += [TaskUsage(f.job, f.index, f.machine, f.cpu_m, f.memory_mb, f.at,
                                  f.cpu_m if f.cpu_avg_m is None else f.cpu_avg_m) for f in some]
            return out
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, msgspec.DecodeError) as e:
            self.counters["failures"] += 1
            why = f"{type(e).__name__}: {e}"
            if self._failing.get(member) != why:
                self._failing[member] = why
                log.warning("member %s at %s did not give its tasks' usage (they show as not measured): %s",
                            member, url, why)
            return []
