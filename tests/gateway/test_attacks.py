"""The gateway attacked as an attacker would, over real sockets: bodies past the limit (chunked too), headers and
bodies that never finish, floods of connections without a key, bodies nested past reading, token ids outside the
vocabulary, a prompt far past the context. Each is a one-line 4xx in the protocol's shape (or a connection closed
at once), never a 500, and keyed clients are served throughout."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.gateway import policies
from tests.gateway.policies import RulePolicy
from toolrl.gateway import Gateway
from toolrl.gateway.guard import ConnectionGuard
from toolrl.parsers import get_parser


@pytest.fixture
def gateway(chat):
    guard = ConnectionGuard(max_unkeyed=32, header_timeout_s=1.0)
    made = Gateway(RulePolicy(chat, policies.calculator), chat, get_parser("hermes"), "tiny", guard=guard,
                   context_length=8192).start()  # fmt: skip
    made.body_timeout_s = 1.0
    yield made
    made.stop()


def connect(gateway) -> socket.socket:
    sock = socket.create_connection((gateway.host, gateway.port), timeout=10)
    return sock


def head(gateway, path: str, extra: str = "", key: bool = True) -> bytes:
    auth = f"Authorization: Bearer {gateway.key}\r\n" if key else ""
    return f"POST /v1{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}{extra}".encode()


def response(sock: socket.socket) -> tuple[int, bytes, bool]:
    """(status, body, whether the server closed the connection after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, data, True
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), 0)  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    sock.settimeout(2)
    try:
        closed = sock.recv(1) == b""
    except (TimeoutError, ConnectionResetError):
        closed = False
    return int(header.split()[1]), body, closed


def closed_now(sock: socket.socket, within: float = 0.5) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def keyed_request_ms(gateway) -> float:
    started = time.perf_counter()
    reply = httpx.get(f"{gateway.base_url()}/models", headers={"Authorization": f"Bearer {gateway.key}"}, timeout=10)
    assert reply.status_code == 200
    return (time.perf_counter() - started) * 1000


def test_a_chunked_body_past_the_limit_is_refused_while_it_arrives(gateway):
    """40 MiB sent chunked, no Content-Length: refused at the 16 MiB limit with a 413, the connection closed, and
    the server never held the whole body."""
    sock = connect(gateway)
    sock.sendall(head(gateway, "/chat/completions", "Transfer-Encoding: chunked\r\n\r\n"))
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        for _ in range(40):
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server stopped reading: what a client past the limit sees
    status, body, closed = response(sock)
    assert status == 413 and "the body is over 16,777,216 bytes" in json.loads(body)["error"]["message"]
    assert closed and sent < 40
    declared = connect(gateway)  # a Content-Length past the limit: refused before a byte of the body is read
    declared.sendall(head(gateway, "/chat/completions", "Content-Length: 99999999999\r\n\r\n") + b"{}")
    status, _, closed = response(declared)
    assert status == 413 and closed


def test_headers_or_a_body_that_never_finish_are_cut_off(gateway):
    slow = connect(gateway)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
    assert not closed_now(slow, 0.3) and closed_now(slow, 3.0)  # the header deadline (1 s here) closes it
    partial = connect(gateway)
    partial.sendall(head(gateway, "/chat/completions", "Content-Length: 100\r\n\r\n") + b'{"messages": ')
    status, body, closed = response(partial)
    assert status == 408 and "took more than 1 s to arrive" in json.loads(body)["error"]["message"] and closed
    assert gateway.guard.refused["header_timeout"] >= 1


def test_a_flood_of_connections_without_a_key_keeps_descriptors_for_keyed_clients(gateway):
    """300 connections that send nothing: past 32 unkeyed ones each is closed at once; a keyed client is served
    in well under a second the whole time; the header deadline closes the rest."""
    flood = []
    for _ in range(300):
        try:
            flood.append(connect(gateway))
        except OSError:
            break
    time.sleep(0.3)
    shut = sum(closed_now(s, 0.05) for s in flood)
    assert shut >= len(flood) - 32 and gateway.guard.refused["unkeyed"] >= len(flood) - 32
    assert keyed_request_ms(gateway) < 500
    time.sleep(1.5)
    assert sum(closed_now(s, 0.05) for s in flood) == len(flood)  # the deadline closed the ones kept
    for sock in flood:
        sock.close()


def test_a_request_without_the_key_is_refused_and_its_connection_closed(gateway):
    sock = connect(gateway)
    sock.sendall(head(gateway, "/chat/completions", "Content-Length: 2\r\n\r\n", key=False) + b"{}")
    status, body, closed = response(sock)
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error" and closed
    wrong = connect(gateway)
    wrong.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: nope\r\nContent-Length: 2\r\n\r\n{}")
    status, body, closed = response(wrong)
    assert status == 401 and json.loads(body)["type"] == "error" and closed  # Anthropic's shape


def test_connections_from_one_address_are_capped(chat):
    guard = ConnectionGuard(max_per_address=8, max_unkeyed=100, header_timeout_s=5.0)
    gateway = Gateway(RulePolicy(chat, policies.calculator), chat, get_parser("hermes"), "tiny", guard=guard).start()
    try:
        held = [connect(gateway) for _ in range(8)]
        extra = connect(gateway)
        assert closed_now(extra, 1.0) and guard.refused["per_address"] == 1
        assert not any(closed_now(s, 0.05) for s in held)
    finally:
        gateway.stop()


