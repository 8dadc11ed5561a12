//! A `tokenizers` tokenizer for a GGUF SentencePiece vocabulary (`tokenizer.ggml.model =
//! "llama"`: Llama 1/2, Mistral, TinyLlama and other SentencePiece BPE models).
//!
//! A GGUF keeps no merges for these: llama.cpp's SPM tokenizer merges adjacent symbols into
//! the vocabulary piece with the highest score (leftmost first on ties), falls back to
//! `<0xXX>` byte tokens for what no piece covers, writes spaces as "▁" and puts a space before
//! each run of text that starts the input or follows a special token. The same thing in
//! `tokenizers` terms is what transformers' SentencePiece→`tokenizer.json` conversion builds: a
//! BPE model with byte fallback whose merges are every split of a normal piece into two normal
//! pieces, ranked by the merged piece's score (then its id); the prefix space and "▁" as a
//! normalizer, which `tokenizers` runs on each stretch of text between added tokens (as
//! llama.cpp prefixes each fragment); and the inverse decoder.

use anyhow::{Result, anyhow, bail};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, Tokenizer};
use yomi_models::gguf::GgufFile;

use crate::tokenizer::TextTokenizer;

/// `tokenizer.ggml.token_type` values (llama.cpp's / gguf-py's `TokenType`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// SentencePiece's word-boundary mark, which stands for a space inside pieces.
const SPACE: &str = "\u{2581}";

/// The SentencePiece vocabulary of a GGUF, checked, as the tokenizer needs it.
struct SpmVocab<'a> {
    tokens: &'a [String],
    scores: Vec<f32>,
    types: Vec<i32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

/// A special id from `key`, or `default` when the key is absent. A present id outside the
/// vocabulary is an error: a wrong BOS would silently corrupt every prompt.
fn special_id(f: &GgufFile, key: &str, n: usize, default: Option<u32>) -> Result<Option<u32>> {
    if f.get(key).is_none() {
        return Ok(default.filter(|&d| (d as usize) < n));
    }
    let id = f.get_u64(key).map_err(|e| anyhow!("{e}"))?;
    if id >= n as u64 {
        bail!("{key} = {id} is outside the vocabulary of {n} tokens");
    }
    Ok(Some(id as u32))
}

/// An optional bool key; a present key of another type is an error, not the default.
fn flag(f: &GgufFile, key: &str, default: bool) -> Result<bool> {
    if f.get(key).is_none() {
        return Ok(default);
    }
    f.get_bool(key).map_err(|e| anyhow!("{e}"))
}

impl<'a> SpmVocab<'a> {
    fn read(f: &'a GgufFile) -> Result<Self> {
        let tokens = f
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(|e| anyhow!("{e}"))?;
        let n = tokens.len();
        if n == 0 {
            bail!("tokenizer.ggml.tokens is empty");
        }
        // Without scores there is no merge order, so no faithful tokenization.
        let scores = f
            .get_f32_array("tokenizer.ggml.scores")
            .map_err(|e| anyhow!("a SentencePiece vocabulary needs its piece scores: {e}"))?
            .into_owned();
        if scores.len() != n {
            bail!(
                "tokenizer.ggml.scores has {} entries for {n} tokens",
                scores.len()
            );
        }
        // llama.cpp treats every token as normal when the types are missing; so do we.
        let types = match f.get("tokenizer.ggml.token_type") {
            None => vec![NORMAL; n],
            Some(_) => f
                .get_i32_array("tokenizer.ggml.token_type")
                .map_err(|e| anyhow!("{e}"))?
                .into_owned(),
        };
        if types.len() != n {
            bail!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            );
        }
        if let Some((i, t)) = types
            .iter()
            .enumerate()
            .find(|(_, t)| !(NORMAL..=BYTE).contains(*t))
        {
            bail!(
                "tokenizer.ggml.token_type[{i}] = {t} (token {:?}) is not a token type (1..=6)",
                tokens[i]
            );
        }
        if let Some(i) = (0..n).find(|&i| types[i] == BYTE && byte_value(&tokens[i]).is_none()) {
            bail!("byte token {i} is {:?}, not of the form <0xXX>", tokens[i]);
        }
        // Defaults are llama.cpp's for SPM vocabularies: <unk> 0, <s> 1, </s> 2, BOS on.
        let first_unknown = types.iter().position(|&t| t == UNKNOWN).map(|i| i as u32);
        Ok(Self {
            tokens,
            scores,
            bos: special_id(f, "tokenizer.ggml.bos_token_id", n, Some(1))?,
            eos: special_id(f, "tokenizer.ggml.eos_token_id", n, Some(2))?,
            unk: special_id(
                f,
                "tokenizer.ggml.unknown_token_id",
                n,
                first_unknown.or(Some(0)),
            )?,
            add_bos: flag(f, "tokenizer.ggml.add_bos_token", true)?,
            add_eos: flag(f, "tokenizer.ggml.add_eos_token", false)?,
            add_space_prefix: flag(f, "tokenizer.ggml.add_space_prefix", true)?,
            types,
        })
    }

    /// Every split of a normal piece into two normal pieces, best merged-piece score first,
    /// then by the merged piece's id (transformers' order for SentencePiece BPE). Only normal
    /// pieces take part: control, byte and unused pieces never come out of a merge.
    fn merges(&self, vocab: &Vocab) -> Vec<(String, String)> {
        let is_normal = |s: &str| {
            vocab
                .get(s)
                .is_some_and(|&id| self.types[id as usize] == NORMAL)
        };
        let mut ranked: Vec<(f32, u32, &str, &str)> = Vec::new();
        for (piece, &id) in vocab {
            if self.types[id as usize] != NORMAL {
                continue;
            }
            for (at, _) in piece.char_indices().skip(1) {
                let (l, r) = piece.split_at(at);
                if is_normal(l) && is_normal(r) {
                    ranked.push((self.scores[id as usize], id, l, r));
                }
            }
        }
        ranked.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(b.2))
                .then(a.3.cmp(b.3))
        });
        ranked
            .into_iter()
            .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
            .collect()
    }
}

