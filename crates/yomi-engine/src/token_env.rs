//! The bytes each token id stands for, as a grammar engine sees a vocabulary: the `toktrie`
//! token environment that `llguidance` computes its masks over, built from yomi's own
//! [`TextTokenizer`] (not from `toktrie_hf_tokenizers`, which would pull in a second copy of
//! `tokenizers`).
//!
//! A token's bytes are what the tokenizer's decoder makes of it, token by token:
//!
//! - **Byte-level BPE** (GPT-2, SmolLM2, Qwen, Llama 3): every character of the token string
//!   stands for one byte through GPT-2's byte↔unicode table; a string with a character outside
//!   the table (an added token such as `<tool_call>` written as plain text) is its own UTF-8,
//!   exactly as the `ByteLevel` decoder treats it.
//! - **SentencePiece** (`▁` for a space, `<0xNN>` byte fallback; GGUF `llama` vocabularies and
//!   HF conversions of SentencePiece models): `<0xNN>` is the byte NN, anything else is its
//!   UTF-8 with the space mark turned into a space. The decoder's `Strip` of the text's first
//!   space is a property of where a text starts, not of the token, so it is not applied here.
//! - **Special tokens** (added tokens marked special: `<|im_end|>`, `<s>`, control tokens of a
//!   GGUF) are `0xFF` followed by their name, the marker `toktrie` reserves for them, so no
//!   text can spell one; a grammar names them explicitly (`<|im_end|>` or `<[id]>`).
//!
//! Ids the model's logits have but the tokenizer does not know are empty: no grammar allows
//! them. The end-of-sequence set is the engine's EOS ids, which a grammar allows where it may
//! finish.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::{Result, bail};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use serde_json::Value;

use crate::tokenizer::TextTokenizer;

/// How a vocabulary spells bytes in its token strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// GPT-2's byte↔unicode table (`ByteLevel` decoder).
    ByteLevel,
    /// SentencePiece: `space` stands for a space, `<0xNN>` for a byte (`ByteFallback`).
    SentencePiece { space: char },
}

impl Spelling {
    /// The spelling a tokenizer's decoder undoes; an error names a decoder yomi cannot read
    /// bytes from (then constrained decoding is not available for the model).
    pub fn of(tok: &TextTokenizer) -> Result<Spelling> {
        let Some(decoder) = tok.inner().get_decoder() else {
            bail!("the tokenizer has no decoder, so its tokens' bytes are unknown");
        };
        let json = serde_json::to_value(decoder)?;
        let mut parts = Vec::new();
        flatten(&json, &mut parts);
        let kind = |t: &str| parts.iter().any(|p| p["type"] == t);
        if kind("ByteLevel") {
            return Ok(Spelling::ByteLevel);
        }
        // The mark the decoder turns into a space: a `Replace` to " ", or `Metaspace`'s.
        let space = parts.iter().find_map(|p| match p["type"].as_str() {
            Some("Replace") if p["content"] == " " => single_char(&p["pattern"]["String"]),
            Some("Metaspace") => single_char(&p["replacement"]),
            _ => None,
        });
        if kind("ByteFallback") || kind("Metaspace") {
            return Ok(Spelling::SentencePiece {
                space: space.unwrap_or('\u{2581}'),
            });
        }
        let names: Vec<&str> = parts.iter().filter_map(|p| p["type"].as_str()).collect();
        bail!(
            "cannot tell the bytes of this tokenizer's tokens (decoder {names:?}; byte-level BPE \
             and SentencePiece vocabularies are supported)"
        )
    }
}

fn single_char(v: &Value) -> Option<char> {
    let mut it = v.as_str()?.chars();
    let c = it.next()?;
    it.next().is_none().then_some(c)
}

/// A decoder's parts in order (a `Sequence` is opened).
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v["decoders"].as_array() {
        Some(list) if v["type"] == "Sequence" => list.iter().for_each(|d| flatten(d, out)),
        _ => out.push(v),
    }
}

/// GPT-2's table from the printable characters byte-level vocabularies use back to bytes:
/// the printable Latin-1 bytes stand for themselves, the other 68 bytes, in order, for
/// U+0100 onwards.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
            (c, b)
        })
        .collect()
}