def test_nesting_and_token_ids_are_checked_in_one_line(gateway):
    headers = {"Authorization": f"Bearer {gateway.key}"}
    deep = {"messages": [{"role": "user", "content": "x", "meta": json.loads("[" * 70 + "]" * 70)}]}
    error = httpx.post(f"{gateway.base_url()}/chat/completions", json=deep, headers=headers)
    assert error.status_code == 400 and error.json()["error"]["message"] == "the body nests deeper than 64 levels"
    ids = httpx.post(f"{gateway.base_url()}/completions", json={"prompt": [1, 2, 10**9], "max_tokens": 4},
                     headers=headers)  # fmt: skip
    assert ids.status_code == 400 and ids.json()["error"]["param"] == "prompt[2]"
    negative = httpx.post(f"{gateway.base_url()}/completions", json={"prompt": [-1]}, headers=headers)
    assert negative.status_code == 400 and "is not in the vocabulary" in negative.json()["error"]["message"]


def test_a_10mb_prompt_is_refused_at_once_and_other_clients_are_not_held_up(gateway):
    """Bounded by characters before any tokenizing: refused in well under a second, while another client's
    request is answered in under 100 ms (on a busy machine: within 4x what it takes just before, as no request
    waits for the big one to be read and refused)."""
    big = {"messages": [{"role": "user", "content": "word " * 2_000_000}]}

    def attempt() -> tuple[list[float], list[float]]:
        latencies, done = [], {}
        before = [keyed_request_ms(gateway) for _ in range(5)]

        def huge() -> None:
            started = time.perf_counter()
            reply = httpx.post(f"{gateway.base_url()}/chat/completions", json=big,
                               headers={"Authorization": f"Bearer {gateway.key}"}, timeout=60)  # fmt: skip
            done["reply"], done["s"] = reply, time.perf_counter() - started

        thread = threading.Thread(target=huge)
        thread.start()
        while thread.is_alive():
            latencies.append(keyed_request_ms(gateway))
            time.sleep(0.01)
        thread.join()
        error = done["reply"].json()["error"]
        assert done["reply"].status_code == 400 and error["code"] == "context_length_exceeded"
        assert "10,000,000 characters" in error["message"] and done["s"] < 1.0
        return latencies, before

    # A machine shared with other work (a fresh clone's suite beside two more processes: load 5 on 2 cores) has
    # stalled one sample to 4.2x: the latency bound is asked of the best of three tries, the refusal of every one.
    tries = []
    for _ in range(3):
        latencies, before = attempt()
        tries.append((latencies, before))
        if latencies and max(latencies) < max(100, 4 * max(before)):
            break
    else:
        pytest.fail(f"another client waited over 4x its time in every try: {tries}")


@pytest.mark.parametrize("parameters", ["string", [], 5, {"type": "string"}, {"type": ["object", "null"]}])
def test_a_tool_schema_that_is_not_an_object_is_one_line_400_in_every_protocol(gateway, parameters):
    """Issue 72: a tool whose parameters are not an object's schema was a 500 (a traceback in the log) in chat,
    Responses and Messages."""
    headers = {"Authorization": f"Bearer {gateway.key}"}
    user = [{"role": "user", "content": "hi"}]
    asks = {
        "/chat/completions": {"messages": user, "tools": [{"type": "function",
                                                           "function": {"name": "f", "parameters": parameters}}]},
        "/responses": {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": parameters}]},
        "/messages": {"max_tokens": 8, "messages": user, "tools": [{"name": "f", "input_schema": parameters}]},
    }  # fmt: skip
    for path, body in asks.items():
        reply = httpx.post(f"{gateway.base_url()}{path}", json=body, headers=headers, timeout=30)
        if parameters == []:  # an empty list is no schema at all to Responses and Messages: their default
            assert reply.status_code in ((400,) if path == "/chat/completions" else (200,)), (path, reply.text)
            continue
        assert reply.status_code == 400, (path, reply.text)
        message = reply.json()["error"]["message"]
        assert (
            message.startswith("tools[0] (f): its parameters must be a JSON schema of an object")
            and "\n" not in message
        )
    assert gateway.stats["errors"] == 0  # no fault of ours: each is the client's, told as such
    nameless = {"messages": user, "tools": [{"type": "function", "function": "f"}]}
    reply = httpx.post(f"{gateway.base_url()}/chat/completions", json=nameless, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[0]"
    empty = {"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": None}}]}
    assert httpx.post(f"{gateway.base_url()}/chat/completions", json=empty, headers=headers).status_code == 200


def test_count_tokens_refuses_what_messages_refuses_at_once_and_completions_bounds_stop_as_chat_does(gateway):
    headers = {"x-api-key": gateway.key}
    big = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "system": "x " * (6 << 20)}
    for path in ("/messages", "/messages/count_tokens"):
        started = time.perf_counter()
        reply = httpx.post(f"{gateway.base_url()}{path}", json=big, headers=headers, timeout=60)
        assert reply.status_code == 400 and "prompt is too long" in reply.json()["error"]["message"], path
        assert time.perf_counter() - started < 5.0  # refused by its characters, before tokenizing 12 MB
    for stop in (["a"] * 100, "a" * 1000):
        reply = httpx.post(f"{gateway.base_url()}/completions", json={"prompt": "hi", "stop": stop},
                           headers={"Authorization": f"Bearer {gateway.key}"})  # fmt: skip
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "stop"
