"""Reference backends: small, faithful implementations of the HTTP APIs the agent
drives (AUTOMATIC1111's ``/sdapi/v1``, ComfyUI's ``/prompt`` + ``/ws``), served
on loopback so the HTTP executors are tested over real HTTP, and usable as CPU
demo backends. They need the ``dev`` extra (torch, diffusers, pillow)."""
