//! Text ↔ token ids (DESIGN §2): a thin wrapper over Hugging Face `tokenizers`, plus a streaming
//! detokenizer that turns generated ids into text deltas as they arrive.

use std::path::Path;

use anyhow::{Context, Result, anyhow};

/// A tokenizer for one model: `tokenizer.json` from an HF directory, or one built from GGUF
/// metadata by the loader (`from_tokenizer`).
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`. The error names the file when it is missing or not a valid
    /// tokenizer.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read tokenizer file {}", path.display()))?;
        Self::from_json_bytes(&bytes)
            .with_context(|| format!("invalid tokenizer file {}", path.display()))
    }

    /// Parses the JSON text of a `tokenizer.json`.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| anyhow!("cannot parse tokenizer JSON: {e}"))?;
        Ok(Self { inner })
    }

    /// Wraps a tokenizer built elsewhere (e.g. from GGUF vocab and merges).
    pub fn from_tokenizer(inner: tokenizers::Tokenizer) -> Self {
        Self { inner }
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Text → ids. `add_special_tokens` runs the tokenizer's post-processor (BOS etc.), as
    /// Python's `tokenizer.encode(text)` does by default. Special-token strings in the text
    /// (e.g. `<|im_start|>` from a chat template) are always recognised as single tokens.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| anyhow!("tokenizer failed to encode text: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids → text. `skip_special` drops special tokens (`<|im_end|>`, …) from the output.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("tokenizer failed to decode {} ids: {e}", ids.len()))
    }

    /// The id of a token string (vocabulary entry or added token), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id, if any.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Above this many ids waiting behind an incomplete character, the pending text is emitted
/// anyway (with its U+FFFD): no valid UTF-8 character needs more than 4 byte-level tokens, so
/// the bytes are genuinely invalid and holding them back would only grow the window.
const MAX_PENDING_IDS: usize = 8;

/// How many trailing context ids [`StreamDecoder::with_context`] keeps (vLLM uses 5).
const CONTEXT_IDS: usize = 5;

/// Streaming detokenizer: feed generated ids one at a time and get the newly completed text.
///
/// Keeps a short window of recent ids. Each step decodes the window and diffs it against the
/// decoded text of the window's already-emitted prefix (the approach of HF's `DecodeStream` and
/// vLLM's incremental detokenizer), so decoders that depend on neighbouring tokens (byte-level
/// BPE splitting a multi-byte character, SentencePiece leading spaces) come out right. Text is
/// held back while it ends in U+FFFD (an incomplete UTF-8 sequence).
///
/// Concatenating every `push` delta and the final `flush` gives `decode(all_ids)`.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    skip_special: bool,
    /// The window: ids from `prefix_index` context tokens on.
    ids: Vec<u32>,
    /// `ids[..prefix_index]` is context whose text (`prefix`) has been emitted already.
    prefix_index: usize,
    /// Decoded text of `ids[..prefix_index]`.
    prefix: String,
    /// Ids pushed since the last emitted delta.
    pending: usize,
    /// Decoded text of the whole window at the last `push` that emitted nothing.
    last_text: Option<String>,
}

impl StreamDecoder {
    /// A decoder for a fresh output. `skip_special` as in [`TextTokenizer::decode`].
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            ..Self::default()
        }
    }

    /// A decoder whose output continues `context` (e.g. the prompt): the last few context ids
    /// seed the window so the first generated token is decoded as a continuation (this matters
    /// for decoders that strip a leading space at the start of a text). No context text is
    /// emitted.
    pub fn with_context(tok: &TextTokenizer, context: &[u32], skip_special: bool) -> Result<Self> {
        let start = context.len().saturating_sub(CONTEXT_IDS);
        let ids = context[start..].to_vec();
        let prefix = tok.decode(&ids, skip_special)?;
        Ok(Self {
            skip_special,
            prefix_index: ids.len(),
            ids,
            prefix,
            pending: 0,
            last_text: None,
        })
    }

    /// Adds one id; returns the text it completed, or `None` while the text is incomplete or
    /// empty (e.g. a skipped special token).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        self.pending += 1;
        let text = tok.decode(&self.ids, self.skip_special)?;
        let complete = !text.ends_with('\u{FFFD}') || self.pending > MAX_PENDING_IDS;
        if text.len() > self.prefix.len() && complete {
            let delta = match text.strip_prefix(self.prefix.as_str()) {
                Some(d) => d.to_string(),
                // The decoder rewrote the context (should not happen with a context window);
                // emit the part after the common prefix rather than fail.
                None => text[common_prefix_len(&self.prefix, &text)..].to_string(),
            };
            // The emitted tokens become the context of the next step; older context is dropped.
            self.ids.drain(..self.prefix_index);
            self.prefix_index = self.ids.len();
            self.prefix = tok.decode(&self.ids, self.skip_special)?;
            self.pending = 0;
            self.last_text = None;
            Ok(Some(delta))
        } else {
            self.last_text = Some(text);
            Ok(None)
        }
    }

    /// Emits what is still held back (an incomplete character comes out as U+FFFD, as a full
    /// decode would) and resets the pending state. Call once when generation stops.
    pub fn flush(&mut self) -> Option<String> {
        let text = self.last_text.take()?;
        self.pending = 0;
        if text.len() <= self.prefix.len() {
            return None;
        }
        let start = if text.starts_with(self.prefix.as_str()) {
            self.prefix.len()
        } else {
            common_prefix_len(&self.prefix, &text)
        };
        let delta = text[start..].to_string();
        self.prefix = text;
        self.prefix_index = self.ids.len();
        if delta.is_empty() { None } else { Some(delta) }
    }
}

/// Byte length of the longest common prefix of `a` and `b` that ends on a char boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/qwen35-tiny"
    );

    fn fixture_tokenizer() -> TextTokenizer {
        TextTokenizer::from_file(format!("{FIXTURE}/tokenizer.json")).expect("fixture tokenizer")
    }

    fn reference_prompt() -> (String, Vec<u32>) {
        let json = std::fs::read_to_string(format!("{FIXTURE}/reference.json")).expect("json");
        let v: serde_json::Value = serde_json::from_str(&json).expect("parse");
        let text = v["prompt_text"].as_str().expect("prompt_text").to_string();
        let bytes = std::fs::read(format!("{FIXTURE}/reference.safetensors")).expect("st");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let t = st.tensor("prompt_ids").expect("prompt_ids");
        assert_eq!(t.dtype(), safetensors::Dtype::I64);
        let ids = t
            .data()
            .chunks_exact(8)
            .map(|c| {
                let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
                u32::try_from(v).expect("id fits u32")
            })
            .collect();
        (text, ids)
    }

    fn stream_all(tok: &TextTokenizer, ids: &[u32], skip_special: bool) -> (String, usize) {
        let mut dec = StreamDecoder::new(skip_special);
        let mut out = String::new();
        let mut deltas = 0;
        for &id in ids {
            if let Some(d) = dec.push(tok, id).expect("push") {
                assert!(!d.contains('\u{FFFD}'), "delta with U+FFFD: {d:?}");
                out.push_str(&d);
                deltas += 1;
            }
        }
        if let Some(d) = dec.flush() {
            out.push_str(&d);
        }
        (out, deltas)
    }

    #[test]
    fn encode_matches_reference_prompt_ids() {
        let tok = fixture_tokenizer();
        let (text, ids) = reference_prompt();
        assert!(!ids.is_empty());
        assert_eq!(tok.encode(&text, true).expect("encode"), ids);
        assert_eq!(tok.decode(&ids, false).expect("decode"), text);
    }

    #[test]
    fn special_tokens_and_vocab() {
        let tok = fixture_tokenizer();
        assert_eq!(tok.vocab_size(), 512);
        assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
        assert_eq!(tok.token_to_id("no such token"), None);
        assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
        let ids = tok
            .encode("<|im_start|>user\nhi<|im_end|>", false)
            .expect("encode");
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.last(), Some(&2));
        assert_eq!(tok.decode(&ids, true).expect("decode"), "user\nhi");
        assert_eq!(
            tok.decode(&ids, false).expect("decode"),
            "<|im_start|>user\nhi<|im_end|>"
        );
    }

    #[test]
    fn from_file_errors_name_the_file() {
        let missing = format!("{FIXTURE}/no-such-tokenizer.json");
        let err = format!("{:#}", TextTokenizer::from_file(&missing).unwrap_err());
        assert!(err.contains("no-such-tokenizer.json"), "{err}");
        let bad = format!("{FIXTURE}/config.json"); // valid JSON, not a tokenizer
        let err = format!("{:#}", TextTokenizer::from_file(&bad).unwrap_err());
        assert!(err.contains("config.json"), "{err}");
    }

    #[test]
    fn stream_decoder_matches_full_decode_on_prompt() {
        let tok = fixture_tokenizer();
        let (text, ids) = reference_prompt();
        let (streamed, deltas) = stream_all(&tok, &ids, false);
        assert_eq!(streamed, text);
        assert!(deltas > 1);
    }

    #[test]
    fn stream_decoder_handles_split_multibyte_chars() {
        let tok = fixture_tokenizer();
        let text = "héllo wörld 日本語 🎉";
        let ids = tok.encode(text, false).expect("encode");
        assert_eq!(tok.decode(&ids, false).expect("decode"), text);
        // The tiny vocabulary must split some character over several tokens for this test to
        // mean anything.
        let split = ids.iter().any(|&id| {
            tok.decode(&[id], false)
                .expect("decode")
                .contains('\u{FFFD}')
        });
        assert!(split, "no token splits a character");
        let (streamed, _) = stream_all(&tok, &ids, false);
        assert_eq!(streamed, text);
    }

    #[test]
    fn stream_decoder_specials_and_incomplete_tail() {
        let tok = fixture_tokenizer();
        let mut ids = vec![1];
        ids.extend(tok.encode("a 🎉 b", false).expect("encode"));
        ids.push(2);
        for skip in [false, true] {
            let (streamed, _) = stream_all(&tok, &ids, skip);
            assert_eq!(streamed, tok.decode(&ids, skip).expect("decode"));
        }
        // Stop in the middle of the emoji: flush emits the replacement char a full decode gives.
        let emoji = tok.encode("🎉", false).expect("encode");
        assert!(emoji.len() > 1);
        let cut = &emoji[..emoji.len() - 1];
        let (streamed, _) = {
            let mut dec = StreamDecoder::new(false);
            let mut out = String::new();
            for &id in cut {
                assert_eq!(dec.push(&tok, id).expect("push"), None);
            }
            out.push_str(&dec.flush().expect("flush text"));
            (out, 0)
        };
        assert_eq!(streamed, tok.decode(cut, false).expect("decode"));
        assert!(streamed.ends_with('\u{FFFD}'));
    }

    #[test]
    fn stream_decoder_with_context() {
        let tok = fixture_tokenizer();
        let (_, ids) = reference_prompt();
        let (prompt, generated) = ids.split_at(ids.len() / 2);
        let mut dec = StreamDecoder::with_context(&tok, prompt, false).expect("ctx");
        let mut out = String::new();
        for &id in generated {
            if let Some(d) = dec.push(&tok, id).expect("push") {
                out.push_str(&d);
            }
        }
        if let Some(d) = dec.flush() {
            out.push_str(&d);
        }
        let full = tok.decode(&ids, false).expect("decode");
        let head = tok.decode(prompt, false).expect("decode");
        assert_eq!(format!("{head}{out}"), full);
    }
}
