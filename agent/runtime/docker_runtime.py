"""The real runtime: Docker through the docker SDK, every call run off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from functools import partial
from typing import Any, Callable

import docker
import docker.errors
import requests.exceptions

from agent.models import TaskSpec
from agent.runtime.base import L_MACHINE, ContainerInfo, ImageNotFound, RuntimeUnavailable, task_env, task_labels

log = logging.getLogger("twine.agent")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
PULL_POLICIES = ("if-not-present", "never")
# container events that change what a reconcile pass would do: an exit (die), or a container
# removed behind the agent's back (destroy). The agent's own stops and removals come back as such
# too: the agent knows them and lets them pass (agent/daemon.py _watch_containers).
WATCHED_EVENTS = ("die", "destroy")


def container_name(machine_id: str, spec: TaskSpec, generation: int) -> str:
    job = _UNSAFE.sub("_", spec.job.replace("/", "."))
    return f"twine-{_UNSAFE.sub('_', machine_id)}-{job}-{spec.index}-g{generation}"


def _info(c: Any) -> ContainerInfo:
    state = c.attrs.get("State", {})
    return ContainerInfo(
        id=c.id,
        name=c.name,
        labels=dict(c.labels or {}),
        status=state.get("Status", c.status),
        exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
        started_at=state.get("StartedAt", ""),
        finished_at=state.get("FinishedAt", ""),
        oom_killed=bool(state.get("OOMKilled")),
        error=state.get("Error", ""),
        pid=int(state.get("Pid") or 0),
    )


TASK_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID", "KILL", "NET_BIND_SERVICE")


class DockerRuntime:
    def __init__(self, base_url: str | None = None, pull: str = "if-not-present", cgroup_parent: str | None = None):
        if pull not in PULL_POLICIES:
            raise ValueError(f"pull policy must be one of {PULL_POLICIES}")
        self._base_url = base_url
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self.pull = pull
        self.cgroup_parent = cgroup_parent
        # False while the host profile turns the cgroup cpu controller off for the task group:
        # a task's `cpus` is then a placement reservation only (no cpu.max), so that Docker (or
        # systemd, for Docker's systemd cgroup driver) does not turn the controller back on.
        self.cpu_limits = True

    def _docker(self) -> docker.DockerClient:
        with self._client_lock:  # the default executor's threads and the event stream's ask at once
            return self._make_client()

    def _make_client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                if self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, version="auto", timeout=60)
                else:
                    self._client = docker.from_env(version="auto", timeout=60)
            except docker.errors.DockerException as e:
                raise RuntimeUnavailable(f"docker is not reachable: {e}") from e
        return self._client

    async def _call(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        try:
            return await asyncio.to_thread(partial(fn, *args, **kw))
        except docker.errors.APIError:
            raise  # the daemon answered and refused: the caller reports it per task
        except (requests.exceptions.ConnectionError, docker.errors.DockerException) as e:
            raise RuntimeUnavailable(f"docker is not reachable: {e}") from e

    async def ping(self) -> bool:
        try:
            return bool(await self._call(lambda: self._docker().ping()))
        except RuntimeUnavailable:
            return False

    def _ensure_image(self, image: str) -> None:
        client = self._docker()
        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        if self.pull == "never":
            raise ImageNotFound(f"image {image!r} is not on this host (pull policy: never)")
        try:
            client.images.pull(image)
        except docker.errors.APIError as e:
            raise ImageNotFound(f"image {image!r} is not on this host and pulling it failed: {e.explanation or e}") from None

    async def ensure_image(self, image: str) -> None:
        await self._call(self._ensure_image, image)

    def _start(self, machine_id: str, spec: TaskSpec, generation: int) -> ContainerInfo:
        self._ensure_image(spec.image)
        kwargs: dict[str, Any] = dict(
            image=spec.image,
            command=list(spec.command) or None,
            name=container_name(machine_id, spec, generation),
            labels=task_labels(machine_id, spec, generation),
            environment={**dict(spec.env), **task_env(machine_id, spec)},
            nano_cpus=int(spec.cpus * 1e9) if self.cpu_limits else 0,
            mem_limit=f"{spec.memory_mb}m",
            pids_limit=spec.pids,
            network_mode=spec.network_mode,
            # no privilege a task's process could gain by exec (setuid binaries), and of Docker's
            # default capabilities only those an ordinary service uses (no raw sockets, device
            # nodes, chroot, audit, file capabilities)
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            cap_add=list(TASK_CAPABILITIES),
            detach=True,
        )
        if self.cgroup_parent:
            kwargs["cgroup_parent"] = self.cgroup_parent
        client = self._docker()
        try:
            c = client.containers.create(**kwargs)
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: a container of that name exists
                raise
            old = client.containers.get(kwargs["name"])
            if (old.labels or {}).get(L_MACHINE) != machine_id:
                raise
            old.remove(force=True)  # a leftover of ours that never started: replace it
            c = client.containers.create(**kwargs)
        c.start()
        c.reload()
        return _info(c)

    async def start(self, machine_id: str, spec: TaskSpec, generation: int) -> ContainerInfo:
        return await self._call(self._start, machine_id, spec, generation)

    def _stop(self, container_id: str, grace: float) -> None:
        try:
            self._docker().containers.get(container_id).stop(timeout=max(0, int(round(grace))))
        except docker.errors.NotFound:
            pass

    async def stop(self, container_id: str, grace: float) -> None:
        await self._call(self._stop, container_id, grace)

    def _remove(self, container_id: str) -> None:
        try:
            self._docker().containers.get(container_id).remove(force=True)
        except docker.errors.NotFound:
            pass

    async def remove(self, container_id: str) -> None:
        await self._call(self._remove, container_id)

    def _inspect(self, container_id: str) -> ContainerInfo | None:
        try:
            return _info(self._docker().containers.get(container_id))
        except docker.errors.NotFound:
            return None

    async def inspect(self, container_id: str) -> ContainerInfo | None:
        return await self._call(self._inspect, container_id)

    def _list(self, machine_id: str) -> list[ContainerInfo]:
        found = self._docker().containers.list(all=True, filters={"label": f"{L_MACHINE}={machine_id}"},
                                                  ignore_removed=True)  # removed between list and inspect
        return [_info(c) for c in found]

    async def list(self, machine_id: str) -> list[ContainerInfo]:
        return await self._call(self._list, machine_id)

    def _logs(self, container_id: str, tail: int) -> list[str]:
        try:
            raw = self._docker().containers.get(container_id).logs(tail=tail)
        except docker.errors.NotFound:
            return []
        return raw.decode(errors="replace").splitlines()

    async def logs(self, container_id: str, tail: int = 20) -> list[str]:
        return await self._call(self._logs, container_id, tail)

    def watch(self, machine_id: str, on_event: Callable[[dict], None], retry: float = 1.0) -> Callable[[], None]:
        """Follow Docker's event stream for this machine's containers on a thread of its own (not
        the default executor's, whose threads the starts share) and call on_event(event) there for
        each exit or removal. The stream is opened again after `retry` seconds when dockerd goes
        away. Returns the function that stops it."""
        stopping = threading.Event()
        current: list[Any] = []
        filters = {"type": "container", "label": f"{L_MACHINE}={machine_id}", "event": list(WATCHED_EVENTS)}

        def follow() -> None:
            lost = False
            while not stopping.is_set():
                stream = None
                try:
                    stream = self._docker().events(decode=True, filters=filters)
                    current[:] = [stream]
                    if stopping.is_set():  # stop() came before there was a stream to close
                        break
                    if lost:  # what happened while it was lost: the pass this wakes finds out
                        log.info("docker event stream open again")
                        on_event({"status": "reconnected"})
                    lost = False
                    for event in stream:
                        on_event(event)
                    why = "it ended"
                except Exception as e:  # dockerd restarted or gone: the periodic pass still runs
                    why = str(e)
                finally:
                    if stream is not None:  # its connection, before another is opened; closing a socket
                        with contextlib.suppress(Exception):  # stop() closed, or a reset one, raises
                            stream.close()
                if stopping.is_set():
                    break
                if not lost:
                    log.warning("docker event stream lost (%s); opening it again every %.0fs", why, retry)
                lost = True
                stopping.wait(retry)

        def stop() -> None:
            stopping.set()
            for stream in current:
                with contextlib.suppress(Exception):
                    stream.close()

        threading.Thread(target=follow, name=f"docker-events-{machine_id}", daemon=True).start()
        return stop
