"""A minimal OpenAI-compatible HTTP server around a local causal LM (the pipeline's saved models).

    python -m pipeline.inference.openai_server models/sft --port 8000 [--host 127.0.0.1] [--api-key-env VAR]

Routes: `POST /v1/completions` (the prompt as sent), `POST /v1/chat/completions` and
`GET /v1/models`. A chat request is served in the prompt format the model was trained with, as its
folder's `pipeline_config.json` records it (`prompt`): `chat`, the messages rendered by the
tokenizer's chat template, after the recorded system message when the request sends none; `raw`,
the one user message's content as the model's whole prompt (the question as the task writes it), and
a 400 naming the format for a system message or several turns, which a raw model never saw. A folder
without that record (an older one, a Hub id) is served as before: the template when the tokenizer has
one, else the message contents concatenated.

No streaming, no `stop` sequences, no logprobs (each refused with a 400, as is a
prompt plus `max_tokens` beyond the model's context, vLLM's rule). One model call at a time
(a lock), each prompt decoded alone with `pipeline.inference.generation.generate`, so a
greedy answer equals `generate` on that prompt in-process. Serves the embedded
teacher over HTTP, and the tests of `pipeline.inference.openai_backend`.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pipeline.inference.generation import generate

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat's default is the rest of the context
# Accepted only at these values (OpenAI's defaults): anything else asks for what this server does not do.
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
               "best_of": (None, 1)}

# Called with each request's parsed body (after the key check): None to answer normally,
# an int to answer with that HTTP status instead (e.g. 500), a float to sleep that many seconds first.
BeforeRequest = Callable[[dict], int | float | None]


class RequestError(Exception):
    """An error answered in OpenAI's schema: {"error": {"message", "type", "code"}}."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class OpenAIServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not keep the process alive

    def __init__(self, address, model, tokenizer, model_name: str, api_key: str | None,
                 before_request: BeforeRequest | None, prompt: dict | None = None) -> None:
        super().__init__(address, _Handler)
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.prompt = prompt  # the format the model was trained with ({"format", "system"}); None: not recorded
        self.api_key, self.before_request = api_key, before_request
        self.model_lock = threading.Lock()  # one generate() at a time: the model and torch's RNG are shared

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes, e.g. http://127.0.0.1:8000/v1."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"


def make_server(
    model, tokenizer, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
    before_request: BeforeRequest | None = None, model_name: str = "local", prompt: dict | None = None,
) -> OpenAIServer:
    """A bound server, not yet serving: call `serve_forever()` (port 0 picks a free port: `server_address`).

    `prompt`: the format the model was trained with (`prompt_format(folder)`), which chat requests are served in;
    None when unknown."""
    return OpenAIServer((host, port), model, tokenizer, model_name, api_key, before_request, prompt)


