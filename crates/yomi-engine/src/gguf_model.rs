//! Loading a GGUF file: config from metadata, weights in their block formats, a `tokenizers`
//! tokenizer built from `tokenizer.ggml.*`, and the chat template from
//! `tokenizer.chat_template`.

use anyhow::{Result, anyhow, bail};
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};
use yomi_models::Model;
use yomi_models::gguf::GgufFile;
use yomi_models::gguf_source::{GgufSource, config_from_gguf};
use yomi_models::model::WeightSink;

use crate::template::{ChatTemplate, GenerationDefaults};
use crate::tokenizer::TextTokenizer;

pub(crate) fn load(
    path: &Path,
    progress: &mut dyn FnMut(usize, usize),
    sink: Option<&mut dyn WeightSink>,
) -> Result<(
    Model,
    TextTokenizer,
    Option<ChatTemplate>,
    GenerationDefaults,
)> {
    let file = GgufFile::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let cfg = config_from_gguf(&file).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    let src = GgufSource::new(&file, &cfg);
    let model = Model::load_into(cfg, &src, progress, sink)
        .map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    let tokenizer = tokenizer_from_gguf(&file).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    let chat = ChatParts::of(&file, &tokenizer);
    let template = match &chat.template {
        Some(src) => Some(ChatTemplate::new(src, chat.bos.clone(), chat.eos.clone())?),
        None => None,
    };
    let defaults = GenerationDefaults {
        eos_token_ids: chat.eos_ids,
        ..Default::default()
    };
    Ok((model, tokenizer, template, defaults))
}

/// What a GGUF file says about chat: its template, the bos/eos token strings the template may
/// use, and the ids that end a generation (eos, and eot where it differs).
struct ChatParts {
    template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
    eos_ids: Vec<u32>,
}

impl ChatParts {
    fn of(file: &GgufFile, tokenizer: &TextTokenizer) -> Self {
        let token = |key: &str| -> Option<String> {
            let id = file.get_u64(key).ok()?;
            tokenizer.inner().id_to_token(id as u32)
        };
        let mut eos_ids = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Ok(id) = file.get_u64(key)
                && !eos_ids.contains(&(id as u32))
            {
                eos_ids.push(id as u32);
            }
        }
        ChatParts {
            template: file
                .get_str("tokenizer.chat_template")
                .ok()
                .map(String::from),
            bos: token("tokenizer.ggml.bos_token_id"),
            eos: token("tokenizer.ggml.eos_token_id"),
            eos_ids,
        }
    }
}

/// Writes the model of the GGUF file `path` into the existing directory `dir` as a Hugging Face
/// directory yomi loads as it loads the file: the weights and `config.json`
/// ([`yomi_models::gguf_export`]), `tokenizer.json` (the tokenizer built from
/// `tokenizer.ggml.*`), `tokenizer_config.json` (chat template, bos and eos tokens) and
/// `generation_config.json` (the ids that end a generation). `progress` gets (tensors written,
/// total).
pub fn export_hf_dir(
    path: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<yomi_models::gguf_export::ExportReport> {
    let file = GgufFile::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let tokenizer = tokenizer_from_gguf(&file).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    let report = yomi_models::gguf_export::export_weights(&file, dir, progress)
        .map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    let write = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| anyhow!("cannot write {}: {e}", p.display()))
    };
    write(
        "tokenizer.json",
        tokenizer
            .inner()
            .to_string(true)
            .map_err(|e| anyhow!("cannot serialize the tokenizer: {e}"))?,
    )?;
    let chat = ChatParts::of(&file, &tokenizer);
    let mut tok_config = serde_json::json!({});
    if let Some(t) = &chat.template {
        tok_config["chat_template"] = t.clone().into();
    }
    if let Some(b) = &chat.bos {
        tok_config["bos_token"] = b.clone().into();
    }
    if let Some(e) = &chat.eos {
        tok_config["eos_token"] = e.clone().into();
    }
    write(
        "tokenizer_config.json",
        serde_json::to_string_pretty(&tok_config)?,
    )?;
    write(
        "generation_config.json",
        serde_json::to_string_pretty(&serde_json::json!({"eos_token_id": chat.eos_ids}))?,
    )?;
    // The safetensors writer makes its files private; they are as readable as the GGUF file
    // (`yomi quantize` gives its output the permissions of these).
    let perms = std::fs::metadata(path)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?
        .permissions();
    for entry in std::fs::read_dir(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))? {
        let p = entry.map_err(|e| anyhow!("{}: {e}", dir.display()))?.path();
        std::fs::set_permissions(&p, perms.clone())
            .map_err(|e| anyhow!("cannot set the permissions of {}: {e}", p.display()))?;
    }
    Ok(report)
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value (its regex table), as
/// `tokenizers` pieces.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level =
        |regex: bool| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, regex));
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        Ok(PreTokenizerWrapper::Split(
            Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?,
        ))
    };
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // Qwen3.5's tokenizer.json regex (llama.cpp's `qwen35` pre-tokenizer): Qwen2's, except
    // that combining marks (\p{M}) count as part of a word, so "e" + U+0301 stays one piece.
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Ok(match pre {
        // GPT-2 byte-level pattern, digits split one by one.
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level(true),
            ]))
        }
        "gpt2" | "default" | "gpt-2" => byte_level(true),
        "llama3" | "llama-bpe" | "smaug-bpe" | "falcon3" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(LLAMA3)?, byte_level(false)]))
        }
        "qwen2" | "deepseek-r1-qwen" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN2)?, byte_level(false)]))
        }
        "qwen35" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN35)?, byte_level(false)]))
        }
        other => bail!(
            "unsupported GGUF pre-tokenizer `{other}` (supported: smollm, gpt2, llama3, qwen2, qwen35 families)"
        ),
    })
}

