"""The AUTOMATIC1111 API on corral, driven by ``webuiapi`` (a PyPI client written for the
real webui), against real processes: server, agent, reference webui on CPU."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import webuiapi
from compat_harness import CompatCluster, compat_cluster
from e2e_harness import ADMIN, eventually
from PIL import Image

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CompatCluster]:
    yield from compat_cluster(Path(tmp_path_factory.mktemp("compat-a1111")))


def client(corral: CompatCluster, user: str, token: str = ADMIN) -> webuiapi.WebUIApi:
    """A webui client as a tool would make it for a webui started with --api-auth."""
    return webuiapi.WebUIApi(host="127.0.0.1", port=corral.port, username=user, password=token)


def test_txt2img_returns_an_image_with_the_webuis_info(corral: CompatCluster) -> None:
    api = client(corral, "alice")
    result = api.txt2img(prompt="a red barn", steps=3, width=32, height=32, seed=7)
    assert result.image.size == (32, 32)
    assert result.info["seed"] == 7
    assert result.info["all_seeds"] == [7]
    assert result.info["sd_model_name"] == "tiny-sd"
    assert result.parameters["prompt"] == "a red barn"


def test_the_request_is_a_corral_job_of_the_callers_team_and_user(corral: CompatCluster) -> None:
    with corral.cluster.client() as http:
        team = http.post("/v1/tokens", json={"kind": "team", "team": "vision", "name": "app"})
        token = team.json()["token"]
        client(corral, "ana", token).txt2img(prompt="a fox", steps=2, width=32, height=32)
        jobs = http.get("/v1/jobs", params={"user": "ana"}).json()["jobs"]
    (job,) = jobs
    assert (job["kind"], job["backend"], job["team"], job["state"]) == (
        "sample",
        "a1111",
        "vision",
        "succeeded",
    )
    assert job["payload"]["prompt"] == "a fox"
    assert job["payload"]["mode"] == "txt2img"


def test_img2img_and_upscale(corral: CompatCluster) -> None:
    api = client(corral, "alice")
    base = api.txt2img(prompt="a barn", steps=2, width=32, height=32, seed=1).image
    changed = api.img2img(
        images=[base],
        prompt="a barn at night",
        steps=3,
        width=32,
        height=32,
        denoising_strength=0.6,
        seed=2,
    )
    assert changed.image.size == (32, 32)
    assert changed.info["seed"] == 2
    upscaled = api.extra_single_image(image=base, upscaler_1="Lanczos", upscaling_resize=2)
    assert upscaled.image.size == (64, 64)
    assert "Lanczos" in upscaled.info


def test_progress_shows_only_the_callers_request_with_a_preview_and_interrupt_keeps_it(
    corral: CompatCluster,
) -> None:
    alice, bob = client(corral, "alice"), client(corral, "bob")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            alice.txt2img, prompt="a long one", steps=150, width=32, height=32, seed=3
        )
        seen = eventually(
            lambda: (p := alice.get_progress())["current_image"] and p["progress"] > 0.05 and p,
            timeout=60,
            what="alice's progress with a preview",
        )
        assert seen["state"]["sampling_steps"] == 150
        assert 0 < seen["state"]["sampling_step"] < 150
        preview = Image.open(io.BytesIO(base64.b64decode(seen["current_image"])))
        assert preview.size == (32, 32)
        idle = bob.get_progress()  # bob has nothing running: he sees nothing of alice's
        assert (idle["progress"], idle["state"]["job_count"], idle["current_image"]) == (0, 0, None)
        alice.interrupt()
        result = running.result(timeout=60)
    assert result.image.size == (32, 32)  # the partial picture, as the webui answers
    assert result.info["seed"] == 3
    assert alice.get_progress()["state"]["job_count"] == 0


def test_a_checkpoint_chosen_by_one_client_applies_to_its_own_requests_only(
    corral: CompatCluster,
) -> None:
    carol, dave = client(corral, "carol"), client(corral, "dave")
    titles = carol.util_get_model_names()
    assert any(t.startswith("tiny-sd-v2") for t in titles), titles
    carol.set_options({"sd_model_checkpoint": "tiny-sd-v2"})
    assert carol.get_options()["sd_model_checkpoint"].startswith("tiny-sd-v2")
    assert dave.get_options()["sd_model_checkpoint"].startswith("tiny-sd.safetensors")
    mine = carol.txt2img(prompt="x", steps=2, width=32, height=32)
    theirs = dave.txt2img(prompt="x", steps=2, width=32, height=32)
    again = carol.txt2img(prompt="x", steps=2, width=32, height=32)
    assert mine.info["sd_model_name"] == "tiny-sd-v2"
    assert theirs.info["sd_model_name"] == "tiny-sd"
    assert again.info["sd_model_name"] == "tiny-sd-v2"


def test_lists_come_from_the_connected_backends(corral: CompatCluster) -> None:
    api = client(corral, "alice")
    models = {m["model_name"] for m in api.get_sd_models()}
    assert models == {"tiny-sd", "tiny-sd-v2"}
    assert "Euler a" in api.util_get_sampler_names()
    assert {"None", "Lanczos"} <= {u["name"] for u in api.get_upscalers()}
    assert [lora["name"] for lora in api.get_loras()] == ["tiny-detail"]


def test_a_model_no_node_has_is_refused_in_the_webuis_shape(corral: CompatCluster) -> None:
    api = client(corral, "alice")
    with pytest.raises(RuntimeError) as refused:
        api.txt2img(
            prompt="x",
            steps=2,
            width=32,
            height=32,
            override_settings={"sd_model_checkpoint": "sdxl-turbo"},
        )
    status, text = refused.value.args
    body = json.loads(text)
    assert status == 404
    assert set(body) == {"error", "detail", "body", "errors"}
    assert "no node has model 'sdxl-turbo'" in body["detail"]
    answer = api.set_options({"sd_model_checkpoint": "nope"})  # webuiapi returns the body
    assert "no node has model 'nope'" in answer["detail"]


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        pytest.param({}, 401, id="no-credentials"),
        pytest.param(
            {"Authorization": "Basic " + base64.b64encode(b"me:wrong").decode()},
            401,
            id="basic-wrong-token",
        ),
        pytest.param({"Authorization": "Bearer nope"}, 401, id="bearer-wrong-token"),
        pytest.param({"Authorization": f"Bearer {ADMIN}"}, 200, id="bearer-token"),
        pytest.param(
            {"Authorization": "Basic " + base64.b64encode(f"me:{ADMIN}".encode()).decode()},
            200,
            id="basic-any-user-token-as-password",
        ),
    ],
)
def test_auth_as_the_tools_send_it(
    corral: CompatCluster, headers: dict[str, str], want: int
) -> None:
    for path in ("/sdapi/v1/progress", "/queue"):
        reply = httpx.get(corral.http + path, headers=headers)
        assert reply.status_code == want, reply.text
        if want == 401:
            assert reply.headers["WWW-Authenticate"] == "Basic"


def test_two_clients_floods_are_mixed_fairly(corral: CompatCluster) -> None:
    """Both slots busy (carol); dora queues 4 requests, then emil 4: they start alternately.

    Fair mixing remembers recent service (the scheduler's service ledger), and the module's
    cluster is shared: users served by earlier tests (alice, bob) would rightly go last. Two
    users nobody else in this module uses start level, so the oldest request goes first.
    """
    carol, dora, emil = (client(corral, u) for u in ("carol", "dora", "emil"))
    small = {"prompt": "x", "steps": 2, "width": 32, "height": 32}
    with ThreadPoolExecutor(10) as pool, corral.cluster.client() as http:

        def queued(user: str) -> int:
            jobs = http.get("/v1/jobs", params={"user": user, "state": "queued"}).json()["jobs"]
            return len(jobs)

        blockers = [pool.submit(carol.txt2img, **small | {"steps": 500}) for _ in range(2)]
        eventually(lambda: dora.get_progress() and carol.get_progress()["progress"] > 0, 30)
        floods = [pool.submit(dora.txt2img, **small) for _ in range(4)]
        eventually(lambda: queued("dora") == 4, 30, "dora's 4 requests queued")
        floods += [pool.submit(emil.txt2img, **small) for _ in range(4)]
        eventually(lambda: queued("emil") == 4, 30, "emil's 4 requests queued")
        carol.interrupt()  # both slots free up: the 8 queued requests now start in turn
        for future in floods:
            assert future.result(timeout=120).image.size == (32, 32)
        for future in blockers:
            future.result(timeout=60)
        jobs = [
            j
            for user in ("dora", "emil")
            for j in http.get("/v1/jobs", params={"user": user, "limit": 4}).json()["jobs"]
        ]
    order = [j["user"] for j in sorted(jobs, key=lambda j: j["started_at"])]
    assert order == ["dora", "emil"] * 4, order


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(
            {"prompt": "x", "override_settings": ["no"]},
            "override_settings",
            id="override-settings-not-an-object",
        ),
        pytest.param({"prompt": "x", "styles": ["a\u0000b"]}, "NUL characters", id="nul-character"),
    ],
)
def test_a_malformed_request_is_a_422_naming_the_field(
    corral: CompatCluster, body: dict[str, object], field: str
) -> None:
    reply = httpx.post(
        f"{corral.http}/sdapi/v1/txt2img", json=body, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert reply.status_code == 422, reply.text
    assert field in json.dumps(reply.json()["detail"])
