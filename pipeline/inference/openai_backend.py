"""A teacher behind any OpenAI-compatible endpoint (vLLM, SGLang, hosted APIs), with a resumable cache.

    sampler = OpenAISampler("http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B", cache_path=Path("cache/teacher.sqlite"))
    generations = sampler.sample(prompts, n=4, temperature=0.7, top_p=0.95, max_new_tokens=512, seed=0)

One request per prompt asks for all `n` completions; `concurrency` requests are in
flight at once. Each prompt's result is committed to a sqlite cache as soon as it
arrives, so an interrupted or partly failed run resumes without paying twice.
The API key is read from the environment at construction and is never written to
a file, a log line, an exception message or the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from pathlib import Path
from typing import Literal

import httpx
import openai
from tqdm.auto import tqdm

from pipeline.core.io import InputError
from pipeline.inference.generation import Generation
from pipeline.modeling import chat

log = logging.getLogger(__name__)

PLACEHOLDER_KEY = "EMPTY"  # what vLLM and SGLang accept when started without --api-key

# After the client's own retries, these fail every other prompt the same way: stop sending more.
# (APITimeoutError subclasses APIConnectionError but depends on the prompt's length: not fatal.)
_FATAL = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError, openai.APIConnectionError)


class TeacherRequestError(InputError):
    """Some prompts still failed after retries; the others are cached and a rerun resumes."""


class OpenAISampler:
    """The `Sampler` protocol over an OpenAI-compatible `/v1/completions` or `/v1/chat/completions`.

    `Generation.tokens` is the response's `usage.completion_tokens` (the total over the
    n choices, as the API reports it) split evenly across the choices, the remainder going
    to the first ones, so the tokens of a prompt sum to what the server billed; the API
    gives no per-choice count. A response without `usage` counts 0 tokens.
    """

    local = False  # weights behind an endpoint: no step-level search, no tokenizer check

    def __init__(
        self,
        base_url: str,
        model: str,
        api: Literal["completions", "chat"] = "completions",
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        cache_path: Path | None = None,
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', not {api!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.base_url, self.model, self.api, self.api_key_env = base_url, model, api, api_key_env
        self.concurrency, self.timeout_s, self.max_retries = concurrency, timeout_s, max_retries
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.name = f"openai:{model}"
        key = os.environ.get(api_key_env)
        if not key:
            log.warning("%s is not set: sending the placeholder key %r (fine for vLLM without --api-key)",
                        api_key_env, PLACEHOLDER_KEY)
            key = PLACEHOLDER_KEY
        self.status_counts: Counter[int] = Counter()  # HTTP responses seen, by status code
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # event hooks run on the worker threads
        http_client = openai.DefaultHttpxClient(  # an httpx.Client with the openai client's defaults
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            event_hooks={"request": [self._on_request], "response": [self._on_response]},
        )
        # The client's own retries are this backend's equivalent of Prefect task retries: per request,
        # on 408/409/429/5xx, timeouts and connection errors, sleeping 0.5, 1, 2, 4, 8 s (x0.75-1 jitter)
        # or what a Retry-After header says (up to 120 s). Other 4xx are not retried.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries, http_client=http_client
        )

    def __repr__(self) -> str:
        return (f"OpenAISampler(base_url={self.base_url!r}, model={self.model!r}, api={self.api!r}, "
                f"api_key_env={self.api_key_env!r}, concurrency={self.concurrency}, timeout_s={self.timeout_s}, "
                f"max_retries={self.max_retries}, cache_path={self.cache_path!r})")

    @property
    def stats(self) -> dict[str, int | float]:
        """Totals over this sampler's life: HTTP requests sent (retries included), non-2xx responses,
        prompts answered from the cache, prompts sent, prompts that failed, completion tokens received
        and seconds spent in `sample`."""
        with self._lock:
            return {
                "requests": self._counts["requests"],
                "http_errors": sum(c for status, c in self.status_counts.items() if not 200 <= status < 300),
                "cache_hits": self._counts["cache_hits"],
                "prompts_requested": self._counts["prompts_requested"],
                "prompts_failed": self._counts["prompts_failed"],
                "completion_tokens": self._counts["completion_tokens"],
                "seconds": round(self._counts["milliseconds"] / 1000, 3),
            }

    def sample(
        self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
        max_new_tokens: int = 192, seed: int = 0,
    ) -> list[list[Generation]]:
        if n < 1 or (temperature == 0 and n > 1):
            raise ValueError(f"n={n} with temperature={temperature}: greedy decoding gives one completion")
        start = time.perf_counter()
        # typed once, so that temperature 0 and 0.0 share a cache key
        params = {"n": int(n), "temperature": float(temperature), "top_p": float(top_p),
                  "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
        try:
            with closing(self._open_cache()) as db:
                return self._sample(db, prompts, params)
        finally:
            with self._lock:
                self._counts["milliseconds"] += round((time.perf_counter() - start) * 1000)

    def _sample(self, db: sqlite3.Connection, prompts: Sequence[str], params: dict) -> list[list[Generation]]:
        results: dict[str, list[Generation]] = {}
        todo: dict[str, str] = {}  # cache key -> prompt; a repeated prompt is requested once
        hits = 0
        for prompt in prompts:
            key = self._key(prompt, params)
            cached = db.execute("SELECT value FROM generations WHERE key = ?", (key,)).fetchone()
            if cached:
                results[key] = [Generation(**g) for g in json.loads(cached[0])]
                hits += 1
            else:
                todo[key] = prompt
        with self._lock:
            self._counts["cache_hits"] += hits
            self._counts["prompts_requested"] += len(todo)
        errors, skipped = self._request_all(db, todo, params, results)
        failed = [p for p in prompts if self._key(p, params) not in results]
        with self._lock:
            self._counts["prompts_failed"] += len(failed)
        if failed:
            raise self._failure(errors, skipped, len(failed), len(prompts))
        return [results[self._key(p, params)] for p in prompts]

    def _request_all(
        self, db: sqlite3.Connection, todo: dict[str, str], params: dict, results: dict[str, list[Generation]]
    ) -> tuple[list[openai.OpenAIError], int]:
        """Request every prompt in `todo`, caching each result as it lands; the errors and prompts not sent."""
        errors: list[openai.OpenAIError] = []
        skipped = 0
        abort = threading.Event()  # set on an error that every later prompt would hit too
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="teacher")
        try:
            futures = {pool.submit(self._request, p, params, abort): k for k, p in todo.items()}
            with tqdm(total=len(todo), desc=self.name, unit="prompt") as progress:
                for future in as_completed(futures):
                    progress.update()
                    try:
                        generations = future.result()
                    except openai.OpenAIError as exc:
                        errors.append(exc)
                        continue
                    if generations is None:
                        skipped += 1
                        continue
                    key = futures[future]
                    results[key] = generations
                    db.execute("INSERT OR REPLACE INTO generations VALUES (?, ?)",
                               (key, json.dumps([{"text": g.text, "tokens": g.tokens} for g in generations])))
                    db.commit()  # per prompt: an interrupted run keeps everything that arrived
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # on Ctrl-C, do not start the queued prompts
        return errors, skipped

    def _request(self, prompt: str, params: dict, abort: threading.Event) -> list[Generation] | None:
        """All n completions of one prompt (None when the run was aborted before it was sent)."""
        if abort.is_set():
            return None
        common = {
            "model": self.model, "n": params["n"], "temperature": params["temperature"], "top_p": params["top_p"],
            "max_tokens": params["max_new_tokens"], "seed": params["seed"],
        }
        try:
            if self.api == "chat":
                messages = chat.messages(prompt)  # the system message of params' prompt section, then the user's
                response = self._client.chat.completions.create(messages=messages, **common)
            else:  # the worked examples (`chat.with_shots`) before the question, as the local samplers render it
                response = self._client.completions.create(prompt=chat.render(None, prompt), **common)
        except _FATAL as exc:
            if not isinstance(exc, openai.APITimeoutError):
                abort.set()  # here, before this thread takes the next prompt; requests in flight still finish
            raise
        choices = sorted(response.choices, key=lambda c: c.index)
        texts = [(c.message.content or "") if self.api == "chat" else c.text for c in choices]
        total = response.usage.completion_tokens if response.usage else 0
        with self._lock:
            self._counts["completion_tokens"] += total
        share, extra = divmod(total, max(1, len(texts)))
        return [Generation(text=t, tokens=share + (i < extra)) for i, t in enumerate(texts)]

    def _failure(self, errors: list[openai.OpenAIError], skipped: int, failed: int, total: int) -> TeacherRequestError:
        first = errors[0]
        status = getattr(first, "status_code", None)
        detail = type(first).__name__ + (f" (HTTP {status})" if status else "") + f": {str(first)[:300]}"
        if self._client.api_key != PLACEHOLDER_KEY:
            detail = detail.replace(self._client.api_key, "***")  # a server may echo the key it rejected
        not_sent = f", {skipped} of them not sent since the error would repeat" if skipped else ""
        resume = (f"a rerun resumes from the cache at {self.cache_path}" if self.cache_path
                  else "no cache_path is set, so a rerun requests every prompt again")
        return TeacherRequestError(
            f"teacher {self.base_url} (model {self.model}): {failed} of {total} prompts failed "
            f"(up to {self.max_retries} retries each){not_sent}; first error: {detail}; {resume}"
        )

    def _key(self, prompt: str, params: dict) -> str:
        ident = {"prompt": prompt, "base_url": self.base_url, "model": self.model, "api": self.api, **params}
        if self.api == "chat" and (system := chat.active().system):
            ident["system"] = system  # another system message asks another question
        if chat.shots():
            ident["shots"] = chat.shots()  # and so do other worked examples before it
        return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def _open_cache(self) -> sqlite3.Connection:
        """The cache at `cache_path`, or one in memory (for this call only) when there is none."""
        if self.cache_path is None:
            db = sqlite3.connect(":memory:")
        else:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.cache_path)
        db.execute("CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        return db

    def _on_request(self, request: httpx.Request) -> None:
        with self._lock:
            self._counts["requests"] += 1

    def _on_response(self, response: httpx.Response) -> None:
        with self._lock:
            self.status_counts[response.status_code] += 1
