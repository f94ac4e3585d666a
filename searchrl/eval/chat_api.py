"""Prompting baselines over any OpenAI-compatible chat endpoint: API models (GPT-4o, Claude through a
compatible gateway, ...) or a local vLLM / SGLang server, as a `Generate` (prompts, stop strings -> texts)
that every prompting baseline runs on.

`ChatClient` POSTs {base_url}/v1/chat/completions (model, messages, temperature, max_tokens, stop), with
- the API key read from the environment variable `key_env` names (sent as a Bearer token, never logged);
- at most `concurrency` requests in flight and request starts spaced by 1 / `requests_per_second`;
- every exchange (connect, send, the whole response) over within `timeout` seconds, however slowly the
  server trickles its bytes (`searchrl.retrieval.deadline`);
- retries of 429, 5xx, connection errors, timeouts and a 200 whose body is not JSON, with exponential backoff
  (`backoff` doubled per attempt), waiting what a Retry-After header asks for instead when the server sends
  one; no wait is longer than `max_backoff`, whatever the header says;
- a disk cache (`cache_dir`) keyed by (base_url, model, messages, sampling parameters): a rerun makes no
  requests. An answer is cached before its usage is logged, so that nothing in the accounting can lose an
  answer that was paid for;
- a usage log (`usage_log`, JSONL): each request's prompt and completion tokens (the response's `usage`; None
  where the server gives no count) and its cost from the user's price table (`prices`: a JSON file {model:
  {"prompt": USD, "completion": USD}} per million tokens; no prices are built in).

Every failure of a request is a `ChatAPIError` naming its cause (and the cache file, for a torn entry).
A message `content` given as a list of parts (OpenAI's content parts) is their text parts joined.

`ChatGenerate` keeps the rollout engine's contract: a text that a stop string ended ends with that stop
string. A server that names the stop it matched (vLLM's `stop_reason`, SGLang's `matched_stop`) gets it
appended back; for one that does not (OpenAI's), set `server_stop=False` when a method reads the stop
(Search-o1's end-of-query marker): the stops are then applied here, on the whole generation. A text prompt
(a base-model layout) is sent as one user message; the endpoint renders its model's own chat template.
With `server_extensions` (vLLM, SGLang), a final assistant message is continued (`continue_final_message`)
and a `Chat`'s template switches go as `chat_template_kwargs`; other endpoints get the messages as they
are (an Anthropic-backed gateway continues a final assistant message as a prefill).

Tasks' commands take the same --api_* flags (`define_flags`): the prompting baselines and DeepRetrieval's
API rows (docs/autosearch.md, docs/deepretrieval.md).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import hashlib
import http.client
import json
import math
import os
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from absl import flags

from searchrl.retrieval.deadline import Connection, TLSConnection
from searchrl.text import chat

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
ENDPOINT = "/v1/chat/completions"


class ChatAPIError(RuntimeError):
    """A request the endpoint refused (a 4xx other than 429), that still failed after every retry, whose
    answer cannot be read, or whose cache entry is torn."""


class _Transient(Exception):
    """One attempt's failure that a retry may cure; `wait_s`: what the server's Retry-After asks for."""

    def __init__(self, message: str, wait_s: float | None = None):
        super().__init__(message)
        self.wait_s = wait_s


def _field(default: Any, help_text: str) -> Any:
    """A config field with its --api_* flag's help."""
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class ChatAPIConfig:
    """Where and how to call the endpoint (the --api_* flags)."""

    base_url: str | None = _field(None, "the server root, e.g. http://127.0.0.1:8000 (no /v1)")
    model: str | None = _field(None, "the model name the endpoint serves")
    key_env: str = _field("", "the environment variable holding the API key; empty: no key (local server)")
    temperature: float = _field(0.0, "sampling temperature")
    max_tokens: int = _field(1024, "most tokens generated per request")
    concurrency: int = _field(8, "requests in flight at once")
    requests_per_second: float = _field(0.0, "spacing of request starts, retries included; 0: no limit")
    max_retries: int = _field(6, "retries of 429, 5xx and connection errors")
    backoff: float = _field(1.0, "seconds before the first retry (without Retry-After), doubled per retry")
    max_backoff: float = _field(60.0, "the longest wait before a retry (backoff or Retry-After), in seconds")
    timeout: float = _field(300.0, "seconds per request, the whole response included")
    cache_dir: str = _field("", "disk cache of responses; empty: none")
    usage_log: str = _field("", "JSONL log of every request made (tokens, cost); empty: none")
    prices: str = _field("", 'JSON price table {model: {"prompt": USD, "completion": USD}} per million '
                         "tokens; empty: no costs")
    server_stop: bool = _field(True, "send the stop strings to the server; off: apply them here (for an "
                               "endpoint that does not report the stop it matched, e.g. OpenAI's)")
    server_extensions: bool = _field(False, "vLLM / SGLang: continue a final assistant message, send "
                                     "chat_template_kwargs")

    def __post_init__(self):
        if not (self.base_url or "").startswith(("http://", "https://")):
            raise ValueError(f"api base_url {self.base_url!r} must start with http:// or https://")
        if self.base_url.rstrip("/").endswith("/v1"):
            raise ValueError(f"api base_url {self.base_url!r} ends with /v1: give the server root, "
                             f"{ENDPOINT} is appended")
        if not self.model:
            raise ValueError("api model is empty (--api_model)")
        if self.concurrency < 1 or self.max_retries < 0 or self.requests_per_second < 0:
            raise ValueError(f"api concurrency must be >= 1 (got {self.concurrency}), max_retries >= 0 "
                             f"(got {self.max_retries}), requests_per_second >= 0 "
                             f"(got {self.requests_per_second})")
        for name in ("timeout", "max_backoff"):
            if not 0 < (seconds := getattr(self, name)) < math.inf:
                raise ValueError(f"api {name} must be a positive number of seconds, got {seconds}")
        if self.key_env and not os.environ.get(self.key_env):
            raise ValueError(f"the environment variable {self.key_env!r} (--api_key_env) is not set")


