"""ComfyUI's model-free core image nodes, for the reference ComfyUI.

``EmptyImage``, ``LoadImage``, ``LoadImageMask``, ``ImageInvert``, ``ImageScale``,
``ImageBlur`` and ``PreviewImage`` (``SaveImage`` is in ``comfyui_nodes``) with the
input schemas of ComfyUI's ``nodes.py`` and ``comfy_extras/nodes_post_processing.py``
(names, types, defaults, ranges, choices, ``image_upload``), so real graphs run with
no model at all. An ``IMAGE`` here is a list of RGB pictures (ComfyUI's batch
tensor), a ``MASK`` a list of ``L`` pictures (0 = 0.0, 255 = 1.0). The pixel work is
Pillow's, close to ComfyUI's tensor arithmetic but not bit-identical (ImageBlur's
Gaussian in particular).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageFilter, ImageOps

MAX_RESOLUTION = 16384  # ComfyUI's nodes.MAX_RESOLUTION
UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")  # ImageScale's
CROP_METHODS = ("disabled", "center")
COLOR_CHANNELS = ("alpha", "red", "green", "blue")  # LoadImageMask's ``_color_channels``
INPUT_FILES = "INPUT_FILES"
"""An input whose choices are the files in the input folder (``LoadImage``'s ``image``)."""

_RESAMPLE = {
    "nearest-exact": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "area": Image.Resampling.BOX,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def _dimension(default: int, low: int) -> dict[str, Any]:
    return {"default": default, "min": low, "max": MAX_RESOLUTION, "step": 1}


# name -> (required inputs: type or choices, options per input, outputs, category)
SPECS: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]], tuple[str, ...], str]] = {
    "EmptyImage": (
        {"width": "INT", "height": "INT", "batch_size": "INT", "color": "INT"},
        {
            "width": _dimension(512, 1),
            "height": _dimension(512, 1),
            "batch_size": {"default": 1, "min": 1, "max": 4096},
            "color": {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1, "display": "color"},
        },
        ("IMAGE",),
        "image",
    ),
    "LoadImage": (
        {"image": INPUT_FILES},
        {"image": {"image_upload": True}},
        ("IMAGE", "MASK"),
        "image",
    ),
    "LoadImageMask": (
        {"image": INPUT_FILES, "channel": COLOR_CHANNELS},
        {"image": {"image_upload": True}},
        ("MASK",),
        "mask",
    ),
    "ImageInvert": ({"image": "IMAGE"}, {}, ("IMAGE",), "image"),
    "ImageScale": (
        {
            "image": "IMAGE",
            "upscale_method": UPSCALE_METHODS,
            "width": "INT",
            "height": "INT",
            "crop": CROP_METHODS,
        },
        {"width": _dimension(512, 0), "height": _dimension(512, 0)},
        ("IMAGE",),
        "image/upscaling",
    ),
    "ImageBlur": (
        {"image": "IMAGE", "blur_radius": "INT", "sigma": "FLOAT"},
        {
            "blur_radius": {"default": 1, "min": 1, "max": 31, "step": 1},
            "sigma": {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1},
        },
        ("IMAGE",),
        "image/postprocessing",
    ),
}
DISPLAY = {
    "EmptyImage": "EmptyImage",
    "LoadImage": "Load Image",
    "LoadImageMask": "Load Image (as Mask)",
    "ImageInvert": "Invert Image",
    "ImageScale": "Upscale Image",
    "ImageBlur": "Image Blur",
    "SaveImage": "Save Image",
    "PreviewImage": "Preview Image",
}


def batch(image: Any) -> list[Image.Image]:
    """An IMAGE as a list (a single picture is a batch of one)."""
    return list(image) if isinstance(image, list) else [image]


