"""Vision-language policies: which models are, how a family turns images into model inputs and tokens, and the
images of a sequence as the model consumes them. The chat template renders one marker token per image part
(Qwen2-VL: `<|vision_start|><|image_pad|><|vision_end|>`, LLaVA: `<image>`); the family's processor
replaces the marker with the image's own tokens, and the trajectory keeps ids and each image's inputs (the
truth training gives the model again). Families: Qwen2-VL / Qwen2.5-VL (QwenImages) and those whose
transformers processor expands one image token, LLaVA first (ProcessorImages); tiny random models of both for
tests (tests/harness/tiny_vlm.py)."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch

from toolrl.text import first_line

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IMAGE_MARK = VISION_START + IMAGE_PAD + VISION_END
"""How a Qwen2-VL template renders an image part of a message."""
LLAVA_IMAGE = "<image>"
QWEN_FAMILY = ("qwen2_vl", "qwen2_5_vl")


@dataclass
class VisionImage:
    """One image of a sequence as the model reads it: the tokens that stand for it, where they start in the
    sequence's ids, its model inputs (pixel patches, grid), and the image it came from (for records)."""

    ids: list[int]
    """The image's tokens, in place of the one marker token the chat template rendered for it."""
    inputs: dict[str, torch.Tensor] = field(repr=False)
    """Its share of the model's image inputs (pixel_values; Qwen2-VL also image_grid_thw): a sequence's images
    concatenate them along the first dimension."""
    start: int = 0
    """Index in the sequence's token ids of its first token."""
    source: Any = field(default=None, repr=False)
    """The ToolImage or task image it was made from."""

    @property
    def tokens(self) -> int:
        return len(self.ids)


def is_vision_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def is_vision_model(name_or_path: str | Path) -> bool:
    """Whether a local model folder holds a vision-language model (its config has a vision_config)."""
    from transformers import AutoConfig

    try:
        return is_vision_config(AutoConfig.from_pretrained(name_or_path))
    except (OSError, ValueError):
        return False


def as_pil(image: Any):
    """A PIL image in RGB from a ToolImage, a PIL image, or a task file's reference (path, data: URL, bytes),
    read and checked by toolrl.tools.images."""
    if hasattr(image, "pil"):
        return image.pil()
    if hasattr(image, "convert"):
        return image.convert("RGB")
    from toolrl.tools.images import load_image

    return load_image(image).pil()


class ImageProcessor(ABC):
    """A family's way from images to model inputs and tokens. `marker_id`: the one token the chat template
    renders for an image part, which `expand` replaces with the image's own tokens."""

    marker_id: int
    image_token_id: int
    """The token repeated for an image's features (never trained)."""

    @abstractmethod
    def process(self, images: list[Any]) -> list[VisionImage]: ...

    def expand(self, ids: list[int], images: list[VisionImage], offset: int = 0) -> list[int]:
        """`ids` with its k-th marker replaced by image k's tokens; sets each image's start (counted from
        `offset`, where `ids` will sit in the sequence)."""
        places = [i for i, t in enumerate(ids) if t == self.marker_id]
        if len(places) != len(images):
            raise ValueError(f"{len(places)} image places in the text for {len(images)} images")
        out: list[int] = []
        last = 0
        for at, image in zip(places, images, strict=True):
            out.extend(ids[last:at])
            image.start = offset + len(out)
            out.extend(image.ids)
            last = at + 1
        out.extend(ids[last:])
        return out


class QwenImages(ImageProcessor):
    """Qwen2-VL / Qwen2.5-VL: the image processor cuts an image into patches on a (t, h, w) grid; the image's
    one pad becomes grid.prod() / merge**2 pads. transformers' composite processor does the same but builds a
    video processor that needs torchvision; this composes the image processor and the tokenizer directly."""

    def __init__(self, processor: Any, tokenizer: Any) -> None:
        self.processor = processor
        self.merge = int(getattr(processor, "merge_size", 2))
        self.marker_id = self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if self.marker_id is None or self.marker_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token: not a Qwen2-VL-family model")

    def process(self, images: list[Any]) -> list[VisionImage]:
        out = []
        for image in images:
            batch = self.processor(images=[as_pil(image)], return_tensors="pt")
            grid = batch["image_grid_thw"]
            count = int(grid[0].prod()) // (self.merge * self.merge)
            inputs = {"pixel_values": batch["pixel_values"], "image_grid_thw": grid}
            out.append(VisionImage([self.image_token_id] * count, inputs, source=image))
        return out


