"""Property tests of the HTTP API: generated requests, and none may make the server fail (5xx).

It runs against a real ``corral server`` process with the admin token, on
SQLite and PostgreSQL (PostgreSQL refuses NUL characters and numbers past
64 bits that SQLite takes: those differences are exactly what this test is
for). Four sweeps, each bounded so the whole file stays well within a minute:

* every operation of our OpenAPI document (schemathesis, ``MAX_EXAMPLES`` each);
* the drop-in AUTOMATIC1111 and ComfyUI APIs, which stay out of that document
  (their tools document them), from the short OpenAPI description below;
* pagination cursors, forged in the API's own encoding (random strings alone
  almost never decode);
* the values the drop-in APIs look up in the store (prompt ids, file names);
* the headers every route reads before its parameters: ``Authorization`` in
  every shape (Bearer, Basic, garbage) on the API and the drop-in APIs, and
  ``Last-Event-ID`` on both event streams.

The endless all-events stream is only opened (status and headers), never read
to its end; the admin token's rotation is left out (it would shut every later
request out with 401). With no agent connected the drop-in APIs answer 503 "no connected
node offers the backend": that is their documented answer, not a failure.
"""

from __future__ import annotations

import base64
import string
from collections.abc import Callable
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_harness import ServerProcess

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 15
DROP_IN_EXAMPLES = 20
PROPERTY_EXAMPLES = 60
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
NO_BACKEND = 503  # the drop-in APIs' answer while no agent offers their backend


def operations(live: ServerProcess) -> list[schemathesis.schemas.APIOperation]:  # type: ignore[name-defined]
    loaded = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    loaded = loaded.exclude(path="/v1/events", method="GET")
    loaded = loaded.exclude(path="/v1/tokens/admin/rotate")  # it would revoke our own token
    return [result.ok() for result in loaded.get_all_operations()]


def test_no_request_makes_the_server_fail(live_server: ServerProcess) -> None:
    """Every operation, ``MAX_EXAMPLES`` generated requests each: never a 5xx."""
    live = live_server
    ops = operations(live)
    assert len(ops) > 15
    failures = _fuzz(ops, live, {"Authorization": f"Bearer {live.admin_token}"}, MAX_EXAMPLES)
    assert not failures, "\n".join(failures[:20])


def test_no_drop_in_request_makes_the_server_fail(live_server: ServerProcess) -> None:
    """``/sdapi/v1/*``, ``/prompt``, ``/history``, ``/view``, ``/queue`` ...: never a 5xx
    but the documented 503 for a backend no agent offers."""
    live = live_server
    loaded = schemathesis.openapi.from_dict(DROP_IN)
    ops = [result.ok() for result in loaded.get_all_operations()]
    basic = base64.b64encode(f"alice:{live.admin_token}".encode()).decode()
    failures = _fuzz(ops, live, {"Authorization": f"Basic {basic}"}, DROP_IN_EXAMPLES)
    assert not failures, "\n".join(failures[:20])


def test_no_forged_cursor_makes_the_server_fail(live_server: ServerProcess) -> None:
    """Cursors holding any number or text, in the API's encoding or not: 200 or a 422
    that names ``cursor``."""
    live = live_server
    failures: list[str] = []
    with _client(live) as http:

        @given(cursor=CURSORS)
        @_examples
        def check(cursor: str) -> None:
            reply = http.get("/v1/jobs", params={"cursor": cursor})
            if reply.status_code != 200 and reply.json().get("field") != "cursor":
                failures.append(f"cursor={cursor!r} -> {reply.status_code}: {reply.text[:200]}")

        check()
    assert not failures, "\n".join(failures[:20])


def test_no_authorization_header_makes_the_server_fail(live_server: ServerProcess) -> None:
    """Any ``Authorization`` on the API, the drop-in APIs and the event stream: 2xx, 401 or
    403 (or the drop-in APIs' 503), never a 5xx."""
    live = live_server
    failures: list[str] = []
    with httpx.Client(base_url=live.url, timeout=10) as http:

        @given(authorization=AUTHORIZATIONS, path=st.sampled_from(AUTHENTICATED_PATHS))
        @_examples
        def check(authorization: str, path: str) -> None:
            status = _status(http, path, {"Authorization": authorization})
            if status >= 500 and not (status == NO_BACKEND and not path.startswith("/v1/")):
                failures.append(f"GET {path} Authorization={authorization!r} -> {status}")

        check()
    assert not failures, "\n".join(failures[:20])


