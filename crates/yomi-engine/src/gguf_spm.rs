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
