"""OpenAISampler against the real loopback server around a saved tiny model: APIs, retries, cache, key hygiene."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter

import pytest
import torch

from pipeline.core.io import InputError
from pipeline.inference.generation import Generation, generate
from pipeline.inference.openai_backend import OpenAISampler, TeacherRequestError
from pipeline.inference.openai_server import make_server
from pipeline.modeling.models import build_student, load_model, save_model, train_tokenizer
from pipeline.modeling.params import BaseModelConfig

PROMPTS = ["Question: what is 3+4?\n", "Question: what is 12-5?\n", "Question: what is 2*9?\n"]
SECRET = "sk-test-SECRET-123"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Qwen2 and its tokenizer, saved as the pipeline saves models and loaded back."""
    texts = [f"Question: what is {a}+{b}?\nStep 1: {a} + {b} = {a + b}.\nAnswer: {a + b}"
             for a in range(20) for b in range(15)]
    tok = train_tokenizer(texts, 320)
    # a Qwen2 (not the default Llama): at this seed and init its random answers differ between the prompts
    cfg = BaseModelConfig(architecture="qwen2", seed=0, vocab_size=320, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=512)
    folder = tmp_path_factory.mktemp("tiny_model")
    model = build_student(cfg, tok)
    with torch.no_grad():  # the default 0.02 init answers every prompt alike; wide weights make answers differ
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    save_model(model, tok, folder)
    return load_model(folder)


class Faults:
    """The server's before_request hook: counts requests per prompt, answers a prompt's first
    requests with the faults planned for it (an int status, or a float delay in seconds)."""

    def __init__(self, plan: dict[str, list[int | float]] | None = None) -> None:
        self.plan = {p: list(f) for p, f in (plan or {}).items()}
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> int | float | None:
        prompt = body["prompt"] if "prompt" in body else "".join(m["content"] for m in body["messages"])
        with self.lock:
            self.seen[prompt] += 1
            todo = self.plan.get(prompt)
            return todo.pop(0) if todo else None


@contextlib.contextmanager
def serving(tiny, **kwargs):
    model, tok = tiny
    server = make_server(model, tok, **kwargs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def expected(tiny, prompts, **kwargs) -> list[list[Generation]]:
    """What the server's generate gives, in-process, prompt by prompt."""
    model, tok = tiny
    return [generate(model, tok, [p], max_new_tokens=8, progress=False, **kwargs)[0] for p in prompts]


def texts(results):
    return [[g.text for g in gens] for gens in results]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_n_completions_per_prompt_in_order_and_greedy_matches_generate(tiny, api):
    with serving(tiny) as server:
        sampler = OpenAISampler(server.url, "local", api=api, concurrency=3)
        greedy = sampler.sample(PROMPTS, n=1, temperature=0.0, max_new_tokens=8, seed=0)
        sampled = sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=7)
    # the chat route renders the user message with the tokenizer's template (the built one's), as vLLM does
    served = PROMPTS if api == "completions" else [
        tiny[1].apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS]
    assert api == "completions" or served[0].startswith("<|user|>\n")
    want = expected(tiny, served)
    assert len({gens[0].text for gens in want}) > 1  # distinct answers, so the order is checked
    assert greedy == want  # texts and token counts (n=1: usage is exact)
    assert texts(sampled) == texts(expected(tiny, served, do_sample=True, temperature=1.0, top_p=0.9,
                                            num_return_sequences=3, seed=7))
    assert all(len(gens) == 3 and all(1 <= g.tokens <= 8 for g in gens) for gens in sampled)
    assert sampler.name == "openai:local"
    stats = sampler.stats
    assert stats["requests"] == stats["prompts_requested"] == 6 and stats["http_errors"] == 0
    assert stats["completion_tokens"] == sum(g.tokens for gens in greedy + sampled for g in gens)


def test_server_errors_and_timeouts_are_retried(tiny):
    # the first prompt gets two 500s, the second one answer slower than the client's 1 s timeout
    faults = Faults({PROMPTS[0]: [500, 500], PROMPTS[1]: [2.5]})
    with serving(tiny, before_request=faults) as server:
        sampler = OpenAISampler(server.url, "local", timeout_s=1.0, max_retries=3, concurrency=3)
        results = sampler.sample(PROMPTS, temperature=0.0, max_new_tokens=8, seed=0)
    assert results == expected(tiny, PROMPTS)
    assert faults.seen[PROMPTS[0]] >= 3 and faults.seen[PROMPTS[1]] >= 2 and faults.seen[PROMPTS[2]] >= 1
    assert sum(faults.seen.values()) > len(PROMPTS)
    assert sampler.stats["http_errors"] >= 2 and sampler.status_counts[500] == 2
    assert sampler.stats["requests"] >= sum(faults.seen.values())  # the timed-out request was sent too


