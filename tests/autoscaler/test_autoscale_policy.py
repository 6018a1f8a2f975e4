"""The pure autoscaler: scenarios first, then invariants (STYLE.md habit 8)."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.autoscaler import Config, Member, Pending, Pool, Reply, Request, autoscale
from corral.core.model import Gpu, Job, Node
from corral.core.resources import GIB, ResourceRequest
from corral.core.states import NodeState

A100 = Pool("a100", gpus=8, gpu_model="A100", vram_bytes=80 * GIB, cpus=64, max_nodes=4,
            cost_per_hour=20.0)  # fmt: skip
G4090 = Pool("4090", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8, max_nodes=10,
             cost_per_hour=0.5)  # fmt: skip
NOW = 10_000.0
CFG = Config(scale_up_delay_s=30, idle_s=600, boot_timeout_s=900, lost_s=300, backoff_s=300)


def gpu_job(job_id: str, gpus: int = 1, *, models: Iterable[str] = (), replicas: int = 1,
            vram_gib: float = 0, **fields: object) -> Job:  # fmt: skip
    r = ResourceRequest(gpus=gpus, vram_bytes=int(vram_gib * GIB), gpu_models=frozenset(models))
    return Job(job_id, resources=r, replicas=replicas, **fields)  # type: ignore[arg-type]


def waiting(
    *jobs: Job, since: float = NOW - 60, reasons: Iterable[str] = ()
) -> tuple[Pending, ...]:
    return tuple(Pending(j, since, frozenset(reasons)) for j in jobs)


def joined(pool: Pool, name: str, *, state: NodeState = NodeState.READY, last_seen: float = NOW,
           draining: bool = False, paused: bool = False) -> Node:  # fmt: skip
    cards = tuple(Gpu(i, pool.gpu_model, pool.vram_bytes) for i in range(pool.gpus))
    return Node(name, gpus=cards, cpus=pool.cpus, state=state, last_seen=last_seen,
                draining=draining, paused=paused)  # fmt: skip


def decide(**fields: object) -> Reply:
    base: dict[str, object] = {"now": NOW, "pools": (A100, G4090), "members": (), "config": CFG}
    return autoscale(Request(**(base | fields)))  # type: ignore[arg-type]


def launched(reply: Reply) -> dict[str, int]:
    return {launch.pool: launch.count for launch in reply.launches}


# -- scaling up -----------------------------------------------------------------------------


def test_waiting_work_launches_the_cheapest_pool_that_fits() -> None:
    reply = decide(pending=waiting(gpu_job("a"), gpu_job("b"), gpu_job("c")))
    assert launched(reply) == {"4090": 3}  # three 1-GPU jobs: three cheap 4090 machines
    assert not reply.unmet


def test_a_job_only_a100s_fit_opens_an_a100_and_packs_the_rest_onto_it() -> None:
    small = [gpu_job(f"s{i}", 1, models=["A100"]) for i in range(4)]
    jobs = [gpu_job("big", 4, models=["A100"]), *small]
    reply = decide(pending=waiting(*jobs))
    assert launched(reply) == {"a100": 1}  # 4 + 4 x 1 GPUs fill one 8-GPU machine


def test_work_that_has_not_waited_the_delay_launches_nothing() -> None:
    reply = decide(pending=waiting(gpu_job("a"), since=NOW - 10))
    assert reply.idle


def test_work_more_machines_cannot_help_launches_nothing() -> None:
    pending = waiting(gpu_job("a"), reasons=["quota_exceeded"]) + waiting(
        gpu_job("b"), reasons=["not_before"]
    )
    assert decide(pending=pending).idle


def test_work_no_pool_fits_is_unmet_with_the_reason() -> None:
    reply = decide(pending=waiting(gpu_job("h", 1, models=["H100"])))
    assert reply.launches == ()
    assert [u.job_id for u in reply.unmet] == ["h"]
    assert "needs H100" in reply.unmet[0].reason


def test_booting_members_absorb_demand_so_nothing_is_launched_twice() -> None:
    members = (Member("4090-a", "4090", NOW - 20), Member("4090-b", "4090", NOW - 20))
    reply = decide(members=members, pending=waiting(gpu_job("a"), gpu_job("b"), gpu_job("c")))
    assert launched(reply) == {"4090": 1}


def test_max_nodes_caps_launches_and_says_why() -> None:
    pool = Pool("small", gpus=1, gpu_model="T4", vram_bytes=16 * GIB, max_nodes=2)
    reply = decide(pools=(pool,), pending=waiting(*(gpu_job(f"j{i}") for i in range(5))))
    assert launched(reply) == {"small": 2}
    assert len(reply.unmet) == 3
    assert "max_nodes" in reply.unmet[0].reason


def test_max_launch_caps_one_decision() -> None:
    jobs = waiting(*(gpu_job(f"j{i}") for i in range(5)))
    reply = decide(config=Config(max_launch=2), pending=jobs)
    assert sum(launched(reply).values()) == 2
    assert "launch limit" in reply.unmet[0].reason


def test_a_gang_is_all_or_nothing() -> None:
    pool = Pool("p", gpus=8, gpu_model="A100", vram_bytes=80 * GIB, max_nodes=1)
    reply = decide(pools=(pool,), pending=waiting(gpu_job("gang", 8, replicas=2)))
    assert reply.launches == ()  # one machine of two: no machine started for half a gang
    pool2 = Pool("p", gpus=8, gpu_model="A100", vram_bytes=80 * GIB, max_nodes=2)
    assert launched(decide(pools=(pool2,), pending=waiting(gpu_job("gang", 8, replicas=2)))) == {
        "p": 2
    }


def test_min_nodes_are_kept_up_without_demand() -> None:
    pool = Pool("warm", gpus=1, gpu_model="L4", vram_bytes=24 * GIB, min_nodes=2, max_nodes=5)
    reply = decide(pools=(pool,), members=(Member("warm-1", "warm", NOW),))
    assert launched(reply) == {"warm": 1}


# -- scaling down ---------------------------------------------------------------------------


def test_an_idle_member_is_drained_then_removed() -> None:
    members = (Member("m1", "4090", 0.0),)
    nodes = {"m1": joined(G4090, "m1")}
    first = decide(members=members, nodes=nodes, idle_since={"m1": NOW - 700})
    assert first.drain == ("m1",)
    assert first.remove == ()
    nodes = {"m1": joined(G4090, "m1", draining=True)}
    second = decide(members=members, nodes=nodes, idle_since={"m1": NOW - 700}, draining={"m1"})
    assert [r.name for r in second.remove] == ["m1"]


def test_a_member_idle_less_than_idle_s_stays() -> None:
    reply = decide(members=(Member("m1", "4090", 0.0),), nodes={"m1": joined(G4090, "m1")},
                   idle_since={"m1": NOW - 100})  # fmt: skip
    assert reply.idle


def test_busy_and_hand_drained_members_are_never_removed() -> None:
    members = (Member("busy", "4090", 0.0), Member("hand", "4090", 0.0))
    nodes = {"busy": joined(G4090, "busy"), "hand": joined(G4090, "hand", draining=True)}
    reply = decide(members=members, nodes=nodes, busy=frozenset({"busy"}),
                   idle_since={"busy": 0.0, "hand": 0.0})  # fmt: skip
    assert reply.idle


def test_demand_coming_back_undrains_instead_of_launching() -> None:
    members = (Member("m1", "4090", 0.0),)
    nodes = {"m1": joined(G4090, "m1", draining=True)}
    reply = decide(members=members, nodes=nodes, idle_since={"m1": 0.0}, draining={"m1"},
                   pending=waiting(gpu_job("a"), since=NOW - 1))  # fmt: skip
    assert reply.undrain == ("m1",)
    assert reply.launches == ()
    assert reply.remove == ()


def test_nodes_that_are_no_member_are_never_touched() -> None:
    reply = decide(nodes={"mine": joined(G4090, "mine")}, idle_since={"mine": 0.0})
    assert reply.idle


def test_min_nodes_stay_even_when_idle() -> None:
    pool = Pool("warm", gpus=1, gpu_model="L4", vram_bytes=24 * GIB, min_nodes=1, max_nodes=5)
    reply = decide(pools=(pool,), members=(Member("w1", "warm", 0.0),),
                   nodes={"w1": joined(pool, "w1")}, idle_since={"w1": 0.0})  # fmt: skip
    assert reply.idle


# -- broken members ---------------------------------------------------------------------------


def test_a_member_that_never_joins_is_removed_and_its_pool_backs_off() -> None:
    reply = decide(members=(Member("slow", "4090", NOW - 1000),), pending=waiting(gpu_job("a")))
    assert [r.name for r in reply.remove] == ["slow"]
    assert "did not join" in reply.remove[0].reason
    assert reply.backoff == {"4090": NOW + 300}
    assert launched(reply) == {"a100": 1}  # the next cheapest pool that fits takes the work
    later = decide(backoff=reply.backoff, pools=(G4090,), pending=waiting(gpu_job("a")))
    assert later.launches == ()
    assert "backing off" in later.unmet[0].reason


def test_a_member_lost_for_lost_s_is_removed() -> None:
    node = joined(G4090, "gone", state=NodeState.LOST, last_seen=NOW - 400)
    reply = decide(members=(Member("gone", "4090", 0.0),), nodes={"gone": node})
    assert [r.name for r in reply.remove] == ["gone"]


# -- invariants ---------------------------------------------------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> Request:
    pools = (A100, G4090, Pool("cpu", cpus=16, max_nodes=draw(st.integers(0, 3)), min_nodes=0))
    names = [f"m{i}" for i in range(draw(st.integers(0, 8)))]
    members = tuple(Member(n, draw(st.sampled_from(["a100", "4090", "cpu"])), NOW - draw(
        st.floats(0, 2000))) for n in names)  # fmt: skip
    nodes = {}
    for m in members:
        if draw(st.booleans()):
            pool = next(p for p in pools if p.name == m.pool)
            nodes[m.name] = joined(pool, m.name, draining=draw(st.booleans()))
    busy = frozenset(n for n in nodes if draw(st.booleans()))
    jobs = [gpu_job(f"j{i}", draw(st.integers(0, 8)), replicas=draw(st.integers(1, 3)))
            for i in range(draw(st.integers(0, 12)))]  # fmt: skip
    pending = tuple(Pending(j, NOW - draw(st.floats(0, 100))) for j in jobs)
    idle = {n: NOW - draw(st.floats(0, 2000)) for n in nodes}
    draining = frozenset(n for n in nodes if nodes[n].draining and draw(st.booleans()))
    return Request(NOW, pools, members, nodes, busy, idle, draining, pending, config=CFG)


@settings(max_examples=300, deadline=None)
@given(requests())
def test_invariants(request: Request) -> None:
    reply = autoscale(request)
    pools = {p.name: p for p in request.pools}
    removed = {r.name for r in reply.remove}
    drained = set(reply.drain)
    for launch in reply.launches:  # never past max_nodes, never into a backing-off pool
        alive = sum(1 for m in request.members if m.pool == launch.pool and m.name not in removed)
        assert alive + launch.count <= pools[launch.pool].max_nodes
        assert launch.count > 0
    assert sum(x.count for x in reply.launches) <= request.config.max_launch
    for name in removed | drained:  # never a busy node, never a stranger
        assert name not in request.busy
        assert any(m.name == name for m in request.members)
    hand = {n for n, node in request.nodes.items() if node.draining} - request.draining
    assert not (removed & hand)
    assert not (drained & hand)
    assert not (drained & removed)
    assert not (set(reply.undrain) & removed)
    assert set(reply.undrain) <= request.draining  # only its own drains are undone
    assert autoscale(request) == reply  # deterministic


def test_only_the_priorities_given_start_machines() -> None:
    config = Config(scale_up_delay_s=30, priorities=frozenset({"paid"}))
    free, paid = gpu_job("f", priority="free"), gpu_job("p", priority="paid")
    reply = decide(config=config, pending=waiting(free))
    assert reply.launches == ()
    assert "free starts no machine" in reply.unmet[0].reason
    reply = decide(config=config, pending=waiting(paid, free))
    assert launched(reply) == {"4090": 1}  # for the paid job only
    assert [u.job_id for u in reply.unmet] == ["f"]
    booting = (Member("4090-a", "4090", NOW - 10),)
    assert decide(config=config, members=booting, pending=waiting(free)).unmet == ()  # rides along


def test_a_drained_member_is_kept_when_its_pool_is_down_to_min_nodes() -> None:
    pool = Pool("warm", gpus=1, gpu_model="L4", vram_bytes=24 * GIB, min_nodes=1, max_nodes=5)
    reply = decide(pools=(pool,), members=(Member("w1", "warm", 0.0),),
                   nodes={"w1": joined(pool, "w1", draining=True)}, idle_since={"w1": 0.0},
                   draining=frozenset({"w1"}))  # fmt: skip
    assert reply.undrain == ("w1",)  # min_nodes was raised after it was drained
    assert reply.remove == ()


class _Forgetful(dict):  # type: ignore[type-arg]
    """``Packing.first`` that never remembers: plain first fit over every machine."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


@settings(max_examples=200, deadline=None)
@given(requests())
def test_remembering_where_first_fit_starts_changes_no_decision(request: Request) -> None:
    from unittest import mock

    from corral.autoscaler import packing

    real_init = packing.Packing.__init__

    def plain(
        self: packing.Packing, room: dict[str, int], limit: int, budget: float | None = None
    ) -> None:
        real_init(self, room, limit, budget)
        self.first = _Forgetful()

    with mock.patch.object(packing.Packing, "__init__", plain):
        reference = autoscale(request)
    assert autoscale(request) == reference
