"""The chat format of a vision-language policy: the text format's prompts and continuations, with images as
message parts that the template renders as image places, then each place expanded to the image's tokens
(models/vision.py). What comes back is token ids plus the images they hold, with their positions: the truth a
rollout appends and training reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolrl.chat.format import TOOL_RESPONSE_FALLBACK, ChatFormat
from toolrl.errors import DataError
from toolrl.models.vision import ImageProcessor, VisionImage
from toolrl.text import clip, first_line
from toolrl.tools.images import name_images


class VisionChatFormat(ChatFormat):
    supports_images = True

    def __init__(self, tokenizer, images: ImageProcessor):
        super().__init__(tokenizer)
        self.images = images

    def _parts(self, text: str, count: int) -> list[dict[str, Any]]:
        return [{"type": "text", "text": text}, *({"type": "image"} for _ in range(count))]

    def tool_messages_with_images(self, contents: Sequence[str], counts: Sequence[int]) -> list[dict[str, Any]]:
        """Tool results as messages, each with its images after its text."""
        if self.template_has_tool_role:
            return [{"role": "tool", "content": self._parts(c, n)} for c, n in zip(contents, counts, strict=True)]
        wrapped = [TOOL_RESPONSE_FALLBACK.format(content=c) for c in contents]
        return [{"role": "user", "content": self._parts(c, n)} for c, n in zip(wrapped, counts, strict=True)]

    def observation_with_images(
        self,
        contents: Sequence[str],
        images: Sequence[Sequence[Any]],
        model_ended_turn: bool,
        offset: int,
        image_room: int | None = None,
        token_room: int | None = None,
    ) -> tuple[list[int], list[VisionImage], int]:
        """The observation's ids with each result's images after its text, those images processed (their
        positions counted from `offset`, where the observation starts in the sequence), and how many results
        had an image the model cannot take (an extreme aspect ratio, say): such a result's text becomes an
        error for the model, without its images (the caller counts them as tool errors). Images past
        `image_room` images (rollout.max_images) or `token_room` image tokens (rollout.max_image_tokens) are
        named in their result's text instead, unprocessed past the first."""
        processed, failed, texts = [], 0, list(contents)
        count = image_room if image_room is not None else len([i for per_result in images for i in per_result])
        tokens = token_room if token_room is not None else float("inf")
        for k, per_result in enumerate(images):
            shown, over = list(per_result[: max(count, 0)]), list(per_result[max(count, 0) :])
            count -= len(shown)
            texts[k] = name_images(texts[k], over, "over rollout.max_images: not shown")
            try:
                done = self.images.process(shown) if shown else []
            except Exception as exc:  # the image processor's refusal must not end the rollout
                processed.append([])
                failed += 1
                texts[k] = f"Error: the tool's image cannot be shown to the model ({clip(first_line(exc), 200)})"
                continue
            kept, too_big = [], []
            for image in done:
                if image.tokens <= tokens:
                    kept.append(image)
                    tokens -= image.tokens
                else:
                    too_big.append(image.source)
            texts[k] = name_images(texts[k], too_big, "over rollout.max_image_tokens: not shown")
            processed.append(kept)
        flat = [image for per_result in processed for image in per_result]
        if not flat:
            return self.observation_ids(texts, model_ended_turn), [], failed
        messages = self.tool_messages_with_images(texts, [len(per_result) for per_result in processed])
        ids = self.continuation_ids(messages, model_ended_turn)
        return self.images.expand(ids, flat, offset), flat, failed

    def prompt_with_images(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        images: Sequence[Any],
        instructions: str | None = None,
        token_room: int | None = None,
    ) -> tuple[list[int], list[VisionImage]]:
        """The prompt's ids with the task's `images` after the text of its last user message, and the images
        (at most `token_room` image tokens: rollout.max_image_tokens)."""
        if not images:
            return self.prompt_ids(messages, tools, instructions), []
        messages = self.prompt_messages(messages, tools, instructions)
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last] = {**messages[last], "content": self._parts(messages[last]["content"], len(images))}
        text = self._render(messages, tools=list(tools) or None, add_generation_prompt=True)
        try:
            processed = self.images.process(list(images))
        except Exception as exc:
            raise DataError(f"a task's image cannot be shown to the model: {clip(first_line(exc), 200)}") from None
        tokens = sum(image.tokens for image in processed)
        if token_room is not None and tokens > token_room:
            raise DataError(
                f"its images take {tokens} image tokens, over rollout.max_image_tokens ({token_room}); raise it, "
                "or lower the image size"
            )
        return self.images.expand(self.encode(text), processed, 0), processed
