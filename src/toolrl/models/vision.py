"""Vision-language policies: which models are, their image processor next to their tokenizer, and the images
of a sequence as the model consumes them (pixel patches and the grid each image makes).

A Qwen2-VL-family prompt holds each image as `<|vision_start|><|image_pad|><|vision_end|>`; the image
processor turns the image into patches on a (t, h, w) grid, and the one pad becomes grid.prod() / merge**2
pads, one per token the vision tower gives. transformers' composite processor does the same expansion but
also builds a video processor, which needs torchvision; toolrl composes the image processor and the tokenizer
itself, so token ids stay the truth and no video stack is needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IMAGE_MARK = VISION_START + IMAGE_PAD + VISION_END
"""How the template renders an image part of a message (Qwen2-VL's)."""


@dataclass
class VisionImage:
    """One image of a sequence as the model reads it: its patches, its grid, where its tokens start in the
    sequence's ids, and the image file it came from (for records and viewers)."""

    pixel_values: torch.Tensor = field(repr=False)
    """[patches, channels x temporal x patch x patch], as the image processor gives them."""
    grid_thw: tuple[int, int, int]
    start: int = 0
    """Index in the sequence's token ids of its first image pad."""
    tokens: int = 0
    """Its number of image pads."""
    source: Any = field(default=None, repr=False)
    """The ToolImage (or task image) it was made from."""


def is_vision_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def is_vision_model(name_or_path: str | Path) -> bool:
    """Whether a local model folder holds a vision-language model (its config has a vision_config)."""
    from transformers import AutoConfig

    try:
        return is_vision_config(AutoConfig.from_pretrained(name_or_path))
    except (OSError, ValueError):
        return False


class ImageProcessor:
    """A model's image processor and the tokens its images take."""

    def __init__(self, processor: Any, tokenizer: Any, limits: Any = None) -> None:
        self.processor = processor
        self.merge = int(getattr(processor, "merge_size", 2))
        self.pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if self.pad_id is None or self.pad_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token: not a Qwen2-VL-family model")

    @classmethod
    def load(cls, name_or_path: str | Path, tokenizer: Any) -> ImageProcessor:
        from transformers import AutoImageProcessor

        return cls(AutoImageProcessor.from_pretrained(name_or_path), tokenizer)

    def process(self, images: list[Any]) -> list[VisionImage]:
        """Each image (a ToolImage, or anything with .pil()) as patches and grid."""
        out = []
        for image in images:
            pil = image.pil() if hasattr(image, "pil") else image
            batch = self.processor(images=[pil], return_tensors="pt")
            grid = tuple(int(v) for v in batch["image_grid_thw"][0])
            tokens = grid[0] * grid[1] * grid[2] // (self.merge * self.merge)
            out.append(VisionImage(batch["pixel_values"], grid, tokens=tokens, source=image))
        return out

    def expand(self, ids: list[int], images: list[VisionImage], offset: int = 0) -> list[int]:
        """`ids` with its k-th single image pad replaced by image k's pads; sets each image's start (counted
        from `offset`, where `ids` will sit in the sequence)."""
        pads = [i for i, t in enumerate(ids) if t == self.pad_id]
        if len(pads) != len(images):
            raise ValueError(f"{len(pads)} image places in the text for {len(images)} images")
        out: list[int] = []
        last = 0
        for at, image in zip(pads, images, strict=True):
            out.extend(ids[last:at])
            image.start = offset + len(out)
            out.extend([self.pad_id] * image.tokens)
            last = at + 1
        out.extend(ids[last:])
        return out


def model_inputs(images: list[VisionImage], device: torch.device) -> dict[str, torch.Tensor]:
    """pixel_values and image_grid_thw of a sequence's images, for the model's forward or generate."""
    if not images:
        return {}
    return {
        "pixel_values": torch.cat([im.pixel_values for im in images]).to(device),
        "image_grid_thw": torch.tensor([im.grid_thw for im in images], device=device),
    }


TINY_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '"
    + IMAGE_MARK
    + "' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with image parts rendered as Qwen2-VL renders them (the tiny test model's template)."""


def make_tiny_vlm(target: Path, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A tiny randomly initialised Qwen2.5-VL (the real architecture at a tiny size: vision tower, merger,
    M-RoPE) with the default model's tokenizer plus Qwen2-VL's vision tokens, a ChatML template with image
    parts, and Qwen2-VL's image processor, saved to `target`."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from toolrl.models.resolve import DEFAULT_MODEL, resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    tokenizer.add_special_tokens({"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>"]})
    tokenizer.chat_template = TINY_TEMPLATE
    special = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
        ("image_token_id", IMAGE_PAD), ("video_token_id", "<|video_pad|>"),
    )}  # fmt: skip
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    text = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, initializer_range=0.3, **ids,
    )  # fmt: skip
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
    )  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **special, **ids)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64).save_pretrained(target)
    return target
