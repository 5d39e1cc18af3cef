"""`twine-agent run`: the node agent daemon.

start (recover a half-done profile switch, adopt containers, serve HTTP) -> run (watch the
desired state, reconcile, probe health, heartbeat to the control plane if there is one) -> stop
(on SIGTERM/SIGINT: stop our loops, leave every task running). Tasks never depend on the agent
being alive, nor on the control plane being reachable.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import time
from dataclasses import replace

from agent import desired as desired_mod
from agent.config import AgentConfig
from agent.controlplane_client import ControlPlaneClient, ControlPlaneSource
from agent.errors import DesiredStateError, InputError
from agent.health import HealthReport, probe
from agent.http import Endpoints, serve
from agent.models import DesiredState
from agent.profiles.appliers.base import ApplierError
from agent.profiles.engine import Engine
from agent.profiles.loader import ProfileName, from_content
from agent.profiles.model import Report
from agent.reconcile import Plan, plan
from agent.report import machine_info, steady, task_reports
from agent.runtime.base import ContainerInfo, ContainerRuntime, ImageNotFound, RuntimeUnavailable
from agent.runtime.docker_runtime import DockerRuntime
from agent.sdnotify import Notifier, host_rebooting
from agent.status import status
from agent.tls import client_context
from agent.usage import Running, Sampler

# container starts (and replacements) a reconcile pass runs at once: each holds a thread of the
# default executor (6 on a 2-core host) for its Docker calls, which the health probe shares
START_CONCURRENCY = 4
log = logging.getLogger("twine.agent")
PROFILE_RETRY = 60.0  # a failed profile is retried after this long, or at once when desired changes
SHUTDOWN_BOUND = 10.0


class Agent:
    def __init__(
        self, config: AgentConfig, runtime: ContainerRuntime, source: desired_mod.DesiredSource | None,
        client: ControlPlaneClient | None = None,
    ):
        self.config = config
        self.runtime = runtime
        self.source = source
        self.client = client
        self.engine = Engine(config.host_context(), config.state_dir, config.profile_search())
        self.desired: DesiredState = DesiredState()
        self.source_error = ""
        self.profile_report: Report | None = None
        self._profile_failed_at: tuple[str | None, str, float] | None = None
        self.containers: list[ContainerInfo] = []
        self.listed_at: float | None = None  # when Docker was last asked for the whole list (wall clock)
        self.sampler = Sampler()  # what the tasks and the host use, sent with each heartbeat
        self.last_plan = Plan()
        self.task_errors: dict[str, str] = {}
        self.last_exit: dict[str, dict] = {}
        self.adopted: list[str] = []
        self.health: HealthReport | None = None
        self.counters = {"reconcile_passes": 0, "reconcile_errors": 0, "tasks_started": 0, "tasks_stopped": 0,
                         "container_events": 0}
        self.started_at = time.time()
        self._wake = asyncio.Event()
        # containers this agent is stopping and removing (their events are its own); only the
        # event loop touches it, and each pass keeps only the ids Docker still lists
        self._removing: set[str] = set()
        self._stop = asyncio.Event()
        self.notifier = Notifier()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, initial: DesiredState | None) -> None:
        before_reboot = await asyncio.to_thread(self.engine.forget_previous_boot)
        if before_reboot is not None:
            # Tasks wait for the profile (profile_ready is False until it is applied again).
            log.warning("the host rebooted since profile %s was applied: applying it again before any task starts",
                        before_reboot)
        recovered = await asyncio.to_thread(self.engine.recover)
        if recovered is not None:
            log.warning("rolled back an unfinished profile switch to %s: ok=%s", recovered.profile, recovered.ok)
            self.profile_report = recovered
        cached = desired_mod.load_cache(self.config.state_dir)
        self.desired = initial or cached or DesiredState()
        if initial is not None:
            desired_mod.save_cache(self.config.state_dir, initial)
        try:
            await self._list()
            self.adopted = [c.id for c in self.containers if c.running]
            log.info("adopted %d running container(s) of machine %s", len(self.adopted), self.config.machine_id)
        except RuntimeUnavailable as e:
            log.error("%s; will keep trying", e)

    async def run(self) -> None:
        runner = await serve(self.config.listen, Endpoints(lambda: status(self), lambda: self.health))
        self.notifier.ready(f"machine {self.config.machine_id}: {len(self.adopted)} task container(s) adopted")
        stop_watch = self._watch_containers()
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(self._reconcile_loop()), tg.create_task(self._health_loop()),
                         tg.create_task(self.notifier.watchdog_loop())]
                if self.source is not None:
                    loops.append(tg.create_task(self.source.watch(self._on_desired, self._on_source_error)))
                if self.client is not None:
                    loops.append(tg.create_task(self.client.heartbeat_loop(self.heartbeat_report)))
                await self._stop.wait()
                for t in loops:
                    t.cancel()
            if self.client is not None and await asyncio.to_thread(host_rebooting):
                await self._announce_reboot()
        finally:
            if stop_watch is not None:
                try:
                    stop_watch()
                except Exception:  # closing the stream must not keep the rest from closing
                    log.exception("stopping the docker event stream")
            await runner.cleanup()
            if self.client is not None:
                await self.client.close()

    def stop(self) -> None:
        self._stop.set()

    def _watch_containers(self):
        """A container of ours that exits or is removed wakes a reconcile pass at once (issue #12:
        an exit waited for the next periodic pass, and the control plane for the heartbeat after)."""
        watch = getattr(self.runtime, "watch", None)
        if watch is None:
            return None
        loop = asyncio.get_running_loop()

        def on_event(event: dict) -> None:  # on the runtime's thread: handed to the loop
            try:
                loop.call_soon_threadsafe(self._container_event, event)
            except RuntimeError:  # the loop is closed: the agent is stopping
                pass

        return watch(self.config.machine_id, on_event)

    def _container_event(self, event: dict) -> None:
        cid = event.get("id")
        if cid in self._removing:  # our own stop and removal: nothing a pass has to learn of
            if event.get("status") == "destroy":
                self._removing.discard(cid)
            return
        if event.get("status") != "reconnected":
            self.counters["container_events"] += 1
        self._wake.set()

    async def _announce_reboot(self) -> None:
        """Tell the control plane this host is rebooting, so that its silence is no failure."""
        try:
            answer = await self.client.announce_reboot()
            log.warning("host rebooting: told the control plane (%s)", answer.get("maintenance"))
        except Exception as e:  # the reboot goes on; the health check handles the silence
            log.warning("host rebooting; could not tell the control plane: %s", e)

    def _notify(self) -> None:
        """Tell the control plane soon that something changed."""
        if self.client is not None:
            self.client.notify()

    # -- desired state -----------------------------------------------------------------------

    async def _on_desired(self, desired: DesiredState) -> None:
        try:
            await self.validate(desired)
        except InputError as e:
            self._on_source_error(str(e))
            return
        self.source_error = ""
        self.desired = desired
        self._profile_failed_at = None
        await asyncio.to_thread(desired_mod.save_cache, self.config.state_dir, desired)
        log.info("new desired state %s: profile %s, %d task(s)", desired.version, desired.profile, len(desired.tasks))
        self._wake.set()
        self._notify()

    def _on_source_error(self, message: str) -> None:
        self.source_error = message

    async def validate(self, desired: DesiredState) -> None:
        """Everything that can be checked before touching the host: the profile and the images."""
        if desired.profile:
            await asyncio.to_thread(self.engine.load, _target(desired, self.client is not None))
        if self.client is not None:
            # From the control plane, one task's missing image must not hold back the machine's
            # other tasks: it fails to start, and its report says why.
            return
        for i, t in enumerate(desired.tasks):
            try:
                await self.runtime.ensure_image(t.image)
            except ImageNotFound as e:
                raise DesiredStateError(desired.source, f"tasks[{i}].image", t.image, str(e)) from None
            except RuntimeUnavailable:
                return  # cannot check now; a task that cannot start is reported per task later

    # -- reconcile ---------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            # cleared before the pass: a wake that comes during it (a new desired state, an exit)
            # brings the next pass at once instead of being lost until the interval
            self._wake.clear()
            wait = self.config.reconcile_interval
            try:
                p = await self.reconcile_once()
                if p.due_at is not None:  # a restart's backoff ends before the interval does
                    wait = min(wait, max(p.due_at - time.time(), 0.05))
            except Exception:  # one bad pass must not stop the agent: the next pass repairs
                self.counters["reconcile_errors"] += 1
                log.exception("reconcile pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    def profile_ready(self) -> bool:
        spec = self.desired.profile_spec
        return self.engine.in_force(self.desired.profile, spec.hash if spec is not None else None)

    async def _converge_profile(self) -> None:
        if self.profile_ready():
            return
        want = self.desired.profile
        failed = self._profile_failed_at
        if failed and failed[:2] == (want, self.desired.version) and time.time() - failed[2] < PROFILE_RETRY:
            return
        if want is None:
            report = await asyncio.to_thread(self.engine.rollback)
        else:
            try:
                report = await asyncio.to_thread(self.engine.apply, _target(self.desired, self.client is not None))
            except InputError as e:
                report = Report("apply", want, False, error=str(e))
        self.profile_report = report
        if report.ok:
            log.info("profile %s %s in %.1f ms", want, report.action, report.seconds * 1000)
            self._profile_failed_at = None
        else:
            log.error("profile %s failed: %s", want, report.error)
            self._profile_failed_at = (want, self.desired.version, time.time())
        self._notify()

    async def reconcile_once(self) -> Plan:
        self.counters["reconcile_passes"] += 1
        await self._converge_profile()
        before = {c.id: (c.status, steady(c, self.listed_at)) for c in self.containers}
        await self._list()
        # a removal whose destroy event never came (the stream was down, the removal failed, or the
        # event came first): gone from the list, it is forgotten; a late event costs one pass
        self._removing.intersection_update(c.id for c in self.containers)
        if {c.id: (c.status, steady(c, self.listed_at)) for c in self.containers} != before:
            self._notify()  # an exit, a removal or a task now steady is news even when nothing is started
        p = plan(self.desired.tasks, self.containers, self.profile_ready(), time.time())
        self.last_plan = p
        if p.update or p.restart or p.place:  # the applied record is read once a pass, not per start
            self.runtime.cpu_limits = not self.cpu_controller_off()
        grace = self.config.stop_grace
        await asyncio.gather(*(self._stop_container(c, grace) for c in p.stop))
        # a pass's replacements and starts run side by side, at most START_CONCURRENCY at a time
        # (issue #12: one after another, ten tasks took ten container starts end to end)
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def replace_task(old: ContainerInfo | None, spec, gen: int) -> ContainerInfo | None:
            async with slots:
                if old is not None:
                    await self._stop_container(old, grace)
                return await self._start(spec, gen)

        # every start runs to its end before the pass ends, even when one fails (a start left
        # running would meet the next pass's start of the same task)
        results = await asyncio.gather(*(replace_task(old, spec, gen) for old, spec, gen in (*p.update, *p.restart)),
                                       *(replace_task(None, spec, gen) for spec, gen in p.place),
                                       return_exceptions=True)
        if failed := next((r for r in results if isinstance(r, BaseException)), None):
            raise failed
        if (p.update or p.restart or p.place) and not self.runtime.cpu_limits:
            await self._hold_cpu_controller_off()
        if not p.empty():
            started = [r for r in results if isinstance(r, ContainerInfo)]
            if len(started) == len(results):
                # every start gave its container: the list is known without asking Docker again
                # (a list inspects each container: issue #12, submit to running was 1.2x of docker run)
                gone = {c.id for c in p.stop} | {old.id for old, _, _ in (*p.update, *p.restart)}
                self.containers = [c for c in self.containers if c.id not in gone] + started
            else:
                await self._list()
            self._notify()
        return p

    async def _list(self) -> None:
        asked = time.time()  # what Docker answers is true of this moment or later
        self.containers = await self.runtime.list(self.config.machine_id)
        self.listed_at = asked

    async def _stop_container(self, c: ContainerInfo, grace: float) -> None:
        self._removing.add(c.id)  # its die and destroy events are ours (_watch_containers)
        try:
            if c.running:
                await self.runtime.stop(c.id, grace)
                self.counters["tasks_stopped"] += 1
            else:
                self._remember_exit(c, await self.runtime.logs(c.id, tail=20))
            await self.runtime.remove(c.id)
        except BaseException:  # it stays: its own events are news again
            self._removing.discard(c.id)
            raise

    def _remember_exit(self, c: ContainerInfo, logs: list[str]) -> None:
        self.last_exit[str(c.task)] = {
            "exit_code": c.exit_code, "finished_at": c.finished_at, "generation": c.generation,
            "oom_killed": c.oom_killed, "logs": logs,
        }

    def cpu_controller_off(self) -> bool:
        """The applied profile turned the cgroup cpu controller off (and it applied here)."""
        record = self.engine.current()
        setting = (record or {}).get("settings", {}).get("cgroup_cpu:enabled")
        return bool(setting) and setting["value"] is False and "cgroup_cpu:enabled" not in record.get("not_applicable", {})

    async def _hold_cpu_controller_off(self) -> None:
        """runc turns the cgroup cpu controller on in every ancestor of each container it creates:
        the profile that turned it off is written again (agent/profiles/appliers/cgroup_cpu.py)."""
        try:
            if written := await asyncio.to_thread(self.engine.hold, "cgroup_cpu"):
                log.info("cgroup cpu controller off again after container starts (%s)", ", ".join(written))
        except (OSError, ApplierError) as e:  # reported by the health check's verify as drift
            log.error("could not hold the cgroup cpu controller off: %s", e)

    async def _start(self, spec, generation: int) -> ContainerInfo | None:
        """The started container, or None when it could not start (the task's error says why)."""
        key = str(spec.key)
        try:
            info = await self.runtime.start(self.config.machine_id, spec, generation)
            self.task_errors.pop(key, None)
            self.counters["tasks_started"] += 1
            return info
        except (ImageNotFound, RuntimeUnavailable) as e:
            self.task_errors[key] = str(e)
        except Exception as e:  # docker refused (bad command...): a task failure, not an agent crash
            self.task_errors[key] = f"start failed: {e}"
            log.error("task %s: start failed: %s", key, e)
        return None

    # -- health ------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            docker_up = await self.runtime.ping()
            drift: tuple[str, ...] = ()
            if self.engine.current() is not None:
                report = await asyncio.to_thread(self.engine.verify)
                drift = tuple(f"{r.setting_id}: {r.reason}" for r in report.failed())
            before = self.health
            self.health = await asyncio.to_thread(probe, self.config.state_dir, docker_up, drift)
            if before is None or before.problems != self.health.problems:
                self._notify()
            await asyncio.sleep(self.config.health_interval)

    # -- control plane -----------------------------------------------------------------------

    def heartbeat_report(self) -> dict:
        """What the heartbeat tells the control plane (docs/api.md): the client adds seq and digest."""
        record = self.engine.current()
        ready = self.profile_ready()
        failed = self.profile_report is not None and not self.profile_report.ok and not ready
        h = self.health
        return {
            "desired_version": self.desired.version,
            "desired_error": self.source_error,
            "health": {"ok": h.ok, "problems": list(h.problems)} if h else {"ok": False, "problems": ["not probed yet"]},
            "profile": {
                "name": (record.get("ref") or record["profile"]) if record else None,
                "hash": record.get("hash") if record else None,
                "ok": ready,
                "error": self.profile_report.error if failed else "",
            },
            "tasks": task_reports(self.containers, self.desired.tasks, self.task_errors, self.listed_at),
            "usage": self.sampler.sample(Running(c.id, c.pid, c.task.job, c.task.index)
                                         for c in self.containers if c.running and c.pid > 0),
        }


def _target(desired: DesiredState, from_control_plane: bool):
    """What to apply: the profile's content when the control plane sent it, else its name (one
    the control plane names is looked up in the profile directories only, never as a path)."""
    spec = desired.profile_spec
    if spec is not None:
        return from_content(spec.name, spec.sections, spec.hash)
    return ProfileName(desired.profile) if from_control_plane and desired.profile else desired.profile


def _runtime(config: AgentConfig) -> DockerRuntime:
    parent = config.task_cgroup if config.task_cgroup.endswith(".slice") else "/" + config.task_cgroup.strip("/")
    return DockerRuntime(pull=config.image_pull, cgroup_parent=parent)


def _control_plane(config: AgentConfig, tls: ssl.SSLContext | None) -> tuple[ControlPlaneSource, ControlPlaneClient]:
    """The long-poll source and its client; registration happens in the background, when first needed."""
    client = ControlPlaneClient(
        config.control_plane, config.bootstrap_token(), config.state_dir, machine_info(config), config.heartbeat_interval,
        tls=tls,
    )
    cached = desired_mod.load_cache(config.state_dir)
    return ControlPlaneSource(client, cached.version if cached else ""), client


async def _main(config: AgentConfig, tls: ssl.SSLContext | None = None) -> int:
    runtime = _runtime(config)
    source: desired_mod.DesiredSource | None = None
    client, initial = None, None
    if config.control_plane:
        source, client = _control_plane(config, tls)
    elif config.desired:
        source = desired_mod.FileSource(config.desired)
        initial = source.read()  # DesiredStateError: exit 2, nothing touched
    agent = Agent(config, runtime, source, client)
    if initial is not None:
        await agent.validate(initial)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.start(initial)
    task = asyncio.create_task(agent.run())
    stopping = asyncio.create_task(agent._stop.wait())
    log.info("agent %s up; listening on %s", config.machine_id, config.listen)
    await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    if task.done():  # run() ended by itself: it failed (e.g. the listen address is taken)
        stopping.cancel()
        exc = task.exception()
        log.error("agent stopped: %s", exc)
        return 3 if isinstance(exc, OSError) else 1
    log.info("stopping: tasks keep running")
    try:
        await asyncio.wait_for(task, SHUTDOWN_BOUND)
    except TimeoutError:
        task.cancel()
    return 0


def run_daemon(config: AgentConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not config.machine_id:
        raise InputError("/etc/machine-id", "machine_id", "", "no machine id: set machine_id in the config or --machine-id")
    tls = None
    if config.control_plane:
        config.bootstrap_token()  # InputError (exit 2) before anything starts
        if config.control_plane_ca:  # the same: a CA file we cannot use
            tls = client_context(config.control_plane_ca, "config", "control_plane_ca")
    config.state_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_main(replace(config), tls))
