import dataclasses

import pytest

from corral.core import GIB, MILLI, InvalidSpec, ResourceRequest, parse_bytes
from corral.core.resources import memory_text, parse_cpus, parse_memory


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("24GiB", 24 * GIB),
        ("512 MiB", 512 * 1024**2),
        ("8G", 8 * 1000**3),
        ("1.5GiB", int(1.5 * GIB)),
        ("100", 100),
        ("100B", 100),
        (4096, 4096),
    ],
)
def test_parse_bytes_understands_binary_and_decimal_units(text: str | int, want: int) -> None:
    assert parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["", "lots", "12 parsecs", "-3GiB", -1])
def test_parse_bytes_names_the_field_on_bad_input(bad: str | int) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_bytes(bad, field_name="resources.vram")
    assert info.value.field == "resources.vram"


def test_a_shared_job_counts_the_larger_of_compute_and_vram_share() -> None:
    half_by_vram = ResourceRequest(vram_bytes=12 * GIB)
    assert half_by_vram.shared
    assert half_by_vram.milli_on(24 * GIB) == MILLI // 2
    quarter_compute = ResourceRequest(gpu_milli=250, vram_bytes=2 * GIB)
    assert quarter_compute.milli_on(24 * GIB) == 250


def test_whole_gpus_count_whole_cards_and_cpu_only_counts_nothing() -> None:
    assert ResourceRequest(gpus=3).milli_on(80 * GIB) == 3 * MILLI
    cpu = ResourceRequest(cpus=4)
    assert not cpu.wants_gpu
    assert cpu.milli_on(80 * GIB) == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpus": -1}, "resources.gpus"),
        ({"gpu_milli": 1000}, "resources.gpu_milli"),
        ({"gpus": 1, "gpu_milli": 500}, "resources.gpu_milli"),
        ({"vram_bytes": -5}, "resources.vram_bytes"),
        ({"cpus": -1}, "resources.cpus"),
    ],
)
def test_impossible_requests_are_refused_naming_the_field(
    kwargs: dict[str, int], field: str
) -> None:
    with pytest.raises(InvalidSpec) as info:
        ResourceRequest(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_from_gpus_turns_fractions_into_shares() -> None:
    assert ResourceRequest.from_gpus(2).gpus == 2
    assert ResourceRequest.from_gpus(0.25).gpu_milli == 250
    with pytest.raises(InvalidSpec):
        ResourceRequest.from_gpus(1.5)


def test_a_request_hashes_as_the_generated_dataclass_hash_would() -> None:
    """``ResourceRequest.__hash__`` is written out (a compiled build compiles it); it must
    stay the hash of every compared field, in order, as ``dataclass`` generates it."""
    for r in (
        ResourceRequest(),
        ResourceRequest(gpus=2, vram_bytes=40 << 30, cpus=8, gpu_models=frozenset({"H100"})),
        ResourceRequest(gpu_milli=250, cpu_fallback=True),
    ):
        compared = tuple(getattr(r, f.name) for f in dataclasses.fields(r) if f.compare)
        assert hash(r) == hash(compared)
        assert hash(r) == hash(dataclasses.replace(r))


def test_requests_compare_as_the_generated_dataclass_eq_would() -> None:
    """``ResourceRequest.__eq__`` is written out too: equal exactly when every compared
    field is, and never equal to another class (a tuple of the same fields included)."""
    base = ResourceRequest(gpus=2, vram_bytes=40 << 30, cpus=8, gpu_models=frozenset({"H100"}))
    changes: list[dict[str, object]] = [
        {"gpus": 1},
        {"vram_bytes": 0},
        {"cpus": 4},
        {"gpu_models": frozenset({"A100"})},
        {"cpu_fallback": True},
        {"gpus": 0, "gpu_milli": 500},
    ]
    assert base == dataclasses.replace(base)
    assert base == ResourceRequest(
        gpus=2, vram_bytes=40 << 30, cpus=8, gpu_models=frozenset({"H100"})
    )
    for change in changes:
        other = dataclasses.replace(base, **change)  # type: ignore[arg-type]
        assert base != other
        assert other != base
    compared = tuple(getattr(base, f.name) for f in dataclasses.fields(base) if f.compare)
    assert base != compared
    assert base != 2


@pytest.mark.parametrize(
    ("value", "want_milli"),
    [(2, 2000), (0.5, 500), ("0.5", 500), ("500m", 500), (11.4, 11_400), ("1m", 1), (0, 0)],
)
def test_cpus_are_read_to_a_milli_cpu(value: float | str, want_milli: int) -> None:
    cpus = parse_cpus(value)
    assert ResourceRequest(cpus=cpus).cpu_milli == want_milli


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (-1, "must be a finite number >= 0"),
        (float("nan"), "must be a finite number >= 0"),
        ("five", "not a CPU count: 'five' (try 2, 0.5 or '500m')"),
        ("5mm", "not a CPU count"),
        (0.0005, "finer than a milli-CPU"),
        ("0.5m", "finer than a milli-CPU"),
        (True, "expected a number of CPUs"),
        (10**9, "more CPUs than any machine has"),
    ],
)
def test_bad_cpu_counts_are_refused_naming_the_field(value: object, want: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_cpus(value, field_name="resources.cpus")
    assert info.value.field == "resources.cpus"
    assert want in info.value.message
    with pytest.raises(InvalidSpec, match=r"resources\.cpus"):
        ResourceRequest(cpus=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("512Mi", 512 * 1024**2),
        ("16Gi", 16 * GIB),
        ("1G", 10**9),
        ("1.5Gi", 3 * GIB // 2),
        ("2Ti", 2 * 1024**4),
        ("128k", 128_000),
        ("1Ki", 1024),
        ("129e6", 129_000_000),
        ("64GiB", 64 * GIB),
        ("512 MB", 512 * 10**6),
        ("100", 100),
        (4096, 4096),
        (0.5, 1),  # a fraction of a byte rounds up, as Kubernetes rounds it
        (0, 0),
    ],
)
def test_parse_memory_reads_kubernetes_quantities(value: str | float, want: int) -> None:
    assert parse_memory(value) == want


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("lots", "not a memory quantity"),
        ("12 parsecs", "not a memory quantity"),
        ("", "not a memory quantity"),
        ("-1Gi", "not a memory quantity"),
        (-1, ">= 0"),
        (float("nan"), "finite"),
        ("500m", "write 500Mi or 500M"),
        ("2Ei", "more memory than any machine"),
        (True, "expected bytes"),
        (None, "expected bytes"),
    ],
)
def test_parse_memory_names_the_field_on_bad_input(value: object, says: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_memory(value, field_name="resources.memory")
    assert info.value.field == "resources.memory"
    assert says in info.value.message


def test_memory_reads_back_in_messages() -> None:
    assert [memory_text(n) for n in (100, 512 * 1024**2, 16 * GIB, 3 * GIB // 2)] == [
        "100 bytes",
        "512 MiB",
        "16 GiB",
        "1.5 GiB",
    ]


def test_a_request_refuses_impossible_memory_naming_the_field() -> None:
    with pytest.raises(InvalidSpec) as info:
        ResourceRequest(memory_bytes=-1)
    assert info.value.field == "resources.memory"
