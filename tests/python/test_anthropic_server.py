"""The official `anthropic` Python client against `yomi serve`'s `/v1/messages` (qwen35-tiny).

Run by scripts/test.sh after `cargo test`; YOMI_BIN names the `yomi` binary. The fixture has
random weights, so its text is gibberish: the tests check shapes, and that a greedy request
gives the same text and token counts as the same request through the OpenAI chat route.
Sampling parameters go in `extra_body`: recent versions of the client no longer take
`temperature`, `top_p` or `top_k` as arguments, and the server still reads them.
"""

import http.client
import json
import time

import anthropic
import openai
import pytest

from test_openai_server import NAME, Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def make_client(server, **kw) -> anthropic.Anthropic:
    kw.setdefault("api_key", "none")
    return anthropic.Anthropic(base_url=server.url, max_retries=0, timeout=60, **kw)


@pytest.fixture(scope="module")
def client(server):
    return make_client(server)


@pytest.fixture(scope="module")
def oai(server):
    return server.client()


GREEDY = {"temperature": 0}


def create(client, content, max_tokens=16, **kw):
    return client.messages.create(
        model=NAME, max_tokens=max_tokens, extra_body=GREEDY,
        messages=[{"role": "user", "content": content}], **kw)


def openai_chat(oai, messages, max_tokens=16, **kw):
    # Anthropic's route renders the template with thinking off unless asked for.
    return oai.chat.completions.create(
        model=NAME, messages=messages, max_tokens=max_tokens, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def thinking_of(message):
    return "".join(b.thinking for b in message.content if b.type == "thinking")


FINISH = {"length": "max_tokens", "stop": "end_turn"}


def assert_same_as_openai(m, r):
    assert text_of(m) == (r.choices[0].message.content or "")
    assert thinking_of(m) == (getattr(r.choices[0].message, "reasoning_content", None) or "")
    assert m.stop_reason == FINISH[r.choices[0].finish_reason]
    assert m.usage.output_tokens == r.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == r.usage.prompt_tokens


def test_non_streaming_matches_the_openai_route(client, oai):
    m = create(client, "def add(a, b):", max_tokens=12)
    assert m.type == "message" and m.role == "assistant"
    assert m.model == NAME
    assert m.id.startswith("msg_")
    assert m.content and all(b.type in ("text", "thinking") for b in m.content)
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 12
    assert m.usage.input_tokens > 0 and m.usage.cache_read_input_tokens >= 0
    r = openai_chat(oai, [{"role": "user", "content": "def add(a, b):"}], max_tokens=12)
    assert_same_as_openai(m, r)


def test_streaming_matches_non_streaming(client):
    full = create(client, "class Foo:", max_tokens=20)
    with client.messages.stream(
        model=NAME, max_tokens=20, extra_body=GREEDY,
        messages=[{"role": "user", "content": "class Foo:"}],
    ) as stream:
        events = [e.type for e in stream]
        text = "".join(stream.text_stream)  # already consumed: nothing more
        final = stream.get_final_message()
    assert text == ""
    # Anthropic's event order (the SDK adds its own `text` events beside the deltas).
    raw = [e for e in events if e not in ("text", "thinking", "signature", "citation", "input_json")]
    assert raw[0] == "message_start" and raw[-1] == "message_stop"
    assert raw[-2] == "message_delta"
    opened = [e for e in raw if e == "content_block_start"]
    assert len(opened) == len([e for e in raw if e == "content_block_stop"]) >= 1
    assert final.id.startswith("msg_") and final.model == NAME
    assert text_of(final) == text_of(full)
    assert thinking_of(final) == thinking_of(full)
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens
    # The prefix cache may serve the second run's prompt: the sum is the prompt either way.
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == full.usage.input_tokens + full.usage.cache_read_input_tokens)


