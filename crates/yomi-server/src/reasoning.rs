//! Splits a thinking model's streamed output into reasoning (between `<think>` and
//! `</think>`) and content, as OpenAI-compatible servers report them (`reasoning_content` and
//! `content`).
//!
//! The output is in a thinking block from the start when the rendered prompt ends with an
//! open `<think>` (Qwen3.5's template with thinking on), or when the output itself starts with
//! `<think>` (after whitespace). Text up to `</think>` is reasoning; after it, leading
//! whitespace is dropped and the rest is content. Tags split across deltas are held back until
//! they are whole; nothing else is delayed. Models whose think tags are special tokens (skipped
//! when decoding) report them with [`ReasoningSplitter::special_tag`].

/// Opens a thinking block.
pub const THINK_OPEN: &str = "<think>";
/// Closes a thinking block.
pub const THINK_CLOSE: &str = "</think>";

/// Text of one delta, split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// At the start: the output may open a thinking block.
    Detect,
    Thinking,
    /// After `</think>` (leading whitespace still to drop) or with no thinking block.
    Content {
        started: bool,
    },
}

/// The streaming splitter (see the module notes).
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    mode: Mode,
    buf: String,
}

/// The longest suffix of `s` that is a proper prefix of `tag` (a tag that may still be
/// arriving), in bytes.
fn partial_tag_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// Whether the rendered prompt leaves the model inside a thinking block.
pub fn prompt_opens_thinking(prompt_text: &str) -> bool {
    prompt_text.trim_end().ends_with(THINK_OPEN)
}

impl ReasoningSplitter {
    /// `starts_thinking`: the prompt already opened the thinking block.
    pub fn new(starts_thinking: bool) -> Self {
        ReasoningSplitter {
            mode: if starts_thinking {
                Mode::Thinking
            } else {
                Mode::Detect
            },
            buf: String::new(),
        }
    }

    /// Whether the output is inside a thinking block now.
    pub fn is_thinking(&self) -> bool {
        self.mode == Mode::Thinking
    }

    /// A think tag that is a special token (absent from the decoded text) was emitted.
    pub fn special_tag(&mut self, open: bool) -> Split {
        match (open, self.mode) {
            (true, Mode::Detect) => self.push(THINK_OPEN),
            (false, Mode::Thinking) => self.push(THINK_CLOSE),
            _ => Split::default(),
        }
    }

    /// Takes the next text delta; returns what can be reported now.
    pub fn push(&mut self, text: &str) -> Split {
        self.buf.push_str(text);
        let mut out = Split::default();
        loop {
            match self.mode {
                Mode::Detect => {
                    let t = self.buf.trim_start();
                    if t.is_empty() || (THINK_OPEN.starts_with(t) && t.len() < THINK_OPEN.len()) {
                        break;
                    }
                    if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                        self.buf = rest.to_string();
                        self.mode = Mode::Thinking;
                    } else {
                        self.mode = Mode::Content { started: true };
                    }
                }
                Mode::Thinking => {
                    if let Some(i) = self.buf.find(THINK_CLOSE) {
                        out.reasoning.push_str(&self.buf[..i]);
                        self.buf.drain(..i + THINK_CLOSE.len());
                        self.mode = Mode::Content { started: false };
                        continue;
                    }
                    let hold = partial_tag_suffix(&self.buf, THINK_CLOSE);
                    let cut = self.buf.len() - hold;
                    out.reasoning.push_str(&self.buf[..cut]);
                    self.buf.drain(..cut);
                    break;
                }
                Mode::Content { started } => {
                    if !started {
                        let t = self.buf.trim_start();
                        if t.is_empty() {
                            self.buf.clear();
                            break;
                        }
                        self.buf = t.to_string();
                        self.mode = Mode::Content { started: true };
                    }
                    out.content.push_str(&self.buf);
                    self.buf.clear();
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: whatever was held back.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Split::default();
        match self.mode {
            Mode::Thinking => out.reasoning = rest,
            Mode::Detect | Mode::Content { started: true } => out.content = rest,
            Mode::Content { started: false } => {
                out.content = rest.trim_start().to_string();
            }
        }
        out
    }

    /// Splits a whole text at once.
    pub fn split_all(starts_thinking: bool, text: &str) -> Split {
        let mut s = Self::new(starts_thinking);
        let mut out = s.push(text);
        out.append(s.finish());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of cutting `text` into deltas gives the same split as the whole text.
    fn all_cuts(starts: bool, text: &str, want_reasoning: &str, want_content: &str) {
        let whole = ReasoningSplitter::split_all(starts, text);
        assert_eq!(whole.reasoning, want_reasoning, "whole {text:?}");
        assert_eq!(whole.content, want_content, "whole {text:?}");
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &bounds {
            for &b in &bounds {
                if b < a {
                    continue;
                }
                let mut s = ReasoningSplitter::new(starts);
                let mut got = Split::default();
                for part in [&text[..a], &text[a..b], &text[b..]] {
                    got.append(s.push(part));
                }
                got.append(s.finish());
                assert_eq!(got, whole, "cuts {a} {b} of {text:?}");
            }
        }
    }

    #[test]
    fn plain_output_is_content() {
        all_cuts(false, "Hello, world!", "", "Hello, world!");
        all_cuts(
            false,
            "  indented <think> later",
            "",
            "  indented <think> later",
        );
        all_cuts(false, "<thin air", "", "<thin air");
        all_cuts(false, "", "", "");
    }

    #[test]
    fn a_think_block_at_the_start_is_reasoning() {
        all_cuts(
            false,
            "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
            "\nLet me see.\n",
            "The answer is 4.",
        );
        all_cuts(false, "\n<think>é</think>ü", "é", "ü");
    }

    #[test]
    fn a_prompt_that_opened_the_block() {
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        all_cuts(true, "hmm </thi", "hmm </thi", "");
        all_cuts(true, "a < b</think>\n\nyes", "a < b", "yes");
        all_cuts(true, "no close tag", "no close tag", "");
    }

    #[test]
    fn special_think_tokens() {
        let mut s = ReasoningSplitter::new(false);
        let mut got = s.special_tag(true);
        got.append(s.push("reason"));
        assert!(s.is_thinking());
        got.append(s.special_tag(false));
        got.append(s.push("\n\nanswer"));
        // A stray open tag inside content changes nothing.
        got.append(s.special_tag(true));
        got.append(s.push("!"));
        got.append(s.finish());
        assert_eq!(got.reasoning, "reason");
        assert_eq!(got.content, "answer!");
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_tag_suffix("abc</th", THINK_CLOSE), 4);
        assert_eq!(partial_tag_suffix("abc<", THINK_CLOSE), 1);
        assert_eq!(partial_tag_suffix("abc", THINK_CLOSE), 0);
        assert_eq!(partial_tag_suffix("é", THINK_CLOSE), 0);
    }
}
