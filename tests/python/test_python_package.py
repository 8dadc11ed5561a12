"""The `yomi` Python package (bindings/python) on the qwen35-tiny fixture, against `yomi run`.

Run by scripts/test.sh, which builds and installs the package first; YOMI_BIN names the `yomi`
binary (default: target/debug/yomi). Greedy and seeded outputs must be the CLI's token for
token, and the stats must carry the keys of `yomi run --json`.
"""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yomi

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT.parent / "shared" / "fixtures" / "qwen35-tiny"
PROMPT = "The quick brown fox"


def yomi_bin() -> str:
    b = os.environ.get("YOMI_BIN") or str(ROOT / "target" / "debug" / "yomi")
    if not Path(b).is_file():
        pytest.fail(f"yomi binary not found at {b} (build it, or set YOMI_BIN)")
    return b


def cli_run(message: str, *args: str) -> dict:
    """`yomi run --json` on the fixture: the JSON object of its last line."""
    p = subprocess.run(
        [yomi_bin(), "run", "--model", str(MODEL_DIR), "--device", "cpu", "-m", message, "--json", *args],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model():
    return yomi.Model(str(MODEL_DIR), device="cpu")


def test_greedy_raw_prompt_matches_cli(model):
    cli = cli_run(PROMPT, "--raw", "--max-tokens", "24", "--temperature", "0", "--draft", "none")
    r = model.generate(PROMPT, max_tokens=24, temperature=0, draft="none")
    assert r.prompt_tokens == cli["prompt_ids"]
    assert r.tokens == cli["output_ids"]
    assert r.text == cli["text"]
    assert r.finish_reason == cli["finish_reason"]
    assert len(r.tokens) == r.stats["generated_tokens"]


def test_chat_messages_match_cli(model):
    cli = cli_run("Hello there", "--system", "Be brief.", "--max-tokens", "16", "--temperature", "0")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = model.generate(messages, max_tokens=16, temperature=0)
    assert r.prompt_tokens == cli["prompt_ids"]
    assert r.tokens == cli["output_ids"]
    assert r.text == cli["text"]


def test_stats_keys_are_the_cli_json_keys(model):
    cli = cli_run(PROMPT, "--raw", "--max-tokens", "8")
    r = model.generate(PROMPT, max_tokens=8)
    assert isinstance(r.stats, dict)
    assert list(r.stats) == list(cli["stats"])
    for mine, theirs in zip(r.stats["passes_by_rows"], cli["stats"]["passes_by_rows"]):
        assert list(mine) == list(theirs)
    assert r.stats["prefill_tokens"] == len(r.prompt_tokens)
    assert model.device == cli["device"]


def test_seeded_sampling_is_reproducible_and_matches_cli(model):
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, top_k=40)
    a = model.generate(PROMPT, seed=1234, **kw)
    b = model.generate(PROMPT, seed=1234, **kw)
    assert a.tokens == b.tokens and a.text == b.text
    cli = cli_run(PROMPT, "--raw", "--max-tokens", "24", "--temperature", "0.9", "--top-p", "0.95",
                  "--top-k", "40", "--seed", "1234")
    assert a.tokens == cli["output_ids"]
    others = [model.generate(PROMPT, seed=s, **kw).tokens for s in (1, 2, 3)]
    assert any(t != a.tokens for t in others), "different seeds should sample differently"


def test_drafting_is_lossless(model):
    plain = model.generate(PROMPT, max_tokens=32, temperature=0, draft="none")
    drafted = model.generate(PROMPT, max_tokens=32, temperature=0, draft="suffix")
    assert drafted.tokens == plain.tokens


def test_stream_pieces_concatenate_to_the_text(model):
    whole = model.generate(PROMPT, max_tokens=24, temperature=0)
    s = model.generate(PROMPT, max_tokens=24, temperature=0, stream=True)
    assert s.stats is None and s.result is None
    pieces = list(s)
    assert len(pieces) > 1 and all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == whole.text
    assert s.result.text == whole.text and s.result.tokens == whole.tokens
    assert list(s.stats) == list(whole.stats)
    assert s.stats["generated_tokens"] == len(whole.tokens)
    assert list(s) == []


def test_stream_close_cancels(model):
    s = model.generate(PROMPT, max_tokens=400, temperature=0, stream=True)
    next(s)
    s.close()
    rest = list(s)
    assert s.result.finish_reason in ("cancelled", "stop")
    assert len(s.result.tokens) < 400
    assert len(rest) < 400


def test_stop_string(model):
    whole = model.generate(PROMPT, max_tokens=24, temperature=0, draft="none").text
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    r = model.generate(PROMPT, max_tokens=24, temperature=0, draft="none", stop=[stop])
    assert r.finish_reason == "stop"
    assert r.text == whole[:whole.index(stop)]


def test_bad_path_raises_with_the_engine_message(monkeypatch):
    missing = ROOT / "no-such-model"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        yomi.Model(str(missing))
    with pytest.raises(yomi.YomiError, match="has no config.json"):
        yomi.Model(str(ROOT / "tests"))
    # A name that is in no Hugging Face cache (the variable is read as `yomi` reads it).
    monkeypatch.setenv("HF_HUB_CACHE", str(ROOT / "no-such-cache"))
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        yomi.Model("hf:no-org/no-model")


DFLASH = ROOT / "crates" / "yomi-models" / "tests" / "data" / "dflash-tiny"


