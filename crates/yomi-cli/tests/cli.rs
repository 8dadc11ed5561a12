//! The `yomi` binary end to end: the fixture model through `run` and `logits`, and every kind
//! of bad input giving a one-line error and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../../../tests/support/smollm2.rs"]
mod smollm2;

fn yomi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_yomi"))
        .args(args)
        .output()
        .expect("run yomi")
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// A failed run: non-zero exit, exactly one stderr line starting with "error:" that contains
/// `needle`, and no panic.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

/// Copies the tiny fixture into a temp dir so a test can break it.
fn broken_copy() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture("qwen35-tiny")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, d.path().join(f.file_name().unwrap())).unwrap();
    }
    d
}

fn run_on(dir: &Path) -> Output {
    yomi(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "-m",
        "hello",
        "--max-tokens",
        "2",
    ])
}

/// Rewrites model.safetensors with `edit` applied to the tensor map.
fn rewrite_weights(
    dir: &Path,
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut t: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut t);
    let views: Vec<(String, safetensors::tensor::TensorView)> = t
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

#[test]
fn run_json_reproduces_the_reference_greedy_ids() {
    run_json_matches_reference(&fixture("qwen35-tiny"));
}

/// The same through llama.cpp's qwen35 GGUF of the fixture (f32, tests/data/qwen35-tiny-gguf):
/// its tokenizer, template and weights give the reference's ids.
#[test]
fn qwen35_gguf_run_json_reproduces_the_reference_greedy_ids() {
    run_json_matches_reference(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf"),
    );
}

/// `yomi run --raw --json` on the qwen35-tiny prompt with `model` gives the reference's prompt
/// and greedy ids, and the stats.
fn run_json_matches_reference(model: &Path) {
    let dir = fixture("qwen35-tiny");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = reference["prompt_text"].as_str().unwrap();
    let out = yomi(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--raw",
        "-m",
        prompt,
        "--max-tokens",
        "48",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    // The ids the reference holds, read with the safetensors crate.
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = |name: &str| -> Vec<u64> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u64)
            .collect()
    };
    let got = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    assert_eq!(got("prompt_ids"), ids("prompt_ids"));
    assert_eq!(got("output_ids"), ids("greedy_ids"));
    let stats = &v["stats"];
    for k in [
        "time_to_first_token_s",
        "prefill_tokens_per_s",
        "generation_tokens_per_s",
        "tokens_per_forward_pass",
        "memory_bytes",
        "duration_s",
    ] {
        assert!(stats[k].as_f64().is_some(), "stats.{k} missing: {stats}");
    }
    assert!(stats["energy_j"].is_null() || stats["energy_j"].as_f64().is_some());
    // No device memory on the CPU.
    assert!(stats["device_memory_bytes"].is_null(), "{stats}");
    assert_eq!(stats["tokens_per_forward_pass"].as_f64(), Some(1.0));
}

