"""The Vagrant region as tests and benchmarks drive it: the same `vagrant up` users run
(vagrant/Vagrantfile), a control VM and machine VMs, each with its own kernel and systemd as PID 1.

Where systemd is not PID 1 (here, CI) libvirtd runs in a private namespace (vagrant/vmenv.sh) and
every command that talks to the VMs (vagrant, ssh, twinectl) runs inside it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent.sdnotify import systemd_is_pid1

REPO = Path(__file__).resolve().parents[2]
VAGRANT = REPO / "vagrant"
VMENV = VAGRANT / "vmenv.sh"
REGION = VAGRANT / ".region"
MACHINES = ("m1", "m2")  # the machine VMs every VM test has
SPARE = f"m{len(MACHINES) + 1}"  # up with the region, paused, its agent held (not started) until a test adds it (Region.add)
API_PORT = 17080
# The region's control hosts: control alone, or with TWINE_VM_CONTROL=3 a highly available control
# plane (the Vagrantfile's TWINE_CONTROL=3: etcd and twine-controld on m1 and m2 as well, joined by
# the installer's flags; controld on mN answers at API_PORT + N here). Not the default: beside the
# agents of the 1-vCPU machine guests, etcd and controld took a third of m1's emulated CPU (11 and 8
# minutes of it in 40), so tasks measured 0.4-0.6 of a core they burn and heartbeats were missed:
# the default region grows to three control hosts in the HA test instead (tests/vm/test_ha.py, when asked for).
CONTROL = ("control", "m1", "m2")[:3 if os.environ.get("TWINE_VM_CONTROL") == "3" else 1]
NET = "192.168.56"  # the Vagrantfile's TWINE_NET: control .10, mN .10+N


def guest_ip(vm: str) -> str:
    return f"{NET}.{10 if vm == 'control' else 10 + int(vm[1:])}"


def log(message: str) -> None:
    """To stderr and to vagrant/.region/vm.log: the bring-up runs in a thread while other tests run,
    and pytest shows their captured output only when they fail."""
    line = f"[vm {time.strftime('%H:%M:%S')}] {message}"
    print(line, file=sys.stderr, flush=True)
    REGION.mkdir(parents=True, exist_ok=True)
    with open(REGION / "vm.log", "a") as f:
        f.write(line + "\n")


def kvm_usable() -> bool:
    """A KVM that runs stock kernels (kvm_intel/kvm_amd), not only /dev/kvm."""
    return Path("/dev/kvm").exists() and any(Path(f"/sys/module/{m}").exists() for m in ("kvm_intel", "kvm_amd"))


class Region:
    def __init__(self, machines: int = len(MACHINES), spare: bool = True) -> None:
        # `up` starts control and the first `machines` machine VMs, then the spare (m3) with its
        # agent installed and not started (TWINE_HELD), and pauses it: it is no machine of the
        # region until a test resumes it and starts its agent (`add`), and paused again (`park`)
        # when that test is done.
        self.base = ("control", *(f"m{i}" for i in range(1, machines + 1)))
        self.spare = f"m{machines + 1}" if spare else None
        self.control = list(CONTROL)  # the control hosts now: a test that grows the region adds to them
        self.env = {
            **os.environ,
            "TWINE_MACHINES": str(machines + spare),
            "TWINE_HELD": self.spare or "",
            "TWINE_CONTROL": str(len(CONTROL)),
            # m1 has 2 vCPUs (IRQs to move between, irqbalance to hold off), the others 1: more
            # emulated vCPUs than host cores slows every guest sharply.
            "TWINE_VM_CPUS": "2 1 1",
            "TWINE_LABELS": "dc1/msb1 dc2/msb2 dc1/msb3",
            "TWINE_VM_MEMORY": "768",
            "TWINE_API_PORT": str(API_PORT),
            "TWINE_LIBVIRT_DRIVER": os.environ.get("TWINE_LIBVIRT_DRIVER") or ("kvm" if kvm_usable() else "qemu"),
        }
        self.ssh_config = REGION / "ssh_config"
        self.forwarders: dict[int, subprocess.Popen] = {}  # host port -> this region's own forwarder (api_url)
        self.forwarding = threading.Lock()
        self.run_id = format(int(time.time()) % 0xFFFFF, "x")  # a kept region keeps entitlements: fresh names
        self.timings: dict[str, float] = {}

    # -- running things where the VMs are ---------------------------------------------------

    def run(self, *cmd: str, timeout: float = 600, check: bool = True, inside: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        argv = [str(VMENV), "exec", *cmd] if inside else list(cmd)
        r = subprocess.run(argv, cwd=VAGRANT, env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def vagrant(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        r = self.run("vagrant", *args, timeout=timeout)
        log(f"vagrant {' '.join(args)}: {time.monotonic() - t0:.0f} s")
        return r

    def ssh_argv(self, vm: str, command: str, root: bool = True) -> list[str]:
        # One SSH connection per VM, kept open: a new handshake costs seconds under emulation.
        return ["ssh", "-F", str(self.ssh_config), "-o", "ConnectTimeout=20", "-o", "BatchMode=yes",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={REGION}/ssh-%r@%h:%p", "-o", "ControlPersist=600",
                vm, "--", *(("sudo",) if root else ()), "bash", "-c", shlex.quote(command)]

    def ssh(self, vm: str, command: str, timeout: float = 300, check: bool = True) -> str:
        """`command` as root in the VM's shell; its stdout."""
        return self.run(*self.ssh_argv(vm, command), timeout=timeout, check=check).stdout

    def stream(self, *cmd: str) -> subprocess.Popen:
        """`cmd` where the VMs are, running on: its stdout a pipe of text lines (stop it with
        os.killpg: it leads a session of its own)."""
        return subprocess.Popen([str(VMENV), "exec", *cmd], cwd=VAGRANT, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def api_url(self, vm: str) -> str:
        """The URL of the controld on `vm` from this host: the port the Vagrantfile forwards to its
        7080 (API_PORT + N for mN). Vagrant forwards it with an `ssh -L` that ends with the guest's
        sshd: after a reboot from inside the guest nothing forwards it any more (fresh-clone runs E
        and I: "connection refused" at m1's port for the HA test's writes, after test_failures had
        rebooted m1). Then a forwarder of this region's own (ssh -L through the same SSH settings)
        takes the port; it ends with the region's namespace, or when its guest goes (ServerAlive)
        and is started again at the next call."""
        port = API_PORT + (0 if vm == "control" else int(vm[1:]))
        with self.forwarding:
            if self.run("bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}", check=False).returncode != 0:
                old = self.forwarders.pop(port, None)
                if old is not None and old.poll() is None:
                    os.killpg(old.pid, 9)
                    old.wait()
                self.forwarders[port] = subprocess.Popen(
                    [str(VMENV), "exec", "ssh", "-F", str(self.ssh_config), "-N", "-o", "BatchMode=yes",
                     "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                     "-L", f"127.0.0.1:{port}:127.0.0.1:7080", vm],
                    cwd=VAGRANT, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True)
                self.wait(lambda: self.run("bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}",
                                           check=False).returncode == 0, 60, f"{vm}'s API port forwarded", every=0.5)
                log(f"{vm}'s API port {port} forwarded anew (Vagrant's forward was gone)")
        return f"https://127.0.0.1:{port}"

    def ctl(self, *args: str, check: bool = True, timeout: float = 1200, via: str = "control"):
        """twinectl on this host, as an operator runs it, at the controld of the control host `via`;
        --json answers parsed."""
        env = {"TWINE_URL": self.api_url(via), "TWINE_CA": str(REGION / "pki" / "ca.pem"),
               "TWINE_TOKEN_FILE": str(REGION / "api-token")}
        r = self.run(str(REPO / ".venv/bin/twinectl"), "--json", *args, env=env, timeout=timeout, check=check)
        if not check:
            return r
        return json.loads(r.stdout) if r.stdout.strip() else None

    def put_profile(self, name: str, text: str) -> None:
        """A host profile file on every control host (each controld replica reads its own
        /etc/twine/profiles: an operator keeps them the same, as with any configuration)."""
        for vm in self.control:
            self.ssh(vm, f"cat > /etc/twine/profiles/{name}.toml <<'EOF'\n{text.rstrip()}\nEOF")

    def wait(self, predicate, timeout: float, what: str, every: float = 2.0):
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except (AssertionError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
                last = e
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {str(last)[-2000:]}")

    def name(self, base: str) -> str:
        return f"{base}-{self.run_id}"

    # -- what tests read --------------------------------------------------------------------

    def machines(self) -> dict[str, dict]:
        """controld's machines by hostname (a hostname that registered again, as a spare brought up
        anew in a kept region does: its healthy record)."""
        return {m["hostname"]: m for m in sorted(self.ctl("machine", "list")["machines"], key=lambda m: m["healthy"])}

    def containers(self, vm: str) -> dict[str, tuple[str, str, int]]:
        """The VM's task containers: name -> (id, StartedAt, RestartCount)."""
        out = self.ssh(vm, "docker ps -q --filter label=twine.machine | xargs -r docker inspect "
                           "-f '{{.Name}} {{.Id}} {{.State.StartedAt}} {{.RestartCount}}'")
        found = {}
        for line in out.split("\n"):
            if line.strip():
                name, cid, started, restarts = line.split()
                found[name.lstrip("/")] = (cid, started, int(restarts))
        return found

    def unit(self, vm: str, unit: str) -> dict[str, str]:
        out = self.ssh(vm, f"systemctl show {unit} -p ActiveState -p SubState -p MainPID -p NRestarts -p Type "
                           "-p WatchdogUSec -p KillMode")
        return dict(line.split("=", 1) for line in out.split("\n") if "=" in line)

    # -- bringing it up and down ------------------------------------------------------------

    def is_up(self) -> bool:
        """Every VM of the region running (and the namespace that holds them, where there is one)."""
        if self.run(str(VMENV), "status", inside=False, check=False).returncode != 0:
            return False
        out = self.run("vagrant", "status", "--machine-readable", check=False).stdout
        states = {line.split(",")[1]: line.split(",")[3] for line in out.splitlines() if ",state," in line}
        if any(states.get(vm) != "running" for vm in self.base):
            return False
        self.write_ssh_config()
        return True

    def write_ssh_config(self) -> None:
        """ssh's settings for every VM that is running (`vagrant ssh-config` fails on one not created)."""
        out = self.run("vagrant", "status", "--machine-readable", check=False).stdout
        running = [line.split(",")[1] for line in out.splitlines() if line.split(",")[2:4] == ["state", "running"]]
        self.ssh_config.write_text(self.run("vagrant", "ssh-config", *running, timeout=300).stdout)

    def up(self) -> None:
        t0 = time.monotonic()
        # pip needs PyPI, which the namespace's network does not reach: the wheelhouse first
        self.run("bash", str(REPO / "scripts/build-wheelhouse.sh"), str(REGION / "wheelhouse"), inside=False,
                 env={"PYTHON": str(REPO / ".venv/bin/python")}, timeout=900)
        r = self.run("bash", str(VAGRANT / "box/build.sh"), inside=False, timeout=1800)
        self.timings["box"] = time.monotonic() - t0
        log(f"box ready in {self.timings['box']:.0f} s: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
        self.run(str(VMENV), "up", inside=False, timeout=120)
        t0 = time.monotonic()
        self.vagrant("up", *self.base, timeout=2400)
        self.timings["up"] = time.monotonic() - t0
        if self.spare:  # once the others are up: fewer emulated boots at once beside the host's tests
            t0 = time.monotonic()
            self.vagrant("up", self.spare, timeout=2400)
            # paused until a test adds it: an idle emulated guest still takes a share of the host's
            # two cores from the guests the other tests use
            self.virsh("suspend", self.spare)
            self.timings["spare"] = time.monotonic() - t0
        self.write_ssh_config()

    def virsh(self, verb: str, vm: str) -> None:
        names = self.run("virsh", "-c", "qemu:///system", "list", "--all", "--name").stdout.split()
        domain = next(n for n in names if n.endswith(f"_{vm}"))  # vagrant-libvirt names it <folder>_<vm>
        self.run("virsh", "-c", "qemu:///system", verb, domain)

    def power_cut(self, vm: str) -> None:
        """The VM's power cut: libvirt destroys the domain (no shutdown, no notice). What `vagrant
        halt --force` does too, after 30-35 s of loading vagrant here."""
        self.virsh("destroy", vm)

    def power_on(self, vm: str, timeout: float = 900) -> None:
        """The VM boots again and answers SSH. Its network was configured for good at its first
        `vagrant up` (the same address: libvirt's DHCP lease by its MAC); `vagrant up` would do that
        again, and sync the staged install, in about 100 s more under emulation here."""
        t0 = time.monotonic()
        self.virsh("start", vm)
        self.wait(lambda: self.run(*self.ssh_argv(vm, "true"), timeout=60, check=False).returncode == 0,
                  timeout, f"{vm} answering SSH", every=5)
        log(f"virsh start {vm} to SSH: {time.monotonic() - t0:.0f} s")

    def add(self, vm: str) -> None:
        """The spare machine VM joins the region: resumed, and its agent started (the VM brought
        up first if it is not there, e.g. a kept region whose spare a test removed)."""
        out = self.run("vagrant", "status", vm, "--machine-readable", check=False).stdout
        resumed = f",{vm},state,paused" in out
        if resumed:
            self.virsh("resume", vm)
        elif f",{vm},state,running" not in out:
            self.vagrant("up", vm, timeout=2400)
        self.write_ssh_config()
        if resumed:  # its clock stood still while paused: set it as NTP would (certificates issued since are "not yet valid" to it otherwise)
            self.ssh(vm, f"date -s @{time.time():.3f} >/dev/null")
        self.ssh(vm, "systemctl start twine-agent")

    def park(self, vm: str) -> None:
        """Pause a spare machine VM that a test added: no share of the host's cores, no tasks; its
        machine is failed (silent past the heartbeat timeout) before this returns, so that no later
        test sees that failure happen. `add` resumes it."""
        mid = self.machines()[vm]["id"]
        self.virsh("suspend", vm)
        self.wait(lambda: not next(m for m in self.ctl("machine", "list")["machines"] if m["id"] == mid)["healthy"],
                  300, f"{vm}'s machine failed")

    def down(self) -> None:
        t0 = time.monotonic()
        for p in self.forwarders.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        try:
            self.vagrant("destroy", "-f", timeout=900)
        finally:
            self.run(str(VMENV), "down", inside=False, timeout=300, check=False)
            self.timings["down"] = time.monotonic() - t0


class Bringup:
    """The region's `vagrant up`, started in a thread as soon as VM tests are collected, so that the
    VMs boot while the other tests run (the VM tests run last). `region()` waits for it.
    With keep (TWINE_VM_KEEP=1, never under CI) a region that is up is used as it is."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.region = Region()
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._up, name="vm-region-up", daemon=True)
        self.thread.start()

    def _up(self) -> None:
        try:
            if self.keep and self.region.is_up():
                log("using the region that is up (TWINE_VM_KEEP=1)")
                return
            log("bringing the region up in the background (log: vagrant/.region/vm.log)")
            self.region.up()
        except BaseException as e:  # noqa: BLE001 - raised again in the test that waits for it
            self.error = e

    def wait(self, timeout: float = 3600) -> Region:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"the region was not up after {timeout:.0f} s (vagrant/.region/vm.log)")
        if self.error is not None:
            raise AssertionError(f"bringing the region up failed: {self.error}") from self.error
        return self.region

    def finish(self) -> None:
        """At the end of the session: down, unless kept (waits for a bring-up still under way)."""
        self.thread.join()
        if not self.keep:
            self.region.down()


def missing_tools() -> str:
    need = ["vagrant", "virsh", "libvirtd", "qemu-system-x86_64", "mmdebstrap"]
    if not systemd_is_pid1():
        need += ["tini", "nsenter", "unshare"]
    return ", ".join(t for t in need if shutil.which(t) is None)
