"""Tool calling through the official `openai` client against `yomi serve`.

The fixture model (qwen35-tiny, random weights) never writes a tool call by itself, so these
tests cover the request side end to end (tools accepted, rendered by the model's own template,
`tool_choice` variants, tool calls and results in the history, errors) and the response
shapes; turning model text into `tool_calls` (each format, streaming chunks) is tested
deterministically in Rust (crates/yomi-server/src/tools.rs and chat_tools.rs).

The model is served twice: as shipped (a template that ignores tools) and with a Qwen3.5-shaped
template that renders them (tests/python/fixtures/qwen35_tools.jinja, put beside links to the
fixture's files as `chat_template.jinja`, which takes precedence over tokenizer_config.json).
"""

import json
import os
import shutil
import socket
import subprocess
import time
import http.client
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "qwen35-tiny"
TOOLS_TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "qwen35_tools.jinja"
NAME = "tiny"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


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
    def __init__(self, model_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [yomi_bin(), "serve", "--model", str(model_dir), "--port", str(self.port),
             "--served-model-name", NAME],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"yomi serve exited: {self.proc.stderr.read()}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    c.close()
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        pytest.fail("yomi serve did not become healthy")

    def post_raw(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    model = tmp_path_factory.mktemp("qwen35-tiny-tools")
    for f in FIXTURE.iterdir():
        (model / f.name).symlink_to(f)
    shutil.copy(TOOLS_TEMPLATE, model / "chat_template.jinja")
    s = Server(model)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(tools_server):
    return tools_server.client()


def create(client, messages=QUESTION, max_tokens=4, **kw):
    return client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=max_tokens, temperature=0, seed=1, **kw)


def check_message(r):
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.message.tool_calls:
        assert c.finish_reason in ("tool_calls", "length")
        for call in c.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            assert call.function.name in ("get_weather", "get_time")
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(c.message.content, str)


def test_the_template_renders_the_tools(client):
    plain = create(client)
    auto = create(client, tools=[WEATHER])
    two = create(client, tools=[WEATHER, TIME], tool_choice="auto", parallel_tool_calls=False)
    for r in (plain, auto, two):
        check_message(r)
    # The tools' descriptions are in the prompt, the second tool's too.
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    assert two.usage.prompt_tokens > auto.usage.prompt_tokens
    # `none`: the tools are not shown; `required` and a named function: shown as for `auto`
    # (what forces the call is the grammar the output is decoded under, see
    # test_structured_output.py).
    none = create(client, tools=[WEATHER], tool_choice="none")
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason in ("stop", "length")
    required = create(client, tools=[WEATHER], tool_choice="required")
    named = create(client, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for r in (required, named):
        check_message(r)
        assert r.usage.prompt_tokens == auto.usage.prompt_tokens


def test_tool_calls_and_results_round_trip(client):
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]
    without = create(client, tools=[WEATHER, TIME])
    r = create(client, messages=history, tools=[WEATHER, TIME])
    check_message(r)
    assert r.usage.prompt_tokens > without.usage.prompt_tokens
    # The arguments reach the template as a mapping: more arguments, a longer prompt.
    history2 = json.loads(json.dumps(history))
    history2[1]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        {"city": "Paris", "days": 2, "unit": "celsius", "detail": "hourly"})
    r2 = create(client, messages=history2, tools=[WEATHER, TIME])
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
    # Calls in the history need no tools offered (and nothing is parsed then).
    r3 = create(client, messages=history)
    check_message(r3)
    assert r3.choices[0].message.tool_calls is None


def test_streaming_with_tools(client):
    full = create(client, tools=[WEATHER], max_tokens=24)
    stream = create(client, tools=[WEATHER], max_tokens=24, stream=True,
                    stream_options={"include_usage": True})
    content, calls, finish, roles = [], {}, None, []
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            content.append(d.content)
        for t in d.tool_calls or []:
            if t.id:
                calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
            calls[t.index]["arguments"] += t.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert roles == ["assistant"]
    assert finish == full.choices[0].finish_reason
    assert "".join(content) == (full.choices[0].message.content or "")
    want = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in full.choices[0].message.tool_calls or []]
    assert [calls[i] for i in sorted(calls)] == want
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_a_template_without_tools_still_accepts_them():
    s = Server(FIXTURE)
    try:
        c = s.client()
        plain = create(c)
        with_tools = create(c, tools=[WEATHER], tool_choice="required")
        check_message(with_tools)
        assert with_tools.usage.prompt_tokens == plain.usage.prompt_tokens
    finally:
        s.stop()


def test_bad_tool_requests_are_400(client, tools_server):
    bad = [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ]
    for extra, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=2, **extra)
        assert e.value.status_code == 400, extra
        assert e.value.param == param, (extra, e.value.body)
    for messages, param in [
        ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}],
         "messages[0].tool_calls[0].function.name"),
        ([{"role": "assistant", "tool_calls": "call it"}], "messages[0].tool_calls"),
        ([{"role": "tool", "tool_call_id": 5, "content": "x"}], "messages[0].tool_call_id"),
    ]:
        status, err = tools_server.post_raw("/v1/chat/completions", {"model": NAME, "messages": messages})
        assert status == 400 and err["error"]["param"] == param, err
        assert err["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=2, extra_body={"tools": [WEATHER]})
    assert e.value.param == "tools"
    # The server keeps serving.
    check_message(create(client, tools=[WEATHER]))
