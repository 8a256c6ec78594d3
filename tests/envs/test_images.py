"""The images environment: seeded tasks whose images are drawn here (the same image for a task every time),
tools that take images by name and answer with a new, named image (rotate turns a turned number upright;
crop enlarges a corner), errors for bad names and boxes, and the answer check."""

import asyncio

from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolCall, ToolExecutor


def env(**options):
    sets = [f"env.options.{k}={v}" for k, v in {"num_train": 6, "num_test": 2, "size": 112, **options}.items()]
    config = load_config(overrides=["env.name=images", *sets])
    return make_env(config.env, config.model.name, None)


def test_tasks_are_seeded_and_their_images_drawn_the_same_each_time():
    images = env()
    task = images.tasks("train")[0]
    assert task.answer.isdigit() and len(task.answer) == 3 and not task.images  # drawn per episode
    first, again = images.reset(task), images.reset(task)
    assert first.task.images[0].tobytes() == again.task.images[0].tobytes()
    assert [t.id for t in env().tasks("test")] == [t.id for t in images.tasks("test")]


def test_tools_take_images_by_name_and_answer_with_named_images():
    images = env(kinds='["small"]')
    task = images.tasks("train")[0]
    episode = images.reset(task)
    executor = ToolExecutor([])
    try:
        step = asyncio.run(episode.step([ToolCall("crop", {"image": "task", "left": 0.0, "top": 0.0,
                                                            "right": 0.5, "bottom": 0.5})], executor))  # fmt: skip
        [result] = step.observations
        assert result.outcome == "ok" and result.content.startswith("image-1: task cropped")
        assert (result.images[0].width, result.images[0].height) == (112, 112)
        turned = asyncio.run(episode.step([ToolCall("rotate", {"image": "image-1", "degrees": 90})], executor))
        assert turned.observations[0].content.startswith("image-2: image-1 turned by 90 degrees")
        bad = asyncio.run(episode.step([ToolCall("rotate", {"image": "nope", "degrees": 45})], executor))
        assert bad.observations[0].outcome == "invalid_arguments" and "degrees must be" in bad.observations[0].content
        missing = asyncio.run(episode.step([ToolCall("rotate", {"image": "nope", "degrees": 90})], executor))
        assert "no image named 'nope'" in missing.observations[0].content
    finally:
        executor.close()


def test_a_turned_number_is_the_upright_drawing_turned_and_rotate_undoes_it():
    from toolrl.envs.images import draw_number

    class Upright:
        @staticmethod
        def choice(options):
            return 0  # image.rotate(0): the drawing before it is turned

    images = env(kinds='["rotated"]')
    for task in images.tasks("train")[:3]:
        episode = images.reset(task)
        shown = episode.task.images[0]
        upright = draw_number(task.answer, 112, "rotated", Upright())
        [turn] = [d for d in (90, 180, 270) if upright.rotate(d).tobytes() == shown.tobytes()]
        executor = ToolExecutor([])
        try:
            step = asyncio.run(episode.step([ToolCall("rotate", {"image": "task", "degrees": 360 - turn})], executor))
        finally:
            executor.close()
        assert step.observations[0].images[0].pil().tobytes() == upright.tobytes()
    task = images.tasks("test")[0]
    traj = Trajectory.start(task, [1, 2])
    traj.add_model_turn([3], [-0.1], f"<answer>{task.answer}</answer>")
    assert images.rubric.criteria[0].fn(traj, task) == 1.0


def test_image_tasks_from_a_file_with_paths_and_data_urls(tmp_path):
    import base64
    import io
    import json

    import pytest
    from PIL import Image

    from toolrl.errors import DataError

    (tmp_path / "pics").mkdir()
    Image.new("RGB", (30, 20), (200, 0, 0)).save(tmp_path / "pics" / "red.png")
    buffer = io.BytesIO()
    Image.new("RGB", (10, 10), (0, 0, 200)).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rows = [
        {"id": "a", "question": "What colour?", "answer": "Red", "image": "pics/red.png"},
        {"id": "b", "question": "Which two?", "answer": "red blue", "images": ["pics/red.png", url]},
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(overrides=["env.name=images", f"env.train_file={tasks}", f"env.test_file={tasks}"])
    images = make_env(config.env, config.model.name, None)
    first, second = images.tasks("train")
    assert first.images == [tmp_path / "pics" / "red.png"] and "image" not in first.meta
    shown = images.reset(second).task.images
    assert [im.size for im in shown] == [(30, 20), (10, 10)] and shown[1].getpixel((5, 5)) == (0, 0, 200)
    book = images.reset(second)
    executor = ToolExecutor([])
    try:
        step = asyncio.run(book.step([ToolCall("rotate", {"image": "task-2", "degrees": 90})], executor))
    finally:
        executor.close()
    assert step.observations[0].content.startswith("image-1: task-2 turned")
    traj = Trajectory.start(first, [1])
    traj.add_model_turn([2], [-0.1], "<answer> red </answer>")
    assert images.rubric.criteria[0].fn(traj, first) == 1.0  # spaces and case aside
    tasks.write_text(json.dumps({"question": "q", "answer": "a", "image": "pics/none.png"}) + "\n")
    with pytest.raises(DataError, match=r"row 0 image: no image file .*none.png; paths are relative"):
        make_env(config.env, config.model.name, None).tasks("train")