/// The byte of a `<0xXX>` token.
fn byte_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Builds the tokenizer of a GGUF SentencePiece (`llama`) vocabulary.
pub(crate) fn spm_tokenizer(f: &GgufFile) -> Result<TextTokenizer> {
    let v = SpmVocab::read(f)?;
    // A repeated token string maps to its last id, as in llama.cpp's token→id table.
    let vocab: Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = v.merges(&vocab);
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.unk {
        bpe = bpe.unk_token(v.tokens[unk as usize].clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| anyhow!("cannot build the SentencePiece BPE model: {e}"))?;
    let mut tok = Tokenizer::new(bpe);

    let space = Replace::new(" ", SPACE).map_err(|e| anyhow!("{e}"))?;
    let mut norm = Vec::new();
    if v.add_space_prefix {
        norm.push(NormalizerWrapper::Prepend(Prepend::new(SPACE.to_string())));
    }
    norm.push(NormalizerWrapper::Replace(space));
    tok.with_normalizer(Some(NormSequence::new(norm)))
        .map_err(|e| anyhow!("{e}"))?;

    let mut dec = vec![
        DecoderWrapper::Replace(Replace::new(SPACE, " ").map_err(|e| anyhow!("{e}"))?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if v.add_space_prefix {
        // Undo the prefix space: fused first, so only the start of the text loses a space.
        dec.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tok.with_decoder(Some(DecoderSequence::new(dec)));

    // Control and unknown tokens are special and user-defined ones plain, as in llama.cpp
    // (which matches all three in text); none is normalized, so the raw text must match.
    let added: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(&v.types)
        .filter(|(s, t)| !s.is_empty() && matches!(**t, UNKNOWN | CONTROL | USER_DEFINED))
        .map(|(s, &t)| AddedToken::from(s.clone(), t != USER_DEFINED).normalized(false))
        .collect();
    tok.add_special_tokens(added)
        .map_err(|e| anyhow!("cannot add special tokens: {e}"))?;

    let bos = if v.add_bos { v.bos } else { None };
    let eos = if v.add_eos { v.eos } else { None };
    if v.add_bos && bos.is_none() {
        bail!("tokenizer.ggml.add_bos_token is set but there is no BOS token");
    }
    if v.add_eos && eos.is_none() {
        bail!("tokenizer.ggml.add_eos_token is set but there is no EOS token");
    }
    if bos.is_some() || eos.is_some() {
        tok.with_post_processor(Some(post_processor(&v, bos, eos)?));
    }
    Ok(TextTokenizer::from_tokenizer(tok))
}

/// `[BOS] $A [EOS]` for one sequence (and `[BOS] $A [EOS] [BOS] $B [EOS]` for a pair, as HF's
/// Llama tokenizer), with only the markers the GGUF asks for. The template names the tokens
/// `BOS`/`EOS` so that any token text (spaces, colons) is safe in it.
fn post_processor(v: &SpmVocab, bos: Option<u32>, eos: Option<u32>) -> Result<TemplateProcessing> {
    let named = |name: &str, id: u32| {
        SpecialToken::new(
            name.to_string(),
            vec![id],
            vec![v.tokens[id as usize].clone()],
        )
        .map_err(|e| anyhow!("{e}"))
    };
    let mut special = Vec::new();
    if let Some(id) = bos {
        special.push(named("BOS", id)?);
    }
    if let Some(id) = eos {
        special.push(named("EOS", id)?);
    }
    let template = |seqs: &[(&str, u8)]| -> Vec<String> {
        let mut out = Vec::new();
        for (seq, type_id) in seqs {
            if bos.is_some() {
                out.push(format!("BOS:{type_id}"));
            }
            out.push(format!("{seq}:{type_id}"));
            if eos.is_some() {
                out.push(format!("EOS:{type_id}"));
            }
        }
        out
    };
    TemplateProcessing::builder()
        .try_single(template(&[("$A", 0)]))
        .map_err(|e| anyhow!("{e}"))?
        .try_pair(template(&[("$A", 0), ("$B", 1)]))
        .map_err(|e| anyhow!("{e}"))?
        .special_tokens(special)
        .build()
        .map_err(|e| anyhow!("cannot build the BOS/EOS post-processor: {e}"))
}

#[cfg(test)]
mod tests {
    use super::spm_tokenizer;
    use yomi_models::gguf::{GgufArray, GgufFile, GgufValue};

    /// A GGUF (v3, metadata only) holding `kvs`; enough for the tokenizer, which reads no
    /// tensors.
    fn gguf(kvs: &[(&str, GgufValue)]) -> GgufFile {
        fn put_str(o: &mut Vec<u8>, s: &str) {
            o.extend((s.len() as u64).to_le_bytes());
            o.extend(s.as_bytes());
        }
        let mut o = b"GGUF".to_vec();
        o.extend(3u32.to_le_bytes());
        o.extend(0u64.to_le_bytes());
        o.extend((kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            put_str(&mut o, k);
            match v {
                GgufValue::U32(x) => {
                    o.extend(4u32.to_le_bytes());
                    o.extend(x.to_le_bytes());
                }
                GgufValue::Bool(b) => {
                    o.extend(7u32.to_le_bytes());
                    o.push(*b as u8);
                }
                GgufValue::String(s) => {
                    o.extend(8u32.to_le_bytes());
                    put_str(&mut o, s);
                }
                GgufValue::Array(a) => {
                    o.extend(9u32.to_le_bytes());
                    match a {
                        GgufArray::I32(v) => {
                            o.extend(5u32.to_le_bytes());
                            o.extend((v.len() as u64).to_le_bytes());
                            v.iter().for_each(|x| o.extend(x.to_le_bytes()));
                        }
                        GgufArray::F32(v) => {
                            o.extend(6u32.to_le_bytes());
                            o.extend((v.len() as u64).to_le_bytes());
                            v.iter().for_each(|x| o.extend(x.to_le_bytes()));
                        }
                        GgufArray::String(v) => {
                            o.extend(8u32.to_le_bytes());
                            o.extend((v.len() as u64).to_le_bytes());
                            v.iter().for_each(|s| put_str(&mut o, s));
                        }
                        other => panic!("test writer: no array {other:?}"),
                    }
                }
                other => panic!("test writer: no value {other:?}"),
            }
        }
        GgufFile::from_bytes(o).expect("test GGUF parses")
    }

    /// A small SentencePiece-style vocabulary as llama.cpp's converter lays it out: <unk>,
    /// <s>, </s>, the 256 byte tokens, then normal pieces with descending scores, and one
    /// user-defined token.
    fn vocab() -> Vec<(&'static str, GgufValue)> {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for p in ["▁", "h", "i", "▁h", "▁hi", "<tool>"] {
            tokens.push(p.into());
            types.push(if p == "<tool>" { 4 } else { 1 });
        }
        let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
        vec![
            ("tokenizer.ggml.model", GgufValue::String("llama".into())),
            (
                "tokenizer.ggml.tokens",
                GgufValue::Array(GgufArray::String(tokens)),
            ),
            (
                "tokenizer.ggml.scores",
                GgufValue::Array(GgufArray::F32(scores)),
            ),
            (
                "tokenizer.ggml.token_type",
                GgufValue::Array(GgufArray::I32(types)),
            ),
            ("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
            ("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
            ("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)),
        ]
    }

    fn with(key: &str, value: Option<GgufValue>) -> GgufFile {
        let mut kvs = vocab();
        kvs.retain(|(k, _)| *k != key);
        if let Some(v) = value {
            let key: &'static str = Box::leak(key.to_string().into_boxed_str());
            kvs.push((key, v));
        }
        gguf(&kvs)
    }

    fn error(f: &GgufFile, want: &str) -> String {
        match spm_tokenizer(f) {
            Ok(_) => panic!("malformed vocabulary accepted (expected an error with {want:?})"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn builds_from_the_metadata_alone() {
        let t = spm_tokenizer(&gguf(&vocab())).unwrap();
        let id = |s: &str| t.token_to_id(s).unwrap();
        // " hi" → "▁▁hi": the prefix space, then the best-scored merges.
        assert_eq!(t.encode(" hi", false).unwrap(), [id("▁"), id("▁hi")]);
        assert_eq!(t.encode("hi", true).unwrap(), [1, id("▁hi")]);
        // "x" is no piece: byte fallback. The user-defined token is matched whole, and the
        // text after it gets its own prefix space, as in llama.cpp.
        assert_eq!(
            t.encode("x<tool>hi", false).unwrap(),
            [id("▁"), id("<0x78>"), id("<tool>"), id("▁hi")]
        );
        assert_eq!(
            t.decode(&[1, id("▁hi"), id("<0x78>")], true).unwrap(),
            "hix"
        );

        // add_bos_token = false and add_space_prefix = false are obeyed.
        let mut kvs = vocab();
        kvs.retain(|(k, _)| *k != "tokenizer.ggml.add_bos_token");
        kvs.push(("tokenizer.ggml.add_bos_token", GgufValue::Bool(false)));
        kvs.push(("tokenizer.ggml.add_space_prefix", GgufValue::Bool(false)));
        let t = spm_tokenizer(&gguf(&kvs)).unwrap();
        assert_eq!(t.encode("hi", true).unwrap(), [id("h"), id("i")]);
        assert_eq!(t.decode(&[id("▁hi")], false).unwrap(), " hi");
    }

    #[test]
    fn malformed_metadata_is_a_clear_error() {
        let n = match &vocab()[1].1 {
            GgufValue::Array(a) => a.len(),
            _ => unreachable!(),
        };
        let cases: Vec<(GgufFile, &str)> = vec![
            (
                with("tokenizer.ggml.scores", None),
                "needs its piece scores",
            ),
            (
                with(
                    "tokenizer.ggml.scores",
                    Some(GgufValue::Array(GgufArray::F32(vec![0.0; n - 1]))),
                ),
                "tokenizer.ggml.scores has",
            ),
            (
                with(
                    "tokenizer.ggml.scores",
                    Some(GgufValue::String("no".into())),
                ),
                "tokenizer.ggml.scores",
            ),
            (
                with(
                    "tokenizer.ggml.token_type",
                    Some(GgufValue::Array(GgufArray::I32(vec![1; n + 1]))),
                ),
                "tokenizer.ggml.token_type has",
            ),
            (
                with(
                    "tokenizer.ggml.token_type",
                    Some(GgufValue::Array(GgufArray::I32(
                        (0..n).map(|i| if i == 7 { 9 } else { 1 }).collect(),
                    ))),
                ),
                "token_type[7] = 9",
            ),
            (
                with(
                    "tokenizer.ggml.token_type",
                    Some(GgufValue::Array(GgufArray::I32(
                        (0..n).map(|i| if i == n - 2 { 6 } else { 1 }).collect(),
                    ))),
                ),
                "not of the form <0xXX>",
            ),
            (
                with(
                    "tokenizer.ggml.bos_token_id",
                    Some(GgufValue::U32(n as u32)),
                ),
                "outside the vocabulary",
            ),
            (
                with("tokenizer.ggml.add_bos_token", Some(GgufValue::U32(1))),
                "add_bos_token",
            ),
            (
                with(
                    "tokenizer.ggml.tokens",
                    Some(GgufValue::Array(GgufArray::String(Vec::new()))),
                ),
                "tokens is empty",
            ),
            (with("tokenizer.ggml.tokens", None), "tokenizer.ggml.tokens"),
        ];
        for (f, want) in cases {
            let e = error(&f, want);
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    /// Without token types llama.cpp takes every token as normal; the tokenizer still builds
    /// and encodes, byte tokens included.
    #[test]
    fn missing_token_types_mean_normal() {
        let t = spm_tokenizer(&with("tokenizer.ggml.token_type", None)).unwrap();
        assert_eq!(
            t.encode("hi", false).unwrap(),
            [t.token_to_id("▁hi").unwrap()]
        );
        assert_eq!(
            t.decode(&t.encode("x", false).unwrap(), false).unwrap(),
            "x"
        );
    }
}
