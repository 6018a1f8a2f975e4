"""Run a reference backend on loopback, for demos and manual testing.

python -m corral.agent.reference a1111 --port 7860
python -m corral.agent.reference comfyui --port 8188 --preview-method auto
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m corral.agent.reference")
    parser.add_argument("backend", choices=("a1111", "comfyui"))
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--preview-method", default="auto", help="comfyui only: none|auto")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per sampling step")
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="comfyui only: more *.safetensors here"
    )
    args = parser.parse_args(argv)
    asyncio.run(
        _serve(args.backend, args.port, args.preview_method, args.step_delay, args.models_dir)
    )


async def _serve(
    backend: str, port: int, preview_method: str, step_delay: float, models_dir: Path | None
) -> None:
    from corral.agent.reference.serve import serving

    app: object
    if backend == "a1111":
        from corral.agent.reference.a1111 import ReferenceA1111

        app = ReferenceA1111(step_delay_s=step_delay).app
    else:
        from corral.agent.reference.comfyui import ReferenceComfyUI

        app = ReferenceComfyUI(
            preview_method=preview_method, step_delay_s=step_delay, models_dir=models_dir
        ).app
    async with serving(app, port=port) as url:
        print(f"reference {backend} listening on {url}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    main()
