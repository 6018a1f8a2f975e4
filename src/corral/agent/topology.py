"""How this node's GPUs sit: their NUMA nodes and how each pair is linked.

Two GPUs joined by NVLink exchange gradients many times faster than two that
talk across the CPU sockets, and a process fed from another socket's memory
is slower too. The agent knows the layout, read from NVML (``read_nvml``:
NVLink state, the common PCIe ancestor of each pair, each GPU's NUMA node) or,
for tests and demos, given as ``--fake-topology`` (``parse_fake``), and

* pins a job's process to the CPUs of its GPUs' NUMA nodes (``cpus_for``);
* reports each NUMA node's share of its CPU slots (``cpu_shares``), from which the
  server draws a GPU job's CPUs;
* ranks GPU sets by closeness (``closest``: NVLink-connected sets first), the
  choice a placement of several GPUs on one node should make.

Link kinds, closest first: ``nvlink``, ``pcie_switch`` (behind one PCIe
switch), ``same_socket`` (through one CPU's host bridge), ``cross_socket``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from corral.core import InvalidSpec
from corral.core.topology import LINKS, closest, describe

# NVML's nvmlGpuTopologyLevel_t: 0 internal, 10 single switch, 20 multiple switches,
# 30 host bridge, 40 same NUMA node, 50 across sockets (SMP interconnect).
_LEVELS = {0: "pcie_switch", 10: "pcie_switch", 20: "pcie_switch", 30: "same_socket"}
_LEVELS |= {40: "same_socket", 50: "cross_socket"}
NODE_ROOT = Path("/sys/devices/system/node")


@dataclass(frozen=True, slots=True)
class Topology:
    """The GPUs' NUMA nodes (by GPU index; -1: unknown), the link of each pair (``(a, b)``
    with ``a < b``; a pair not listed is ``cross_socket``) and each NUMA node's CPUs."""

    numa: tuple[int, ...] = ()
    links: Mapping[tuple[int, int], str] = field(default_factory=dict)
    numa_cpus: Mapping[int, frozenset[int]] = field(default_factory=dict)

    def link(self, a: int, b: int) -> str:
        return self.links.get((min(a, b), max(a, b)), "cross_socket")

    def cpus_for(self, gpus: Sequence[int]) -> frozenset[int] | None:
        """The CPUs of ``gpus``' NUMA nodes this process may use; None when unknown (a CPU
        job, a GPU of unknown node, or no such CPU left to this agent)."""
        nodes = {self.numa[g] for g in gpus if 0 <= g < len(self.numa)}
        if not gpus or not nodes or -1 in nodes:
            return None
        cpus = frozenset().union(*(self.numa_cpus.get(n, frozenset()) for n in nodes))
        usable = cpus & os.sched_getaffinity(0)
        return frozenset(usable) or None

    def cpu_shares(self, total_milli: int) -> list[tuple[int, int]]:
        """``total_milli`` (the node's CPU slots, in milli-CPUs) split among the NUMA nodes by
        their CPU count, as ``(numa node, milli-CPUs)``: what the agent reports, so the
        server draws a GPU job's CPUs from its GPUs' NUMA nodes. Slots, not CPUs: an agent
        offering fewer slots than it has CPUs (``--cpus``) offers each node its share."""
        counts = sorted((n, len(cpus)) for n, cpus in self.numa_cpus.items() if cpus)
        every = sum(c for _, c in counts)
        if not every:
            return []
        shares = [(n, total_milli * c // every) for n, c in counts]
        left = total_milli - sum(s for _, s in shares)  # the rounding, to the first node
        return [(shares[0][0], shares[0][1] + left), *shares[1:]]

    def closest(self, free: Sequence[int], count: int) -> tuple[int, ...]:
        """``count`` of the ``free`` GPUs linked as closely as possible (``core/topology.py``)."""
        return closest(free, count, self.link, self.numa_of)

    def numa_of(self, gpu: int) -> int:
        return self.numa[gpu] if 0 <= gpu < len(self.numa) else -1

    def row(self, gpu: int) -> tuple[str, ...]:
        """``gpu``'s link to every GPU by index ("" to itself): what the agent reports."""
        return tuple("" if g == gpu else self.link(gpu, g) for g in range(len(self.numa)))

    def describe(self, gpus: Sequence[int]) -> str:
        """How a job's GPUs sit, for its log (``core/topology.describe``)."""
        return describe(gpus, self.link, self.numa_of)


def parse_fake(text: str, gpus: int) -> Topology:
    """``"numa=0,0,1,1; nvlink=0-1,2-3; pcie_switch=0-2; cpus=0:0-15,1:16-31"``: each GPU's
    NUMA node, pairs by link kind (others cross sockets, or share one when their NUMA node
    does) and each NUMA node's CPUs (default: this machine's, from /sys)."""
    parts: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in (*LINKS, "numa", "cpus"):
            raise InvalidSpec("fake_topology", f"{item!r}: write numa=..., nvlink=a-b, cpus=...")
        parts[key.strip()] = value.strip()
    numa = tuple(_ints(parts.get("numa", ""), "numa")) or (0,) * gpus
    if len(numa) != gpus:
        raise InvalidSpec("fake_topology", f"numa names {len(numa)} GPUs, the node has {gpus}")
    links = {
        (a, b): "same_socket"
        for a, b in itertools.combinations(range(gpus), 2)
        if numa[a] == numa[b]
    }
    for kind in reversed(LINKS[:2]):  # nvlink wins over a switch named for the same pair
        for pair in filter(None, parts.get(kind, "").split(",")):
            a, b = sorted(_ints(pair.replace("-", ","), kind))
            if not 0 <= a < b < gpus:
                raise InvalidSpec("fake_topology", f"{kind}={pair}: no such pair of GPUs")
            links[(a, b)] = kind
    cpus = _numa_cpus(parts["cpus"]) if "cpus" in parts else numa_cpus_from_sys()
    return Topology(numa, links, cpus)


def read_nvml(nvml: ModuleType, handles: Sequence[Any]) -> Topology:
    """The layout of the GPUs behind ``handles`` as NVML describes it."""
    buses = [_decoded(nvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    links: dict[tuple[int, int], str] = {}
    for a, b in itertools.combinations(range(len(handles)), 2):
        try:
            level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
            links[(a, b)] = _LEVELS.get(level, "cross_socket")
        except nvml.NVMLError:
            continue
    for a, handle in enumerate(handles):
        for peer in _nvlink_peers(nvml, handle):
            if peer.lower() in buses and buses.index(peer.lower()) != a:
                b = buses.index(peer.lower())
                links[(min(a, b), max(a, b))] = "nvlink"
    numa = tuple(_numa_of(bus) for bus in buses)
    return Topology(numa, links, numa_cpus_from_sys())


def _nvlink_peers(nvml: ModuleType, handle: Any) -> list[str]:
    peers = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link):
                peers.append(
                    str(_decoded(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                )
        except nvml.NVMLError:
            break  # no more links on this GPU (or no NVLink at all)
    return peers


def _numa_of(bus: str) -> int:
    """A PCI device's NUMA node from /sys (NVML names the bus with 8 domain digits)."""
    domain, _, rest = bus.partition(":")
    path = Path("/sys/bus/pci/devices") / f"{domain[-4:]}:{rest}" / "numa_node"
    try:
        return max(-1, int(path.read_text().strip()))
    except (OSError, ValueError):
        return -1


def numa_cpus_from_sys(root: Path = NODE_ROOT) -> dict[int, frozenset[int]]:
    found: dict[int, frozenset[int]] = {}
    for node in root.glob("node[0-9]*"):
        try:
            found[int(node.name[4:])] = parse_cpulist((node / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return found


def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8,10-11"`` (the kernel's cpulist) -> the CPUs."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def _numa_cpus(text: str) -> dict[int, frozenset[int]]:
    out: dict[int, frozenset[int]] = {}
    for item in _split_nodes(text):
        node, _, cpus = item.partition(":")
        try:
            out[int(node)] = parse_cpulist(cpus)
        except ValueError:
            raise InvalidSpec("fake_topology", f"cpus={item!r}: write node:cpulist") from None
    return out


def _split_nodes(text: str) -> list[str]:
    """``"0:0-3,8,1:4-7"`` -> ``["0:0-3,8", "1:4-7"]``: a new node starts at ``N:``."""
    items: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ":" in part or not items:
            items.append(part)
        else:
            items[-1] += f",{part}"
    return items


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidSpec("fake_topology", f"{name}={text!r}: write numbers") from None


def _decoded(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
