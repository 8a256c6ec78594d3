"""Image tasks that need a tool: read a number printed on an image that is turned (rotate it upright) or too
small to read at the image's resolution (crop and zoom into it). Images are drawn here, from a seed; the
answer is the number. Tools receive images by reference: the task's image is `task`, and every image a tool
returns gets the next id (`image-1`, ...), named in the result's text, so the model never copies pixels
through its tokens. For vision-language policies (`needs_vision`); recipes/images.yaml."""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

from pydantic import Field

from toolrl.envs.base import Environment, Episode, Task, final_answer, register_env
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.envs.tasks import GeneratedTasks, TaskSplits, unique_seeded_tasks
from toolrl.models.vision import as_pil
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.rewards.rules import common_criteria
from toolrl.tools.function import tool_from_function
from toolrl.tools.limits import InvalidArguments

SYSTEM = (
    "You are a careful assistant who reads numbers in images. The user's image is named `task`. Tools: "
    "rotate(image, degrees) turns an image counter-clockwise; crop(image, left, top, right, bottom) cuts out a "
    "box (fractions 0..1 of the width and height) and enlarges it. Each tool answers with a new image and its "
    "name. When you can read the number, reply with <answer>NUMBER</answer>."
)


class ImagesOptions(GeneratedTasks):
    size: int = Field(224, ge=56, le=1024)
    """Width and height of the task images, in pixels."""
    kinds: list[Literal["rotated", "small"]] = Field(default_factory=lambda: ["rotated", "small"])
    """rotated: the number is turned by 90, 180 or 270 degrees; small: it is printed small in one corner."""


def draw_number(number: str, size: int, kind: str, rng: random.Random):
    """The task's image: `number` large and turned, or small in a random corner."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    if kind == "rotated":
        font = ImageFont.load_default(size=size // 4)
        box = pen.textbbox((0, 0), number, font=font)
        at = ((size - box[2]) // 2, (size - box[3]) // 2)
        pen.text(at, number, fill=(0, 0, 0), font=font)
        return image.rotate(rng.choice([90, 180, 270]))
    font = ImageFont.load_default(size=max(6, size // 24))
    corner = rng.choice([(0.05, 0.05), (0.7, 0.05), (0.05, 0.85), (0.7, 0.85)])
    pen.text((int(corner[0] * size), int(corner[1] * size)), number, fill=(0, 0, 0), font=font)
    return image


def generate_tasks(seed: int, options: ImagesOptions) -> dict[str, list[Task]]:
    def draw(rng: random.Random, index: int) -> tuple[str, str, dict]:
        number, kind = str(rng.randint(100, 999)), options.kinds[index % len(options.kinds)]
        question = {"rotated": "The number in the image is turned.", "small": "The number is printed small."}[kind]
        return f"{question} What number is it? (image {index})", number, {"kind": kind, "draw_seed": rng.random()}

    return unique_seeded_tasks(seed, options, draw, "img", [])


def with_image(task: Task, size: int) -> Task:
    """The task with its image drawn (from its own seed: the same image every time); drawn per episode, so a
    long run does not keep thousands of images."""
    if task.images or "draw_seed" not in task.meta:  # a task file's own images (env.train_file), read now
        return dataclasses.replace(task, images=[as_pil(image) for image in task.images])
    image = draw_number(task.answer, size, task.meta["kind"], random.Random(task.meta["draw_seed"]))
    return dataclasses.replace(task, images=[image])


class ImageBook:
    """One trajectory's images by name: the task's, then each one a tool made."""

    def __init__(self, task_images: list) -> None:
        names = ["task", *(f"task-{k}" for k in range(2, len(task_images) + 1))]
        self.images = dict(zip(names, task_images, strict=False))

    def get(self, name: str):
        if name not in self.images:
            raise InvalidArguments(f"no image named {name!r}; images: {', '.join(self.images)}")
        return self.images[name]

    def add(self, image, what: str) -> list:
        name = f"image-{sum(not n.startswith('task') for n in self.images) + 1}"
        self.images[name] = image
        return [f"{name}: {what}", image]

    def tools(self):
        book = self

        def rotate(image: str, degrees: int) -> list:
            """Turn an image counter-clockwise.

            Args:
                image: The image's name (`task`, or one a tool returned).
                degrees: 90, 180 or 270.
            """
            if degrees % 90:
                raise InvalidArguments("degrees must be 90, 180 or 270")
            turned = book.get(image).rotate(degrees % 360, expand=True)
            return book.add(turned, f"{image} turned by {degrees} degrees")

        def crop(image: str, left: float, top: float, right: float, bottom: float) -> list:
            """Cut a box out of an image and enlarge it to the image's size.

            Args:
                image: The image's name.
                left: Left edge, a fraction 0..1 of the width.
                top: Top edge, a fraction 0..1 of the height.
                right: Right edge (more than left).
                bottom: Bottom edge (more than top).
            """
            if not (0 <= left < right <= 1 and 0 <= top < bottom <= 1):
                raise InvalidArguments("need 0 <= left < right <= 1 and 0 <= top < bottom <= 1")
            source = book.get(image)
            w, h = source.size
            box = (int(left * w), int(top * h), max(int(right * w), int(left * w) + 1), max(int(bottom * h), 1))
            return book.add(source.crop(box).resize(source.size), f"{image} cropped to {box} and enlarged")

        return [tool_from_function(fn, isolation="thread") for fn in (rotate, crop)]


def correct(trajectory, task: Task) -> float:
    """The answer in <answer> tags equals the task's (spaces and case aside)."""
    return float((final_answer(trajectory.final_text) or "").strip().casefold() == task.answer.strip().casefold())


@register_env("images")
class ImagesEnv(Environment):
    name = "images"
    Options = ImagesOptions
    needs_vision = True

    def __init__(self, config, options: ImagesOptions):
        super().__init__(config, options)
        self.splits = TaskSplits(config, generate_tasks(config.seed, options))
        self.rubric = Rubric([Criterion("correct", correct, 1.0), *common_criteria()], success="correct")

    def tools(self):
        return ImageBook([]).tools()  # the schemas the prompt shows; each episode binds its own images

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """The number on the image, read without a tool."""
        return answered(task.answer)

    def messages(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.question}]

    def reset(self, task: Task) -> Episode:
        task = with_image(task, self.options.size)
        return Episode(task, self.messages(task), ImageBook(task.images).tools())