def test_no_last_event_id_makes_the_server_fail(live_server: ServerProcess) -> None:
    """Any ``Last-Event-ID`` on a job's stream and on the all-events stream: never a 5xx."""
    live = live_server
    failures: list[str] = []
    with _client(live) as http:
        job = http.post("/v1/jobs", json={"payload": {}}).json()["id"]
        assert http.post(f"/v1/jobs/{job}/cancel").status_code == 200  # its stream ends
        paths = [f"/v1/jobs/{job}/events", "/v1/events"]

        @given(last=LAST_EVENT_IDS, path=st.sampled_from(paths))
        @_examples
        def check(last: str, path: str) -> None:
            status = _status(http, path, {"Last-Event-ID": last})
            if status >= 500:
                failures.append(f"GET {path} Last-Event-ID={last!r} -> {status}")

        check()
    assert not failures, "\n".join(failures[:20])


def test_no_prompt_or_file_name_makes_the_server_fail(live_server: ServerProcess) -> None:
    """Any text as a ComfyUI prompt id or output file name (the values looked up in the
    store): never a 5xx."""
    live = live_server
    failures: list[str] = []
    with _client(live) as http:

        @given(text=st.text(max_size=60), where=st.sampled_from(list(PROMPT_LOOKUPS)))
        @_examples
        def check(text: str, where: str) -> None:
            method, path, kwargs = PROMPT_LOOKUPS[where](text)
            reply = http.request(method, path, **kwargs)
            if reply.status_code >= 500:
                failures.append(f"{where} {text!r} -> {reply.status_code}: {reply.text[:200]}")

        check()
    assert not failures, "\n".join(failures[:20])


# ---- generated values ---------------------------------------------------------------------


def _encoded(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


HEADER_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=120,
)  # what an HTTP client can put in a header value (latin-1, no control characters)
BIG = st.integers(min_value=-(2**80), max_value=2**80)
CURSORS = st.one_of(
    BIG.map(lambda n: _encoded(f"s{n}")),
    st.text(max_size=40).map(lambda t: _encoded(f"s{t}")),
    st.text(alphabet=string.ascii_letters + string.digits + "-_=", max_size=100),
)
LAST_EVENT_IDS = st.one_of(BIG.map(str), HEADER_TEXT)
AUTHORIZATIONS = st.one_of(
    HEADER_TEXT,
    HEADER_TEXT.map(lambda t: f"Bearer {t}"),
    st.tuples(HEADER_TEXT, st.sampled_from(["", ":", ":x"]), HEADER_TEXT).map(
        lambda p: "Basic " + base64.b64encode(("".join(p)).encode()).decode()
    ),
    HEADER_TEXT.map(lambda t: f"Basic {t}"),
    st.sampled_from(["Bearer", "Basic", "Basic =", "bearer  x", "Digest x"]),
)
AUTHENTICATED_PATHS = [
    "/v1/queue",
    "/v1/jobs",
    "/v1/events",
    "/v1/models",
    "/sdapi/v1/options",
    "/sdapi/v1/progress",
    "/queue",
    "/history/x",
]

PROMPT_LOOKUPS: dict[str, Callable[[str], tuple[str, str, dict[str, object]]]] = {
    "queue-delete": lambda t: ("POST", "/queue", {"json": {"delete": [t]}}),
    "interrupt": lambda t: ("POST", "/interrupt", {"json": {"prompt_id": t}}),
    "history": lambda t: ("GET", "/history/" + quote(t, safe=""), {}),
    "view": lambda t: ("GET", "/view", {"params": {"filename": t, "subfolder": f"job_{t}"}}),
    "result": lambda t: ("GET", "/v1/jobs/job_x/result/" + quote(t, safe=""), {}),
}


def _examples(test: Callable[..., None]) -> Callable[..., None]:
    return settings(FUZZ, max_examples=PROPERTY_EXAMPLES)(test)


def _client(live: ServerProcess) -> httpx.Client:
    headers = {"Authorization": f"Bearer {live.admin_token}"}
    return httpx.Client(base_url=live.url, headers=headers, timeout=10)


def _status(http: httpx.Client, path: str, headers: dict[str, str]) -> int:
    """The status of a GET, without reading the body (a stream may be endless). Header
    values go as latin-1 bytes, as a raw client may send them (with no whitespace around, which
    HTTP does not carry)."""
    sent = {name: value.strip().encode("latin-1") for name, value in headers.items()}
    with http.stream("GET", path, headers=sent) as reply:
        return reply.status_code