def prompt_format(model_dir: str | os.PathLike) -> dict | None:
    """The prompt format a model folder records it was trained with (`pipeline_config.json`'s `prompt`:
    {"format": "raw" or "chat", "system": ...}); None for a folder without it (older ones, a Hub id)."""
    from pathlib import Path

    from pipeline.core import paths

    manifest = Path(model_dir) / paths.MODEL_MANIFEST
    try:
        prompt = json.loads(manifest.read_text()).get("prompt")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(prompt, dict) or prompt.get("format") not in ("raw", "chat"):
        return None
    return {"format": prompt["format"], "system": prompt.get("system")}


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    timeout = 300  # seconds an idle keep-alive connection is kept open

    def do_GET(self) -> None:
        self._answer(self._models)

    def do_POST(self) -> None:
        self._answer(self._complete)

    def _not_allowed(self) -> None:
        def refuse() -> dict:
            raise RequestError(405, f"method {self.command} is not allowed (GET /v1/models, POST completions)")

        self._answer(refuse)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed

    def _answer(self, route: Callable[[], dict]) -> None:
        try:
            status, body = 200, route()
        except RequestError as exc:
            status, body = exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.status}}
        except Exception as exc:  # a bug or a model error: the client sees a 500 and may retry
            log.exception("request failed")
            status, body = 500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error",
                                           "code": 500}}
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout) meanwhile
            self.close_connection = True

    def _models(self) -> dict:
        if self.path.rstrip("/") != "/v1/models":
            raise RequestError(404, f"no route GET {self.path}", "not_found_error")
        self._check_key()
        return {"object": "list", "data": [{"id": self.server.model_name, "object": "model", "created": 0,
                                            "owned_by": "pipeline"}]}

    def _complete(self) -> dict:
        route = self.path.rstrip("/")
        if route not in ("/v1/completions", "/v1/chat/completions"):
            self._read_body()  # keep the connection usable
            raise RequestError(404, f"no route POST {self.path}", "not_found_error")
        body = self._read_body()
        self._check_key()
        hook = self.server.before_request(body) if self.server.before_request else None
        if isinstance(hook, int):
            raise RequestError(hook, f"injected fault: HTTP {hook}", "server_error")
        if isinstance(hook, float):
            time.sleep(hook)
        chat = route == "/v1/chat/completions"
        prompts = ([_chat_prompt(body.get("messages"), self.server.tokenizer, self.server.prompt,
                                 self.server.model_name)] if chat
                   else _prompts(body.get("prompt")))
        return self._generate(body, prompts, chat)

    def _generate(self, body: dict, prompts: list[str], chat: bool) -> dict:
        if body.get("model") is None:
            raise RequestError(400, "model is required")
        if body.get("model") != self.server.model_name:
            raise RequestError(404, f"The model `{body.get('model')}` does not exist.", "not_found_error")
        if body.get("stream"):
            raise RequestError(400, "stream is not supported")
        if body.get("stop"):
            raise RequestError(400, "stop sequences are not supported")
        for name, accepted in UNSUPPORTED.items():
            if body.get(name) not in accepted:
                raise RequestError(400, f"{name} is not supported")
        tok = self.server.tokenizer
        lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        if not all(lengths):
            raise RequestError(400, "a prompt is empty (no tokens to continue from)")
        context = getattr(self.server.model.config, "max_position_embeddings", None) or 1 << 20
        key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_tokens = _number(body, key, context - max(lengths) if chat else DEFAULT_MAX_TOKENS, int, 1, 1 << 20)
        if max(lengths) + max_tokens > context:  # vLLM's rule: past it the model has no positions left
            raise RequestError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                    f"{max(lengths) + max_tokens} tokens ({max(lengths)} in the prompt, {max_tokens} "
                                    "in the completion). Please reduce the length of the prompt or completion.")
        n = _number(body, "n", 1, int, 1, 128)
        temperature = _number(body, "temperature", 1.0, float, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, float, 1e-9, 1.0)
        seed = _number(body, "seed", 0, int, -(1 << 63), (1 << 64) - 1)  # torch's range
        if temperature == 0 and n > 1:
            raise RequestError(400, "n > 1 needs temperature > 0 (greedy decoding gives one completion)")
        with self.server.model_lock:
            outputs = [generate(self.server.model, tok, [p], max_new_tokens=max_tokens, do_sample=temperature > 0,
                                temperature=temperature, top_p=top_p, num_return_sequences=n, seed=seed or 0,
                                progress=False)[0] for p in prompts]
        choices = []
        for i, gen in enumerate(g for out in outputs for g in out):
            # "stop" when the model ended before the limit (an EOS on the very last token reads "length")
            choice = {"index": i, "finish_reason": "length" if gen.tokens >= max_tokens else "stop", "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": gen.text}
            else:
                choice["text"] = gen.text
            choices.append(choice)
        prompt_tokens = sum(lengths)
        completion_tokens = sum(gen.tokens for out in outputs for gen in out)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.server.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    def _read_body(self) -> dict:
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(411, "Content-Length is required")
        if not length.isdigit():  # int() would take "-1", and read(-1) waits for the client to close
            self.close_connection = True  # the body's end is unknown: the connection cannot carry another request
            raise RequestError(400, f"Content-Length must be a whole number of bytes, not {length!r}")
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise RequestError(400, f"body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "body must be a JSON object")
        return body

    def _check_key(self) -> None:
        """Only when the server has a key; the answer never echoes what was sent."""
        if self.server.api_key is None:
            return
        sent = self.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.server.api_key}".encode()):
            raise RequestError(401, "Incorrect API key provided.", "invalid_api_key")

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)  # the request line and status, never headers


