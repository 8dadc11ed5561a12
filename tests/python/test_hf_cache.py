"""`--model hf:ORG/NAME` against a Hugging Face cache laid out by `huggingface_hub` itself.

The cache is written with `huggingface_hub`'s own functions, as `hf_hub_download` writes it,
without network: `repo_folder_name` names the repository's folder, each file goes into
`blobs/<sha256>` and `_create_symlink` links it from `snapshots/<commit>/` (the function the
download uses), and `_cache_commit_hash_for_specific_revision` writes `refs/main`. Then
`huggingface_hub`'s own readers (`try_to_load_from_cache`, `scan_cache_dir`) must find the files
before `yomi` is run on them.

Run by scripts/test.sh; YOMI_BIN names the `yomi` binary (default: target/debug/yomi).
"""

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache
from huggingface_hub.file_download import (
    _cache_commit_hash_for_specific_revision,
    _create_symlink,
    _get_pointer_path,
    repo_folder_name,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT.parent / "shared" / "fixtures" / "qwen35-tiny"
GGUF = ROOT / "tests" / "data" / "qwen35-tiny-gguf" / "qwen35-tiny-f32.gguf"
GGUF_Q8 = ROOT / "tests" / "data" / "qwen35-tiny-gguf" / "qwen35-tiny-q8_0.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
START_DIR = Path.cwd()  # a relative YOMI_BIN is relative to it (a test changes directory)


def yomi_bin() -> str:
    b = os.environ.get("YOMI_BIN") or str(ROOT / "target" / "debug" / "yomi")
    path = START_DIR / b
    if not path.is_file():
        pytest.fail(f"yomi binary not found at {b} (build it, or set YOMI_BIN)")
    return str(path)


def add_to_cache(cache: Path, repo_id: str, files: dict, commit: str = COMMIT) -> Path:
    """Puts `files` ({path in the repo: local file}) into the cache as commit `commit` of
    `repo_id`'s main branch, the way `hf_hub_download` stores a download."""
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    for rel, src in files.items():
        data = Path(src).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        pointer = Path(_get_pointer_path(str(storage), commit, rel))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=False)
    _cache_commit_hash_for_specific_revision(str(storage), "main", commit)
    return storage / "snapshots" / commit


def yomi(cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HUB_CACHE"] = str(cache)
    return subprocess.run([yomi_bin(), *args], env=env, capture_output=True, text=True, timeout=120)


def run(cache: Path, model: str) -> subprocess.CompletedProcess:
    return yomi(cache, "run", "--model", model, "-m", "hi", "--max-tokens", "2", "--device", "cpu")


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert "panicked" not in p.stderr
    return lines[0]


@pytest.fixture
def cache(tmp_path) -> Path:
    c = tmp_path / "hub"
    c.mkdir()
    hf_files = {p.name: p for p in MODEL_DIR.iterdir() if p.is_file() and not p.name.startswith("reference")}
    add_to_cache(c, "yomi-test/qwen35-tiny", hf_files)
    add_to_cache(c, "yomi-test/qwen35-tiny-GGUF", {"README.md": MODEL_DIR / "config.json", GGUF.name: GGUF})
    add_to_cache(c, "yomi-test/two-GGUF", {GGUF.name: GGUF, "q8/" + GGUF_Q8.name: GGUF_Q8})
    return c


def test_cache_is_what_huggingface_hub_reads(cache):
    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    assert {r.repo_id for r in info.repos} == {
        "yomi-test/qwen35-tiny", "yomi-test/qwen35-tiny-GGUF", "yomi-test/two-GGUF"}
    for r in info.repos:
        assert [rev.commit_hash for rev in r.revisions] == [COMMIT]
        assert {ref for rev in r.revisions for ref in rev.refs} == {"main"}
    p = try_to_load_from_cache("yomi-test/qwen35-tiny", "config.json", cache_dir=cache)
    assert isinstance(p, str) and Path(p).is_symlink()


def test_hf_model_directory(cache):
    p = run(cache, "hf:yomi-test/qwen35-tiny")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()
    # Without `hf:` too, when no such path exists.
    p = run(cache, "yomi-test/qwen35-tiny")
    assert p.returncode == 0, p.stderr


def test_gguf_repository(cache):
    p = run(cache, "hf:yomi-test/qwen35-tiny-GGUF")
    assert p.returncode == 0, p.stderr
    p = run(cache, f"yomi-test/two-GGUF:q8/{GGUF_Q8.name}")
    assert p.returncode == 0, p.stderr
    p = run(cache, f"hf:yomi-test/two-GGUF@main:{GGUF.name}")
    assert p.returncode == 0, p.stderr


def test_several_ggufs_need_a_file(cache):
    line = one_error_line(run(cache, "hf:yomi-test/two-GGUF"))
    assert "2 .gguf files" in line and f"q8/{GGUF_Q8.name}" in line and GGUF.name in line, line
    line = one_error_line(run(cache, "hf:yomi-test/two-GGUF:nope.gguf"))
    assert "has no nope.gguf" in line, line


def test_missing_repository(cache):
    line = one_error_line(run(cache, "hf:yomi-test/absent"))
    assert line == (f"error: yomi-test/absent is not in the Hugging Face cache at {cache} "
                    "(download it with `yomi pull yomi-test/absent`)"), line
    line = one_error_line(run(cache, "yomi-test/absent"))
    assert "no such file or directory" in line and "yomi pull yomi-test/absent" in line, line


def test_local_path_wins(cache, tmp_path, monkeypatch):
    # A folder named like the repository, holding the model, is used as it is.
    local = tmp_path / "yomi-test" / "absent"
    local.mkdir(parents=True)
    for p in MODEL_DIR.iterdir():
        if p.is_file() and not p.name.startswith("reference"):
            (local / p.name).symlink_to(p)
    monkeypatch.chdir(tmp_path)
    p = run(cache, "yomi-test/absent")
    assert p.returncode == 0, p.stderr


def test_pull_without_network(cache):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(cache), HF_ENDPOINT="http://127.0.0.1:9")
    p = subprocess.run([yomi_bin(), "pull", "yomi-test/anything"], env=env,
                       capture_output=True, text=True, timeout=60)
    line = one_error_line(p)
    assert "cannot reach the Hugging Face hub at http://127.0.0.1:9" in line, line
