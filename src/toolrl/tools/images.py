"""Images in tool results: what a tool returns (a PIL image, the bytes of an image file, a `data:image/...`
URL, MCP's image content, or a list mixing them with text) becomes an observation's text plus checked
images. Every image is decoded here, once: an unreadable or unsupported one is the tool's error (an error
observation for the model, a counted tool error), one over `hard_max_pixels` is refused before it is decoded
(no decompression bomb reaches memory), and one over `max_pixels` is scaled down, keeping its aspect."""

from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrl.text import to_text

MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif", b"RIFF": "image/webp"}
SUPPORTED = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp"}


class ImageError(Exception):
    """An image a tool returned that cannot be used: unreadable, unsupported or too large (the tool's error,
    not the model's: not a ValueError, which the executor reads as invalid arguments)."""


@dataclass(frozen=True)
class ImageLimits:
    max_pixels: int = 1024 * 1024
    """Larger images are scaled down to this many pixels (aspect kept)."""
    hard_max_pixels: int = 64 * 1024 * 1024
    """Images claiming more pixels than this are refused unread."""
    max_per_result: int = 8


@dataclass(frozen=True)
class ToolImage:
    """An image as a PNG or JPEG file's bytes, with its size; what a trajectory keeps and a record writes."""

    data: bytes = field(repr=False)
    mime: str
    width: int
    height: int

    def pil(self):
        """The image decoded, in RGB."""
        from PIL import Image

        return Image.open(io.BytesIO(self.data)).convert("RGB")

    def b64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def describe(self) -> str:
        return f"[image {self.width}x{self.height}]"


@dataclass
class ToolOutput:
    """A tool's answer: observation text, and the images that come with it, in order."""

    text: str
    images: list[ToolImage] = field(default_factory=list)
    value: Any = None
    """The tool's return value itself (ToolResult.value)."""


def _sniff(data: bytes) -> str | None:
    for magic, mime in MAGIC.items():
        if data.startswith(magic):
            return mime
    return "image/bmp" if data.startswith(b"BM") else None


def _decode_b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"{where}: not valid base64 ({exc})") from None


def load_image(value: Any, limits: ImageLimits = ImageLimits()) -> ToolImage:
    """One image from any form a tool may return it in, checked and within the limits."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, ToolImage):
        data = value.data
    elif _is_pil(value):
        data = png_bytes(value)
    elif isinstance(value, bytes | bytearray):
        data = bytes(value)
    elif isinstance(value, str) and value.startswith("data:image/"):
        header, _, payload = value.partition(",")
        if ";base64" not in header:
            raise ImageError("a data: URL image must be base64-encoded")
        data = _decode_b64(payload, "data: URL")
    elif isinstance(value, dict) and value.get("type") == "image":
        data = _decode_b64(str(value.get("data", "")), "image content")
    elif isinstance(value, dict) and isinstance(value.get("bytes"), bytes | bytearray):
        data = bytes(value["bytes"])  # a datasets Image value, undecoded
    elif isinstance(value, os.PathLike):
        try:
            data = Path(value).read_bytes()
        except OSError as exc:
            raise ImageError(f"{value}: cannot be read ({exc.strerror})") from None
    else:
        raise ImageError(f"not an image: {type(value).__name__}")
    mime = _sniff(data)
    if mime is None or mime not in SUPPORTED:
        raise ImageError("unsupported or unreadable image data (PNG, JPEG, GIF, WebP or BMP expected)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > limits.hard_max_pixels:
                raise ImageError(f"image of {width}x{height} pixels is over the limit of {limits.hard_max_pixels}")
            image.load()  # decodes: a truncated or corrupt file fails here
            if width * height > limits.max_pixels or mime not in ("image/png", "image/jpeg"):
                scale = min(1.0, (limits.max_pixels / (width * height)) ** 0.5)
                size = (max(1, int(width * scale)), max(1, int(height * scale)))
                converted = image.convert("RGB").resize(size) if scale < 1 else image.convert("RGB")
                data, mime, (width, height) = png_bytes(converted), "image/png", converted.size
    except ImageError:
        raise
    except Image.DecompressionBombError:  # PIL's own guard, on opening a header that claims even more
        raise ImageError(f"image over the limit of {limits.hard_max_pixels} pixels (refused unread)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"unreadable image ({type(exc).__name__}: {exc})") from None
    return ToolImage(data, mime, width, height)


def is_image(value: Any) -> bool:
    """Whether a tool's value is an image (and not text or data to show as JSON)."""
    if isinstance(value, ToolImage) or _is_pil(value):
        return True
    if isinstance(value, bytes | bytearray):
        return _sniff(bytes(value)) is not None
    if isinstance(value, str):
        return value.startswith("data:image/")
    return isinstance(value, dict) and value.get("type") == "image" and "data" in value


def to_output(value: Any, limits: ImageLimits = ImageLimits()) -> ToolOutput:
    """A tool's return value as observation text and images: a string as it is, an image alone, a list or tuple
    of parts (text parts joined by newlines, images in order), anything else as JSON where it can be."""
    texts, images = [], []
    for part in _parts(value):
        if is_image(part):
            images.append(load_image(part, limits))
        else:
            texts.append(to_text(part))
    if len(images) > limits.max_per_result:
        raise ImageError(f"{len(images)} images in one result; at most {limits.max_per_result}")
    return ToolOutput("\n".join(texts), images, value)


def name_images(text: str, images: list, why: str) -> str:
    """`text` with `images` named after it, and why they are not shown (for the model's observation)."""
    if not images:
        return text
    return f"{text}\n{' '.join(image.describe() for image in images)} ({why})".lstrip("\n")


def to_wire(value: Any) -> dict[str, Any]:
    """A worker process's reply for a tool's value: text, and images as base64 (checked by the parent)."""
    parts = _parts(value)
    if not any(is_image(p) for p in parts):
        return {"ok": to_text(value)}
    wire: list[Any] = []
    for part in parts:
        if not is_image(part):
            wire.append(to_text(part))
            continue
        if _is_pil(part):
            part = png_bytes(part)
        if isinstance(part, ToolImage):
            part = part.data
        if isinstance(part, bytes | bytearray):
            part = {"type": "image", "data": base64.b64encode(part).decode("ascii")}
        wire.append(part)
    return {"ok": "", "parts": wire}


def _parts(value: Any) -> list[Any]:
    """A list or tuple that holds an image is parts; any other value is one part."""
    return list(value) if isinstance(value, list | tuple) and any(is_image(v) for v in value) else [value]


def _is_pil(value: Any) -> bool:
    return hasattr(value, "save") and hasattr(value, "mode")


def png_bytes(image: Any) -> bytes:
    """A PIL image as the bytes of a PNG file."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