def _prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str) and prompt:
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt
    raise RequestError(400, "prompt must be a non-empty string or a non-empty list of strings")


def _chat_prompt(messages: Any, tokenizer=None, prompt: dict | None = None, name: str = "local") -> str:
    """The text the model reads for a chat request, in the format it was trained with (`prompt`, see the module
    docstring): raw, the one user message's content; chat, the conversation (after the recorded system message
    when it has none) rendered by the tokenizer's chat template. Not recorded (None): the template when there is
    one (as vLLM does), else the message contents concatenated (roles dropped). Text parts count."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list")
    parts, conversation = [], []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise RequestError(400, "each message needs a string content (or text parts)")
        parts.append(content)
        conversation.append({"role": str(message.get("role", "user")), "content": content})
    if prompt is not None and prompt.get("format") == "raw":
        roles = [m["role"] for m in conversation]
        if roles != ["user"]:
            got = ("a system message" if "system" in roles else
                   f"{len(roles)} messages ({', '.join(roles)})" if len(roles) > 1 else f"a {roles[0]} message")
            raise RequestError(400, f"The model `{name}` was trained with prompt format raw (the question's text "
                                    "alone, no roles or chat template), so a chat request to it is one user message "
                                    f"whose content is the question, served as the model's whole prompt; got {got}. "
                                    "Send the text itself to /v1/completions, or serve a model trained with "
                                    "prompt.format chat.")
        return conversation[0]["content"]
    if prompt is not None and prompt.get("system") and not any(m["role"] == "system" for m in conversation):
        conversation.insert(0, {"role": "system", "content": prompt["system"]})  # as it was trained
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return "".join(parts)


def _number(body: dict, name: str, default: Any, kind: type, low: float, high: float) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise RequestError(400, f"{name} must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    if not low <= value <= high:
        raise RequestError(400, f"{name} must be between {low} and {high}, not {value!r}")
    return kind(value)


def main(argv: list[str] | None = None) -> None:
    from pipeline.core.io import ConfigError, InputError
    from pipeline.core.params import give, read_section
    from pipeline.modeling.models import load_model
    from pipeline.modeling.params import ModelLoadConfig

    parser = argparse.ArgumentParser(prog="python -m pipeline.inference.openai_server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", help="a folder saved by the pipeline (or a Hugging Face id)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key-env", help="require `Authorization: Bearer <key>`, the key read from this variable")
    parser.add_argument("--served-model-name", help="the `model` clients send (default: model_dir as given)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"error: --api-key-env {args.api_key_env}: the variable is not set", file=sys.stderr)
            raise SystemExit(2)
    try:
        give(read_section("model", ModelLoadConfig))  # a program of its own: models load as the stages here load them
        model, tokenizer = load_model(args.model_dir)
    except (ConfigError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    name = args.served_model_name or args.model_dir
    prompt = prompt_format(args.model_dir)
    try:
        server = make_server(model, tokenizer, args.host, args.port, api_key=api_key, model_name=name, prompt=prompt)
    except OSError as exc:  # the port is taken, or the host is not this machine's
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    log.info("serving %s at %s%s; chat requests %s", name, server.url, " (API key required)" if api_key else "",
             "as its raw prompt (prompt format raw, pipeline_config.json)" if prompt and prompt["format"] == "raw"
             else "through its chat template (prompt format chat, pipeline_config.json)" if prompt
             else f"through its chat template if any (no prompt format recorded in {args.model_dir})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
