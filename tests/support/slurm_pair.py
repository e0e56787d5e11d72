"""A two-node Slurm cluster on this one machine, for the multi-node path (#64): two network namespaces, one per
node, joined by a veth pair, each running its own ``slurmd`` (and the first one ``slurmctld``).

The nodes' traffic stays inside the namespaces: the veth pair's ends live in them (the host's namespace sees
neither), and each namespace has its own loopback. Each node's processes also get a UTS namespace (its host name,
``n1`` or ``n2``) and a mount namespace in which ``/etc/hosts`` names both nodes by their veth addresses, as a
cluster's nodes resolve each other. They share this machine's CPUs, memory and file system (the cluster's shared
file system). The link is not a network: a veth pair moves packets by a memory copy in the kernel, with no wire,
NIC or switch; :func:`measure_link` measures what TCP gets over it.

Commands that talk to the cluster run in the first node's namespace with its ``SLURM_CONF``
(:meth:`SlurmPair.run`); the machine's own single-node Slurm (``.ci/provision.sh slurm``) is left alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODES = ("n1", "n2")
SUBNET = "10.231.7"  # the nodes' addresses: SUBNET.1, SUBNET.2 (only inside their namespaces)
NAMESPACE = "modak-{node}"
CONTROLLER_PORT, SLURMD_PORT = 16917, 16918  # apart from the single-node Slurm's 16817/16818
PARTITION = "pair"
CPUS_PER_NODE = 1  # the two nodes split this machine's 2 cores
TOOLS = ("ip", "nsenter", "unshare", "slurmctld", "slurmd", "sbatch", "sinfo")


def address(node: str) -> str:
    return f"{SUBNET}.{NODES.index(node) + 1}"


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL)


@dataclass(frozen=True)
class Link:
    """What TCP gets over the nodes' veth pair."""

    bandwidth_gbps: float  # one stream's throughput, Gbit/s
    latency_us: float  # half the round trip of a one-byte ping-pong

    def describe(self) -> str:
        return (f"a veth pair between two network namespaces of one machine (a kernel memory copy, no wire): "
                f"TCP {self.bandwidth_gbps:.1f} Gbit/s one stream, {self.latency_us:.0f} us one way")