/// Builds the tokenizer of a GGUF vocabulary: byte-level BPE from vocabulary, merges and token
/// types (`gpt2`), or SentencePiece (`llama`, see `gguf_spm`).
pub(crate) fn tokenizer_from_gguf(f: &GgufFile) -> Result<TextTokenizer> {
    let model = f
        .get_str("tokenizer.ggml.model")
        .map_err(|e| anyhow!("{e}"))?;
    match model {
        "gpt2" => {}
        "llama" => return crate::gguf_spm::spm_tokenizer(f),
        _ => bail!(
            "unsupported GGUF tokenizer model `{model}` (supported: gpt2 byte-level BPE, llama SentencePiece)"
        ),
    }
    let tokens = f
        .get_str_array("tokenizer.ggml.tokens")
        .map_err(|e| anyhow!("{e}"))?;
    let merges_raw = f
        .get_str_array("tokenizer.ggml.merges")
        .map_err(|e| anyhow!("{e}"))?;
    let types = f.get_i32_array("tokenizer.ggml.token_type").ok();
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges: Vec<(String, String)> = merges_raw
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| anyhow!("malformed BPE merge `{m}`"))
        })
        .collect::<Result<_>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(false)
        .build()
        .map_err(|e| anyhow!("cannot build the BPE model: {e}"))?;
    let mut tok = Tokenizer::new(bpe);
    let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("default");
    tok.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    // Control (3) and user-defined (4) tokens are matched whole, before BPE.
    if let Some(types) = types {
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter())
            .filter(|(_, t)| **t == 3 || **t == 4)
            .map(|(s, t)| AddedToken::from(s.clone(), *t == 3))
            .collect();
        tok.add_special_tokens(specials)
            .map_err(|e| anyhow!("cannot add special tokens: {e}"))?;
    }
    Ok(TextTokenizer::from_tokenizer(tok))
}

#[cfg(test)]
mod tests {
    use super::pre_tokenizer;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let mut s = PreTokenizedString::from(text);
        pre_tokenizer(pre).unwrap().pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect()
    }

    /// `qwen35` is Qwen3.5's own regex, not Qwen2's: a combining mark stays in its word.
    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        let text = "cafe\u{301} ok";
        let q35 = pieces("qwen35", text);
        let q2 = pieces("qwen2", text);
        assert_eq!(q35.len(), 2, "{q35:?}");
        assert!(q2.len() > q35.len(), "{q2:?}");
        // Both agree where there are no marks.
        assert_eq!(pieces("qwen35", "x = 12;\n"), pieces("qwen2", "x = 12;\n"));
    }
}