def test_failed_prompts_raise_and_a_rerun_requests_only_them(tiny, tmp_path):
    prompts = PROMPTS + ["Question: what is 7+7?\n"]
    bad = [prompts[1], prompts[3]]
    cache = tmp_path / "cache" / "teacher.sqlite"
    faults = Faults({p: [503] * 10 for p in bad})  # more failures than max_retries
    with serving(tiny, before_request=faults) as server:
        sampler = OpenAISampler(server.url, "local", max_retries=1, concurrency=2, cache_path=cache)
        with pytest.raises(TeacherRequestError) as err:
            sampler.sample(prompts, temperature=0.0, max_new_tokens=8, seed=0)
        assert isinstance(err.value, InputError)
        message = str(err.value)
        assert "2 of 4 prompts failed" in message and "HTTP 503" in message and str(cache) in message
        assert faults.seen == {prompts[0]: 1, prompts[1]: 2, prompts[2]: 1, prompts[3]: 2}
        assert sampler.stats["prompts_failed"] == 2

        faults.plan.clear()  # the server heals; same URL, so the same cache keys
        faults.seen.clear()
        rerun = OpenAISampler(server.url, "local", max_retries=1, concurrency=2, cache_path=cache)
        results = rerun.sample(prompts, temperature=0.0, max_new_tokens=8, seed=0)
    assert faults.seen == {prompts[1]: 1, prompts[3]: 1}
    assert results == expected(tiny, prompts)
    assert rerun.stats["cache_hits"] == 2 and rerun.stats["prompts_requested"] == 2


def test_api_key_is_sent_and_never_written(tiny, tmp_path, monkeypatch, caplog, capfd):
    caplog.set_level(logging.DEBUG)  # the openai client and httpx log requests at DEBUG
    monkeypatch.setenv("TEACHER_KEY", SECRET)
    faults = Faults({PROMPTS[0]: [500]})  # one retry, so the retry path logs too
    with serving(tiny, api_key=SECRET, before_request=faults) as server:
        sampler = OpenAISampler(server.url, "local", api_key_env="TEACHER_KEY", max_retries=2,
                                cache_path=tmp_path / "teacher.sqlite")
        results = sampler.sample(PROMPTS, temperature=0.0, max_new_tokens=8, seed=0)
        assert results == expected(tiny, PROMPTS)
        assert sum(faults.seen.values()) == 4  # the server checked the key before counting

        monkeypatch.setenv("TEACHER_KEY", "sk-test-WRONG-456")
        wrong = OpenAISampler(server.url, "local", api_key_env="TEACHER_KEY", cache_path=tmp_path / "teacher.sqlite")
        start = time.monotonic()
        with pytest.raises(TeacherRequestError, match=r"3 of 3 prompts failed.*HTTP 401") as err:
            wrong.sample(["a new prompt\n", "another\n", "a third\n"], temperature=0.0, max_new_tokens=8, seed=0)
        assert time.monotonic() - start < 10
        assert wrong.stats["requests"] <= wrong.concurrency  # a 401 is not retried, nor sent for every prompt

        monkeypatch.delenv("TEACHER_KEY")
        with caplog.at_level(logging.WARNING):
            unset = OpenAISampler(server.url, "local", api_key_env="TEACHER_KEY")
        assert "TEACHER_KEY is not set" in caplog.text
        with pytest.raises(TeacherRequestError, match="HTTP 401"):
            unset.sample(PROMPTS[:1], temperature=0.0, max_new_tokens=8, seed=0)
    outputs = capfd.readouterr()
    for text in (caplog.text, outputs.out, outputs.err, str(err.value), repr(sampler), repr(wrong),
                 str(sampler.stats)):
        assert SECRET not in text and "sk-test-WRONG-456" not in text
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "teacher.sqlite" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


