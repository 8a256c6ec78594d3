"""Tools that return images: a PIL image, the bytes of an image file, a data: URL, MCP image content or an
HTTP image/* reply, alone or with text, from a thread, a worker process, an MCP server or an endpoint. Every
image is decoded once and checked: an unreadable one is the tool's error (never a crash), one claiming a
huge size is refused unread, a large one is scaled down."""

import asyncio
import base64
import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from toolrl.tools import ToolCall, ToolExecutor
from toolrl.tools.function import tool_from_function
from toolrl.tools.images import ImageError, ImageLimits, ToolImage, load_image, to_output

FIXTURES = Path(__file__).parents[1] / "fixtures"


def png(width=8, height=6, colour=(0, 0, 255)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def bomb_png(width=100_000, height=100_000) -> bytes:
    """A valid PNG header claiming a huge image, with a tiny body."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))  # noqa: E731
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


def picture(size: int) -> Image.Image:
    """A grey picture of `size` pixels a side."""
    return Image.new("RGB", (size, size), (90, 90, 90))


def captioned(size: int) -> list:
    """A caption, then the picture's PNG bytes."""
    return [f"{size} px", png(size, size)]


def broken() -> bytes:
    """PNG magic followed by garbage."""
    return b"\x89PNG\r\n\x1a\n" + b"garbage" * 10


def call(executor, name, **arguments):
    return asyncio.run(executor.invoke(ToolCall(name, arguments)))


def test_every_form_of_image_loads_checked_with_its_size():
    image = picture(10)
    forms = [image, png(10, 10), "data:image/png;base64," + base64.b64encode(png(10, 10)).decode()]
    forms.append({"type": "image", "data": base64.b64encode(png(10, 10)).decode(), "mime_type": "image/png"})
    for form in forms:
        loaded = load_image(form)
        assert (loaded.width, loaded.height, loaded.mime) == (10, 10, "image/png")
        assert loaded.pil().size == (10, 10)
    output = to_output(["look:", image, {"k": 1}])
    assert output.text == 'look:\n{"k": 1}' and len(output.images) == 1
    assert to_output({"a": 1}).text == '{"a": 1}' and to_output({"a": 1}).images == []


def test_bad_images_are_errors_that_name_the_problem_and_large_ones_shrink():
    with pytest.raises(ImageError, match="unreadable image"):
        load_image(broken())
    for side in (9_000, 100_000):  # over toolrl's limit; over PIL's own too
        with pytest.raises(ImageError, match="over the limit"):
            load_image(bomb_png(side, side))
    with pytest.raises(ImageError, match="not valid base64"):
        load_image("data:image/png;base64,@@@")
    with pytest.raises(ImageError, match="unsupported"):
        load_image(b"GIF7 not a gif")
    big = load_image(png(2000, 1000), ImageLimits(max_pixels=200_000))
    assert big.width * big.height <= 200_000 and abs(big.width / big.height - 2.0) < 0.02
    with pytest.raises(ImageError, match="at most 2"):
        to_output([png(), png(), png()], ImageLimits(max_per_result=2))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_python_tools_return_images_through_the_executor(isolation):
    tools = [tool_from_function(fn) for fn in (picture, captioned, broken)]
    from toolrl.tools import ToolPolicy

    policies = {t.name: ToolPolicy(isolation=isolation) for t in tools}
    executor = ToolExecutor(tools, policies=policies)
    try:
        alone = call(executor, "picture", size=12)
        assert alone.outcome == "ok" and [(i.width, i.height) for i in alone.images] == [(12, 12)]
        both = call(executor, "captioned", size=5)
        assert both.content == "5 px" and isinstance(both.images[0], ToolImage)
        bad = call(executor, "broken")
        assert bad.outcome == "tool_error" and "unreadable image" in bad.content and not bad.images
        assert executor.metrics["errors_tool_error"] == 1
    finally:
        executor.close()


def test_mcp_image_content_and_http_images_arrive_as_images(tmp_path):
    from tests.fixtures import mcp_server_entry, write_tool_config
    from tests.fixtures.http_server import LocalHTTPServer
    from toolrl.tools.toolset import Toolset

    with LocalHTTPServer() as server:
        servers = {
            "srv": mcp_server_entry("square"),
            "web": {"http": {"map": {"url": f"{server.url}/map.png", "method": "GET"}}},
        }
        config = write_tool_config(tmp_path / "tools.json", servers)
        toolset = Toolset.load(config)
        try:
            executor = ToolExecutor(toolset.tools)
            square = call(executor, "srv.square", size=7)
            assert square.content == "a red square of 7 pixels"
            assert (square.images[0].width, square.images[0].height) == (7, 7)
            assert square.images[0].pil().getpixel((3, 3)) == (255, 0, 0)
            corrupt = call(executor, "srv.square", size=7, broken=True)
            assert corrupt.outcome == "tool_error" and "unreadable image" in corrupt.content
            web = call(executor, "web.map")
            assert web.outcome == "ok" and (web.images[0].width, web.images[0].height) == (4, 3)
            executor.close()
        finally:
            toolset.close()


def test_the_runs_image_limits_come_from_its_tools_config():
    from toolrl.config.schema import ToolsConfig
    from toolrl.tools.toolset import run_executor

    tools = [tool_from_function(picture), tool_from_function(captioned)]
    executor, _ = run_executor(tools, ToolsConfig(image_max_pixels=400, images_per_result=0))
    try:
        shrunk = call(executor, "picture", size=100)
        assert shrunk.outcome == "tool_error" and "at most 0" in shrunk.content
    finally:
        executor.close()
    executor, _ = run_executor(tools, ToolsConfig(image_max_pixels=400))
    try:
        image = call(executor, "picture", size=100).images[0]
        assert (image.width, image.height) == (20, 20)
    finally:
        executor.close()
