"""Pools as users write them: every mistake names its place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.autoscaler.config import pools_from_json
from corral.core.errors import InvalidSpec
from corral.core.resources import GIB
from corral.server.autoscale_settings import AutoscaleSettings
from corral.server.autoscaling import load_pools, provider_from, scaling_from
from corral.server.providers import CommandProvider, WebhookProvider
from corral.server.settings import Settings


def test_a_pool_with_every_field() -> None:
    fields = {"name": "a100", "gpus": 8, "gpu_model": "A100", "vram": "80GiB", "cpus": 64}
    fields |= {"labels": {"rack": "r1"}, "backends": ["python"], "min_nodes": 1}
    [pool] = pools_from_json({"pools": [fields | {"max_nodes": 4, "cost_per_hour": 20}]})
    assert (pool.gpus, pool.vram_bytes, pool.cpus) == (8, 80 * GIB, 64)
    assert dict(pool.labels) == {"rack": "r1"}
    assert pool.backends == frozenset({"python"})
    assert (pool.min_nodes, pool.max_nodes, pool.cost_per_hour) == (1, 4, 20.0)


@pytest.mark.parametrize(
    ("document", "field", "words"),
    [
        ({}, "pools", "non-empty list"),
        ({"pools": [{"name": "a", "max_node": 3}]}, "pools[0].max_node", "unknown field"),
        ({"pools": [{"name": "A B"}]}, "pools[0].name", "lower-case"),
        ({"pools": [{"name": "a", "vram": "lots"}]}, "pools[0].vram", "not a size"),
        ({"pools": [{"name": "a", "gpus": 2}]}, "pools[a].vram", "say their VRAM"),
        ({"pools": [{"name": "a", "gpus": 1.5, "vram": "8GiB"}]}, "pools[0].gpus", "whole"),
        ({"pools": [{"name": "a", "min_nodes": 3, "max_nodes": 2}]}, "pools[a].min_nodes", "<="),
        ({"pools": [{"name": "a"}, {"name": "a"}]}, "pools", "unique"),
        ({"pools": [{"name": "a", "labels": {"x": 1}}]}, "pools[0].labels", "strings"),
    ],
)
def test_mistakes_name_the_field(document: object, field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        pools_from_json(document)
    assert caught.value.field == field
    assert words in caught.value.message


def test_a_pools_file_that_is_missing_or_broken_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"cannot read .*nope\.yaml"):
        load_pools(tmp_path / "nope.yaml")
    broken = tmp_path / "pools.yaml"
    broken.write_text("pools: [ {name: a, ")
    with pytest.raises(InvalidSpec, match="not YAML or JSON"):
        load_pools(broken)
    broken.write_text("pools:\n  - {name: a, max_nodes: -1}\n")
    with pytest.raises(InvalidSpec, match=r"pools.yaml: pools\[0\].max_nodes"):
        load_pools(broken)


def test_exactly_one_provider() -> None:
    with pytest.raises(InvalidSpec, match="exactly one provider"):
        provider_from(AutoscaleSettings())
    both = AutoscaleSettings(command="x", webhook_url="http://h/")
    with pytest.raises(InvalidSpec, match="exactly one provider"):
        provider_from(both)
    assert isinstance(provider_from(AutoscaleSettings(command="prov --x")), CommandProvider)
    assert isinstance(provider_from(AutoscaleSettings(webhook_url="http://h/")), WebhookProvider)


def test_corral_server_refuses_a_bad_pools_file_at_start(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: a, gpus: 1, vram: lots}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_AUTOSCALE__POOLS_FILE": str(pools), "CORRAL_AUTOSCALE__COMMAND": "true"}
    argv = [sys.executable, "-m", "corral", "server", "--home", str(tmp_path), "--port", "0"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"{pools}: pools[0].vram: not a size: 'lots'" in done.stderr


def test_a_server_on_every_address_must_say_where_machines_dial(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: a, cpus: 2}\n")
    scaling = {"pools_file": pools, "command": "true"}
    wide = Settings(api={"host": "0.0.0.0"}, autoscale=scaling)  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match=r"autoscale.agent_server.*0\.0\.0\.0"):
        scaling_from(wide)
    told = Settings(
        api={"host": "0.0.0.0"},  # type: ignore[arg-type]
        autoscale=scaling | {"agent_server": "grpc://vps:8471"},  # type: ignore[arg-type]
    )
    provided = scaling_from(told)
    assert provided is not None
    assert [p.name for p in provided[1]] == ["a"]


# -- several providers -------------------------------------------------------------------------

SEVERAL = """
providers:
  cloud: {webhook_url: "http://cloud.example/corral", token_env: CLOUD_TOKEN, timeout_s: 5}
  local: {command: "python examples/autoscale/local_provider.py"}
  home: {fixed: [box-1, box-2]}
pools:
  - {name: g4090, gpus: 1, vram: 24GiB, cost_per_hour: 0.4, provider: cloud}
  - {name: cpu, cpus: 4, provider: local, max_spend_per_hour: 2}
  - {name: home, gpus: 1, vram: 24GiB, provider: home}
"""


def several(tmp_path: Path, text: str = SEVERAL) -> Settings:
    pools = tmp_path / "pools.yaml"
    pools.write_text(text)
    return Settings(autoscale={"pools_file": pools, "agent_server": "grpc://vps:8471"})  # type: ignore[arg-type]


def test_each_pool_gets_the_provider_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUD_TOKEN", "secret")
    provided = scaling_from(several(tmp_path))
    assert provided is not None
    providers, pools = provided
    assert isinstance(providers["cloud"], WebhookProvider)
    assert providers["cloud"].timeout_s == 5
    assert isinstance(providers["local"], CommandProvider)
    assert "" not in providers  # every pool names its own: no default one is needed
    by_name = {p.name: p for p in pools}
    assert by_name["cpu"].max_spend_per_hour == 2
    home = by_name["home"]
    assert (home.fixed, home.min_nodes, home.max_nodes) == (True, 2, 2)  # the set's size


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        pytest.param(("provider: local,", "provider: space,"), "pools[cpu].provider",
                     "no provider named 'space'", id="unknown-provider"),
        pytest.param(("timeout_s: 5", "timeout: 5"), "providers.cloud.timeout",
                     "unknown field", id="unknown-key"),
        pytest.param(("{fixed: [box-1, box-2]}", "{fixed: [box-1], command: x}"),
                     "providers.home", "exactly one", id="two-kinds"),
        pytest.param(("{fixed: [box-1, box-2]}", "{fixed: [box-1, box-1]}"),
                     "providers.home.fixed", "twice", id="fixed-twice"),
    ],
)  # fmt: skip
def test_provider_mistakes_name_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: tuple[str, str], field: str,
    words: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("CLOUD_TOKEN", "secret")
    with pytest.raises(InvalidSpec) as caught:
        scaling_from(several(tmp_path, SEVERAL.replace(*change)))
    assert caught.value.field.endswith(field)
    assert words in caught.value.message


def test_a_webhook_token_must_be_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOUD_TOKEN", raising=False)
    with pytest.raises(InvalidSpec, match="the environment has no CLOUD_TOKEN"):
        scaling_from(several(tmp_path))
