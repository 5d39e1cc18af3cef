"""The key schema: everything of a region lives under /twine/<region>/."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    region: str

    @property
    def root(self) -> str:
        return f"/twine/{self.region}/"

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
        return self.tasks(handle) + f"{index:06d}"

    def events(self) -> str:
        return self.root + "events/"

    def event(self, event_id: str) -> str:
        return self.events() + event_id

    def discovery(self, handle: str | None = None) -> str:
        return self.root + "discovery/" + (handle + "/" if handle else "")