#[test]
fn suffix_drafting_gives_the_reference_greedy_ids_too() {
    let dir = fixture("qwen35-tiny");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = reference["prompt_text"].as_str().unwrap();
    let run = |draft: &str| -> serde_json::Value {
        let o = yomi(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--raw",
            "-m",
            prompt,
            "--max-tokens",
            "48",
            "--json",
            "--draft",
            draft,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s = String::from_utf8(o.stdout).unwrap();
        serde_json::from_str(s.lines().last().unwrap()).unwrap()
    };
    let spec = run("suffix");
    assert_eq!(spec["output_ids"], run("none")["output_ids"]);
    // The passes by tree size add up to the pass and token counts.
    let stats = &spec["stats"];
    let sizes = stats["passes_by_rows"].as_array().unwrap();
    let sum = |k: &str| sizes.iter().map(|p| p[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("passes"), stats["verify_passes"].as_u64().unwrap());
    // Every token but the first (sampled from the prefill's logits) comes from a pass.
    assert_eq!(
        sum("tokens"),
        stats["generated_tokens"].as_u64().unwrap() - 1
    );
    assert!(
        sizes
            .windows(2)
            .all(|w| w[0]["rows"].as_u64() < w[1]["rows"].as_u64())
    );
}

#[test]
fn seeded_sampling_is_reproducible() {
    let dir = fixture("qwen35-tiny");
    let run = || {
        let o = yomi(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "-m",
            "hi",
            "--max-tokens",
            "16",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--seed",
            "7",
            "--json",
        ]);
        assert!(o.status.success());
        let s = String::from_utf8(o.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(s.lines().last().unwrap()).unwrap();
        v["output_ids"].clone()
    };
    assert_eq!(run(), run());
}

/// `YOMI_CPU_ISA` keeps the CPU kernels at or below a level (the JSON's `device` says which
/// ran) and changes nothing in the output: the quantized, attention and elementwise kernels
/// give the same bits at every level, with and without speculative decoding. On a CPU without
/// AVX2 every run is portable and the comparison is trivially true, so the level names are
/// only checked where the CPU has the level.
#[test]
fn cpu_isa_ceiling_changes_the_kernels_not_the_tokens() {
    let model = smollm2::gguf_path();
    let run = |isa: &str, draft: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_yomi"))
            .args(["run", "--model", model.to_str().unwrap(), "--raw", "-m"])
            .arg("def parse_config(path):\n    config = {}\n    with open(path) as f:\n")
            .args(["--max-tokens", "24", "--draft", draft, "--json"])
            .env("YOMI_CPU_ISA", isa)
            .output()
            .expect("run yomi");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "YOMI_CPU_ISA={isa}: {err}");
        let s = String::from_utf8(o.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(s.lines().last().unwrap()).unwrap();
        (
            v["output_ids"].clone(),
            v["device"].as_str().unwrap_or("").to_string(),
        )
    };
    let (ids, device) = run("", "none");
    assert_eq!(ids.as_array().map(|a| a.len()), Some(24), "{ids}");
    let has = |flags: &[&str]| {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        flags
            .iter()
            .all(|f| info.split_whitespace().any(|w| w == *f))
    };
    // The portable kernels are ~30× slower: one run, with drafting (its passes include
    // one-row ones).
    for (isa, flags, drafts) in [
        (
            "avx2",
            &["avx2", "fma", "f16c"][..],
            &["none", "suffix"][..],
        ),
        ("portable", &[][..], &["suffix"][..]),
    ] {
        for &draft in drafts {
            let (got, dev) = run(isa, draft);
            assert_eq!(
                got, ids,
                "YOMI_CPU_ISA={isa} --draft {draft} ({dev} against {device})"
            );
            if has(flags) {
                assert!(dev.starts_with(&format!("cpu ({isa},")), "{dev}");
            }
        }
    }
}

#[test]
fn logits_writes_the_prefill_logits() {
    let dir = fixture("qwen35-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.safetensors");
    let o = yomi(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "1,2,3,40",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("logits").unwrap().shape(), &[4, 512]);
}

/// The float32 tensors of a safetensors file, by name (int64 ones converted).
fn read_tensors(path: &Path) -> std::collections::HashMap<String, (Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let vals: Vec<f64> = match t.dtype() {
                safetensors::Dtype::F32 => t
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                safetensors::Dtype::I64 => t
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                d => panic!("{name}: unexpected dtype {d:?}"),
            };
            (name, (t.shape().to_vec(), vals))
        })
        .collect()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn ids_arg(ids: &[f64]) -> String {
    ids.iter()
        .map(|&x| (x as i64).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `yomi logits --hidden-out` writes the residual stream of every row at every point with the
/// fixtures' convention, and it equals transformers' `hidden_states.i` within 1e-4 (float32 on
/// both sides, only the order of summation differs: measured ≤ 2.2e-5 on these fixtures; the
/// logits' own bound in the fixture tests is 1e-4). K/V in f32 so nothing is rounded to f16.
#[test]
fn logits_hidden_out_equals_the_reference_hidden_states() {
    for name in ["qwen35-tiny", "qwen35-realdims"] {
        let dir = fixture(name);
        let r = read_tensors(&dir.join("reference.safetensors"));
        let prompt = &r["prompt_ids"].1;
        let tmp = tempfile::tempdir().unwrap();
        let (out, hid) = (tmp.path().join("l.st"), tmp.path().join("h.st"));
        let o = yomi(&[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--kv-cache",
            "f32",
            "--tokens",
            &ids_arg(prompt),
            "--out",
            out.to_str().unwrap(),
            "--hidden-out",
            hid.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let h = read_tensors(&hid);
        let layers = h.len() - 1;
        assert!(layers >= 3, "{name}: {} hidden states", h.len());
        for i in 0..=layers {
            let key = format!("hidden_states.{i}");
            let (shape, got) = &h[&key];
            let (want_shape, want) = &r[&key];
            assert_eq!(shape, want_shape, "{name} {key}");
            let e = max_abs_diff(got, want);
            eprintln!("{name} {key}: max |Δ| {e:.2e}");
            assert!(e < 1e-4, "{name} {key} differs by {e}");
        }
        let e = max_abs_diff(&read_tensors(&out)["logits"].1, &r["prefill_logits"].1);
        assert!(e < 1e-4, "{name} prefill logits differ by {e}");
    }
}

/// A tree with several roots (siblings below the last token) through `yomi logits`: each row
/// equals the last row of a plain run over the tokens and the path to that node, for logits
/// and hidden states. Bound 1e-4: the tree pass and a plain chain sum in other orders
/// (measured within 5e-5 on this fixture's per-path checks).
#[test]
fn logits_sibling_tree_equals_per_path_runs() {
    let dir = fixture("qwen35-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let prompt = [1u32, 40, 41, 42, 300, 7];
    // Three siblings below the last token, two of them with children.
    let parents = [-1i32, -1, 0, 2, -1, 1];
    let toks = [50u32, 51, 52, 53, 54, 55];
    let join = |x: &[String]| x.join(",");
    let run = |tokens: &[u32], tree: Option<(&[i32], &[u32])>, tag: &str| {
        let out = tmp.path().join(format!("{tag}.l"));
        let hid = tmp.path().join(format!("{tag}.h"));
        let mut args = vec![
            "logits".to_string(),
            "--model".into(),
            dir.to_str().unwrap().into(),
            "--kv-cache".into(),
            "f32".into(),
            "--tokens".into(),
            join(&tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>()),
            "--out".into(),
            out.to_str().unwrap().into(),
            "--hidden-out".into(),
            hid.to_str().unwrap().into(),
        ];
        if let Some((p, t)) = tree {
            args.push("--tree-parents".into());
            args.push(join(&p.iter().map(|x| x.to_string()).collect::<Vec<_>>()));
            args.push("--tree-tokens".into());
            args.push(join(&t.iter().map(|x| x.to_string()).collect::<Vec<_>>()));
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = yomi(&argv);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (read_tensors(&out), read_tensors(&hid))
    };
    let (tl, th) = run(&prompt, Some((&parents, &toks)), "tree");
    let (shape, tree_logits) = &tl["logits"];
    assert_eq!(shape, &[parents.len(), 512]);
    let points = th.len();
    for (i, _) in parents.iter().enumerate() {
        let mut path = vec![i];
        while parents[*path.last().unwrap()] >= 0 {
            path.push(parents[*path.last().unwrap()] as usize);
        }
        let mut seq = prompt.to_vec();
        seq.extend(path.iter().rev().map(|&j| toks[j]));
        let (pl, ph) = run(&seq, None, &format!("p{i}"));
        let v = 512;
        let last = &pl["logits"].1[(seq.len() - 1) * v..];
        let e = max_abs_diff(&tree_logits[i * v..(i + 1) * v], last);
        assert!(
            e < 1e-4,
            "row {i}: logits differ from its path's run by {e}"
        );
        for p in 0..points {
            let key = format!("hidden_states.{p}");
            let (s, th_p) = &th[&key];
            let hs = s[1];
            let want = &ph[&key].1[(seq.len() - 1) * hs..];
            let e = max_abs_diff(&th_p[i * hs..(i + 1) * hs], want);
            assert!(
                e < 1e-4,
                "row {i} {key}: differs from its path's run by {e}"
            );
        }
    }
    // Rows that hang from nothing are refused with one line.
    let bad = yomi(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "1,2",
        "--tree-parents",
        "-1,-1,5",
        "--tree-tokens",
        "3,4,5",
        "--out",
        tmp.path().join("x").to_str().unwrap(),
    ]);
    assert_clean_error(&bad, "does not come before it");
}

#[test]
fn missing_path() {
    assert_clean_error(&run_on(Path::new("/nonexistent/model")), "does not exist");
}

#[test]
fn directory_without_config() {
    let d = tempfile::tempdir().unwrap();
    assert_clean_error(&run_on(d.path()), "config.json");
}

#[test]
fn unsupported_architecture() {
    let d = broken_copy();
    std::fs::write(
        d.path().join("config.json"),
        r#"{"architectures": ["MambaForCausalLM"], "hidden_size": 8}"#,
    )
    .unwrap();
    let out = run_on(d.path());
    assert_clean_error(&out, "unsupported architecture `MambaForCausalLM`");
    assert_clean_error(&out, "LlamaForCausalLM");
}

/// A chat template that loops or writes without end: one `error:` line, exit 1, at once
/// (issue 43: the first one hung, the second took all memory).
#[test]
fn hostile_chat_templates() {
    let flood = format!(
        "{{% for i in range(100000) %}}{{% for j in range(100000) %}}{}{{% endfor %}}{{% endfor %}}",
        "x".repeat(1000)
    );
    for (tpl, needle) in [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "budget",
        ),
        (flood.as_str(), "output passed"),
    ] {
        let d = broken_copy();
        let cfg = d.path().join("tokenizer_config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v["chat_template"] = serde_json::json!(tpl);
        std::fs::write(&cfg, v.to_string()).unwrap();
        let t0 = std::time::Instant::now();
        let out = run_on(d.path());
        assert_clean_error(&out, needle);
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn malformed_config() {
    let d = broken_copy();
    std::fs::write(d.path().join("config.json"), "{not json").unwrap();
    assert_clean_error(&run_on(d.path()), "not valid JSON");
}

#[test]
fn truncated_safetensors() {
    let d = broken_copy();
    let p = d.path().join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    for cut in [4u64, 100, len / 2, len - 1] {
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(cut).unwrap();
        assert_clean_error(&run_on(d.path()), "model.safetensors");
    }
}

#[test]
fn corrupt_safetensors_header() {
    let d = broken_copy();
    let p = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    for b in bytes.iter_mut().skip(8).take(40) {
        *b = b'#';
    }
    std::fs::write(&p, bytes).unwrap();
    assert_clean_error(&run_on(d.path()), "not a valid safetensors file");
}

#[test]
fn wrong_dtype() {
    let d = broken_copy();
    rewrite_weights(d.path(), |t| {
        let e = t.iter_mut().find(|e| e.0 == "model.norm.weight").unwrap();
        e.1 = safetensors::Dtype::I32;
    });
    assert_clean_error(
        &run_on(d.path()),
        "weight `model.norm.weight` has dtype I32",
    );
}

#[test]
fn wrong_shape() {
    let d = broken_copy();
    rewrite_weights(d.path(), |t| {
        let e = t
            .iter_mut()
            .find(|e| e.0 == "model.layers.1.linear_attn.in_proj_z.weight")
            .unwrap();
        let n = e.3.len() / 4;
        e.2 = vec![n / 64, 64];
    });
    assert_clean_error(
        &run_on(d.path()),
        "weight `model.layers.1.linear_attn.in_proj_z.weight` has shape",
    );
}

#[test]
fn missing_tensor() {
    let d = broken_copy();
    rewrite_weights(d.path(), |t| {
        t.retain(|e| e.0 != "model.layers.3.self_attn.k_norm.weight")
    });
    assert_clean_error(
        &run_on(d.path()),
        "weight `model.layers.3.self_attn.k_norm.weight` is missing",
    );
}

#[test]
fn empty_prompt() {
    let dir = fixture("qwen35-tiny");
    let out = yomi(&["run", "--model", dir.to_str().unwrap(), "-m", "  "]);
    assert_clean_error(&out, "prompt is empty");
}

#[test]
fn prompt_longer_than_context() {
    let dir = fixture("qwen35-tiny");
    let long = "def f(x): return x\n".repeat(50);
    let out = yomi(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "-m",
        &long,
        "--ctx-size",
        "64",
    ]);
    assert_clean_error(&out, "does not fit the context of 64 tokens");
}

#[test]
fn bad_sampling_parameter() {
    let dir = fixture("qwen35-tiny");
    let out = yomi(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "-m",
        "hi",
        "--top-p",
        "0",
    ]);
    assert_clean_error(&out, "top_p");
}

#[test]
fn bad_logits_arguments() {
    let dir = fixture("qwen35-tiny");
    let out = yomi(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "1,x",
        "--out",
        "/tmp/x.safetensors",
    ]);
    assert_clean_error(&out, "`x` is not a valid number");
    let out = yomi(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "1,99999",
        "--out",
        "/tmp/x.safetensors",
    ]);
    assert_clean_error(&out, "outside the vocabulary");
}

#[test]
fn perplexity_runs_and_rejects_bad_files() {
    let dir = fixture("qwen35-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("t.py");
    std::fs::write(&text, "def add(a, b):\n    return a + b\n".repeat(40)).unwrap();
    let o = yomi(&[
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--file",
        text.to_str().unwrap(),
        "--window",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8(o.stdout).unwrap().trim()).unwrap();
    let ppl = v["perplexity"].as_f64().unwrap();
    // A random model over a 512-token vocabulary: finite and above 1.
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");
    assert_eq!(
        v["scored_tokens"].as_u64().unwrap(),
        v["windows"].as_u64().unwrap() * 32
    );
    let missing = yomi(&[
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--file",
        "/nonexistent.txt",
    ]);
    assert_clean_error(&missing, "cannot read /nonexistent.txt");
    let empty = tmp.path().join("e.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let o = yomi(&[
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--file",
        empty.to_str().unwrap(),
    ]);
    assert_clean_error(&o, "is empty");
}

/// A minimal GGUF v3 file: no tensors, one string metadata entry `general.architecture`.
fn tiny_gguf(arch: &str) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    let key = b"general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(8u32.to_le_bytes()); // string
    b.extend((arch.len() as u64).to_le_bytes());
    b.extend(arch.as_bytes());
    b
}

#[test]
fn gguf_unknown_architecture_and_truncation() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    std::fs::write(&p, tiny_gguf("mamba")).unwrap();
    let out = yomi(&["run", "--model", p.to_str().unwrap(), "-m", "hi"]);
    assert_clean_error(&out, "unsupported GGUF architecture `mamba`");
    let full = tiny_gguf("llama");
    for cut in [3usize, 10, 30, full.len() - 2] {
        std::fs::write(&p, &full[..cut]).unwrap();
        let out = yomi(&["run", "--model", p.to_str().unwrap(), "-m", "hi"]);
        assert_clean_error(&out, "m.gguf");
    }
    std::fs::write(&p, b"NOPE and more bytes here").unwrap();
    assert_clean_error(
        &yomi(&["run", "--model", p.to_str().unwrap(), "-m", "hi"]),
        "m.gguf",
    );
}

/// No GPU here (nor in CI): `--device cuda` is a one-line error, `auto` runs on the CPU.
#[test]
fn device_flag() {
    let dir = fixture("qwen35-tiny");
    let out = yomi(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "-m",
        "hi",
        "--device",
        "cuda",
    ]);
    assert_clean_error(&out, "--device cuda");
    let ok = yomi(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "-m",
        "hi",
        "--max-tokens",
        "2",
        "--device",
        "auto",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The stats say where it ran.
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains("device:              cpu ("), "{err}");
}

/// A llama GGUF whose vocabulary is SentencePiece (tests/data/llama-tiny-spm-gguf): `yomi run`
/// loads it, builds the prompt with its chat template (`<s>` as one BOS token) or as raw text
/// (BOS added, as the GGUF's add_bos_token says), and generates. The weights are random, so
/// only the prompt ids are checked against SentencePiece's (expected.json).
#[test]
fn sentencepiece_gguf_runs() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama-tiny-spm-gguf");
    let model = dir.join("llama-tiny-spm-f16.gguf");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let expected_ids = |text: &str| -> Vec<u64> {
        let case = expected["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["text"] == text)
            .unwrap_or_else(|| panic!("no case {text:?}"));
        case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let run = |extra: &[&str], message: &str| -> serde_json::Value {
        let mut args = vec!["run", "--model", model.to_str().unwrap(), "-m", message];
        args.extend(["--max-tokens", "2", "--json"]);
        args.extend(extra);
        let out = yomi(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    };
    let ids = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };

    let chat = run(&[], "hi");
    assert_eq!(
        ids(&chat["prompt_ids"]),
        expected_ids("<s>[INST] hi [/INST]")
    );
    let out = ids(&chat["output_ids"]);
    assert_eq!(out.len(), 2, "{chat}");
    assert!(out.iter().all(|&i| i < 512), "{out:?}");

    let raw = run(&["--raw"], "Hello world");
    let mut want = vec![1];
    want.extend(expected_ids("Hello world"));
    assert_eq!(ids(&raw["prompt_ids"]), want);
}

/// `--stop` is bounded as the server's `stop` is: at most 4 strings of at most 256 bytes.
#[test]
fn too_many_or_too_long_stop_strings() {
    let dir = fixture("qwen35-tiny");
    let model = dir.to_str().unwrap();
    let mut args = vec!["run", "--model", model, "-m", "hi", "--max-tokens", "2"];
    for s in ["a", "b", "c", "d", "e"] {
        args.extend(["--stop", s]);
    }
    assert_clean_error(&yomi(&args), "--stop: at most 4 stop strings");
    let long = "x".repeat(257);
    let out = yomi(&[
        "run",
        "--model",
        model,
        "-m",
        "hi",
        "--max-tokens",
        "2",
        "--stop",
        &long,
    ]);
    assert_clean_error(&out, "at most 256 bytes");
    let ok = "x".repeat(256);
    let out = yomi(&[
        "run",
        "--model",
        model,
        "-m",
        "hi",
        "--max-tokens",
        "2",
        "--stop",
        "a",
        "--stop",
        &ok,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `config.json` of a copy of the fixture with `edit` applied.
fn edited_config(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let d = broken_copy();
    let path = d.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, v.to_string()).unwrap();
    d
}

/// Values in config.json that would load and then panic or compute NaNs are refused at load,
/// with the field named.
#[test]
fn bad_config_values_are_named() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 5] = [
        (
            |v| v["rms_norm_eps"] = serde_json::json!(-1),
            "rms_norm_eps",
        ),
        (
            |v| v["rope_parameters"]["rope_theta"] = serde_json::json!(0),
            "rope_theta",
        ),
        (
            |v| v["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(0),
            "partial_rotary_factor",
        ),
        (
            |v| v["pad_token_id"] = serde_json::json!(512),
            "pad_token_id",
        ),
        (
            |v| v["num_key_value_heads"] = serde_json::json!(3),
            "num_key_value_heads",
        ),
    ];
    for (edit, needle) in cases {
        let d = edited_config(edit);
        assert_clean_error(&run_on(d.path()), needle);
    }
}

/// A copy of the SentencePiece llama GGUF with the 4-byte value (u32 or f32) of the metadata
/// `key` overwritten in place.
fn gguf_with(dir: &Path, key: &str, value: [u8; 4]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/llama-tiny-spm-gguf/llama-tiny-spm-f16.gguf");
    let mut bytes = std::fs::read(src).unwrap();
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend(key.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("no key {key}"))
        + needle.len();
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert!(ty == 4 || ty == 6, "{key} has type {ty}, not u32 or f32");
    bytes[at + 4..at + 8].copy_from_slice(&value);
    let p = dir.join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    p
}

/// GGUF metadata that used to load and then panic (rotary width 0: exit 101) or compute NaNs
/// is a one-line error naming the key.
#[test]
fn bad_gguf_metadata_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    for (key, value, needle) in [
        (
            "llama.rope.dimension_count",
            0u32.to_le_bytes(),
            "rope.dimension_count",
        ),
        (
            "llama.rope.dimension_count",
            7u32.to_le_bytes(),
            "rope.dimension_count",
        ),
        (
            "llama.rope.freq_base",
            f32::NAN.to_le_bytes(),
            "rope.freq_base",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            (-1.0f32).to_le_bytes(),
            "layer_norm_rms_epsilon",
        ),
        (
            "llama.attention.head_count",
            0u32.to_le_bytes(),
            "attention.head_count",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            600u32.to_le_bytes(),
            "eos_token_id",
        ),
    ] {
        let p = gguf_with(tmp.path(), key, value);
        let out = yomi(&[
            "run",
            "--model",
            p.to_str().unwrap(),
            "-m",
            "hi",
            "--max-tokens",
            "2",
        ]);
        assert_clean_error(&out, needle);
    }
    // The copy itself is fine.
    let p = gguf_with(
        tmp.path(),
        "llama.rope.dimension_count",
        16u32.to_le_bytes(),
    );
    let out = yomi(&[
        "run",
        "--model",
        p.to_str().unwrap(),
        "-m",
        "hi",
        "--max-tokens",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `yomi` with the Hugging Face variables replaced: the cache at `cache`, the hub at `endpoint`.
fn yomi_hf(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_yomi"))
        .args(args)
        .env_remove("HF_HOME")
        .env_remove("HF_TOKEN")
        .env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .output()
        .expect("run yomi")
}

/// With no hub reachable (a closed loopback port), `yomi pull` says so in one line, exit 1.
#[test]
fn pull_without_network() {
    let cache = tempfile::tempdir().unwrap();
    let out = yomi_hf(
        cache.path(),
        "http://127.0.0.1:9",
        &["pull", "yomi-test/anything"],
    );
    assert_clean_error(
        &out,
        "cannot reach the Hugging Face hub at http://127.0.0.1:9 (HF_ENDPOINT) to pull yomi-test/anything",
    );
    let out = yomi_hf(cache.path(), "http://127.0.0.1:9", &["pull", "a/b/c"]);
    assert_clean_error(&out, "a/b/c: expected ORG/NAME");
    let out = yomi_hf(cache.path(), "hub", &["pull", "a/b"]);
    assert_clean_error(
        &out,
        "HF_ENDPOINT=\"hub\": expected an http:// or https:// URL",
    );
}

/// A model name missing from the cache (tests/python/test_hf_cache.py runs cached ones).
#[test]
fn model_not_in_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let out = yomi_hf(
        cache.path(),
        "http://127.0.0.1:9",
        &["run", "--model", "hf:yomi-test/absent", "-m", "hi"],
    );
    assert_clean_error(
        &out,
        &format!(
            "yomi-test/absent is not in the Hugging Face cache at {} (download it with `yomi pull yomi-test/absent`)",
            cache.path().display()
        ),
    );
}

/// `yomi quantize` of a GGUF file (llama.cpp's converter output of qwen35-tiny): the output
/// directory runs, and the Hugging Face directory written on the way is gone afterwards.
#[test]
fn quantize_a_gguf_file() {
    let gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf");
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tiny-l");
    let q = yomi(&[
        "quantize",
        "--model",
        gguf.to_str().unwrap(),
        "--format",
        "l",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["tiny-l"], "only the output is left");
    // As readable as the source (the safetensors writer alone makes private files).
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions();
    assert_eq!(mode(&out.join("model.safetensors")), mode(&gguf));
    let r = run_on(&out);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// A corrupt GGUF file: one line naming the file, and nothing left beside --out.
#[test]
fn quantize_a_corrupt_gguf_file() {
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00 not really").unwrap();
    let out = d.path().join("out");
    let q = yomi(&[
        "quantize",
        "--model",
        bad.to_str().unwrap(),
        "--format",
        "m",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_clean_error(&q, "bad.gguf");
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["bad.gguf"], "nothing but the input is left");
}
