//! A llama GGUF with a real SentencePiece vocabulary (tokenizer.ggml.model = "llama"), written
//! by llama.cpp's converter (tests/data/llama-tiny-spm-gguf, tools/fixtures/make_spm_gguf.py):
//! the tokenizer yomi builds from its metadata gives SentencePiece's ids for every test string
//! in expected.json and decodes them as Hugging Face does.

use std::path::PathBuf;
use yomi_engine::template::ChatMessage;
use yomi_engine::tokenizer::StreamDecoder;
use yomi_engine::{Engine, EngineOptions, Prompt};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama-tiny-spm-gguf")
}

fn engine() -> Engine {
    let path = dir().join("llama-tiny-spm-f16.gguf");
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

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn encodes_and_decodes_like_sentencepiece() {
    let e = engine();
    let exp = expected();
    assert_eq!(exp["add_bos_token"], true);
    let bos = exp["bos_token_id"].as_u64().unwrap() as u32;
    let cases = exp["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "{}", cases.len());
    let mut failures = Vec::new();
    let mut round_trips = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = e.tokenizer.encode(text, false).unwrap();
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            continue;
        }
        let mut with_bos = vec![bos];
        with_bos.extend(&want);
        let got = e.tokenizer.encode(text, true).unwrap();
        if got != with_bos {
            failures.push(format!("{text:?} with BOS: got {got:?}"));
        }
        let decoded = e.tokenizer.decode(&want, false).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!("{text:?}: decoded to {decoded:?}"));
        }
        if case["sentencepiece_round_trips"] == true {
            round_trips += 1;
            if decoded != text {
                failures.push(format!("{text:?} does not round-trip: {decoded:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(round_trips >= 20, "{round_trips}");
}

/// Characters outside the 512-piece vocabulary come out as `<0xXX>` byte tokens (ids 3..=258
/// in SentencePiece's layout) and decode back; `<unk>` text is the unknown token.
#[test]
fn byte_fallback_and_unknown() {
    let e = engine();
    let t = &e.tokenizer;
    assert_eq!(t.id_to_token(3).as_deref(), Some("<0x00>"));
    let emoji = t.encode("🙂", false).unwrap();
    // "▁" then the four UTF-8 bytes of U+1F642.
    let bytes: Vec<String> = emoji[1..]
        .iter()
        .map(|&i| t.id_to_token(i).unwrap())
        .collect();
    assert_eq!(bytes, ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]);
    assert_eq!(t.decode(&emoji, false).unwrap(), "🙂");
    // A lone lead byte is not UTF-8: it decodes to U+FFFD instead of failing.
    assert_eq!(t.decode(&emoji[1..2], false).unwrap(), "\u{FFFD}");
    assert_eq!(t.encode("<unk>", false).unwrap(), [0]);
    assert_eq!(t.decode(&[0], true).unwrap(), "");
}

/// The GGUF's chat template writes `<s>` as text; it must become the one BOS token, with no
/// second BOS from the post-processor, and `</s>` is the stop token.
#[test]
fn chat_prompt_and_stop_ids() {
    let e = engine();
    let chat = Prompt::Chat {
        messages: vec![ChatMessage::user("hi")],
        enable_thinking: None,
    };
    let ids = e.prompt_ids(&chat).unwrap();
    assert_eq!(ids[0], 1, "{ids:?}");
    assert_ne!(ids[1], 1, "{ids:?}");
    let exp = expected();
    let case = exp["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == "<s>[INST] hi [/INST]")
        .unwrap();
    assert_eq!(ids, self::ids(&case["ids"]));
    assert_eq!(e.prompt_ids(&Prompt::Text("hi".into())).unwrap()[0], 1);
    assert!(e.eos_token_ids.contains(&2), "{:?}", e.eos_token_ids);
}

/// Streaming one id at a time gives the same text as decoding all at once: the decoder's
/// prefix-space strip and byte fallback must not leak into the deltas.
#[test]
fn streaming_decode_matches_whole_decode() {
    let e = engine();
    let exp = expected();
    for case in exp["cases"].as_array().unwrap() {
        let want = ids(&case["ids"]);
        let mut s = StreamDecoder::new(false);
        let mut text = String::new();
        for &id in &want {
            if let Some(delta) = s.push(&e.tokenizer, id).unwrap() {
                text.push_str(&delta);
            }
        }
        text.extend(s.flush());
        assert_eq!(text, case["decoded"].as_str().unwrap(), "{want:?}");
    }
}