class SlurmPair:
    """The cluster, started by ``with SlurmPair(folder) as pair:`` and torn down after (daemons, namespaces,
    hosts files). ``folder`` holds its configuration, state and logs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self._daemons: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment of a command that talks to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, argv: Sequence[str | Path], timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess:
        """``argv`` in the first node's network namespace (where the controller listens), as its client."""
        return subprocess.run(["nsenter", f"--net=/run/netns/{NAMESPACE.format(node=NODES[0])}",
                               *map(str, argv)], env={**self.env, **kwargs.pop("env", {})}, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)

    def on(self, node: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` as a process of ``node``: its network, host name and hosts file."""
        namespace = NAMESPACE.format(node=node)
        script = f'mount --bind /etc/netns/{namespace}/hosts /etc/hosts && hostname {node} && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--mount", "--uts", "sh", "-c", script,
                node, *argv]

    def __enter__(self) -> SlurmPair:
        if os.geteuid() != 0:
            raise RuntimeError("a cluster of network namespaces is made by root")
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)} (.ci/provision.sh slurm installs Slurm)")
        self._remove_namespaces()  # a previous run's, killed before it tore down
        try:
            self._make_namespaces()
            self._write_conf()
            self._daemons.append(self._start(NODES[0], ["slurmctld", "-D"], "slurmctld"))
            for node in NODES:
                self._daemons.append(self._start(node, ["slurmd", "-D", "-N", node], f"slurmd-{node}"))
            self._wait_idle()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for daemon in self._daemons:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        self._daemons.clear()
        self._remove_namespaces()

    def _make_namespaces(self) -> None:
        first, second = (NAMESPACE.format(node=n) for n in NODES)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{address(n)} {n}\n" for n in NODES)
        for node in NODES:
            namespace = NAMESPACE.format(node=node)
            _sh("ip", "netns", "add", namespace)
            _sh("ip", "-n", namespace, "link", "set", "lo", "up")
            Path(f"/etc/netns/{namespace}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{namespace}/hosts").write_text(hosts)
        # both ends made inside the namespaces: the host's never holds them
        _sh("ip", "link", "add", f"mk-{NODES[0]}", "netns", first, "type", "veth", "peer", "name", f"mk-{NODES[1]}",
            "netns", second)
        for node in NODES:
            namespace = NAMESPACE.format(node=node)
            _sh("ip", "-n", namespace, "addr", "add", f"{address(node)}/24", "dev", f"mk-{node}")
            _sh("ip", "-n", namespace, "link", "set", f"mk-{node}", "up")

    def _remove_namespaces(self) -> None:
        for node in NODES:
            namespace = NAMESPACE.format(node=node)
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)

    def _write_conf(self) -> None:
        state = self.folder / "state"
        for node in NODES:
            (state / "d" / node).mkdir(parents=True, exist_ok=True)
        (state / "ctld").mkdir(parents=True, exist_ok=True)
        nodes = "".join(f"NodeName={n} NodeAddr={address(n)} CPUs={CPUS_PER_NODE} RealMemory=2000 State=UNKNOWN\n"
                        for n in NODES)
        self.conf.write_text(f"""\
# A two-node Slurm in network namespaces (tests/support/slurm_pair.py).
ClusterName=pair
SlurmctldHost={NODES[0]}({address(NODES[0])})
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SlurmUser=root
SlurmctldPort={CONTROLLER_PORT}
SlurmdPort={SLURMD_PORT}
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={self.folder}/slurmctld.log
SlurmdLogFile={self.folder}/slurmd-%n.log
ReturnToService=2
MinJobAge=3600
{nodes}PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, node: str, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{log}.out", "wb") as out:
            return subprocess.Popen(self.on(node, argv), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
            states = result.stdout.split()
            if result.returncode == 0 and states[1::2] == ["idle"] * len(NODES):
                return
            dead = [d.args for d in self._daemons if d.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-800:] for p in sorted(self.folder.glob("*.out"))}
        raise RuntimeError(f"the two-node Slurm did not become idle (sinfo: {states}): {logs}")


_RECEIVER = """\
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
connection, _ = server.accept()
with connection:
    for _ in range(2000):  # ping-pong
        connection.sendall(connection.recv(1))
    while connection.recv(1 << 20):  # the stream
        pass
"""

_SENDER = """\
import json, socket, sys, time
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
start = time.perf_counter()
for _ in range(2000):
    connection.sendall(b"x")
    connection.recv(1)
round_trip = (time.perf_counter() - start) / 2000
block, sent = b"\\0" * (1 << 20), 0
start = time.perf_counter()
while time.perf_counter() - start < 1.0:
    connection.sendall(block)
    sent += len(block)
connection.shutdown(socket.SHUT_WR)
connection.recv(1)
seconds = time.perf_counter() - start
print(json.dumps({"bandwidth_gbps": sent * 8 / seconds / 1e9, "latency_us": round_trip / 2 * 1e6}))
"""


def measure_link(pair: SlurmPair, port: int = 16990) -> Link:
    """One TCP stream from the second node to the first for a second, after 2,000 one-byte round trips."""
    import json

    receiver = subprocess.Popen(pair.on(NODES[0], [sys.executable, "-c", _RECEIVER, address(NODES[0]), str(port)]),
                                stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        sender = subprocess.run(pair.on(NODES[1], [sys.executable, "-c", _SENDER, address(NODES[0]), str(port)]),
                                capture_output=True, text=True, timeout=60, check=True)
    finally:
        receiver.wait(timeout=60)
    facts = json.loads(sender.stdout)
    return Link(facts["bandwidth_gbps"], facts["latency_us"])


def write_ddp_job(folder: Path, link: Link, wheelhouse: Path, steps: int) -> Path:
    """examples/cnn-train-cpu's network and training script as a data-parallel job of up to two workers, and a
    target of this cluster: two nodes of one core, Slurm, Apptainer, the network the link measured (TCP's own
    throughput, so all of it is usable: efficiency 1), whose SIF files are compressed with zstd (container.
    sif_compression: squashed more than ten times faster than with gzip, and read on both nodes). The job file."""
    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "cnn-train-cpu"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.py", "train.py"):
        shutil.copy(example / name, folder / name)
    job = yaml.safe_load((example / "job.yaml").read_text())
    job.update(name="cnn-ddp", precision=["fp32"], constraints={"runtimes": ["pytorch"]},
               entrypoint={"command": ["python3", "train.py", str(steps)], "files": ["train.py", "model.py"]},
               scaling={"min_efficiency": 0.5, "max_workers": len(NODES)})
    target = yaml.safe_load((example / "target.yaml").read_text())
    target.update(name="netns-pair", nodes=len(NODES),
                  scheduler={"kind": "slurm", "partition": PARTITION, "cores_per_job": CPUS_PER_NODE,
                             "time_limit": "00:20:00"},
                  network={"interconnect": "ethernet", "bandwidth_gbps": round(link.bandwidth_gbps, 2),
                           "latency_us": round(link.latency_us, 1), "efficiency": 1.0},
                  container={**target["container"], "engine": "apptainer", "sif_compression": "zstd"},
                  python={**target.get("python", {}), "wheelhouse": str(wheelhouse), "recipe_indexes": False})
    (folder / "target.yaml").write_text(yaml.safe_dump(target, sort_keys=False))
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return folder / "job.yaml"