def test_missing_server_fails_fast_with_a_clear_error(tiny, tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sampler = OpenAISampler(f"http://127.0.0.1:{port}/v1", "local", max_retries=1, timeout_s=2.0,
                            cache_path=tmp_path / "teacher.sqlite")
    start = time.monotonic()
    with pytest.raises(InputError, match=r"prompts failed.*APIConnectionError.*rerun resumes from the cache"):
        sampler.sample([f"Question: {i}?\n" for i in range(30)], temperature=0.0, max_new_tokens=8, seed=0)
    assert time.monotonic() - start < 10
    # each prompt in flight tries twice (max_retries=1); the queued ones are not sent
    assert sampler.stats["requests"] <= 2 * sampler.concurrency


def test_wrong_model_name_is_a_clear_error(tiny):
    with serving(tiny) as server:
        sampler = OpenAISampler(server.url, "no-such-model", max_retries=1)
        with pytest.raises(TeacherRequestError, match=r"NotFoundError \(HTTP 404\).*no-such-model"):
            sampler.sample(PROMPTS, temperature=0.0, max_new_tokens=8, seed=0)


def test_requests_the_server_cannot_serve_get_a_400_not_a_500_or_a_hang(tiny):
    """An audit's requests: max_tokens past the model's context (it generated for minutes, holding the model lock
    against every later request), an empty prompt, a seed past torch's range, a bad or negative Content-Length
    (read(-1) waited for the client to close), logprobs (silently null), a missing model, another method."""
    import http.client
    import json

    def ask(conn, body: dict | None = None, *, method: str = "POST", path: str = "/v1/completions",
            headers: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.putrequest(method, path)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                           **(headers or {})}.items():
            conn.putheader(key, value)
        conn.endheaders(data)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")

    with serving(tiny) as server:
        host, port = server.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=30)
        ok = {"model": "local", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        assert ask(conn, ok)[0] == 200
        status, body = ask(conn, {**ok, "max_tokens": 1 << 20})
        assert status == 400 and body["error"]["message"].startswith("This model's maximum context length is 512 "
                                                                      "tokens. However, you requested")
        for bad, message in (({"prompt": ""}, "prompt must be a non-empty string"),
                             ({"seed": 1 << 64}, "seed must be between"),
                             ({"logprobs": 2}, "logprobs is not supported"),
                             ({"echo": True}, "echo is not supported"),
                             ({"model": None}, "model is required")):
            status, body = ask(conn, {**ok, **bad})
            assert (status, body["error"]["message"][:len(message)]) == (400, message), bad
        chat = {"model": "local", "messages": [{"role": "user", "content": "what is 3+4?"}], "temperature": 0}
        status, body = ask(conn, chat, path="/v1/chat/completions")
        assert status == 200 and body["usage"]["completion_tokens"] > 16  # the rest of the context, not 16
        assert ask(conn, ok, method="PUT")[0] == 405
        for length in ("abc", "-1"):
            conn = http.client.HTTPConnection(host, port, timeout=30)
            status, body = ask(conn, ok, headers={"Content-Length": length}, raw=b"")
            assert status == 400 and "Content-Length must be a whole number" in body["error"]["message"], length
        assert ask(http.client.HTTPConnection(host, port, timeout=30), ok)[0] == 200  # still serving


def test_chat_requests_are_served_in_the_prompt_format_the_model_folder_records(tiny, tmp_path):
    """Through the official client: a model trained raw (its folder's pipeline_config.json says so) answers a chat
    request as it answers the user message's text as a completion, not through a chat template it never saw, and
    refuses a system message or several turns with a 400 naming its format; a chat-trained one renders the messages
    through its template, after the system message it was trained with."""
    import json

    import openai

    from pipeline.core import paths
    from pipeline.inference.openai_server import prompt_format

    model, tok = tiny
    question = PROMPTS[0]
    templated = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                        add_generation_prompt=True)
    raw_answer, templated_answer = (generate(model, tok, [p], max_new_tokens=8, progress=False)[0][0].text
                                    for p in (question, templated))
    assert raw_answer != templated_answer  # so the test tells the two formats apart
    folders = {}
    for fmt, system in (("raw", None), ("chat", "Answer briefly.")):
        folders[fmt] = tmp_path / fmt
        folders[fmt].mkdir()
        (folders[fmt] / paths.MODEL_MANIFEST).write_text(json.dumps({"stage": "sft", "prompt": {"format": fmt,
                                                                                                 "system": system}}))
    assert prompt_format(folders["raw"]) == {"format": "raw", "system": None}
    assert prompt_format(tmp_path) is None  # an older folder: not recorded

    with serving(tiny, prompt=prompt_format(folders["raw"])) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        chat = client.chat.completions.create(model="local", messages=[{"role": "user", "content": question}],
                                              temperature=0, max_tokens=8)
        completion = client.completions.create(model="local", prompt=question, temperature=0, max_tokens=8)
        assert chat.choices[0].message.content == completion.choices[0].text == raw_answer
        for messages, named in (([{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
                                 "a system message"),
                                ([{"role": "user", "content": question}, {"role": "assistant", "content": "7"},
                                  {"role": "user", "content": question}], "3 messages")):
            with pytest.raises(openai.BadRequestError, match=rf"trained with prompt format raw.*got {named}") as err:
                client.chat.completions.create(model="local", messages=messages, temperature=0, max_tokens=8)
            assert err.value.status_code == 400

    with serving(tiny, prompt=prompt_format(folders["chat"])) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        chat = client.chat.completions.create(model="local", messages=[{"role": "user", "content": question}],
                                              temperature=0, max_tokens=8)
    with_system = tok.apply_chat_template([{"role": "system", "content": "Answer briefly."},
                                           {"role": "user", "content": question}], tokenize=False,
                                          add_generation_prompt=True)
    assert chat.choices[0].message.content == generate(model, tok, [with_system], max_new_tokens=8,
                                                       progress=False)[0][0].text
