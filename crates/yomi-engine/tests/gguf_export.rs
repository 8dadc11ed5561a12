//! A GGUF file written out as a Hugging Face directory (`export_hf_dir`, the first step of
//! `yomi quantize` on a GGUF file) loads as the same model: the same config, tokenizer, chat
//! template and end-of-generation ids, and the same logits — llama.cpp's converter files of the
//! fixtures, a Qwen3.5 hybrid (norms stored as 1 + w, `ssm_a` for A_log, value-head order) and
//! a Llama with a SentencePiece vocabulary (Q/K row order, F16 weights kept F16).

use std::path::{Path, PathBuf};

use yomi_core::TreeBatch;
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, EngineOptions, export_hf_dir};
use yomi_models::{KvDtype, LogitRows, ModelConfig, State};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn load(path: &Path) -> Engine {
    let opts = EngineOptions {
        context_size: Some(256),
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    Engine::load(path, &opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("load {}: {e:#}", path.display()))
}

fn logits(e: &Engine, ids: &[u32]) -> Vec<f32> {
    let mut st = State::new(&e.model.cfg, 256, KvDtype::F32);
    let mut out = Vec::new();
    e.model
        .forward(
            &mut st,
            ids,
            &TreeBatch::chain(ids.len()),
            LogitRows::All,
            &mut out,
        )
        .expect("forward");
    out
}

/// The GGUF file and its export, loaded; the exported directory is kept alive with them.
fn both(gguf: &str) -> (Engine, Engine, tempfile::TempDir) {
    let path = repo(gguf);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let r = export_hf_dir(&path, dir.path(), &mut |_, _| {}).expect("export");
    assert!(r.tensors > 0);
    assert!(r.quantized_types.is_empty(), "{:?}", r.quantized_types);
    (load(&path), load(dir.path()), dir)
}

/// Same config, tokenizer (ids of assorted text, both ways), chat prompt, eos ids and logits
/// within `tol` (max abs) on a prompt of `text`.
fn same_model(g: &Engine, h: &Engine, text: &str, tol: f32) {
    assert_eq!(h.model.cfg, g.model.cfg);
    for s in [
        text,
        "Hello, world!  x = 12;\n\tdef f(a, b):\n        return a+b",
        "café ñ 日本語 🙂",
    ] {
        let (a, b) = (g.tokenizer.encode(s, true), h.tokenizer.encode(s, true));
        assert_eq!(a.unwrap(), b.unwrap(), "{s:?}");
    }
    assert_eq!(h.tokenizer.vocab_size(), g.tokenizer.vocab_size());
    assert_eq!(h.eos_token_ids, g.eos_token_ids);
    let chat = [ChatMessage::system("Be brief."), ChatMessage::user(text)];
    match (&g.template, &h.template) {
        (Some(a), Some(b)) => assert_eq!(
            b.render(&chat, true, None).unwrap(),
            a.render(&chat, true, None).unwrap()
        ),
        (None, None) => {}
        _ => panic!("one has a chat template, the other not"),
    }
    let ids = g.tokenizer.encode(text, true).unwrap();
    assert!(ids.len() > 8);
    let (a, b) = (logits(g, &ids), logits(h, &ids));
    let d = a
        .iter()
        .zip(&b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    eprintln!("logits max abs diff {d:.3e} over {} rows", ids.len());
    assert!(d <= tol, "logits differ by {d}");
}

/// The Qwen3.5 hybrid: its f32 weights come back as they are but for A_log, whose
/// exp(ln(·)) round trip moves −exp(A_log) by an ulp or so (measured: bitwise equal logits);
/// bound 1e-5 on logits of std ≈ 3.
#[test]
fn a_qwen35_gguf_exports_as_the_same_model() {
    let (g, h, _dir) = both("tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf");
    same_model(&g, &h, "def fibonacci(n):\n    return", 1e-5);
}

/// Llama with SentencePiece: F16 weights stay F16 and the Q/K rows are taken back to Hugging
/// Face's order, so the logits are the same computation (bound 1e-5); the SentencePiece
/// tokenizer (byte fallback, BOS added) gives SentencePiece's ids through tokenizer.json.
#[test]
fn a_sentencepiece_llama_gguf_exports_as_the_same_model() {
    let (g, h, dir) = both("tests/data/llama-tiny-spm-gguf/llama-tiny-spm-f16.gguf");
    same_model(&g, &h, "The quick brown fox jumps over the lazy dog.", 1e-5);
    let exp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo("tests/data/llama-tiny-spm-gguf/expected.json")).unwrap(),
    )
    .unwrap();
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(h.tokenizer.encode(text, false).unwrap(), want, "{text:?}");
    }
    // The exported weights are F16 as in the file, not widened.
    let st = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let q = st.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), safetensors::Dtype::F16);
}

/// Every supported architecture's config survives `to_hf_json` → `from_hf_json`, from Hugging
/// Face files and from GGUF metadata.
#[test]
fn configs_round_trip_through_config_json() {
    let mut cfgs: Vec<(String, ModelConfig)> = Vec::new();
    for dir in [
        "tests/data/llama-tiny",
        "tests/data/qwen2-tiny",
        "tests/data/qwen3-tiny",
        "../shared/fixtures/qwen35-tiny",
        "models/yomi-code-hybrid",
    ] {
        let cfg = ModelConfig::from_hf_dir(&repo(dir)).expect(dir);
        cfgs.push((dir.to_string(), cfg));
    }
    for file in [
        "tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf",
        "tests/data/llama-tiny-spm-gguf/llama-tiny-spm-f16.gguf",
    ] {
        let f = yomi_models::gguf::GgufFile::open(repo(file)).expect(file);
        let cfg = yomi_models::gguf_source::config_from_gguf(&f).expect(file);
        cfgs.push((file.to_string(), cfg));
    }
    for (what, cfg) in cfgs {
        let back = ModelConfig::from_hf_json(&cfg.to_hf_json()).expect(&what);
        assert_eq!(back, cfg, "{what}");
    }
}

