"""What agents report of their ComfyUI (``/object_info``) and what the server keeps of it:
the agent's probe against the reference ComfyUI over HTTP, the server's store on a real
blob directory, and the bounds on both sides."""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from pathlib import Path

from corral.agent.backend_info import ObjectInfoProbe
from corral.agent.reference.comfyui import ReferenceComfyUI
from corral.agent.reference.serve import serving
from corral.core.clock import VirtualClock
from corral.server.blobs import LocalBlobStore
from corral.server.services.backend_info import MAX_JSON, BackendInfoStore


def test_the_body_travels_once_per_connection_and_the_store_shares_it_by_digest(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock = VirtualClock(100.0)
        store = BackendInfoStore(LocalBlobStore(tmp_path / "blobs"), clock)
        async with serving(ReferenceComfyUI().app) as url:
            probe = ObjectInfoProbe(url, refresh_s=60)
            assert probe.message() is None  # nothing read yet: nothing to say
            await probe.refresh(clock.now())
            first, again = probe.message(), probe.message()
            probe.reconnected()
            after_reconnect = probe.message()
        assert first is not None
        assert again is not None
        assert after_reconnect is not None
        bodies = [bool(m.json_zlib) for m in (first, again, after_reconnect)]
        assert bodies == [True, False, True]
        assert first.sha256 == again.sha256
        assert not probe.due(clock.now() + 59)
        assert probe.due(clock.now() + 60)

        await store.record("a", {"comfyui": (first.sha256, first.json_zlib)})
        await store.record("b", {"comfyui": (again.sha256, b"")})  # same install, digest only
        found = await store.object_infos(["a", "b", "c"])
        assert found.unreported == ["c"]
        (info,) = found.infos  # one description for both nodes
        assert "KSampler" in info
        fresh = BackendInfoStore(LocalBlobStore(tmp_path / "blobs"), clock)  # another replica
        assert (await fresh.object_infos(["b"])).infos == [info]

    asyncio.run(scenario())


def test_a_body_that_does_not_match_its_digest_or_inflates_too_far_is_dropped(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        store = BackendInfoStore(LocalBlobStore(tmp_path), VirtualClock())
        text = json.dumps({"KSampler": {}}).encode()
        wrong = hashlib.sha256(b"something else").hexdigest()
        await store.record("liar", {"comfyui": (wrong, zlib.compress(text))})
        bomb = b"{" + b" " * MAX_JSON + b"}"
        digest = hashlib.sha256(bomb).hexdigest()
        await store.record("bomb", {"comfyui": (digest, zlib.compress(bomb))})
        await store.record("odd", {"comfyui": ("not-a-digest", zlib.compress(text))})
        await store.record("other", {"a1111": (hashlib.sha256(text).hexdigest(), b"")})
        found = await store.object_infos(["liar", "bomb", "odd", "other"])
        assert (found.infos, found.unreported) == ([], ["liar", "bomb", "odd", "other"])

    asyncio.run(scenario())
