"""Tiny random vision-language models built from real configs and processors, for tests and benchmarks:
Qwen2.5-VL (vision tower, merger, M-RoPE) and LLaVA (a CLIP vision tower, a projector, a Llama)."""

from __future__ import annotations

from pathlib import Path

import torch

from toolrl.models.vision import IMAGE_MARK, IMAGE_PAD, LLAVA_IMAGE, VISION_END, VISION_START


def tiny_template(image_mark: str) -> str:
    """ChatML with image parts rendered as `image_mark` (the tiny test models' template)."""
    return (
        "{% for message in messages %}"
        "{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}{{ '" + image_mark + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def make_tiny_vlm(target: Path, family: str = "qwen2_5_vl", seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A tiny randomly initialised vision-language model of a real family, saved to `target` with the default
    model's tokenizer plus the family's image tokens, a ChatML template with image parts, and the family's
    real image processor. qwen2_5_vl: Qwen2.5-VL's architecture (vision tower, merger, M-RoPE) and Qwen2-VL's
    image processor; llava: LLaVA (a CLIP vision tower, a projector, a Llama) and CLIP's image processor."""
    from transformers import AutoTokenizer

    from toolrl.models.resolve import DEFAULT_MODEL, resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    text = dict(
        hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.3, **ids,
    )  # fmt: skip
    torch.manual_seed(seed)
    if family == "qwen2_5_vl":
        model, processor = _tiny_qwen(tokenizer, text, ids)
    elif family == "llava":
        model, processor = _tiny_llava(tokenizer, text)
    else:
        raise ValueError(f"family must be qwen2_5_vl or llava, got {family!r}")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    processor.save_pretrained(target)
    return target


def _tiny_qwen(tokenizer, text: dict, ids: dict):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>"]})
    tokenizer.chat_template = tiny_template(IMAGE_MARK)
    special = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
        ("image_token_id", IMAGE_PAD), ("video_token_id", "<|video_pad|>"),
    )}  # fmt: skip
    half = text["hidden_size"] // text["num_attention_heads"] // 2  # M-RoPE splits it as Qwen2.5-VL does (1:1.5:1.5)
    sections = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    text = {**text, "vocab_size": len(tokenizer), "rope_scaling": {"type": "mrope", "mrope_section": sections}}
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
    )  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **special, **ids)
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    return Qwen2_5_VLForConditionalGeneration(config), processor


def _tiny_llava(tokenizer, text: dict):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": [LLAVA_IMAGE]})
    tokenizer.chat_template = tiny_template(LLAVA_IMAGE)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(vocab_size=len(tokenizer), **text),
        image_token_index=tokenizer.convert_tokens_to_ids(LLAVA_IMAGE),
    )
    images = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
        image_token=LLAVA_IMAGE, num_additional_image_tokens=1, chat_template=tokenizer.chat_template,
    )  # fmt: skip
    return LlavaForConditionalGeneration(config), processor
