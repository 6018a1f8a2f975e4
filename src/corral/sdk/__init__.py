"""corral.sdk: the Python client of the corral HTTP API (sync ``Client``, asyncio ``AsyncClient``).

::

    from corral.sdk import Client

    corral = Client("http://127.0.0.1:8470", token="corral_...")
    job = corral.submit(kind="sample", payload={"prompt": "a red fox"}, gpus=1)
    png = job.result(timeout=300).read()

See docs/sdk.md. The SDK talks HTTP only; it never imports server code.
"""

from corral.sdk.aio import AsyncClient
from corral.sdk.aio_job import AsyncEventStream, AsyncJob, AsyncResult
from corral.sdk.calls import UNCHANGED
from corral.sdk.client import Client
from corral.sdk.config import DEFAULT_URL, ConfigError, Target, resolve
from corral.sdk.errors import (
    ApiError,
    BadRequest,
    ClientError,
    Conflict,
    JobFailed,
    NotFound,
    PermissionDenied,
    ServerError,
    ServerUnreachable,
    StreamError,
    TooManyRequests,
    Unauthorized,
    UntrustedServer,
    WaitTimeout,
)
from corral.sdk.events import JobEvent
from corral.sdk.groups import AsyncGroup, Group, GroupStatus, StepStatus
from corral.sdk.inputs import InputFile
from corral.sdk.job import EventStream, Job, Result
from corral.sdk.models import (
    AllocationStatus,
    AuditActor,
    AuditRecord,
    AutoscalerStatus,
    Delivery,
    DeliveryAttempt,
    Eta,
    GpuStatus,
    JobSpec,
    JobStatus,
    NewToken,
    NodeStatus,
    PolicyStatus,
    PolicyVersion,
    QueueEntry,
    QueueStatus,
    Reason,
    Resources,
    ResourcesStatus,
    ResultFile,
    TeamQuota,
    TokenStatus,
    UsageReport,
    UsageRow,
    WaitInfo,
)
from corral.sdk.retry import Retry

__all__ = [
    "DEFAULT_URL",
    "UNCHANGED",
    "AllocationStatus",
    "ApiError",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncGroup",
    "AsyncJob",
    "AsyncResult",
    "AuditActor",
    "AuditRecord",
    "AutoscalerStatus",
    "BadRequest",
    "Client",
    "ClientError",
    "ConfigError",
    "Conflict",
    "Delivery",
    "DeliveryAttempt",
    "Eta",
    "EventStream",
    "GpuStatus",
    "Group",
    "GroupStatus",
    "InputFile",
    "Job",
    "JobEvent",
    "JobFailed",
    "JobSpec",
    "JobStatus",
    "NewToken",
    "NodeStatus",
    "NotFound",
    "PermissionDenied",
    "PolicyStatus",
    "PolicyVersion",
    "QueueEntry",
    "QueueStatus",
    "Reason",
    "Resources",
    "ResourcesStatus",
    "Result",
    "ResultFile",
    "Retry",
    "ServerError",
    "ServerUnreachable",
    "StepStatus",
    "StreamError",
    "Target",
    "TeamQuota",
    "TokenStatus",
    "TooManyRequests",
    "Unauthorized",
    "UntrustedServer",
    "UsageReport",
    "UsageRow",
    "WaitInfo",
    "WaitTimeout",
    "resolve",
]