class ProcessorImages(ImageProcessor):
    """Families whose transformers processor expands one image token (LLaVA and its kin): each image's tokens
    are what the processor makes of that token with the image, its inputs what the processor gives."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        token = getattr(processor, "image_token", None)
        if token is None:
            raise ValueError("its processor names no image token")
        self.marker_id = self.image_token_id = processor.tokenizer.convert_tokens_to_ids(token)
        self.token = token

    def process(self, images: list[Any]) -> list[VisionImage]:
        out = []
        for image in images:
            pil = as_pil(image)
            batch = self.processor(text=[self.token], images=[pil], return_tensors="pt", add_special_tokens=False)
            inputs = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
            out.append(VisionImage(batch["input_ids"][0].tolist(), inputs, source=image))
        return out


def image_processor_for(path: str | Path, tokenizer: Any, config: Any) -> ImageProcessor:
    """The image processor of a vision-language model folder, by its family."""
    from toolrl.errors import ConfigError

    try:
        if getattr(config, "model_type", None) in QWEN_FAMILY:
            from transformers import AutoImageProcessor

            return QwenImages(AutoImageProcessor.from_pretrained(path), tokenizer)
        from transformers import AutoProcessor

        return ProcessorImages(AutoProcessor.from_pretrained(path))
    except (OSError, ValueError, ImportError, AttributeError) as exc:
        raise ConfigError(
            f"model.name {path}: its image processor cannot be used ({first_line(exc)}); toolrl runs the Qwen2-VL "
            "family and models whose transformers processor expands one image token (LLaVA)"
        ) from None


def model_inputs(images: list[VisionImage], device: torch.device) -> dict[str, torch.Tensor]:
    """A sequence's images' model inputs (pixel_values, and image_grid_thw for Qwen2-VL), for forward or
    generate."""
    if not images:
        return {}
    return {key: torch.cat([im.inputs[key] for im in images]).to(device) for key in images[0].inputs}


def multimodal_base(model: Any) -> Any:
    """The model under the LM head that reads ids and image inputs together (Qwen2_5_VLModel, LlavaModel),
    through a PEFT wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model


def _mrope(model: Any) -> Any | None:
    """The multimodal base of a family with M-RoPE (Qwen2-VL's 3-D positions for image tokens), else None."""
    base = multimodal_base(model)
    return base if hasattr(base, "get_rope_index") else None


def _image_types(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Which tokens are image tokens (1) or text (0): transformers' Qwen2-VL family (since 5.x) gives image
    tokens their 3-D positions only when told (`mm_token_type_ids`, which its own processor makes); without
    it every token gets a 1-D position and a pretrained model reads its images scrambled."""
    return (ids == model.config.image_token_id).int()


def sequence_positions(model: Any, ids: torch.Tensor, mask: torch.Tensor, images: list[VisionImage]) -> torch.Tensor:
    """The position ids of rows of ids (right-padded; `mask` 1 on tokens) holding `images` in row order, as
    the model gives them when it generates: [3, rows, length] M-RoPE positions for the Qwen2-VL family (text
    tokens count on, an image's tokens take its grid's (t, h, w)), [rows, length] 0, 1, 2, ... otherwise."""
    base = _mrope(model)
    grids = [im.inputs["image_grid_thw"] for im in images if "image_grid_thw" in im.inputs]
    if base is None or not grids:
        return torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    kwargs = {"image_grid_thw": torch.cat(grids).to(ids.device), "attention_mask": mask}
    if "mm_token_type_ids" in inspect.signature(base.get_rope_index).parameters:
        kwargs["mm_token_type_ids"] = _image_types(model, ids)
    return base.get_rope_index(ids, **kwargs)[0]


def same_image(a: VisionImage, b: VisionImage) -> bool:
    """Whether two images of sequences are the same model input at the same place."""
    if a.start != b.start or a.ids != b.ids or a.inputs.keys() != b.inputs.keys():
        return False
    return all(a.inputs[k] is b.inputs[k] or torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)


def image_safe_prefix(rows: list[list[VisionImage]], length: int) -> int:
    """The longest prefix of sequences that share their first `length` token ids, at most that long, that
    splits no image (an image's tokens are encoded together) and whose images are the same model inputs in
    every row (`rows`: each sequence's images). Equal ids do not make equal images: every image of one size
    is the same run of pad tokens."""
    for images in rows:
        for image in images:
            if image.start < length < image.start + image.tokens:
                length = image.start
    first = [im for im in rows[0] if im.start < length] if rows else []
    for images in rows[1:]:
        mine = [im for im in images if im.start < length]
        for a, b in zip_longest(first, mine):
            if a is None or b is None or not same_image(a, b):
                length = min(im.start for im in (a, b) if im is not None)
                first = [im for im in first if im.start < length]
                break
    return length