def test_dflash_drafting_matches_plain_decoding(model):
    """`draft_model=` attaches the DFlash drafter (the random tiny fixture drafter for this
    fixture): `draft="dflash"` gives plain decoding's tokens, greedy and seeded, as trees and
    chains, and matches `yomi run --draft dflash`."""
    for shape in ("tree", "chain"):
        drafted = yomi.Model(str(MODEL_DIR), device="cpu", draft_model=str(DFLASH), draft_tree=shape)
        for kw in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 7}):
            plain = model.generate(PROMPT, max_tokens=32, draft="none", **kw)
            got = drafted.generate(PROMPT, max_tokens=32, draft="dflash", **kw)
            assert got.tokens == plain.tokens, (shape, kw)
            assert got.stats["generated_tokens"] == len(got.tokens)
    cli = cli_run(PROMPT, "--raw", "--max-tokens", "32", "--temperature", "0", "--draft", "dflash",
                  "--draft-model", str(DFLASH))
    assert cli["output_ids"] == model.generate(PROMPT, max_tokens=32, temperature=0, draft="none").tokens
    # Without a drafter, "dflash" is an error, not plain decoding in disguise.
    with pytest.raises(ValueError, match="draft_model"):
        model.generate(PROMPT, draft="dflash")
    with pytest.raises(ValueError, match="draft_tree"):
        yomi.Model(str(MODEL_DIR), device="cpu", draft_model=str(DFLASH), draft_tree="bush")
    with pytest.raises(yomi.YomiError, match="DFlash"):
        yomi.Model(str(MODEL_DIR), device="cpu", draft_model=str(ROOT / "no-such-drafter"))


HYBRID = ROOT / "models" / "yomi-code-hybrid"


def hybrid_dir() -> Path:
    """models/yomi-code-hybrid with its weight shards (kept in git history: restored here)."""
    if not all((HYBRID / f"model-0000{i}-of-00003.safetensors").is_file() for i in (1, 2, 3)):
        subprocess.run(["bash", str(HYBRID / "restore_weights.sh")], check=True,
                       capture_output=True, timeout=300)
    return HYBRID


def test_mtp_drafting_matches_plain_decoding(model):
    """`mtp_steps=` attaches the model's own MTP block (yomi-code-hybrid's, trained with it):
    `draft="mtp"` gives plain decoding's tokens, greedy and seeded, and drafts (more than one
    token per pass). Without the block attached, "mtp" is an error."""
    path = str(hybrid_dir())
    prompt = "import os\n\n\ndef list_files(path):\n    \"\"\"Return the files under path.\"\"\""
    plain_model = yomi.Model(path, device="cpu")
    drafted = yomi.Model(path, device="cpu", mtp_steps=3, draft_tree="chain")
    for kw in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 7}):
        plain = plain_model.generate(prompt, max_tokens=48, draft="none", **kw)
        got = drafted.generate(prompt, max_tokens=48, draft="mtp", **kw)
        assert got.tokens == plain.tokens, kw
    assert got.stats["tokens_per_forward_pass"] > 1.0
    with pytest.raises(ValueError, match="mtp_steps"):
        plain_model.generate(prompt, draft="mtp")
    with pytest.raises(yomi.YomiError, match="MTP"):
        yomi.Model(str(MODEL_DIR), device="cpu", mtp_steps=3)


def test_bad_arguments_raise(model):
    with pytest.raises(ValueError, match="temperature"):
        model.generate(PROMPT, temperature=-1)
    with pytest.raises(ValueError, match="draft mode"):
        model.generate(PROMPT, draft="bogus")
    with pytest.raises(ValueError, match="stop strings"):
        model.generate(PROMPT, stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValueError, match='has no "content"'):
        model.generate([{"role": "user"}])
    with pytest.raises(TypeError, match="list of messages"):
        model.generate(42)
    with pytest.raises(TypeError, match="message 0"):
        model.generate(["hello"])
    with pytest.raises(ValueError, match="empty"):
        model.generate([])
    with pytest.raises(ValueError, match="device"):
        yomi.Model(str(MODEL_DIR), device="tpu")


def test_device_cuda_without_gpu_is_a_clear_error_and_auto_falls_back():
    try:
        gpu = yomi.Model(str(MODEL_DIR), device="cuda")
    except yomi.YomiError as e:
        assert "no CUDA driver" in str(e)
        assert yomi.Model(str(MODEL_DIR)).device.startswith("cpu")
    else:
        assert not gpu.device.startswith("cpu")


def count_while(fn):
    """Runs fn() while a Python thread counts; returns (fn's value, the count)."""
    count = 0
    done = threading.Event()

    def counter():
        nonlocal count
        while not done.is_set():
            count += 1

    t = threading.Thread(target=counter)
    t.start()
    try:
        value = fn()
    finally:
        done.set()
        t.join()
    return value, count


def test_gil_is_released_while_generating(model):
    # The counter runs only while generate has let go of the GIL: with it held, the counter
    # would get no turn for the whole generation.
    start = time.perf_counter()
    r, count = count_while(lambda: model.generate(PROMPT, max_tokens=200, temperature=0, draft="none"))
    seconds = time.perf_counter() - start
    assert len(r.tokens) > 0
    # A Python loop counts millions a second; a held GIL would leave a few thousand at most
    # (one switch interval, 5 ms, before generate took it).
    assert count > 20_000, f"{count} increments in {seconds:.2f} s"

    def stream():
        return "".join(model.generate(PROMPT, max_tokens=200, temperature=0, draft="none", stream=True))

    text, count = count_while(stream)
    assert text == r.text
    assert count > 20_000, count
