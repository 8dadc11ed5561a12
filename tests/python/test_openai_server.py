"""The official `openai` Python client against a running `yomi serve` (the qwen35-tiny fixture).

Run by scripts/test.sh after `cargo test`; YOMI_BIN names the `yomi` binary (default:
target/debug/yomi). Each server is started on a free loopback port, awaited on /health and
stopped at the end.
"""

import http.client
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT.parent / "shared" / "fixtures" / "qwen35-tiny"
NAME = "tiny"


def yomi_bin() -> str:
    b = os.environ.get("YOMI_BIN") or str(ROOT / "target" / "debug" / "yomi")
    if not Path(b).is_file():
        pytest.fail(f"yomi binary not found at {b} (build it, or set YOMI_BIN)")
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(
            [yomi_bin(), "serve", "--model", str(MODEL_DIR), "--port", str(self.port),
             "--served-model-name", NAME, *extra],
            stdout=self.log, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"yomi serve exited: {self.proc.stderr.read()}")
            try:
                status, _ = self.get("/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        pytest.fail("yomi serve did not become healthy")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def post_raw(self, path, body: bytes, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def client(self, api_key="none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def chat(client, content, max_tokens=16, **kw):
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens, temperature=0, **kw)


def test_models_and_health(server, client):
    ids = [m.id for m in client.models.list()]
    assert ids == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    status, body = server.get("/health")
    assert status == 200 and body["status"] == "ok"


def test_chat_non_streaming_has_usage(client):
    r = chat(client, "def add(a, b):", max_tokens=12)
    assert r.object == "chat.completion"
    assert r.model == NAME
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0
    # yomi's extras: prefilled tokens and verify passes (the suffix drafter is on by default).
    extra = u.model_extra
    assert extra["prefill_tokens"] == u.prompt_tokens - u.prompt_tokens_details.cached_tokens
    assert extra["spec_verify_ct"] >= 1


def test_max_completion_tokens_and_length(client):
    r = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "x = 1"}],
        max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3


def test_chat_streaming_matches_non_streaming(client):
    full = chat(client, "class Foo:", max_tokens=20)
    stream = chat(client, "class Foo:", max_tokens=20, stream=True)
    parts, finish, roles = [], None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        assert chunk.usage is None
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            parts.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert roles == ["assistant"]
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason


def test_stream_options_include_usage(client):
    stream = chat(client, "import os", max_tokens=8, stream=True,
                  stream_options={"include_usage": True})
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert any(c.choices and c.choices[0].finish_reason for c in chunks[:-1])


def test_text_completions(client):
    r = client.completions.create(model=NAME, prompt="import numpy as np\n", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert isinstance(r.choices[0].text, str)
    assert r.usage.completion_tokens <= 8
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(
            model=NAME, prompt="import numpy as np\n", max_tokens=8, temperature=0, stream=True)
        if c.choices)
    assert streamed == r.choices[0].text


def test_sampling_parameters(client):
    kw = dict(model=NAME, messages=[{"role": "user", "content": "for i in range(10):"}],
              max_tokens=16, temperature=0.9, top_p=0.95, seed=1234,
              extra_body={"top_k": 50, "min_p": 0.01})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    # A stop string cuts the text before it.
    text = chat(client, "while True:", max_tokens=24).choices[0].message.content
    if len(text) > 6:
        stop = text[3:6]
        cut = chat(client, "while True:", max_tokens=24, stop=[stop])
        assert cut.choices[0].message.content == text[: text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_chat_template_kwargs_and_reasoning_content(client):
    on = chat(client, "hi", max_tokens=2)
    off = chat(client, "hi", max_tokens=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # This template adds an empty think block when thinking is off.
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    r = client.chat.completions.create(
        model=NAME, max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b", "reasoning_content": "since a"},
                  {"role": "user", "content": "c"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_bad_requests_raise_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    assert e.value.status_code == 400
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-nonexistent", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "def f(x): return x\n" * 2000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt=["a", "b"])
    # The server keeps serving.
    assert chat(client, "ok", max_tokens=2).choices


def test_malformed_bodies_answer_400(server):
    for body in [b"{not json", b"", b"[1,2,3]", b'{"messages": "hi"}', b'{"messages": [{"content": "x"}]}']:
        status, err = server.post_raw("/v1/chat/completions", body)
        assert status == 400, body
        assert err["error"]["type"] == "invalid_request_error"
        assert err["error"]["message"]
    status, err = server.post_raw("/v1/completions", b"{\"prompt\": 5}")
    assert status == 400 and err["error"]["param"] == "prompt"
    status, err = server.post_raw("/v1/chat/completions", b"{" + b" " * (9 << 20) + b"}")
    assert status == 413


def test_api_key():
    s = Server("--api-key", "sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            chat(s.client(api_key="wrong"), "hi", max_tokens=2)
        assert chat(s.client(api_key="sekret"), "hi", max_tokens=2).choices
        assert s.get("/health")[0] == 200
    finally:
        s.stop()


def long_prefix_messages(question):
    system = "You review Python code and answer in one line. " * 40
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def test_prefix_cache_skips_the_shared_prefix_and_changes_nothing():
    questions = ["def a(): pass", "def b(): return [i * i for i in range(10)]"]
    results = {}
    for mode in ["cache", "no-cache"]:
        s = Server(*(["--no-prefix-cache"] if mode == "no-cache" else []))
        try:
            c = s.client()
            results[mode] = [
                c.chat.completions.create(model=NAME, messages=long_prefix_messages(q), max_tokens=16, temperature=0)
                for q in questions
            ]
        finally:
            s.stop()
    first, second = results["cache"]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    prefilled = second.usage.model_extra["prefill_tokens"]
    assert second.usage.prompt_tokens > 400
    assert cached >= 256 and prefilled < second.usage.prompt_tokens / 2, second.usage
    for r in results["no-cache"]:
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert r.usage.model_extra["prefill_tokens"] == r.usage.prompt_tokens
    # Same output with and without the cache.
    for a, b in zip(results["cache"], results["no-cache"]):
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.usage.completion_tokens == b.usage.completion_tokens


def test_full_queue_503_and_disconnect_frees_the_engine():
    # Slow tokens (30 ms each) and no waiting room: one request at a time.
    s = Server("--queue-size", "0", "--debug-token-delay-ms", "30", "--draft", "none")
    try:
        c = s.client()
        t0 = time.time()
        stream = c.completions.create(model=NAME, prompt="import numpy as np\n", max_tokens=400,
                                      temperature=0, stream=True)
        it = iter(stream)
        next(it)
        next(it)
        # The engine is busy and nothing may wait: 503, as the client's typed error.
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model=NAME, prompt="x", max_tokens=2)
        assert e.value.status_code == 503
        assert e.value.code == "queue_full"
        # Disconnect mid-stream: the generation stops and the engine takes the next request.
        stream.close()
        deadline = time.time() + 10
        while s.get("/health")[1]["requests"]["cancelled"] < 1:
            assert time.time() < deadline, "the generation was not cancelled"
            time.sleep(0.02)
        r = c.completions.create(model=NAME, prompt="x", max_tokens=2)
        assert r.choices[0].text is not None
        assert time.time() - t0 < 8, "400 tokens × 30 ms would take 12 s"
        health = s.get("/health")[1]
        assert health["requests"]["rejected"] == 1
        assert health["requests"]["generated_tokens"] < 200
    finally:
        s.stop()