/// Every id's bytes, `vocab` ids (the model's logits width): see the module notes.
pub fn token_bytes(tok: &TextTokenizer, vocab: usize) -> Result<Vec<Vec<u8>>> {
    let spelling = Spelling::of(tok)?;
    let specials: HashSet<u32> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    let table = byte_level_table();
    let mut out = Vec::with_capacity(vocab);
    for id in 0..vocab as u32 {
        let Some(s) = tok.id_to_token(id) else {
            out.push(Vec::new());
            continue;
        };
        if specials.contains(&id) {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(s.as_bytes());
            out.push(b);
            continue;
        }
        out.push(match spelling {
            Spelling::ByteLevel => s
                .chars()
                .map(|c| table.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| s.as_bytes().to_vec()),
            Spelling::SentencePiece { space } => match byte_fallback(&s) {
                Some(b) => vec![b],
                None => s.replace(space, " ").into_bytes(),
            },
        });
    }
    Ok(out)
}

/// `<0xNN>` (two hex digits) is the byte NN.
fn byte_fallback(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The token environment of a vocabulary: the trie of its tokens' bytes with the EOS ids.
struct YomiTokEnv {
    trie: TokTrie,
}

impl TokenizerEnv for YomiTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Greedy longest-match over the trie. llguidance uses this only to force text as tokens
    /// (not enabled here) and for prompts given to the parser (none are), so it need not be
    /// the tokenizer's own segmentation; `tokenize_is_canonical` says so.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The `toktrie` environment for `tok` over `vocab` ids with `eos` as the end-of-sequence set.
pub fn tok_env(tok: &TextTokenizer, vocab: usize, eos: &[u32]) -> Result<TokEnv> {
    let words = token_bytes(tok, vocab)?;
    let Some(&first) = eos.first() else {
        bail!("the model declares no end-of-sequence token, so a grammar could not end");
    };
    if let Some(&bad) = eos.iter().find(|&&e| e as usize >= vocab) {
        bail!("end-of-sequence id {bad} is outside the vocabulary of {vocab} tokens");
    }
    let vocab_u32 = u32::try_from(vocab)?;
    let info = TokRxInfo::new(vocab_u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    Ok(Arc::new(YomiTokEnv { trie }))
}

#[cfg(test)]
#[path = "../../../tests/support/smollm2.rs"]
mod smollm2;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use super::smollm2;

    fn repo(p: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(p)
    }

    fn gguf_tokenizer(path: PathBuf) -> TextTokenizer {
        let f = yomi_models::gguf::GgufFile::open(&path).expect("open the GGUF");
        crate::gguf_model::tokenizer_from_gguf(&f).expect("its tokenizer")
    }

    /// Texts with spaces at the start, runs of spaces and newlines, tabs, digits, accents,
    /// CJK, an emoji (byte tokens or byte-level pieces of a 4-byte character), JSON and code.
    const SENTENCES: [&str; 8] = [
        "The quick brown fox jumps over the lazy dog.",
        "  two leading spaces,\n\nblank lines\tand a tab",
        "café naïve façade — déjà vu",
        "日本語のテキスト and 中文",
        "emoji 🎉🚀 in text",
        r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}"#,
        "def f(x):\n    return x * 2 + 10\n",
        "<tool_call>\n<function=f>\n</function>\n</tool_call>",
    ];

    /// The text the tokenizer's decoder makes of `ids`, against the concatenated bytes: for
    /// SentencePiece the decoder drops the text's first space (its `Strip`), which belongs to
    /// where a text starts, not to a token.
    fn check(tok: &TextTokenizer, bytes: &[Vec<u8>], ids: &[u32], what: &str) {
        let concat: Vec<u8> = ids
            .iter()
            .flat_map(|&i| bytes[i as usize].clone())
            .collect();
        let mut want = String::from_utf8_lossy(&concat).into_owned();
        if let Ok(Spelling::SentencePiece { .. }) = Spelling::of(tok)
            && want.starts_with(' ')
        {
            want.remove(0);
        }
        let got = tok.decode(ids, false).expect("decode");
        assert_eq!(got, want, "{what}: ids {ids:?}");
    }

    /// For every sentence, the bytes of its tokens are exactly the sentence, and decoding them
    /// agrees; for random runs of ordinary ids, the concatenated bytes decode as the tokenizer
    /// decodes them. Special tokens are the marker and their name.
    fn round_trips(tok: &TextTokenizer, vocab: usize, spm_bytes_in_random: bool) {
        let bytes = token_bytes(tok, vocab).expect("token bytes");
        assert_eq!(bytes.len(), vocab);
        let spm = matches!(Spelling::of(tok), Ok(Spelling::SentencePiece { .. }));
        for s in SENTENCES {
            let ids = tok.encode(s, false).expect("encode");
            let concat: Vec<u8> = ids
                .iter()
                .flat_map(|&i| bytes[i as usize].clone())
                .collect();
            // SentencePiece puts a space before the text (its prefix space).
            let text = if spm { format!(" {s}") } else { s.to_string() };
            assert_eq!(String::from_utf8_lossy(&concat), text, "{s:?}: {ids:?}");
            assert_eq!(concat, text.as_bytes(), "{s:?}");
            check(tok, &bytes, &ids, s);
        }
        let specials: HashSet<u32> = tok
            .inner()
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| {
                let mut want = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                want.extend_from_slice(t.content.as_bytes());
                assert_eq!(bytes[id as usize], want, "special {id}");
                id
            })
            .collect();
        assert!(!specials.is_empty(), "the vocabulary has special tokens");
        // Ordinary ids only: a special's decoded name is not its bytes, and SentencePiece's
        // decoder writes one U+FFFD per byte of a bad byte-token run where a lossy read of
        // the bytes writes one per bad sequence.
        let ordinary: Vec<u32> = (0..vocab as u32)
            .filter(|i| !specials.contains(i))
            .filter(|&i| spm_bytes_in_random || bytes[i as usize].len() != 1 || !spm)
            .filter(|&i| !bytes[i as usize].is_empty())
            .collect();
        let mut r = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..300 {
            let n = 1 + round % 12;
            let ids: Vec<u32> = (0..n)
                .map(|_| {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    ordinary[(r % ordinary.len() as u64) as usize]
                })
                .collect();
            check(tok, &bytes, &ids, &format!("random round {round}"));
        }
    }

    #[test]
    fn byte_level_fixture_tokenizer_round_trips() {
        let tok = TextTokenizer::from_file(repo("../shared/fixtures/qwen35-tiny/tokenizer.json"))
            .expect("fixture tokenizer");
        assert_eq!(Spelling::of(&tok).unwrap(), Spelling::ByteLevel);
        round_trips(&tok, 512, true);
        // The model's logits may be wider than the vocabulary: the extra ids have no bytes.
        let bytes = token_bytes(&tok, 520).unwrap();
        assert!(bytes[512..].iter().all(Vec::is_empty));
    }

    #[test]
    fn smollm2_gguf_tokenizer_round_trips() {
        let tok = gguf_tokenizer(smollm2::gguf_path());
        assert_eq!(Spelling::of(&tok).unwrap(), Spelling::ByteLevel);
        round_trips(&tok, tok.vocab_size(), true);
    }

    #[test]
    fn sentencepiece_gguf_tokenizer_round_trips() {
        let tok = gguf_tokenizer(repo(
            "tests/data/llama-tiny-spm-gguf/llama-tiny-spm-f16.gguf",
        ));
        assert!(matches!(
            Spelling::of(&tok).unwrap(),
            Spelling::SentencePiece { space: '\u{2581}' }
        ));
        round_trips(&tok, tok.vocab_size(), false);
        // Byte tokens are their byte.
        let bytes = token_bytes(&tok, tok.vocab_size()).unwrap();
        let nl = tok.token_to_id("<0x0A>").expect("a newline byte token");
        assert_eq!(bytes[nl as usize], b"\n");
    }

    #[test]
    fn qwen35_gguf_tokenizer_round_trips() {
        let tok = gguf_tokenizer(repo("tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf"));
        round_trips(&tok, tok.vocab_size(), true);
    }

    #[test]
    fn the_environment_knows_eos_and_refuses_a_vocabulary_without_one() {
        let tok = TextTokenizer::from_file(repo("../shared/fixtures/qwen35-tiny/tokenizer.json"))
            .expect("fixture tokenizer");
        let env = tok_env(&tok, 512, &[2, 0]).expect("env");
        assert_eq!(env.tok_trie().eos_tokens(), &[2, 0]);
        assert_eq!(env.tok_trie().vocab_size(), 512);
        let err = tok_env(&tok, 512, &[]).err().expect("no EOS");
        assert!(format!("{err}").contains("end-of-sequence"), "{err}");
        assert!(tok_env(&tok, 512, &[600]).is_err());
    }
}
