"""bench/placement.py on a tiny trace the test writes: every policy runs the paper's protocol
and reports the four loads; what it places fits the nodes (the bench asserts every take)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import packing  # noqa: E402
import placement  # noqa: E402

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,96000,262144,8,G2
n1,96000,262144,8,G2
n2,104000,262144,2,T4
n3,16000,262144,2,P100
n4,64000,262144,4,V100M16
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,12000,16384,1,1000,
p1,6000,12288,1,460,
p2,8000,30517,0,0,
p3,4000,8192,1,250,T4
p4,24000,65536,4,1000,
p5,32000,65536,8,1000,
p6,2152,4096,1,810,P100|V100M16
p7,12000,16384,2,1000,
"""


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_tiny.csv").write_text(PODS)
    return tmp_path


def test_every_policy_reports_each_load_and_the_table(
    traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert placement.main(["--traces", str(traces), "--variants", "tiny"]) == 0
    out = capsys.readouterr().out
    for policy in placement.POLICIES:
        for load in ("100%", "110%", "120%", "130%"):
            assert f"tiny        {policy:<9} load {load}: allocated " in out
    table = out.split("arrived load\n", 1)[1].splitlines()
    assert table[0].split() == ["variant", *placement.POLICIES]
    shares = [float(x) for x in table[1].split()[1:]]
    assert all(0.3 < s <= 1.0 for s in shares), shares


def test_arrivals_stop_once_the_target_share_of_gpus_was_asked_for() -> None:
    tasks = [packing.Task(1000, 1, 500), packing.Task(1000, 0, 0), packing.Task(1000, 2, 1000)]
    got = list(packing.arrivals(tasks, seed=3, gpu_target_milli=10_000))
    asked = sum(t.gpu_milli_total for t in got)
    assert asked >= 10_000
    assert asked - got[-1].gpu_milli_total < 10_000
    assert sorted(got[:3], key=lambda t: t.gpus) == sorted(tasks, key=lambda t: t.gpus)


def test_fgd_fragmentation_counts_cards_a_typical_task_cannot_use() -> None:
    frag = packing.Fragmentation([(packing.Task(1000, 1, 500), 1.0)])
    # 300 free on one card cannot take a half card; 1000 on the other can
    assert frag.of(("G2", 8000, (300, 1000))) == 300
    # not enough CPU: every free card is fragment
    assert frag.of(("G2", 500, (300, 1000))) == 1300
    # a model the task does not accept
    only_t4 = packing.Fragmentation([(packing.Task(1000, 1, 500, ("T4",)), 1.0)])
    assert only_t4.of(("G2", 8000, (1000,))) == 1000


def test_fgd_puts_a_half_card_where_it_fragments_least() -> None:
    nodes = [
        packing.NodeState("a", "G2", 8000, 8000, [1000, 1000]),
        packing.NodeState("b", "G2", 8000, 8000, [500, 1000]),
    ]
    workload = [(packing.Task(1000, 1, 500), 0.5), (packing.Task(1000, 2, 1000), 0.5)]
    fgd = packing.FGD(nodes, seed=0, frag=packing.Fragmentation(workload))
    # on b's half-used card it leaves b's whole card and all of a: nothing fragmented
    assert fgd.place(packing.Task(1000, 1, 500)) == (1, (0,))


def test_the_trace_s_memory_is_read_and_binds_every_policy(traces: Path) -> None:
    nodes = packing.load_nodes(traces / "openb_node_list_gpu_node.csv")
    tasks = packing.load_tasks(traces / "openb_pod_list_tiny.csv")
    assert (nodes[0].mem_total, tasks[2].memory) == (262144, 30517)  # MiB, as the trace says
    blind = packing.load_tasks(traces / "openb_pod_list_tiny.csv", memory=False)
    assert {t.memory for t in blind} == {0}
    # a node of 16 GiB takes a 12 GiB task, never a 16 GiB + 1 one: for corral, best-fit and
    # FGD alike
    small = packing.Task(1000, 1, 1000, memory=12288)
    big = packing.Task(1000, 1, 1000, memory=16385)

    def node() -> packing.NodeState:
        return packing.NodeState("n", "G2", 8000, 8000, [1000, 1000], 16384, 16384)

    corral = placement.CorralPacker([node()], window=1)
    assert (corral.offer(big), corral.offer(small)) == (0, 1)
    assert corral.nodes[0].mem_free == 16384 - 12288
    frag = packing.Fragmentation([(small, 1.0)])
    for packer in (packing.BestFit([node()], seed=0), packing.FGD([node()], 0, frag)):
        assert packer.place(big) is None, packer.name
        assert packer.place(small) is not None, packer.name


def test_no_memory_leaves_it_out_for_all(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert placement.main(["--traces", str(traces), "--variants", "tiny", "--no-memory"]) == 0
    assert "tiny        corral    load 130%: allocated " in capsys.readouterr().out
