//! The qwen35 GGUF made by llama.cpp's converter from the shared qwen35-tiny fixture
//! (tests/data/qwen35-tiny-gguf, tools/fixtures/make_qwen35_gguf.sh) as an engine: its
//! `tokenizer.ggml.*` tokenizer, chat template and stop ids agree with the fixture's own
//! tokenizer.json / tokenizer_config.json.

use std::path::PathBuf;
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, EngineOptions, Prompt};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn engine(path: PathBuf) -> Engine {
    Engine::load(
        &path,
        &EngineOptions {
            context_size: Some(256),
            threads: Some(1),
            ..Default::default()
        },
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("load {}: {e:#}", path.display()))
}

fn prompt_ids(fixture: &std::path::Path) -> Vec<u32> {
    let bytes = std::fs::read(fixture.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

#[test]
fn gguf_tokenizer_encodes_the_fixture_prompt() {
    let fixture = root().join("../shared/fixtures/qwen35-tiny");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let text = json["prompt_text"].as_str().unwrap();
    let gguf = engine(root().join("tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf"));
    let want = prompt_ids(&fixture);
    assert_eq!(gguf.tokenizer.encode(text, false).unwrap(), want);
    assert_eq!(gguf.tokenizer.decode(&want, false).unwrap(), text);

    // Chat prompts (template + special tokens) and stop ids as from the HF directory.
    let hf = engine(fixture.clone());
    for thinking in [None, Some(false)] {
        let chat = Prompt::Chat {
            messages: vec![ChatMessage::user("def f(x):\n    return x")],
            enable_thinking: thinking,
        };
        let ids = gguf.prompt_ids(&chat).unwrap();
        assert_eq!(ids, hf.prompt_ids(&chat).unwrap(), "thinking {thinking:?}");
        assert_eq!(ids[0], 1, "<|im_start|> is one special token");
    }
    assert!(gguf.eos_token_ids.contains(&2), "{:?}", gguf.eos_token_ids);
}
