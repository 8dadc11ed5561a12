"""Build the prompt set for the SmolLM2 DFlash drafter from material available offline.

Sources (all on this machine or from Debian's archive; nothing from the network at build time):
  wordnet   Debian package `wordnet-base` (Princeton WordNet 3.0): /usr/share/wordnet/data.{noun,
            verb,adj,adv} — lemmas, glosses, hypernyms; /usr/share/wordnet/cntlist.rev for how
            common a sense is (SemCor tag counts), so prompts favour everyday words.
  fortune   Debian packages `fortunes`, `fortunes-min`: /usr/share/games/fortunes/* (quotations,
            jokes, riddles; the art/ascii-art files are left out).
  man       The NAME lines ("cmd - what it does") of the section-1 man pages of a fixed list of
            Debian packages (coreutils, grep, git, ...), read with `man -f`.
  pydoc     Python's standard library (this interpreter: CPython 3.11): module names and the first
            sentence of the docstrings of public functions/classes of a fixed module list.
  synth     Arithmetic, algebra, unit and date questions generated here from a seeded RNG.
The words, commands, functions and quotes fill hand-written templates (TEMPLATES below) of six
kinds: question, explain, instruct (writing tasks), code, math, chat (casual messages).

Splits: every candidate has a group key (its source item: the lemma, the command, the function,
the quotation, the number pair). Groups go to eval / tune / train by a hash of the key, so no
word, command, function or quotation is shared between splits; then fixed-seed sampling picks
~20k train, 200 tune and 200 eval prompts with a fixed kind mix. The eval split is fixed here
and is never used for tuning.

    python3 tools/train/prompts.py [--out tools/train/data]      (needs: apt-get install -y
                                                                  wordnet-base fortunes fortunes-min)
Writes {train,tune,eval}.jsonl.gz: one {"id", "kind", "source", "prompt"} object per line, and
prints each file's sha256 (the same machine image gives the same files).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib
import inspect
import json
import os
import random
import re
import subprocess
import sys
import warnings

WORDNET = "/usr/share/wordnet"
FORTUNES = "/usr/share/games/fortunes"
MAN_PACKAGES = [
    "coreutils", "findutils", "grep", "sed", "tar", "gzip", "bzip2", "xz-utils", "util-linux",
    "procps", "bash", "git", "openssh-client", "curl", "wget", "make", "binutils", "less",
    "diffutils", "man-db", "zip", "unzip", "rsync", "file", "gawk", "patch", "psmisc",
]
PY_MODULES = [
    "os", "os.path", "sys", "re", "json", "math", "cmath", "statistics", "random", "string",
    "textwrap", "difflib", "datetime", "calendar", "time", "collections", "heapq", "bisect",
    "itertools", "functools", "operator", "pathlib", "shutil", "glob", "fnmatch", "tempfile",
    "csv", "configparser", "hashlib", "hmac", "secrets", "base64", "binascii", "struct",
    "zlib", "gzip", "bz2", "lzma", "zipfile", "tarfile", "sqlite3", "pickle", "copy",
    "pprint", "enum", "dataclasses", "typing", "abc", "contextlib", "logging", "argparse",
    "getopt", "threading", "queue", "subprocess", "socket", "ssl", "select", "selectors",
    "asyncio", "urllib.parse", "urllib.request", "http.client", "http.server", "email",
    "html", "html.parser", "xml.etree.ElementTree", "unicodedata", "locale", "decimal",
    "fractions", "numbers", "array", "weakref", "types", "inspect", "dis", "ast", "tokenize",
    "traceback", "warnings", "unittest", "doctest", "timeit", "cProfile", "uuid", "ipaddress",
    "mimetypes", "shlex", "platform", "signal", "io", "codecs", "filecmp", "graphlib",
    "zoneinfo", "wave", "colorsys", "sched", "concurrent.futures", "multiprocessing",
]

TEMPLATES = {
    "question": [
        "What does the word \"{w}\" mean?",
        "What is {a} {w}?",
        "Can you tell me what \"{w}\" means and give an example sentence?",
        "Is {a} {w} a kind of {h}?",
        "What is the difference between {a} {w} and {a2} {h}?",
        "Where would I typically find {a} {w}?",
        "Why is {a} {w} important?",
        "What does the `{cmd}` command do?",
        "How do I use `{cmd}` on Linux?",
        "What does `{fn}` do in Python?",
        "What is the Python module `{mod}` used for?",
        "Who might have said this, and what did they mean: \"{q}\"",
    ],
    "explain": [
        "Explain the meaning of \"{w}\" to a child.",
        "Explain what {a} {w} is in simple terms.",
        "Explain the concept of {w} in two or three paragraphs.",
        "Describe {a} {w} ({g}).",
        "Explain how to {v}.",
        "Explain, step by step, what `{cmd}` does and when to use it.",
        "Explain what `{fn}` does and show a short example.",
        "Explain this quotation: \"{q}\"",
        "What is the joke or point in this? \"{q}\"",
        "Explain the idea behind this definition: {w} means \"{g}\".",
    ],
    "instruct": [
        "Write a short poem about {a} {w}.",
        "Write a short story in which {a} {w} plays an important role.",
        "Write a product description for {a} {w}.",
        "List five facts about {w}.",
        "Give me three tips on how to {v}.",
        "Write a haiku about {w}.",
        "Write a short dialogue between two friends about {w}.",
        "Write an email to a colleague who wants to learn to {v}.",
        "Summarize in one sentence: \"{q}\"",
        "Rewrite this in plain modern English: \"{q}\"",
        "Write a paragraph that uses the words \"{w}\" and \"{w2}\".",
        "Give me a list of ten words related to {w}.",
        "Write a limerick about {a} {w}.",
        "Make a to-do list for someone who wants to {v}.",
    ],
    "code": [
        "Write a Python function that uses `{fn}`.",
        "In Python: {doc_lc} Write a function that does this without using `{fn}`.",
        "Write a Python function to {doc_lc}",
        "Show how to use the `{mod}` module in Python with a small example.",
        "Write a shell command that uses `{cmd}` to {cmd_doc}.",
        "Write a bash script that uses `{cmd}`.",
        "What is the output of this Python code?\n```python\n{snippet}\n```",
        "Find the bug in this Python code and fix it:\n```python\n{buggy}\n```",
        "Write a Python class that represents {a} {w}.",
        "Write a JavaScript function that {js_task}.",
        "Write a SQL query that {sql_task}.",
        "Write a Python function that {js_task}.",
    ],
    "math": [
        "What is {x} + {y}?",
        "What is {x} times {y}?",
        "Calculate {x} - {y}.",
        "What is {x} divided by {d}?",
        "Solve for x: {a1}x + {b1} = {c1}",
        "What is {p}% of {x}?",
        "If a train travels at {s} km/h for {t} hours, how far does it go?",
        "I have {n1} {w}s and give away {n2}. How many are left?",
        "What is the square of {y}?",
        "Convert {t} hours into minutes.",
        "A rectangle is {n1} cm by {n2} cm. What are its area and perimeter?",
        "Is {x} a prime number?",
    ],
    "chat": [
        "Hi! How are you today?",
        "hey, what's up? i'm thinking about getting {a} {w}",
        "I'm bored. Any ideas?",
        "Can you help me {v}?",
        "My friend says \"{q}\" What do you think?",
        "I love {w}! Do you?",
        "Tell me something interesting about {w}.",
        "good morning! can you recommend a book about {w}?",
        "I feel stressed about work. What should I do?",
        "Tell me a joke about {w}.",
        "What should I cook tonight?",
        "Thanks for your help yesterday with the {w}.",
    ],
}
KIND_MIX = {"question": 0.22, "explain": 0.18, "instruct": 0.20, "code": 0.20, "math": 0.10,
            "chat": 0.10}

JS_TASKS = [
    "reverses a string", "checks whether a string is a palindrome", "returns the largest "
    "number in a list", "counts the vowels in a string", "removes duplicates from a list",
    "computes the factorial of n", "returns the n-th Fibonacci number", "sorts a list of words "
    "by length", "merges two sorted lists", "flattens a nested list", "counts word frequencies "
    "in a text", "converts Celsius to Fahrenheit", "checks whether a year is a leap year",
    "finds the second largest element of a list", "capitalizes every word of a sentence",
    "computes the average of a list of numbers", "validates an email address",
    "returns the prime numbers below n", "rotates a list by k positions", "transposes a matrix",
    "computes the greatest common divisor of two numbers", "groups a list of words by their "
    "first letter", "checks whether two strings are anagrams", "converts a number to Roman "
    "numerals", "parses a date string in YYYY-MM-DD format", "returns the median of a list",
    "implements binary search", "implements bubble sort", "counts the lines of a file",
    "removes the whitespace from both ends of every line", "computes the dot product of two "
    "vectors", "checks whether brackets in a string are balanced",
]
SQL_TASKS = [
    "selects all customers from the table customers who live in {city}",
    "counts the orders per customer", "finds the five most expensive products",
    "returns the average salary per department", "deletes rows older than 30 days from logs",
    "joins the tables orders and customers on customer_id", "finds duplicate emails in users",
    "lists employees hired after 2020", "updates the price of product 42 to 9.99",
]
CITIES = ["Paris", "Berlin", "Tokyo", "Lima", "Cairo", "Oslo", "Toronto", "Sydney", "Madrid",
          "Nairobi", "Seoul", "Rome", "Boston", "Mumbai", "Dublin", "Lisbon"]


# --------------------------------------------------------------------------------------------
# Sources


def wordnet_entries():
    """[(lemma, gloss, hypernym lemma or None, pos, count)] for senses with a SemCor count."""
    counts = {}
    with open(os.path.join(WORDNET, "cntlist.rev")) as f:
        for line in f:
            key, _sense, cnt = line.split()
            lemma = key.split("%")[0]
            counts[lemma] = counts.get(lemma, 0) + int(cnt)
    out = []
    for pos, fname in (("n", "data.noun"), ("v", "data.verb"), ("a", "data.adj"),
                       ("r", "data.adv")):
        first = {}
        lines = []
        with open(os.path.join(WORDNET, fname)) as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                parts = head.split()
                off, w_cnt = parts[0], int(parts[3], 16)
                words = [parts[4 + 2 * i] for i in range(w_cnt)]
                p_at = 4 + 2 * w_cnt
                p_cnt = int(parts[p_at])
                hyper = None
                for j in range(p_cnt):
                    sym, tgt = parts[p_at + 1 + 4 * j], parts[p_at + 2 + 4 * j]
                    if sym == "@" and hyper is None:
                        hyper = tgt
                first[off] = words[0]
                gloss = gloss.split(";")[0].strip().strip('"').strip()
                lines.append((words[0], gloss, hyper))
        for w, gloss, hyper in lines:
            lemma = w.lower()
            c = counts.get(lemma, 0)
            if c < 3 or not re.fullmatch(r"[a-z][a-z_'-]*[a-z]", lemma) or len(gloss) < 8:
                continue
            h = first.get(hyper, "").lower().replace("_", " ") if hyper else None
            out.append((lemma.replace("_", " "), gloss, h, pos, c))
    return out


def fortunes():
    out = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if "." in name or name in ("art", "ascii-art") or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for entry in text.split("\n%\n"):
            e = " ".join(entry.split())
            if 20 <= len(e) <= 300 and "|" not in e and "\\" not in e:
                out.append((name, e))
    return out


def man_commands():
    """[(command, one-line description)] from `man -f` on section-1 pages of MAN_PACKAGES."""
    names = set()
    for pkg in MAN_PACKAGES:
        r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = re.fullmatch(r"/usr/share/man/man1/([^/]+)\.1(\.gz)?", line)
            if m:
                names.add(m.group(1))
    out = {}
    for name in sorted(names):
        r = subprocess.run(["man", "-f", name], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = re.match(r"^(\S+) \(1\)\s+- (.+)$", line)
            if m and m.group(1) == name:
                out[name] = m.group(2).strip().rstrip(".")
    return sorted(out.items())


def py_functions():
    """[(module, qualified name, first sentence of its docstring)]."""
    out = []
    warnings.simplefilter("ignore")
    for mod_name in PY_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:  # noqa: BLE001 - a module missing from this build
            continue
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            if (getattr(obj, "__module__", None) or mod_name).split(".")[0] != mod_name.split(".")[0] and \
                    not inspect.isbuiltin(obj):
                continue
            doc = inspect.getdoc(obj) or ""
            doc = " ".join(doc.split("\n\n")[0].split())
            m = re.match(r"(.+?[.!?])(\s|$)", doc)
            doc = m.group(1) if m else doc
            if not 15 <= len(doc) <= 160 or "eprecated" in doc or "(" in doc[:len(name) + 2] or doc.startswith(
                    ("Return a new", "Create and return a new")):
                continue
            out.append((mod_name, f"{mod_name}.{name}", doc))
    return out


SNIPPETS = [
    "x = [1, 2, 3]\nprint(x[{i}] * {k})",
    "s = '{word}'\nprint(s[::-1])",
    "print(len('{word}') + {k})",
    "d = {{'a': {k}, 'b': {i}}}\nprint(d['a'] + d['b'])",
    "print(sum(range({k})))",
    "print('{word}'.upper().count('{ch}'))",
    "nums = [{i}, {k}, 7]\nprint(sorted(nums)[-1])",
    "print({k} // 2, {k} % 2)",
]
BUGGY = [
    "def average(xs):\n    return sum(xs) / len(x)",
    "def is_even(n):\n    return n % 2 == 1",
    "def last(xs):\n    return xs[len(xs)]",
    "for i in range(10)\n    print(i)",
    "def greet(name):\n    print('Hello, ' + name + {k})",
    "def factorial(n):\n    if n == 0:\n        return 0\n    return n * factorial(n - 1)",
    "words = ['{word}', 'b']\nprint(words.len())",
    "def count(s, ch):\n    c = 0\n    for x in s:\n        if x = ch:\n            c += 1\n    return c",
]


# --------------------------------------------------------------------------------------------
# Candidates


def article(w):
    return "an" if w[:1] in "aeiou" else "a"


def _fill(t, **kw):
    try:
        return t.format(**kw)
    except (KeyError, IndexError):
        return None


def candidates(rng):
    """Yield (kind, source, group, prompt) for every source item, a few templates each."""
    wn = wordnet_entries()
    nouns = [e for e in wn if e[3] == "n"]
    verbs = [e for e in wn if e[3] == "v"]
    fort = fortunes()
    cmds = man_commands()
    funcs = py_functions()
    print(f"sources: wordnet {len(wn)} senses ({len(nouns)} nouns, {len(verbs)} verbs), "
          f"fortunes {len(fort)}, man commands {len(cmds)}, python functions {len(funcs)}",
          file=sys.stderr)

    def word_kw(e):
        w, g, h, _pos, _c = e
        o = nouns[rng.randrange(len(nouns))][0]
        return dict(w=w, g=g, h=h or "thing", a=article(w), a2=article(h or "thing"), w2=o)

    # WordNet nouns: questions, explanations, writing, chat, code classes, maths word problems.
    noun_t = {k: [t for t in TEMPLATES[k] if "{w}" in t and "{cmd" not in t and "{fn}" not in t
                  and "{q}" not in t and "{v}" not in t] for k in TEMPLATES}
    for e in nouns:
        kw = word_kw(e)
        if e[2] is None:
            kw["h"] = "thing"
        for kind in ("question", "explain", "instruct", "chat", "code", "math"):
            # One template each for code and maths: use it for a fifth of the nouns only.
            if kind in ("code", "math") and rng.random() > 0.2:
                continue
            ts = [t for t in noun_t[kind] if ("{h}" not in t or e[2])]
            if not ts:
                continue
            t = ts[rng.randrange(len(ts))]
            n1, n2 = rng.randint(3, 40), rng.randint(1, 3)
            p = _fill(t, **kw, n1=n1, n2=n2, x=rng.randint(2, 999), y=rng.randint(2, 99))
            if p:
                yield kind, "wordnet", "wn:" + e[0], p
    # WordNet verbs: "how to" tasks (verb + first gloss words as the object).
    for e in verbs:
        w = e[0]
        # The verb alone: glued-on glosses read badly ("drive hunting: search for game").
        v = w if e[4] >= 10 else None
        if v is None:
            continue
        for kind in ("explain", "instruct", "chat"):
            ts = [t for t in TEMPLATES[kind] if "{v}" in t]
            p = _fill(ts[rng.randrange(len(ts))], v=v)
            if p:
                yield kind, "wordnet", "wn:" + w, p
    # Fortunes: quotations and jokes.
    for name, q in fort:
        for kind in ("question", "explain", "instruct", "chat"):
            ts = [t for t in TEMPLATES[kind] if "{q}" in t]
            if ts:
                yield kind, f"fortune/{name}", "fo:" + q[:60], ts[rng.randrange(len(ts))].format(q=q)
    # Man pages.
    for cmd, desc in cmds:
        desc_lc = desc[0].lower() + desc[1:] if desc else desc
        for kind in ("question", "explain", "code"):
            ts = [t for t in TEMPLATES[kind] if "{cmd" in t]
            p = _fill(ts[rng.randrange(len(ts))], cmd=cmd, cmd_doc=desc_lc)
            if p:
                yield kind, "man", "man:" + cmd, p
    # Python standard library.
    for mod, fn, doc in funcs:
        doc_lc = doc[0].lower() + doc[1:]
        for kind in ("question", "explain", "code"):
            ts = [t for t in TEMPLATES[kind] if "{fn}" in t or "{doc_lc}" in t or "{mod}" in t]
            p = _fill(ts[rng.randrange(len(ts))], fn=fn, mod=mod, doc_lc=doc_lc)
            if p:
                yield kind, "pydoc", "py:" + fn, p
    # Code tasks and snippets (synthetic, from the lists above and WordNet words).
    words = [e[0] for e in nouns if " " not in e[0] and len(e[0]) <= 10]
    for i, task in enumerate(JS_TASKS):
        for t in [t for t in TEMPLATES["code"] if "{js_task}" in t]:
            yield "code", "synth", f"task:{i}", t.format(js_task=task)
    for i, task in enumerate(SQL_TASKS):
        for c in CITIES if "{city}" in task else [""]:
            yield "code", "synth", f"sql:{i}:{c}", TEMPLATES["code"][10].format(
                sql_task=task.format(city=c))
    for i in range(3000):
        word = words[rng.randrange(len(words))]
        kw = dict(i=rng.randint(0, 2), k=rng.randint(2, 20), word=word, ch=word[0].upper())
        if i % 2:
            body = SNIPPETS[rng.randrange(len(SNIPPETS))].format(**kw)
            yield "code", "synth", "snip:" + body, TEMPLATES["code"][6].format(snippet=body)
        else:
            body = BUGGY[rng.randrange(len(BUGGY))].format(**kw)
            yield "code", "synth", "bug:" + body, TEMPLATES["code"][7].format(buggy=body)
    # Arithmetic and algebra (synthetic).
    math_t = [t for t in TEMPLATES["math"] if "{w}" not in t]
    for i in range(12000):
        t = math_t[rng.randrange(len(math_t))]
        x, y = rng.randint(2, 9999), rng.randint(2, 99)
        a1 = rng.randint(2, 12)
        xs = rng.randint(-10, 20)
        b1 = rng.randint(1, 50)
        kw = dict(x=x, y=y, d=rng.choice([2, 3, 4, 5, 8, 10, 12, 25]), a1=a1, b1=b1,
                  c1=a1 * xs + b1, p=rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]),
                  s=rng.randint(40, 300), t=rng.randint(2, 12), n1=rng.randint(2, 60),
                  n2=rng.randint(2, 60))
        p = t.format(**kw)
        yield "math", "synth", "math:" + p, p
    # Generic chat openers without a slot: a few copies each, one group per opener.
    for t in TEMPLATES["chat"]:
        if "{" not in t:
            yield "chat", "synth", "chat:" + t, t


def split_of(group: str) -> str:
    h = int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % 1000
    return "eval" if h < 15 else "tune" if h < 30 else "train"


def build(sizes, seed=20261207):
    rng = random.Random(seed)
    pools = {s: {k: [] for k in KIND_MIX} for s in sizes}
    seen = set()
    for kind, source, group, prompt in candidates(rng):
        key = " ".join(prompt.lower().split())
        if key in seen:
            continue
        seen.add(key)
        pools[split_of(group)][kind].append({"kind": kind, "source": source, "prompt": prompt})
    out = {}
    for split, n in sizes.items():
        r = random.Random(f"{seed}:{split}")
        chosen = []
        for kind, frac in KIND_MIX.items():
            pool = pools[split][kind]
            k = min(len(pool), round(n * frac))
            chosen += r.sample(pool, k)
        r.shuffle(chosen)
        for i, c in enumerate(chosen):
            c["id"] = f"{split}-{i:05d}"
        out[split] = [{"id": c["id"], "kind": c["kind"], "source": c["source"],
                       "prompt": c["prompt"]} for c in chosen]
        avail = {k: len(v) for k, v in pools[split].items()}
        print(f"{split}: {len(chosen)} prompts from pools {avail}", file=sys.stderr)
    return out


def write_jsonl_gz(path, rows):
    # mtime=0 keeps the gzip bytes reproducible.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())


def read_jsonl_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "data"))
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--tune", type=int, default=200)
    ap.add_argument("--eval", type=int, default=200)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    splits = build({"train": args.train, "tune": args.tune, "eval": args.eval})
    texts = {s: {r["prompt"] for r in rows} for s, rows in splits.items()}
    assert not (texts["train"] & texts["eval"]) and not (texts["train"] & texts["tune"]) and \
        not (texts["tune"] & texts["eval"])
    for s, rows in splits.items():
        path = os.path.join(args.out, f"{s}.jsonl.gz")
        write_jsonl_gz(path, rows)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print(f"{path}: {len(rows)} prompts, {os.path.getsize(path)} bytes, sha256 {digest}")


if __name__ == "__main__":
    main()
