"""The key schema: everything of a region lives under /twine/<region>/."""

from __future__ import annotations

from dataclasses import dataclass, field

INDEX_DIGITS = 6  # a task's index in its keys (tasks/, discovery/): zero-padded, so keys sort by index


def index_part(index: int) -> str:
    """A task's index as its keys end with it (store/revisions.py writes a task's key back with it)."""
    return f"{index:0{INDEX_DIGITS}d}"


@dataclass(frozen=True)
class Keys:
    region: str
    # made once: every key of every commit and watch event starts with it
    root: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", f"/twine/{self.region}/")

    def machines(self) -> str:
        return self.root + "machines/"

    def machine(self, machine_id: str) -> str:
        return self.machines() + machine_id

    def entitlements(self) -> str:
        return self.root + "entitlements/"

    def entitlement(self, name: str) -> str:
        return self.entitlements() + name

    def jobs(self) -> str:
        return self.root + "jobs/"

    def job(self, handle: str) -> str:  # handle: <entitlement>/<name>
        return self.jobs() + handle

    def tasks(self, handle: str | None = None) -> str:
        return self.root + "tasks/" + (handle + "/" if handle else "")

    def task(self, handle: str, index: int) -> str:
        return self.tasks(handle) + index_part(index)

    def events(self) -> str:
        return self.root + "events/"

    def event(self, event_id: str) -> str:
        return self.events() + event_id

    def discovery(self, handle: str | None = None) -> str:
        return self.root + "discovery/" + (handle + "/" if handle else "")

    def endpoint(self, handle: str, index: int) -> str:
        return self.discovery(handle) + index_part(index)

    # -- coordination (controlplane/coordination/coordinator.py): keys attached to leases ------------------

    def members(self) -> str:
        return self.root + "members/"

    def member(self, member_id: str) -> str:
        return self.members() + member_id

    def leaders(self) -> str:
        return self.root + "leaders/"

    def leader(self, shard: int) -> str:
        return self.leaders() + f"{shard:04d}"

    def ratelimit(self, scope: str) -> str:  # "region", "shard-0003"
        return self.root + "ratelimits/" + scope

    def settings(self) -> str:  # region-wide settings: the shard count
        return self.root + "settings"

    def taskcontrol(self, handle: str) -> str:  # the operations in flight for a job's TaskController
        return self.root + "taskcontrol/" + handle

    def rebalance(self, handle: str) -> str:  # the ReBalancer's move requests for a job, and its recent moves
        return self.root + "rebalance/" + handle

    def rollout(self, entitlement: str) -> str:  # the entitlement's host-profile rollout (controlplane/rollouts)
        return self.root + "rollouts/" + entitlement

    def rebalance_settings(self) -> str:  # the ReBalancer's continuous mode: on for which entitlements
        return self.root + "rebalance-settings"

    def capacity_settings(self) -> str:  # opportunistic capacity: reclaims paused or not
        return self.root + "capacity-settings"

    def token(self, token_id: str) -> str:  # an API token's record: its sha256, role and scope, never the secret
        return self.root + "tokens/" + token_id
