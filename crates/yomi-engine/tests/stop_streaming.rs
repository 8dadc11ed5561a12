//! Streamed text is exactly the final text, also with stop strings: text that may begin a
//! stop string is held back until it is known not to, so a stop string that arrives over
//! several tokens never reaches the stream in part.

use std::path::PathBuf;

use yomi_core::SamplerParams;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, FinishReason, GenerateParams, Generation};

fn engine() -> Engine {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/llama-tiny");
    let opts = EngineOptions {
        context_size: Some(512),
        threads: None,
        ..Default::default()
    };
    Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine")
}

fn run(e: &Engine, ids: &[u32], stop: &[String], draft: DraftMode) -> (Generation, String) {
    let p = GenerateParams {
        max_tokens: 40,
        sampler: SamplerParams::greedy(),
        stop: stop.to_vec(),
        draft,
        draft_budget: 8,
    };
    let mut st = e.new_state();
    let mut streamed = String::new();
    let g = e
        .generate(&mut st, ids, &p, StatsRecorder::start(), &mut |t: &str| {
            streamed.push_str(t);
            true
        })
        .expect("generate");
    (g, streamed)
}

#[test]
fn streamed_text_is_the_final_text_with_stop_strings() {
    let e = engine();
    let ids: Vec<u32> = (0..30).map(|i| 5 + (i * 37 % 400) as u32).collect();
    for draft in [DraftMode::None, DraftMode::Suffix] {
        let (full, streamed) = run(&e, &ids, &[], draft);
        assert_eq!(streamed, full.text);
        let text = full.text.clone();
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        assert!(chars.len() > 12, "{text:?}");
        let mut checked = 0;
        for start in [1usize, 3, 5, 8] {
            for len in [2usize, 3, 5] {
                let (a, _) = chars[start];
                let b = chars.get(start + len).map_or(text.len(), |c| c.0);
                let stop = text[a..b].to_string();
                let (g, streamed) = run(&e, &ids, std::slice::from_ref(&stop), draft);
                let want = &text[..text.find(&stop).expect("present")];
                assert_eq!(g.text, want, "stop {stop:?}");
                assert_eq!(streamed, want, "stop {stop:?}: the stream differs");
                assert_eq!(g.finish_reason, FinishReason::Stop);
                checked += 1;
            }
        }
        assert_eq!(checked, 12);
        // A stop string whose start ends the output but that never completes: everything
        // held back comes out at the end.
        let tail: String = chars[chars.len() - 2..].iter().map(|c| c.1).collect();
        let stop = format!("{tail}\u{1F980}never");
        let (g, streamed) = run(&e, &ids, &[stop, "\u{1F980}".into()], draft);
        assert_eq!(g.text, text);
        assert_eq!(streamed, text);
    }
}