def run_image_node(
    kind: str, inputs: dict[str, Any], open_input: Callable[[str], Path]
) -> tuple[Any, ...]:
    """Execute one of ``SPECS``' nodes; ``open_input`` resolves an image name as ComfyUI's
    ``folder_paths.get_annotated_filepath`` does."""
    if kind == "EmptyImage":
        return (_empty(inputs),)
    if kind == "LoadImage":
        return _load(open_input(str(inputs["image"])))
    if kind == "LoadImageMask":
        return (_load_mask(open_input(str(inputs["image"])), str(inputs["channel"])),)
    if kind == "ImageInvert":  # ComfyUI: 1.0 - image
        return ([Image.eval(i.convert("RGB"), lambda v: 255 - v) for i in batch(inputs["image"])],)
    if kind == "ImageScale":
        return ([_scale(i, inputs) for i in batch(inputs["image"])],)
    if kind == "ImageBlur":
        return ([_blur(i, inputs) for i in batch(inputs["image"])],)
    raise KeyError(kind)


def _empty(inputs: dict[str, Any]) -> list[Image.Image]:
    """EmptyImage: ``batch_size`` pictures of one colour, ``color`` as 0xRRGGBB."""
    color = int(inputs.get("color", 0))
    rgb = ((color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF)
    size = (int(inputs["width"]), int(inputs["height"]))
    return [Image.new("RGB", size, rgb) for _ in range(int(inputs.get("batch_size", 1)))]


def _load(path: Path) -> tuple[list[Image.Image], list[Image.Image]]:
    """LoadImage: the picture upright (EXIF), as RGB; its mask is 1 - alpha, or a 64x64
    zero mask when it has no alpha (as ComfyUI's)."""
    with Image.open(path) as opened:
        picture = ImageOps.exif_transpose(opened)
        if "A" in picture.getbands():
            mask = Image.eval(picture.getchannel("A"), lambda v: 255 - v)
        else:
            mask = Image.new("L", (64, 64), 0)
        return [picture.convert("RGB")], [mask]


def _load_mask(path: Path, channel: str) -> list[Image.Image]:
    """LoadImageMask: one channel of the picture as the mask (alpha inverted: 1 - alpha),
    a 64x64 zero mask when the picture has no such channel."""
    with Image.open(path) as opened:
        picture = ImageOps.exif_transpose(opened)
        if picture.getbands() != ("R", "G", "B", "A"):
            picture = picture.convert("RGBA")
        band = channel[0].upper()
        if band not in picture.getbands():
            return [Image.new("L", (64, 64), 0)]
        mask = picture.getchannel(band)
        return [Image.eval(mask, lambda v: 255 - v) if band == "A" else mask]


def _scale(image: Image.Image, inputs: dict[str, Any]) -> Image.Image:
    """ImageScale: to ``width`` x ``height``; a 0 keeps the aspect ratio from the other
    (both 0: unchanged); ``crop: center`` first cuts the picture to the new aspect ratio
    about its centre (ComfyUI's ``common_upscale``)."""
    width, height = int(inputs["width"]), int(inputs["height"])
    if width == 0 and height == 0:
        return image
    w, h = image.size
    width = width or max(1, round(w * height / h))
    height = height or max(1, round(h * width / w))
    if inputs.get("crop") == "center":
        old, new = w / h, width / height
        if old > new:
            x = round((w - w * (new / old)) / 2)
            image = image.crop((x, 0, w - x, h))
        elif old < new:
            y = round((h - h * (old / new)) / 2)
            image = image.crop((0, y, w, h - y))
    return image.resize((width, height), _RESAMPLE[str(inputs["upscale_method"])])


def _blur(image: Image.Image, inputs: dict[str, Any]) -> Image.Image:
    """ImageBlur: a Gaussian of ``sigma`` over a ``2 * blur_radius + 1`` kernel (Pillow's
    Gaussian, whose extent follows sigma)."""
    sigma = float(inputs.get("sigma", 1.0))
    return image.filter(ImageFilter.GaussianBlur(radius=min(sigma, int(inputs["blur_radius"]))))