@dataclasses.dataclass(frozen=True)
class Completion:
    """One choice of a response: its text, why it ended and the stop string the server says it matched."""

    text: str
    finish_reason: str | None
    matched_stop: str | None


def load_prices(path: str) -> dict[str, dict[str, float]]:
    """The user's price table: {model: {"prompt": USD, "completion": USD}} per million tokens, each price a
    finite number >= 0 (checked here, before any request is paid for)."""
    if not path:
        return {}
    try:
        table = json.loads(Path(path).read_text())
    except ValueError as e:
        raise ValueError(f"{path}: the price table is not JSON ({e})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: the price table must be a JSON object {{model: prices}}")
    for model, price in table.items():
        if not isinstance(price, dict) or set(price) != {"prompt", "completion"}:
            raise ValueError(f"{path}: model {model!r} needs exactly {{'prompt': USD, 'completion': USD}} "
                             f"per million tokens, got {price!r}")
        for kind, usd in price.items():
            if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not 0 <= usd < math.inf:
                raise ValueError(f"{path}: model {model!r} {kind!r} price must be a number >= 0 (USD per "
                                 f"million tokens), got {usd!r}")
    return table


def retry_after(value: str | None, now: float, cap: float) -> float | None:
    """Seconds a Retry-After header asks to wait (delta-seconds or an HTTP date), at most `cap`; None if
    absent or not a time (NaN included). A huge value (1e400, a date in the year 9999) waits `cap`."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, OverflowError):
            return None
    return None if math.isnan(seconds) else min(max(0.0, seconds), cap)


def message_text(content: Any) -> str:
    """A message's `content` as text: a string, null (""), or a list of parts whose text parts are joined
    (strings or {"type": "text", "text": ...}); anything else is a ValueError naming it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content part {i} is not text (type {kind!r})")
    return "".join(texts)


