"""A job's JSON written from its fields (the submit route's 201) is ``JobOut``'s JSON."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from corral.core.model import Job
from corral.core.resources import GIB, ResourceRequest
from corral.core.states import JobState
from corral.scheduler.api import Reason, ReasonCode, Remedy, Unplaced
from corral.server.api.render import job_fields, job_out
from corral.server.api.schemas import JobOut
from corral.server.store.jsontext import dumps
from corral.server.store.records import AttemptError, JobRecord, ResultFile

WAITING = Unplaced(
    job_id="j1",
    position=3,
    reasons=(Reason(ReasonCode.GPU_MODEL_MISMATCH, 2, "no H100"),),
    remedy=Remedy.WAIT,
)
FILE = ResultFile(name="out.png", key="k", size=10, content_type="image/png", sha256="ab")
ERROR = AttemptError(attempt=1, node="n2", error="lost", at=3.5)

JSON_VALUES = st.recursive(  # a payload's values: nested, and integers past 64 bits
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
        st.none(),
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
records = st.builds(
    lambda state, gpus, models, payload, selector, attempts, files, started, ckpt: JobRecord(
        job=Job(
            id="j1",
            resources=ResourceRequest(
                gpus=gpus, vram_bytes=0 if gpus else 8 * GIB, gpu_models=models
            ),
            payload=payload,
            node_selector=selector,
            state=state,
            estimated_runtime_s=60.0,
            submitted_at=1764230000.125,
        ),
        allocation_ids=("a1",) if state is not JobState.QUEUED else (),
        node=None if state is JobState.QUEUED else "n1",
        started_at=started,
        attempt_errors=(ERROR,) * attempts,
        result=(FILE,) * files,
        checkpoint=ckpt,
        checkpoint_step=7 if ckpt else None,
        progress=0.5,
    ),
    st.sampled_from(JobState),
    st.integers(0, 4),
    st.frozensets(st.sampled_from(("A100", "H100", "L4"))),
    st.dictionaries(st.text(max_size=5), JSON_VALUES),
    st.dictionaries(st.sampled_from(("rack", "zone")), st.text(max_size=3)),
    st.integers(0, 2),
    st.integers(0, 2),
    st.one_of(st.none(), st.floats(0, 1e9, allow_nan=False)),
    st.one_of(st.none(), st.just("ckpt-1")),
)


@given(records, st.sampled_from((None, WAITING)), st.booleans())
def test_a_jobs_fields_written_as_json_are_its_response_model(
    rec: JobRecord, unplaced: Unplaced | None, queued: bool
) -> None:
    written = dumps(job_fields(rec, unplaced, queued=queued))
    model = job_out(rec, unplaced, queued=queued)
    assert json.loads(written) == json.loads(model.model_dump_json())
    assert JobOut.model_validate_json(written) == model


def test_a_queued_job_says_why_it_waits() -> None:
    rec = JobRecord(job=Job(id="j1", resources=ResourceRequest(gpus=1)))
    fresh, waiting = job_fields(rec)["queue"], job_fields(rec, WAITING)["queue"]
    assert (fresh["position"], fresh["reasons"]) == (0, [])
    assert (waiting["position"], waiting["remedy"]) == (3, "wait")
    assert waiting["reasons"] == [{"code": "gpu_model_mismatch", "nodes": 2, "message": "no H100"}]
