//! One allocation for each distinct short string the kept volumes repeat.
//!
//! Every PV a node holds carries the same few words: its class, reclaim policy, volume mode and
//! phase, its label and annotation keys, the provisioner's name and this node's name as values,
//! `kubernetes.io/hostname` and `In` in its node affinity. As `String`s each is an allocation of
//! its own per volume (32 bytes or more with the allocator's header); interned, a node holds each
//! once and a volume holds a pointer.
//!
//! The table forgets the strings no volume holds any more: when it has grown to twice the size it
//! had after the last sweep, it drops every entry only it still holds. So it holds at most twice
//! the distinct strings live volumes carry, however many volumes came and went.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;

/// The smallest table a sweep leaves room for: below it, sweeping costs more than it saves.
const SMALLEST_SWEEP: usize = 64;

#[derive(Default)]
struct Table {
    words: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Table {
    fn intern(&mut self, word: &str) -> Arc<str> {
        if let Some(held) = self.words.get(word) {
            return held.clone();
        }
        if self.words.len() >= self.sweep_at.max(SMALLEST_SWEEP) {
            self.words.retain(|w| Arc::strong_count(w) > 1);
            self.words.shrink_to_fit();
            self.sweep_at = self.words.len() * 2;
        }
        let held: Arc<str> = Arc::from(word);
        self.words.insert(held.clone());
        held
    }
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The shared copy of `word`.
pub fn intern(word: &str) -> Arc<str> {
    let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    table.get_or_insert_with(Table::default).intern(word)
}

/// A string decoded straight into its shared copy: no `String` is made on the way when the
/// decoder can lend the text (watch events are decoded from a buffer).
pub struct Word(pub Arc<str>);

impl<'de> Deserialize<'de> for Word {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Word;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, text: &str) -> Result<Word, E> {
                Ok(Word(intern(text)))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// For `#[serde(deserialize_with)]` on an `Option<Arc<str>>` field (with `#[serde(default)]`).
pub fn optional_word<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Arc<str>>, D::Error> {
    Ok(Option::<Word>::deserialize(deserializer)?.map(|w| w.0))
}

/// For `#[serde(deserialize_with)]` on an `Arc<str>` field.
pub fn word<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    Ok(Word::deserialize(deserializer)?.0)
}

/// A list of shared words in an allocation of its length.
pub type Words = Box<[Arc<str>]>;

/// For `#[serde(deserialize_with)]` on an `Option<Words>` field (with `#[serde(default)]`).
pub fn optional_words<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Words>, D::Error> {
    Ok(Option::<Vec<Word>>::deserialize(deserializer)?.map(|words| words.into_iter().map(|w| w.0).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_word_is_one_allocation() {
        let mut table = Table::default();
        let a = table.intern("kubernetes.io/hostname");
        let b = table.intern(&String::from("kubernetes.io/hostname"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "kubernetes.io/hostname");
        assert!(!Arc::ptr_eq(&a, &table.intern("In")));
    }

    #[test]
    fn words_no_volume_holds_are_forgotten_so_the_table_stays_bounded() {
        let mut table = Table::default();
        let kept: Vec<Arc<str>> = (0..10).map(|i| table.intern(&format!("kept-{i}"))).collect();
        // A stream of unique words, each dropped at once, as uids of volumes come and go.
        for i in 0..100_000 {
            table.intern(&format!("gone-{i}"));
            assert!(table.words.len() <= 2 * SMALLEST_SWEEP.max(2 * kept.len()) + 1, "{}", table.words.len());
        }
        for (i, word) in kept.iter().enumerate() {
            assert!(Arc::ptr_eq(word, &table.intern(&format!("kept-{i}"))), "a held word stays shared");
        }
    }

    #[test]
    fn words_decode_from_json_into_shared_copies() {
        #[derive(Deserialize)]
        struct Two {
            #[serde(default, deserialize_with = "optional_word")]
            a: Option<Arc<str>>,
            #[serde(default, deserialize_with = "optional_word")]
            b: Option<Arc<str>>,
            #[serde(default, deserialize_with = "optional_words")]
            list: Option<Words>,
            #[serde(default, deserialize_with = "optional_word")]
            absent: Option<Arc<str>>,
        }
        let two: Two = serde_json::from_str(r#"{"a": "Delete", "b": "Del\u0065te", "list": ["Delete", "x"]}"#).unwrap();
        let (a, b, list) = (two.a.unwrap(), two.b.unwrap(), two.list.unwrap());
        assert!(Arc::ptr_eq(&a, &b), "an escaped string is the same word");
        assert!(Arc::ptr_eq(&a, &list[0]));
        assert_eq!(list.len(), 2);
        assert_eq!(two.absent, None);
        assert!(serde_json::from_str::<Two>(r#"{"a": 1}"#).is_err());
        let null: Two = serde_json::from_str(r#"{"a": null, "list": null}"#).unwrap();
        assert!(null.a.is_none() && null.list.is_none());
    }
}