def _fuzz(
    ops: list[schemathesis.schemas.APIOperation],  # type: ignore[name-defined]
    live: ServerProcess,
    headers: dict[str, str],
    examples: int,
) -> list[str]:
    """Every operation's generated requests, sent; the ones answered 5xx, described."""
    failures: list[str] = []
    for operation in ops:

        @given(case=operation.as_strategy())
        @settings(FUZZ, max_examples=examples)
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=live.url, headers=headers, timeout=10)
            status = response.status_code
            documented = status == NO_BACKEND and not case.path.startswith("/v1/")
            if status >= 500 and not documented:
                where = f"{case.method} {case.formatted_path}"
                failures.append(f"{where} -> {status}: {response.text[:300]}")

        check()
    return failures


# ---- the drop-in APIs, described for the fuzzer ------------------------------------------

_ANY = {"type": "object", "additionalProperties": True}
_PRIORITY = {"name": "X-Corral-Priority", "in": "header", "schema": {"type": "string"}}


def _body(properties: dict[str, object]) -> dict[str, object]:
    schema = {"type": "object", "properties": properties, "additionalProperties": True}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(body: dict[str, object] | None = None, *params: dict[str, object]) -> dict[str, object]:
    op: dict[str, object] = {"responses": {"200": {"description": "ok"}}}
    if body is not None:
        op["requestBody"] = body
    if params:
        op["parameters"] = list(params)
    return op


def _query(name: str, kind: str = "string") -> dict[str, object]:
    return {"name": name, "in": "query", "schema": {"type": kind}}


_GENERATE = {
    "prompt": {"type": "string"},
    "steps": {"type": "integer"},
    "width": {"type": "integer"},
    "height": {"type": "integer"},
    "sampler_name": {"type": "string"},
    "override_settings": _ANY,
    "init_images": {"type": "array", "items": {"type": "string"}},
    "image": {"type": "string"},
}
DROP_IN: dict[str, object] = {
    "openapi": "3.0.3",
    "info": {"title": "corral drop-in APIs", "version": "1"},
    "paths": {
        "/sdapi/v1/txt2img": {"post": _op(_body(_GENERATE), _PRIORITY)},
        "/sdapi/v1/img2img": {"post": _op(_body(_GENERATE), _PRIORITY)},
        "/sdapi/v1/extra-single-image": {"post": _op(_body(_GENERATE), _PRIORITY)},
        "/sdapi/v1/progress": {"get": _op(None, _query("skip_current_image", "boolean"))},
        "/sdapi/v1/interrupt": {"post": _op()},
        "/sdapi/v1/skip": {"post": _op()},
        "/sdapi/v1/options": {
            "get": _op(),
            "post": _op(_body({"sd_model_checkpoint": {"type": "string"}})),
        },
        "/sdapi/v1/sd-models": {"get": _op()},
        "/sdapi/v1/loras": {"get": _op()},
        "/sdapi/v1/samplers": {"get": _op()},
        "/sdapi/v1/upscalers": {"get": _op()},
        "/prompt": {
            "post": _op(
                _body(
                    {
                        "prompt": _ANY,
                        "client_id": {"type": "string"},
                        "prompt_id": {"type": "string"},
                        "extra_data": _ANY,
                    }
                ),
                _PRIORITY,
            )
        },
        "/history/{prompt_id}": {
            "get": _op(None, {"name": "prompt_id", "in": "path", "required": True, "schema": {}})
        },
        "/view": {
            "get": _op(
                None,
                {"name": "filename", "in": "query", "required": True, "schema": {"type": "string"}},
                _query("subfolder"),
                _query("type"),
                _query("preview"),
                _query("channel"),
            )
        },
        "/queue": {
            "get": _op(),
            "post": _op(
                _body({"delete": {"type": "array", "items": {"type": "string"}}, "clear": {}})
            ),
        },
        "/interrupt": {"post": _op(_body({"prompt_id": {"type": "string"}}))},
        "/object_info": {"get": _op()},
        "/object_info/{node_class}": {
            "get": _op(None, {"name": "node_class", "in": "path", "required": True, "schema": {}})
        },
        "/models": {"get": _op()},
        "/models/{folder}": {
            "get": _op(None, {"name": "folder", "in": "path", "required": True, "schema": {}})
        },
        "/embeddings": {"get": _op()},
        "/system_stats": {"get": _op()},
        "/history": {"get": _op(None, _query("max_items", "integer"))},
        "/api/prompt": {"get": _op()},
        "/jobs": {
            "get": _op(
                None, _query("status"), _query("limit", "integer"), _query("offset", "integer")
            )
        },
        "/free": {"post": _op(_body({"unload_models": {}, "free_memory": {}}))},
    },
}
