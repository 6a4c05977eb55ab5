//! A tokenizer's ids for texts, as `tokenizers`' `encode_fast(text, false)` gives them,
//! at the speed of a lookup for the words a corpus repeats (see [`Encoder`]).

/// A tokenizer's ids for texts, as `encode_fast(text, false)` gives them, with each
/// pre-token's ids remembered: the library's model tokenizes every pre-token (a word, as the
/// pre-tokenizer split it) into tokens that each own their string, and then builds an
/// encoding with offsets, masks and word indices, where only the ids are needed. A corpus
/// repeats its words, so most pre-tokens are looked up here instead.
///
/// Exact where the ids are the model's for each pre-token in order, the added tokens'
/// where the text holds them: so only without truncation or padding (which cut or add
/// ids), and with a model that gives a word the same tokens every time (not BPE with
/// dropout). Any other tokenizer goes through `encode_fast` whole.
///
/// Byte-level pre-tokenizers with no normalizer are run here too, on texts holding no added
/// token: GPT-2's (`ByteLevel` with its regex), and GPT-4's and Llama 3's (a `Split` by a
/// regex, isolating its matches, then `ByteLevel` without one). The regex splits the text
/// and each piece's bytes map to characters, as the library does, without the library's
/// per-piece strings and alignments — most of what was left of the time.
pub(crate) struct Encoder<'t> {
    tokenizer: &'t tokenizers::Tokenizer,
    /// Whether pre-tokens' ids may be remembered (see above).
    memo: bool,
    /// The byte-level split, where it applies (see above).
    byte_level: Option<ByteLevelSplit>,
    /// Pre-tokens' ids, as the library's pre-tokenizer gave the pre-tokens.
    words: Words,
    /// Byte-level pieces' ids, by the piece as the text holds it (apart from `words`: a
    /// piece as written may read as another's characters, `Ġ` as a mapped space).
    pieces: Words,
    ids: Vec<u32>,
    /// A piece's bytes as characters (byte-level only).
    mapped: String,
}

/// A byte-level pre-tokenizer as `tokenizers` runs it: its regex, where it adds a space in
/// front, and the added tokens to look for (a text holding one goes the library's way).
struct ByteLevelSplit {
    regex: onig::Regex,
    prefix: Prefix,
    added: Option<aho_corasick::AhoCorasick>,
    chars: [char; 256],
}

/// Where a byte-level pre-tokenizer adds a space (`add_prefix_space`) to what does not
/// start with one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prefix {
    None,
    /// The text, before its regex splits it (`ByteLevel` with its regex).
    Text,
    /// Each piece another pre-tokenizer split off (`ByteLevel` after a `Split`).
    Piece,
}