/// A file that is not a model leaves nothing behind in the directory it was to fill but what
/// was written before the error, and says which file.
#[test]
fn a_broken_gguf_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00 not really").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let e = export_hf_dir(&bad, &out, &mut |_, _| {}).expect_err("refused");
    assert!(format!("{e:#}").contains("bad.gguf"), "{e:#}");
}

/// Shards: the weights split over several safetensors files with their index (here shards of
/// 256 KiB; a real export cuts at 2 GiB) load as the same model, bitwise.
#[test]
fn sharded_weights_load_as_the_same_model() {
    use yomi_models::Model;
    use yomi_models::gguf::GgufFile;
    use yomi_models::gguf_export::export_weights_in_shards;
    use yomi_models::safetensors_dir::SafetensorsDir;
    let path = repo("tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf");
    let file = GgufFile::open(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    export_weights_in_shards(&file, dir.path(), 256 << 10, &mut |_, _| {}).unwrap();
    let shards = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".safetensors")
        })
        .count();
    assert!(shards >= 3, "{shards} shards");
    assert!(dir.path().join("model.safetensors.index.json").exists());
    let cfg = ModelConfig::from_hf_dir(dir.path()).unwrap();
    let src = SafetensorsDir::open(dir.path()).unwrap();
    let h = Model::load(cfg, &src, &mut |_, _| {}).unwrap();
    let g = load(&path);
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 % 500 + 5) as u32).collect();
    let mut st = State::new(&h.cfg, 64, KvDtype::F32);
    let mut a = Vec::new();
    h.forward(
        &mut st,
        &ids,
        &TreeBatch::chain(ids.len()),
        LogitRows::All,
        &mut a,
    )
    .unwrap();
    assert!(
        a == logits(&g, &ids),
        "the sharded export computes otherwise"
    );
}

/// A quantized file exports its weights' exact values as f32 and names its block types, which
/// `yomi quantize` reports (its weights get rounded twice).
#[test]
fn a_quantized_gguf_names_its_block_types() {
    let path = repo("tests/data/qwen35-tiny-gguf/qwen35-tiny-q5.gguf");
    let dir = tempfile::tempdir().unwrap();
    let r = export_hf_dir(&path, dir.path(), &mut |_, _| {}).expect("export");
    assert_eq!(r.quantized_types, ["Q5_0", "Q5_1"]);
    let st = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let q = st.tensor("model.layers.3.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), safetensors::Dtype::F32);
    load(dir.path());
}

/// A Qwen3.5 file with its MTP block (llama.cpp's `blk.4.nextn.*` and layer 4;
/// tests/data/qwen35-tiny-gguf/qwen35-tiny-mtp-f16.gguf, qwen35-tiny with mtp-tiny's random
/// block): the block comes out under `mtp.*` and loads from the directory with exactly the
/// weights it has in the file, and the trunk is the same model.
#[test]
fn a_gguf_mtp_block_exports_under_mtp_names() {
    use yomi_models::gguf::GgufFile;
    use yomi_models::gguf_source::{GgufSource, config_from_gguf};
    use yomi_models::mtp::{Mtp, MtpNames};
    use yomi_models::safetensors_dir::SafetensorsDir;
    let (g, h, dir) = both("tests/data/qwen35-tiny-gguf/qwen35-tiny-mtp-f16.gguf");
    same_model(&g, &h, "def fibonacci(n):\n    return", 1e-5);
    assert_eq!(h.model.cfg.mtp_layers, 1);
    let file =
        GgufFile::open(repo("tests/data/qwen35-tiny-gguf/qwen35-tiny-mtp-f16.gguf")).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let from_gguf = Mtp::load(&cfg, &GgufSource::new(&file, &cfg), MtpNames::Gguf).unwrap();
    let src = SafetensorsDir::open(dir.path()).unwrap();
    let from_dir = Mtp::load(&h.model.cfg, &src, MtpNames::HuggingFace).unwrap();
    let values = |m: &yomi_weights::Matrix| {
        let mut buf = vec![0.0f32; m.cols];
        (0..m.rows)
            .flat_map(|r| m.row_f32(r, &mut buf).to_vec())
            .collect::<Vec<f32>>()
    };
    assert!(values(&from_dir.fc_embed) == values(&from_gguf.fc_embed));
    assert!(values(&from_dir.fc_hidden) == values(&from_gguf.fc_hidden));
    assert!(from_dir.norm_embed == from_gguf.norm_embed);
    assert!(from_dir.norm_hidden == from_gguf.norm_hidden);
    assert!(from_dir.norm == from_gguf.norm);
    let (a, b) = (&from_dir.layers[0], &from_gguf.layers[0]);
    for (x, y) in a.matrices().into_iter().zip(b.matrices()) {
        assert!(values(x) == values(y), "an MTP layer matrix differs");
    }
    assert!(a.input_norm == b.input_norm && a.post_norm == b.post_norm);
}