def test_text_stream_collects_the_text(client):
    full = create(client, "import os", max_tokens=10)
    with client.messages.stream(
        model=NAME, max_tokens=10, extra_body=GREEDY, messages=[{"role": "user", "content": "import os"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(full) == text_of(final)
    assert final.usage.output_tokens == full.usage.output_tokens


def test_stop_sequences(client):
    text = text_of(create(client, "while True:", max_tokens=24))
    if len(text) <= 6:
        pytest.skip("the fixture ended its answer too early to cut it")
    stop = text[3:6]
    m = create(client, "while True:", max_tokens=24, stop_sequences=["\x00never", stop])
    assert text_of(m) == text[: text.index(stop)]
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == stop
    with client.messages.stream(
        model=NAME, max_tokens=24, extra_body=GREEDY, stop_sequences=[stop],
        messages=[{"role": "user", "content": "while True:"}],
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(m)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_system_prompt(client, oai):
    plain = create(client, "hi", max_tokens=8)
    as_str = create(client, "hi", max_tokens=8, system="You answer in one line.")
    as_blocks = create(client, "hi", max_tokens=8,
                       system=[{"type": "text", "text": "You answer "}, {"type": "text", "text": "in one line."}])
    total = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # noqa: E731
    assert total(as_str) > total(plain)
    assert text_of(as_str) == text_of(as_blocks)
    r = openai_chat(oai, [{"role": "system", "content": "You answer in one line."},
                          {"role": "user", "content": "hi"}], max_tokens=8)
    assert_same_as_openai(as_str, r)


def test_history_and_content_blocks(client, oai):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
        {"role": "user", "content": "d"},
    ]
    m = client.messages.create(model=NAME, max_tokens=6, extra_body=GREEDY, messages=history,
                               metadata={"user_id": "someone"})
    r = openai_chat(oai, [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                          {"role": "user", "content": "d"}], max_tokens=6)
    assert_same_as_openai(m, r)


def test_thinking_on_renders_the_thinking_prompt(client):
    off = create(client, "hi", max_tokens=2)
    on = create(client, "hi", max_tokens=2, thinking={"type": "enabled", "budget_tokens": 1024})
    total = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # noqa: E731
    # This template adds an empty think block to the prompt when thinking is off.
    assert total(off) > total(on)


def test_bad_requests_raise_typed_errors(client):
    cases = [
        dict(extra_body={"temperature": -1}),
        dict(max_tokens=0),
        dict(messages=[]),
        dict(messages=[{"role": "system", "content": "x"}]),
        dict(messages=[{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
        dict(stop_sequences=["a", "b", "c", "d", "e"]),
        dict(extra_body={"top_k": -1}),
    ]
    for extra in cases:
        kw = dict(model=NAME, max_tokens=4, messages=[{"role": "user", "content": "x"}])
        kw.update(extra)
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**kw)
        assert e.value.status_code == 400, extra
        assert e.value.type == "invalid_request_error", extra
        assert e.value.body["type"] == "error", extra
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-nonexistent", max_tokens=4,
                               messages=[{"role": "user", "content": "x"}])
    assert e.value.type == "not_found_error"
    assert "claude-nonexistent" in e.value.body["error"]["message"]
    # A prompt longer than the context.
    with pytest.raises(anthropic.BadRequestError) as e:
        create(client, "def f(x): return x\n" * 2000)
    assert "context" in e.value.body["error"]["message"]
    # A streamed request fails before its stream starts, with the same typed error.
    with pytest.raises(anthropic.BadRequestError):
        with client.messages.stream(model=NAME, max_tokens=0, messages=[{"role": "user", "content": "x"}]) as s:
            list(s)
    # The server keeps serving.
    assert create(client, "ok", max_tokens=2).content


def post_raw(server, path, body: bytes, headers=None, method="POST"):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        c.request(method, path, body=body,
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def assert_anthropic_error(got, status, kind):
    code, body = got
    assert code == status, body
    assert body["type"] == "error", body
    assert body["error"]["type"] == kind, body
    assert body["error"]["message"], body


def test_malformed_bodies_answer_in_anthropic_shape(server):
    for body in [b"{not json", b"", b"[1,2,3]", b'{"model": "tiny", "messages": "hi", "max_tokens": 1}',
                 b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}',
                 b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text"}]}]}']:
        assert_anthropic_error(post_raw(server, "/v1/messages", body), 400, "invalid_request_error")
    status, err = post_raw(server, "/v1/messages",
                           b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}')
    assert err["error"]["message"].startswith("max_tokens")
    # The layers in front of the route answer in the same shape.
    assert_anthropic_error(post_raw(server, "/v1/messages", b"{" + b" " * (9 << 20) + b"}"),
                           413, "request_too_large")
    assert_anthropic_error(post_raw(server, "/v1/messages", b"{}", {"Content-Type": "text/plain"}),
                           415, "invalid_request_error")
    assert_anthropic_error(post_raw(server, "/v1/messages", b"", method="GET"), 405, "invalid_request_error")
    # Other routes keep OpenAI's shape.
    status, err = post_raw(server, "/v1/chat/completions", b"{not json")
    assert status == 400 and "type" not in err and err["error"]["type"] == "invalid_request_error"


def test_api_key_as_x_api_key_or_bearer():
    s = Server("--api-key", "sekret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            create(make_client(s, api_key="wrong"), "hi", max_tokens=2)
        assert e.value.type == "authentication_error"
        assert create(make_client(s, api_key="sekret"), "hi", max_tokens=2).content
        assert create(make_client(s, api_key=None, auth_token="sekret"), "hi", max_tokens=2).content
        body = b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}'
        assert_anthropic_error(post_raw(s, "/v1/messages", body), 401, "authentication_error")
        # The OpenAI routes take the key as `x-api-key` too.
        assert post_raw(s, "/v1/models", b"", {"x-api-key": "sekret"}, method="GET")[0] == 200
        assert s.get("/health")[0] == 200
    finally:
        s.stop()


def test_full_queue_is_overloaded_529():
    # Slow tokens and no waiting room: one request at a time.
    s = Server("--queue-size", "0", "--debug-token-delay-ms", "30", "--draft", "none")
    try:
        c = make_client(s)
        with c.messages.stream(model=NAME, max_tokens=400, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "import numpy as np"}]) as stream:
            it = iter(stream)
            next(it)
            next(it)
            with pytest.raises(anthropic.OverloadedError) as e:
                create(c, "x", max_tokens=2)
            assert e.value.status_code == 529
            assert e.value.type == "overloaded_error"
        # Leaving the stream disconnects: the engine is free again.
        deadline = time.time() + 10
        while s.get("/health")[1]["requests"]["cancelled"] < 1:
            assert time.time() < deadline, "the generation was not cancelled"
            time.sleep(0.02)
        assert create(c, "x", max_tokens=2).content
    finally:
        s.stop()


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_history(result):
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": result}]}]},
    ]


def test_tool_use_round_trip(client):
    total = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # noqa: E731
    m = client.messages.create(model=NAME, max_tokens=8, extra_body=GREEDY, tools=[WEATHER],
                               messages=tool_history("sunny, 21 C"))
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for b in m.content:
        assert b.type in ("text", "thinking", "tool_use")
        if b.type == "tool_use":
            assert b.name == "get_weather" and isinstance(b.input, dict) and b.id.startswith("toolu_")
    # The result reached the prompt: a longer result makes a longer prompt.
    longer = client.messages.create(model=NAME, max_tokens=8, extra_body=GREEDY, tools=[WEATHER],
                                    messages=tool_history("sunny, 21 C, a light wind from the west all day"))
    assert total(longer) > total(m)
    # Streamed, the same message.
    with client.messages.stream(model=NAME, max_tokens=8, extra_body=GREEDY, tools=[WEATHER],
                                messages=tool_history("sunny, 21 C")) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in m.content]
    assert text_of(final) == text_of(m)
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens
    # Every tool_choice is taken.
    for choice in [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"},
                   {"type": "none"}, {"type": "auto", "disable_parallel_tool_use": True}]:
        r = client.messages.create(model=NAME, max_tokens=2, extra_body=GREEDY, tools=[WEATHER],
                                   tool_choice=choice, messages=[{"role": "user", "content": "hi"}])
        assert r.content, choice
    # Requests that cannot be served are typed errors.
    bad = [
        dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}),
        dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        dict(tools=[{"name": "no schema"}]),
        dict(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "f"}]}]),
    ]
    for extra in bad:
        kw = dict(model=NAME, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        kw.update(extra)
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**kw)
        assert e.value.type == "invalid_request_error", extra


def test_any_and_named_tool_choice_force_a_tool_use(client):
    """`any` and `tool` make the answer a call (constrained decoding): a `tool_use` block whose
    input matches the tool's `input_schema`, streamed or not (the fixture's template shows no
    tools, so the calls are Hermes JSON in tags, yomi's default format)."""
    import jsonschema

    bounded = {"type": "object", "additionalProperties": False, "required": ["city"],
               "properties": {"city": {"type": "string", "maxLength": 10},
                              "unit": {"enum": ["c", "f"]}}}
    weather = {**WEATHER, "input_schema": bounded}
    clock = {"name": "get_time", "input_schema": {"type": "object", "additionalProperties": False,
                                                  "properties": {}}}
    for choice, names in [({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "get_time"}),
                          ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                           {"get_weather"})]:
        kw = dict(model=NAME, max_tokens=200, extra_body=GREEDY, tools=[weather, clock], tool_choice=choice,
                  messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        m = client.messages.create(**kw)
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert [b.type for b in m.content] == ["tool_use"], m.content
        assert uses[0].name in names
        schema = bounded if uses[0].name == "get_weather" else clock["input_schema"]
        jsonschema.validate(uses[0].input, schema)
        with client.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in uses]
        assert final.stop_reason == "tool_use"
