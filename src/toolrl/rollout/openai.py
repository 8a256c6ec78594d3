"""An engine on any OpenAI-compatible server (vLLM, SGLang, llama.cpp server), through `/v1/completions`.

The prompt goes as token ids, the rollout's source of truth, and the server is asked for the sampled tokens'
log-probs. vLLM returns each sampled token as `token_id:N` when asked (`return_tokens_as_token_ids`), which
keeps the trajectory token-exact. A server that returns text only is still usable, for evaluation or a
judge: its text is encoded with the tokenizer and `token_exact` turns False (logged once).

Several servers (`rollout.openai.base_url` as a list): each new sequence goes to the healthy server with the
fewest requests in flight and stays there for its later turns (its prefix is in that server's cache). A server
that fails (connection refused, 5xx, a reply in the wrong shape) is marked down for `RETRY_DOWN_S` and the
request goes to another; after that time it is tried again, the request itself being the health check
(`health()` asks every server's `/models` at once). When no server answers, one line names each URL and why.

The servers' weights are their own: training with this engine would sample from a policy that never changes,
so `toolrl train` refuses it (evaluation and judges use it).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolrl.errors import EngineError
from toolrl.http import HTTPFailure, HTTPTransient, bearer_header, http_client, request_json
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.sampling import SamplingParams, request_seed
from toolrl.rollout.weights import shared_folder, write_weights
from toolrl.text import first_line

log = logging.getLogger(__name__)


RETRY_DOWN_S = 10.0
"""How long a server that failed is left out before a request tries it again."""


@dataclass
class Server:
    base: str
    """Its API root (http://host:port/v1)."""
    in_flight: int = 0
    down_until: float = 0.0
    """time.monotonic() before which it is left out; 0 when it answered last."""
    last_error: str = ""

    @property
    def url(self) -> str:
        return self.base + "/completions"


class OpenAIEngine(Engine):
    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        tokenizer,
        stop_ids: Sequence[int],
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        setting: str = "rollout.openai.base_url",
    ):
        self.setting = setting  # the config key its one-line errors name
        self.client = http_client(headers, connect_timeout_s=10.0, read_timeout_s=timeout_s)
        bases = [base_url] if isinstance(base_url, str) else list(base_url)
        self.servers = [Server(base.rstrip("/")) for base in bases]
        self.url = self.servers[0].url  # the first server's, for messages about one server
        self.assigned: dict[Hashable, Server] = {}
        self._lock = threading.Lock()
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, list(stop_ids)
        self.token_exact = True
        # Sync client in worker threads: one connection pool for the run, whatever event loop asks.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="toolrl-openai")

    def _pick(self, seq: Hashable, tried: list[Server]) -> Server | None:
        """The sequence's server while it is up, else the up server with the fewest requests in flight."""
        now = time.monotonic()
        with self._lock:
            server = self.assigned.get(seq)
            if server is None or server in tried or server.down_until > now:
                up = [s for s in self.servers if s not in tried and s.down_until <= now]
                if not up:
                    return None
                server = min(up, key=lambda s: s.in_flight)
                self.assigned[seq] = server
            server.in_flight += 1
            return server

    def _done(self, server: Server, error: BaseException | None) -> None:
        with self._lock:
            server.in_flight -= 1
            if error is None:
                server.down_until, server.last_error = 0.0, ""
            else:
                server.down_until, server.last_error = time.monotonic() + RETRY_DOWN_S, first_line(error)
                log.warning("%s failed (%s); trying the other servers", server.url, server.last_error)

    def health(self) -> dict[str, str]:
        """Each server's state by asking its /models: "ok" or why not (and it is left out for a while)."""
        states = {}
        for server in self.servers:
            try:
                request_json(self.client, "GET", server.base + "/models", {})
                states[server.base] = "ok"
                server.down_until, server.last_error = 0.0, ""
            except (HTTPFailure, RuntimeError) as exc:
                states[server.base] = server.last_error = first_line(exc)
                server.down_until = time.monotonic() + RETRY_DOWN_S
        return states

    def release(self, seq: Hashable) -> None:
        with self._lock:
            self.assigned.pop(seq, None)

    def body(self, tokens: list[int], params: SamplingParams) -> dict[str, Any]:
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "stop_token_ids": self.stop_ids,  # vLLM and SGLang extensions; other servers ignore unknown keys
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop:  # the server stops there too; what it sends past a stop string is cut off by the gateway
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = request_seed(params, len(tokens))
        return body

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        return await self._request(seq, self.body(tokens, params), self.parse)

    async def prompt_logprobs(self, seq: Hashable, tokens: list[int]) -> list[float]:
        """The log-prob of each of `tokens` given the ones before it, at temperature 1 (the first token's is 0.0):
        the completions API's prompt log-probs (`echo` with `logprobs`, one token generated and left out), which
        vLLM, SGLang and OpenAI's legacy completions return. A server that returns fewer (llama.cpp's) is one
        line: it cannot score."""
        body = {"model": self.model, "prompt": tokens, "max_tokens": 1, "temperature": 1.0, "echo": True,
                "logprobs": 0, "return_tokens_as_token_ids": True, "skip_special_tokens": False}  # fmt: skip
        return await self._request(seq, body, lambda reply, url: self.parse_echo(reply, url, tokens))

    def parse_echo(self, reply: Any, url: str, tokens: list[int]) -> list[float]:
        try:
            logprobs = reply["choices"][0]["logprobs"] or {}
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{url} did not answer in the completions shape: {str(reply)[:200]}") from None
        values, echoed = logprobs.get("token_logprobs") or [], logprobs.get("tokens") or []
        if len(values) < len(tokens):
            raise EngineError(
                f"{self.setting}: {url} returned log-probs for {len(values)} of the {len(tokens)} prompt tokens; "
                "scoring needs the prompt's (completions with echo and logprobs: vLLM, SGLang)"
            )
        ids = [t.removeprefix("token_id:") for t in echoed[: len(tokens)] if isinstance(t, str)]
        if len(ids) == len(tokens) and all(i.isdigit() for i in ids) and [int(i) for i in ids] != tokens:
            raise EngineError(f"{self.setting}: {url} scored other token ids than those sent (another tokenizer?)")
        out = [0.0]
        for k, v in enumerate(values[1 : len(tokens)], start=1):  # a reply is untrusted: log-probs or nothing
            if isinstance(v, bool) or not isinstance(v, int | float) or not -1e9 < v <= 1e-3:
                raise EngineError(f"{self.setting}: {url} gave prompt token {k} the log-prob {str(v)[:40]!r}, "
                                  "which is not a number <= 0")  # fmt: skip
            out.append(float(v))
        return out

    async def _request(self, seq: Hashable, body: dict[str, Any], parse: Callable[[Any, str], Any]) -> Any:
        """POST `body` to the sequence's server, the next healthy one if it fails; `parse` reads the reply."""
        loop = asyncio.get_running_loop()
        tried: list[Server] = []
        while (server := self._pick(seq, tried)) is not None:
            try:
                reply = await loop.run_in_executor(self.pool, request_json, self.client, "POST", server.url, body)
                sampled = parse(reply, server.url)
            except HTTPFailure as exc:
                if isinstance(exc, HTTPTransient):  # down or overloaded: the next server takes the request
                    self._done(server, exc)
                    tried.append(server)
                    continue
                self._done(server, None)  # the request's own fault (4xx): another server would refuse it too
                raise EngineError(f"{self.setting}: {first_line(exc)}") from None
            except RuntimeError as exc:  # an answer in the wrong shape: not a completions server
                self._done(server, exc)
                tried.append(server)
                continue
            except EngineError:  # the server answered, but cannot do what is asked (parse said so)
                self._done(server, None)
                raise
            self._done(server, None)
            return sampled
        if len(self.servers) == 1:  # one server that is down: one line naming the setting and the URL
            server = self.servers[0]
            raise EngineError(f"{self.setting}: {server.last_error}; is the server up at {server.url}?")
        why = "; ".join(f"{s.url}: {s.last_error or 'left out after a failure'}" for s in self.servers)
        raise EngineError(f"{self.setting}: no server answered ({why})")

    def parse(self, reply: Any, url: str | None = None) -> Sampled:
        url = url or self.url
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{url} did not answer in the completions shape: {str(reply)[:200]}") from None
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.removeprefix("token_id:")) for t in tokens]
            lps = [float(lp if lp is not None else 0.0) for lp in logprobs.get("token_logprobs", [])]
        else:
            if self.token_exact:
                log.warning("%s returns no token ids: encoding its text, so trajectories are not token-exact", url)
                self.token_exact = False
            ids = self.tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
            lps = [0.0] * len(ids)
        # Ended only when the stop token itself is among the ids: otherwise the rollout feeds the end of the turn
        # as (untrained) observation tokens, so the sequence stays exactly what the model saw.
        ended = bool(ids) and ids[-1] in self.stop_ids
        return Sampled(ids, lps[: len(ids)] + [0.0] * (len(ids) - len(lps)), ended)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


