//! Loading into a weight sink (`Model::load_into`, how a model streams to a GPU): the sink sees
//! the parts in order with exactly the weights a plain load gives, even though the source drops
//! its file pages after each layer; the model comes back without host matrices.

mod common;

use anyhow::Result;
use yomi_models::gguf::GgufFile;
use yomi_models::gguf_source::{GgufSource, config_from_gguf};
use yomi_models::loader::{load_hf_dir, load_hf_dir_into};
use yomi_models::model::{Layer, Mixer, WeightSink};
use yomi_models::{Model, ModelConfig};
use yomi_weights::{Matrix, Rope};

/// Every matrix of a layer, as f32 rows.
fn layer_values(l: &Layer) -> Vec<Vec<f32>> {
    let mut ms: Vec<&Matrix> = match &l.mixer {
        Mixer::Attention(a) => vec![&a.q, &a.k, &a.v, &a.o],
        Mixer::Gdn(g) => vec![&g.qkv, &g.z, &g.b, &g.a, &g.out],
    };
    ms.extend([&l.mlp.gate, &l.mlp.up, &l.mlp.down]);
    ms.into_iter().map(values).collect()
}

fn values(m: &Matrix) -> Vec<f32> {
    let mut buf = vec![0.0; m.cols];
    (0..m.rows)
        .flat_map(|r| m.row_f32(r, &mut buf).to_vec())
        .collect()
}

/// Records what a sink is given.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
    embed: Vec<f32>,
    layers: Vec<Vec<Vec<f32>>>,
    head: Option<Vec<f32>>,
}

impl WeightSink for Recorder {
    fn begin(&mut self, cfg: &ModelConfig) -> Result<()> {
        self.calls.push(format!("begin {}", cfg.num_layers));
        Ok(())
    }
    fn embed(&mut self, embed: &Matrix) -> Result<()> {
        self.calls.push("embed".into());
        self.embed = values(embed);
        Ok(())
    }
    fn layer(&mut self, i: usize, layer: &Layer) -> Result<()> {
        self.calls.push(format!("layer {i}"));
        self.layers.push(layer_values(layer));
        Ok(())
    }
    fn head(&mut self, _norm: &[f32], lm_head: Option<&Matrix>, _rope: &Rope) -> Result<()> {
        self.calls.push("head".into());
        self.head = lm_head.map(values);
        Ok(())
    }
}

fn check(plain: &Model, streamed: &Model, rec: &Recorder) {
    let n = plain.layers.len();
    let mut want = vec![format!("begin {n}"), "embed".into()];
    want.extend((0..n).map(|i| format!("layer {i}")));
    want.push("head".into());
    assert_eq!(rec.calls, want, "the sink's calls");
    assert!(rec.embed == values(&plain.embed), "the embedding");
    for (i, l) in plain.layers.iter().enumerate() {
        assert!(rec.layers[i] == layer_values(l), "layer {i}");
    }
    assert!(
        rec.head == plain.lm_head.as_deref().map(values),
        "the LM head"
    );
    assert!(streamed.host_matrices_released);
    assert_eq!(streamed.weight_bytes(), 0, "host matrices left");
    // The norms and other vectors stay on the host.
    assert_eq!(streamed.final_norm, plain.final_norm);
}

#[test]
fn a_sink_gets_every_part_in_order_from_a_gguf() {
    let path = common::test_data("qwen35-tiny-gguf").join("qwen35-tiny-f32.gguf");
    let f = GgufFile::open(&path).expect("open GGUF");
    let cfg = config_from_gguf(&f).expect("config");
    let plain = Model::load(cfg.clone(), &GgufSource::new(&f, &cfg), &mut |_, _| {}).unwrap();
    let mut rec = Recorder::default();
    let streamed = Model::load_into(
        cfg.clone(),
        &GgufSource::new(&f, &cfg),
        &mut |_, _| {},
        Some(&mut rec),
    )
    .unwrap();
    check(&plain, &streamed, &rec);
}

#[test]
fn a_sink_gets_every_part_in_order_from_safetensors() {
    let dir = common::test_data("llama-tiny");
    let plain = load_hf_dir(&dir, &mut |_, _| {}).unwrap();
    let mut rec = Recorder::default();
    let streamed = load_hf_dir_into(&dir, &mut |_, _| {}, Some(&mut rec)).unwrap();
    check(&plain, &streamed, &rec);
}

/// A sink that refuses the model stops the load before any weight is read.
#[test]
fn a_refusing_sink_stops_the_load() {
    struct No;
    impl WeightSink for No {
        fn begin(&mut self, _: &ModelConfig) -> Result<()> {
            anyhow::bail!("this device cannot run it")
        }
        fn embed(&mut self, _: &Matrix) -> Result<()> {
            panic!("read after a refusal")
        }
        fn layer(&mut self, _: usize, _: &Layer) -> Result<()> {
            panic!("read after a refusal")
        }
        fn head(&mut self, _: &[f32], _: Option<&Matrix>, _: &Rope) -> Result<()> {
            panic!("read after a refusal")
        }
    }
    let e = load_hf_dir_into(
        &common::test_data("llama-tiny"),
        &mut |_, _| {},
        Some(&mut No),
    )
    .err()
    .expect("refused");
    assert!(e.to_string().contains("cannot run it"), "{e}");
}