def _tokens(usage: Any, name: str) -> int | None:
    """A token count of a response's `usage`; None where the server gives none (or not an integer >= 0)."""
    count = usage.get(name) if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to and including the first stop string in it (the rollout engine's stop)."""
    ends = [text.find(stop) + len(stop) for stop in stops if stop and stop in text]
    return text[:min(ends)] if ends else text


def to_messages(prompt: chat.Prompt) -> tuple[list[dict[str, str]], Mapping[str, Any]]:
    """(messages, chat template switches) of a prompt; a text prompt is one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}], {}
    if isinstance(prompt, chat.Chat):
        return [dict(m) for m in prompt.messages], prompt.template_kwargs
    return [dict(m) for m in prompt], {}


class RateLimiter:
    """Spaces the starts of calls by at least 1 / rate seconds, across threads."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            start = max(self.clock(), self._next)
            self._next = start + self.interval
        self.sleep(max(0.0, start - self.clock()))


class ChatClient:
    """Chat completions from one endpoint and model, cached, rate-limited, retried and logged."""

    def __init__(self, config: ChatAPIConfig, sleep: Callable[[float], None] = time.sleep):
        self.config, self.sleep = config, sleep
        self.url = config.base_url.rstrip("/") + ENDPOINT
        parts = urllib.parse.urlsplit(self.url)
        self._connection = TLSConnection if parts.scheme == "https" else Connection
        self._host, self._port, self._path = parts.hostname, parts.port, parts.path
        self.prices = load_prices(config.prices)
        self.limiter = RateLimiter(config.requests_per_second, sleep=sleep)
        self.requests_made = 0
        self._lock = threading.Lock()

    def payload(self, messages: Sequence[Mapping[str, str]], stops: Sequence[str],
                template_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The request body: model, messages, sampling parameters (and the server's extensions)."""
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "messages": [dict(m) for m in messages],
                                "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        if stops and cfg.server_stop:
            body["stop"] = list(stops)
        if cfg.server_extensions:
            if messages[-1]["role"] == "assistant":
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            if template_kwargs:
                body["chat_template_kwargs"] = dict(template_kwargs)
        return body

    def cache_path(self, body: Mapping[str, Any]) -> Path | None:
        """Where the response to `body` at this endpoint is cached (None without a cache)."""
        if not self.config.cache_dir:
            return None
        key = hashlib.sha256(json.dumps({"base_url": self.config.base_url.rstrip("/"), **body},
                                        sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return Path(self.config.cache_dir) / key[:2] / f"{key}.json"

    def complete(self, messages: Sequence[Mapping[str, str]], stops: Sequence[str] = (),
                 template_kwargs: Mapping[str, Any] | None = None) -> Completion:
        """The first choice for `messages`: from the cache, else from the endpoint (cached, then its usage
        logged)."""
        body = self.payload(messages, stops, template_kwargs or {})
        path = self.cache_path(body)
        if path is not None and path.exists():
            return self._cached(path)
        response, latency, attempts = self._post(body)
        try:
            choice = response["choices"][0]
            matched = choice.get("stop_reason", choice.get("matched_stop"))
            completion = Completion(message_text(choice["message"]["content"]), choice.get("finish_reason"),
                                    matched if isinstance(matched, str) else None)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise ChatAPIError(f"{self.url}: a response without a text choices[0].message.content "
                               f"({type(e).__name__}: {e}): {json.dumps(response)[:300]}") from None
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")
                tmp.write_text(json.dumps({"request": body, "completion": dataclasses.asdict(completion)},
                                          ensure_ascii=False))
                os.replace(tmp, path)
            self._log(body, response, latency, attempts)
        except OSError as e:  # a full disk, a read-only cache or log
            raise ChatAPIError(f"cannot record the answer of {self.url} ({type(e).__name__}: {e})") from None
        return completion

    @staticmethod
    def _cached(path: Path) -> Completion:
        """The completion a cache entry holds; ChatAPIError naming the file when it is torn."""
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))["completion"]
            completion = Completion(**entry)
            if not isinstance(completion.text, str):
                raise TypeError(f"text is {type(completion.text).__name__}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ChatAPIError(f"{path}: a torn cache entry ({type(e).__name__}: {e}); delete it to request "
                               f"the answer again") from None
        return completion

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if self.config.key_env:
            headers["Authorization"] = f"Bearer {os.environ[self.config.key_env]}"
        return headers

    def _post(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float, int]:
        """(the endpoint's JSON answer to `body`, its latency, the attempts made), retried as the module
        doc says."""
        cfg = self.config
        attempt = 0
        while True:
            self.limiter.wait()
            start = time.monotonic()
            with self._lock:
                self.requests_made += 1
            try:
                return self._attempt(body), time.monotonic() - start, attempt + 1
            except _Transient as e:
                error, wait = str(e), e.wait_s
            if attempt == cfg.max_retries:
                raise ChatAPIError(f"{self.url} ({cfg.model}): {error}, after {attempt + 1} attempts")
            self.sleep(wait if wait is not None else min(cfg.backoff * 2 ** attempt, cfg.max_backoff))
            attempt += 1

    def _attempt(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One request, over within `timeout`: the JSON object of a 200; _Transient for what a retry may
        cure, ChatAPIError for a refusal."""
        cfg = self.config
        connection = self._connection(self._host, self._port, time.monotonic() + cfg.timeout)
        try:
            connection.request("POST", self._path, json.dumps(body).encode(), self._headers())
            reply = connection.getresponse()
            data = reply.read()
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short, garbled
            raise _Transient(f"{type(e).__name__}: {str(e)[:200]}") from None
        finally:
            connection.close()
        if reply.status != 200:
            error = f"HTTP {reply.status}: {data[:300].decode(errors='replace')}"
            if reply.status not in RETRY_STATUS:
                raise ChatAPIError(f"{self.url} ({cfg.model}): {error}")
            raise _Transient(error, retry_after(reply.getheader("Retry-After"), time.time(), cfg.max_backoff))
        try:
            response = json.loads(data)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
            raise _Transient(f"HTTP 200 with a body that is not JSON ({str(e)[:100]}): {data[:100]!r}"
                             ) from None
        if not isinstance(response, dict):
            raise _Transient(f"HTTP 200 with a body that is not a JSON object: {data[:100]!r}")
        return response

    def _log(self, body: Mapping[str, Any], response: Mapping[str, Any], latency: float, attempts: int
             ) -> None:
        """Appends one request's usage (and cost, when the model has a price and the server counted the
        tokens) to the usage log."""
        if not self.config.usage_log:
            return
        usage = response.get("usage")
        prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
        price = self.prices.get(body["model"])
        cost = None if price is None or prompt is None or completion is None else (
            prompt * price["prompt"] + completion * price["completion"]) / 1e6
        row = {"time": time.time(), "base_url": self.config.base_url, "model": body["model"],
               "prompt_tokens": prompt, "completion_tokens": completion, "cost_usd": cost,
               "latency_s": round(latency, 3), "attempts": attempts}
        path = Path(self.config.usage_log)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def usage_summary(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Per model in a usage log: requests, prompt and completion tokens, and cost; a total is None when a
    row lacks its part (a model without a price, a response without token counts)."""
    totals: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            t = totals.setdefault(row["model"], {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                                 "cost_usd": 0.0})
            t["requests"] += 1
            for name in ("prompt_tokens", "completion_tokens", "cost_usd"):
                t[name] = None if t[name] is None or row[name] is None else t[name] + row[name]
    return totals


class ChatGenerate:
    """A `Generate` (prompts, stop strings -> texts) over a chat endpoint: each prompt one request, at
    most `concurrency` at once, texts in the prompts' order, each ending with the stop string that ended it
    (see the module doc)."""

    def __init__(self, client: ChatClient):
        self.client = client

    def one(self, prompt: chat.Prompt, stops: tuple[str, ...]) -> str:
        messages, template_kwargs = to_messages(prompt)
        done = self.client.complete(messages, stops, template_kwargs)
        text = done.text
        if not self.client.config.server_stop:
            return cut_at_stop(text, stops)
        if done.matched_stop in stops and not text.endswith(done.matched_stop):
            text += done.matched_stop
        return text

    def __call__(self, prompts: Sequence[chat.Prompt], stops: tuple[str, ...] = ()) -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(self.client.config.concurrency) as pool:
            return list(pool.map(lambda p: self.one(p, stops), prompts))


def define_flags(values: flags.FlagValues) -> dict[str, flags.FlagHolder]:
    """The --api_* flags of a command line, one per `ChatAPIConfig` field (read with `config_from_flags`)."""
    holders = {}
    for field in dataclasses.fields(ChatAPIConfig):
        define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}.get(
            type(field.default), flags.DEFINE_string)
        holders[field.name] = define(f"api_{field.name}", field.default, f"Chat endpoint: "
                                     f"{field.metadata['help']}.", flag_values=values)
    return holders


def out_name(config: ChatAPIConfig) -> str:
    """The directory name of an endpoint's results: api_<model> ('/' in the model name as '_')."""
    return "api_" + config.model.replace("/", "_")


def config_from_flags(holders: Mapping[str, flags.FlagHolder]) -> ChatAPIConfig | None:
    """The endpoint the --api_* flags name; None when no --api_model is given."""
    if not holders["model"].value:
        return None
    if not holders["base_url"].value:
        raise ValueError("--api_model needs --api_base_url (the server root, e.g. http://127.0.0.1:8000)")
    return ChatAPIConfig(**{name: holder.value for name, holder in holders.items()})