class VLLMServers(OpenAIEngine):
    """vLLM servers that train: after each optimizer step the trainer's weights are written once as a
    safetensors file into `weights_dir` (a folder every server can read: /dev/shm on one machine, a shared
    file system across machines), then every server reloads them in place through the installed vLLM's own
    interfaces (its workers' `reload_weights` by POST /collective_rpc, then POST /reset_prefix_cache; both served
    when the server runs with VLLM_SERVER_DEV_MODE=1). A server that cannot load them is left out for the rest
    of the run (it would sample from stale weights); when none can, one line names each URL."""

    def __init__(self, *args, weights_dir: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights_dir = Path(weights_dir) if weights_dir else shared_folder("toolrl-weights-")
        self.weights_dir.mkdir(parents=True, exist_ok=True)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int | None = None) -> None:
        write_weights(weights, self.weights_dir)
        loaded = 0
        for server in self.servers:
            if server.down_until == float("inf"):
                continue
            root = server.base.removesuffix("/v1")
            try:
                body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir)}}
                request_json(self.client, "POST", root + "/collective_rpc", body)
                request_json(self.client, "POST", root + "/reset_prefix_cache", {})
                loaded += 1
            except (HTTPFailure, RuntimeError) as exc:
                with self._lock:
                    server.down_until, server.last_error = float("inf"), f"weights not loaded: {first_line(exc)}"
                log.warning("%s: %s; left out for the rest of the run", root, server.last_error)
        if not loaded:
            why = "; ".join(f"{s.base}: {s.last_error}" for s in self.servers)
            raise EngineError(f"{self.setting}: no server took the new weights ({why})")

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.weights_dir, ignore_errors=True)


def served_engine(chat, served, default_model: str, key: str, engine: type[OpenAIEngine] = OpenAIEngine, **kwargs):
    """An engine on the servers a config section names (`key`: rollout.openai, sft.teacher,
    train.kl.teacher_endpoint: base_url, model, api_key_env, timeout_s, max_concurrency); its one-line errors
    name that section's settings."""
    headers = bearer_header(served.api_key_env, f"{key}.api_key_env")
    model = served.model or default_model
    return engine(served.base_url, model, chat.tokenizer, chat.stop_ids, headers, served.timeout_s,
                  served.max_concurrency, setting=f"{key}.base_url", **kwargs)  # fmt: skip


@register_engine("openai")
def openai_engine(chat, config, **_: object) -> OpenAIEngine:
    return served_engine(chat, config.rollout.openai, config.model.name, "rollout.openai")


@register_engine("vllm-server", supports_training=True, loads_weights=True)
def vllm_server_engine(chat, config, **_: object) -> VLLMServers:
    o = config.rollout.openai
    return served_engine(chat, o, config.model.name, "rollout.openai", VLLMServers, weights_dir=o.weights_dir)