impl ByteLevelSplit {
    /// The split of `pre_tokenizer`, if it is one this knows: its regex and where it adds a
    /// space.
    fn of(pre_tokenizer: &tokenizers::PreTokenizerWrapper) -> Option<(String, Prefix)> {
        use tokenizers::pre_tokenizers::split::SplitPattern;
        use tokenizers::{PreTokenizerWrapper as P, SplitDelimiterBehavior};
        let prefix = |on: bool, at: Prefix| if on { at } else { Prefix::None };
        match pre_tokenizer {
            P::ByteLevel(level) if level.use_regex => Some((
                BYTE_LEVEL_REGEX.to_string(),
                prefix(level.add_prefix_space, Prefix::Text),
            )),
            P::Sequence(sequence) => match sequence.as_ref() {
                [P::Split(split), P::ByteLevel(level)]
                    if !level.use_regex
                        && !split.invert
                        && split.behavior == SplitDelimiterBehavior::Isolated =>
                {
                    match &split.pattern {
                        SplitPattern::Regex(regex) => {
                            Some((regex.clone(), prefix(level.add_prefix_space, Prefix::Piece)))
                        }
                        SplitPattern::String(_) => None,
                    }
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// The regex of `tokenizers`' `ByteLevel` pre-tokenizer (GPT-2's).
const BYTE_LEVEL_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// GPT-2's bytes as characters: the printable ones as themselves, the others as 256 on, in
/// order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
    }
    chars
}

/// Ids by pre-token.
type Words = std::collections::HashMap<String, Vec<u32>, ahash::RandomState>;

/// Pre-tokens an [`Encoder`] remembers at most of each kind (then it remembers no more):
/// about 10 MiB a worker for a code or web corpus's words, the most frequent of which come
/// first. (Memory grows with workers: 64 of them hold 640 MiB at most.)
const ENCODER_WORDS_MAX: usize = 1 << 17;

impl<'t> Encoder<'t> {
    pub(crate) fn new(tokenizer: &'t tokenizers::Tokenizer) -> Encoder<'t> {
        let deterministic = match tokenizer.get_model() {
            tokenizers::ModelWrapper::BPE(bpe) => bpe.dropout.is_none_or(|p| p == 0.0),
            _ => true,
        };
        let memo = deterministic
            && tokenizer.get_truncation().is_none()
            && tokenizer.get_padding().is_none();
        let split = match (tokenizer.get_normalizer(), tokenizer.get_pre_tokenizer()) {
            (None, Some(pre)) if memo => ByteLevelSplit::of(pre),
            _ => None,
        };
        let byte_level = split.and_then(|(regex, prefix)| {
            let added: Vec<&String> = tokenizer
                .get_added_vocabulary()
                .get_vocab()
                .keys()
                .collect();
            let added = match added.is_empty() {
                true => Ok(None),
                false => aho_corasick::AhoCorasick::new(added).map(Some),
            };
            // Any failure: the library's way.
            Some(ByteLevelSplit {
                regex: onig::Regex::new(&regex).ok()?,
                prefix,
                added: added.ok()?,
                chars: byte_chars(),
            })
        });
        Encoder {
            tokenizer,
            memo,
            byte_level,
            words: Default::default(),
            pieces: Default::default(),
            ids: Vec::new(),
            mapped: String::new(),
        }
    }

    /// `text`'s ids, without special tokens (the post-processor's), valid until the next call.
    pub(crate) fn encode(&mut self, text: &str) -> tokenizers::Result<&[u32]> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizer};
        let tokenizer = self.tokenizer;
        if !self.memo {
            self.ids = tokenizer.encode_fast(text, false)?.get_ids().to_vec();
            return Ok(&self.ids);
        }
        self.ids.clear();
        let plain = |split: &ByteLevelSplit| {
            !text.is_empty() && split.added.as_ref().is_none_or(|a| !a.is_match(text))
        };
        if let Some(split) = self.byte_level.as_ref().filter(|s| plain(s)) {
            let prefixed;
            let text = if split.prefix == Prefix::Text && !text.starts_with(' ') {
                prefixed = format!(" {text}");
                prefixed.as_str()
            } else {
                text
            };
            // Matches and the gaps between them, each a piece, as the library isolates them.
            let mut pieces = Vec::new();
            let mut prev = 0;
            for (start, end) in split.regex.find_iter(text) {
                if prev != start {
                    pieces.push(prev..start);
                }
                pieces.push(start..end);
                prev = end;
            }
            if prev != text.len() {
                pieces.push(prev..text.len());
            }
            for piece in pieces {
                self.pre_token(&text[piece], true)?;
            }
            return Ok(&self.ids);
        }
        let mut pieces = tokenizer
            .get_added_vocabulary()
            .extract_and_normalize(tokenizer.get_normalizer(), text);
        if let Some(pre) = tokenizer.get_pre_tokenizer() {
            pre.pre_tokenize(&mut pieces)?;
        }
        for (word, _, tokens) in pieces.get_splits(OffsetReferential::Normalized, OffsetType::None)
        {
            if let Some(tokens) = tokens {
                // An added token, found in the text as it is.
                self.ids.extend(tokens.iter().map(|t| t.id));
            } else {
                self.pre_token(word, false)?;
            }
        }
        Ok(&self.ids)
    }

    /// Appends the ids of `word`, a pre-token (`raw`: a byte-level piece whose bytes are
    /// still to be mapped to characters), remembered or tokenized by the model.
    fn pre_token(&mut self, word: &str, raw: bool) -> tokenizers::Result<()> {
        use tokenizers::Model;
        let known = if raw { &self.pieces } else { &self.words };
        if let Some(ids) = known.get(word) {
            self.ids.extend_from_slice(ids);
            return Ok(());
        }
        let model = self.tokenizer.get_model();
        let tokens = match (raw, &self.byte_level) {
            (true, Some(split)) => {
                self.mapped.clear();
                if split.prefix == Prefix::Piece && !word.starts_with(' ') {
                    self.mapped.push(split.chars[usize::from(b' ')]);
                }
                self.mapped
                    .extend(word.bytes().map(|b| split.chars[b as usize]));
                model.tokenize(&self.mapped)?
            }
            _ => model.tokenize(word)?,
        };
        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        self.ids.extend_from_slice(&ids);
        let known = if raw {
            &mut self.pieces
        } else {
            &mut self.words
        };
        if known.len() < ENCODER_WORDS_MAX {
            known.insert(word.to_string(), ids);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-remembering encoder gives `encode_fast`'s ids, exactly: a byte-level BPE
    /// trained here, with special tokens in the text, over code, prose, Unicode and runs of
    /// whitespace, each text encoded twice (its words remembered the second time); a
    /// normalizer and a non-special added token; and the fallback for BPE with dropout.
    #[test]
    fn the_encoder_gives_the_librarys_ids() {
        use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
        use tokenizers::models::TrainerWrapper;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::{AddedToken, Tokenizer};
        // Half with the special token, half without (the byte-level split's way); bytes of
        // every kind: control characters, CRLF, no-break spaces, CJK, Arabic digits,
        // combining marks, apostrophes in both cases, and the characters byte-level BPE maps
        // spaces to, written out.
        let texts: Vec<String> = (0..200)
            .map(|k| {
                let special = if k % 2 == 0 { "<|end|> tail<|end|>x" } else { "tail" };
                format!(
                    "fn item_{k}(x: u32) -> u32 {{ x * {k} }}   // the cat's hat\r\n\n\tnaïve café {k} 🙂🙂 {special}  {}\u{a0}\u{1}漢字 ٣٤ e\u{301} IT'S Ġthe ĊĠ{k}   ",
                    "word ".repeat(k % 7)
                )
            })
            .collect();
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(400)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from("<|end|>", true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        tokenizer.train(&mut trainer, texts.iter()).unwrap();
        let check = |tokenizer: &Tokenizer, memo: bool, byte_level: bool| {
            let mut encoder = Encoder::new(tokenizer);
            assert_eq!(encoder.memo, memo);
            assert_eq!(encoder.byte_level.is_some(), byte_level);
            for round in 0..2 {
                for text in texts.iter().chain([&String::new(), &" \n ".to_string()]) {
                    let want = tokenizer.encode_fast(text.as_str(), false).unwrap();
                    let got = encoder.encode(text).unwrap();
                    assert_eq!(got, want.get_ids(), "round {round}: {text:?}");
                }
            }
            if memo {
                assert!(
                    !encoder.words.is_empty() || !encoder.pieces.is_empty(),
                    "words remembered"
                );
            }
        };
        check(&tokenizer, true, true);
        // A space in front of each piece between added tokens.
        let mut prefixed = tokenizer.clone();
        prefixed.with_pre_tokenizer(Some(ByteLevel::new(true, true, true)));
        check(&prefixed, true, true);
        // GPT-4's and Llama 3's: a Split by their regex, then ByteLevel without one (with and
        // without a space in front of each piece).
        for prefix_space in [false, true] {
            use tokenizers::pre_tokenizers::{sequence::Sequence, split};
            let regex = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
            let pattern = split::SplitPattern::Regex(regex.into());
            let behavior = tokenizers::SplitDelimiterBehavior::Isolated;
            let pieces = split::Split::new(pattern, behavior, false).unwrap();
            let mut gpt4 = tokenizer.clone();
            gpt4.with_pre_tokenizer(Some(Sequence::new(vec![
                pieces.into(),
                ByteLevel::new(prefix_space, true, false).into(),
            ])));
            check(&gpt4, true, true);
        }
        // A normalizer (the library's pre-tokenizer then), and an added token that is not
        // special.
        let mut normalized = tokenizer.clone();
        normalized.with_normalizer(Some(tokenizers::normalizers::Lowercase));
        normalized.add_tokens(&[AddedToken::from("item_1", false)]);
        check(&normalized, true, false);
        // Dropout: encode_fast whole, which is random; only checked to run.
        let mut dropped = tokenizer.clone();
        if let tokenizers::ModelWrapper::BPE(bpe) = dropped.get_model() {
            let mut bpe = bpe.clone();
            bpe.dropout = Some(0.5);
            dropped.with_model(tokenizers::ModelWrapper::BPE(bpe));
        }
        let encoder = Encoder::new(&dropped);
        assert!(!encoder.memo, "no memory under dropout");
    }
}
