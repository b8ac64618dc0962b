//! The seed corpora of the structured targets (`claim_decision`, `volume_decision`) are binary
//! `arbitrary` encodings. These tests keep them meaningful: each seed decodes, and together they
//! reach the interesting outcomes. When the input structs change, the seeds decode differently
//! and `seeds_reach_the_interesting_outcomes` fails: regenerate them from a fuzzing corpus with
//!
//! ```text
//! HPP_SEED_SOURCE=fuzz/corpus/claim_decision cargo test --test seeds -- --ignored write_seeds
//! ```
//!
//! (run inside fuzz/; the variable names a corpus directory, as fuzz/run.sh leaves it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbitrary::{Arbitrary, Unstructured};
use hostpath_provisioner::deciding::claim::{self as claim_decision, Decision, Interest};
use hostpath_provisioner::deciding::volume::{self as volume_decision, DeleteRefusal, VolumeDecision};
use hostpath_provisioner_fuzz::{ClaimInput, HOSTNAME, VolumeInput, me, two_pools};

/// Decodes like libfuzzer-sys's `fuzz_target!` does.
fn decode<T: for<'a> Arbitrary<'a>>(data: &[u8]) -> Option<T> {
    if data.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// The outcome's variant path, e.g. `Refuse(AccessMode` or `Provision/prefix/fast/pinned`.
fn variant_path(debug: &str) -> String {
    debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '(')
        .collect::<String>()
        .trim_end_matches('(')
        .into()
}

/// Outcome key of a claim_decision input; `None` when it does not decode or is a known finding
/// (seeds must not crash the target).
fn claim_outcome(data: &[u8]) -> Option<String> {
    let input: ClaimInput = decode(data)?;
    let claim = input.claim();
    let class_name = hostpath_provisioner::deciding::class::claim_class_name(&claim).unwrap_or("hostpath").to_owned();
    let class = input.class(&class_name);
    let config = input.config();
    let interest = claim_decision::claim_interest(&claim.metadata, &me());
    match claim_decision::decide_claim(&claim, class.as_ref(), &me(), &config, &[]) {
        Decision::Provision(_) if interest != Interest::Candidate => None,
        Decision::Provision(plan) => Some(format!(
            "Provision-{}-{}-{}",
            if config.use_naming_prefix { "prefix" } else { "plain" },
            plan.pool.name,
            if plan.pinned_by_annotation { "pinned" } else { "selected" }
        )),
        other => Some(variant_path(&format!("{other:?}"))),
    }
}

/// Outcome key of a volume_decision input.
fn volume_outcome(data: &[u8]) -> Option<String> {
    let input: VolumeInput = decode(data)?;
    let pv = input.pv();
    match volume_decision::decide_volume(&pv, &me(), HOSTNAME, &two_pools(), &[]) {
        VolumeDecision::Delete(accepted) => {
            let layout =
                if Some(accepted.dir_name.as_str()) == pv.metadata.name.as_deref() { "plain" } else { "prefixed" };
            Some(format!("Delete-{}-{layout}", accepted.pool))
        }
        VolumeDecision::Refuse(DeleteRefusal::UnsafePath { refusal, .. }) => {
            Some(format!("Refuse(UnsafePath-{}", variant_path(&format!("{refusal:?}"))))
        }
        other => Some(variant_path(&format!("{other:?}"))),
    }
}

type Classifier = fn(&[u8]) -> Option<String>;

fn targets() -> [(&'static str, Classifier, &'static [&'static str]); 2] {
    [
        ("claim_decision", claim_outcome, &["Provision", "-pinned", "-selected", "Refuse", "Skip", "ExplainImmediate"]),
        (
            "volume_decision",
            volume_outcome,
            &[
                "Delete-legacy",
                "Delete-fast",
                "Refuse(UnsafePath-OutsidePools",
                "Refuse(UnsafePath-UnknownLayout",
                "Refuse(NoHostPath",
                "Ignore",
            ],
        ),
    ]
}

fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target)
}

fn read_dir_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).expect("read seed")).collect()
}

#[test]
fn seeds_reach_the_interesting_outcomes() {
    for (target, classify, wanted) in targets() {
        let outcomes: Vec<String> = read_dir_files(&seed_dir(target))
            .iter()
            .map(|data| classify(data).unwrap_or_else(|| panic!("a {target} seed does not decode or is a finding")))
            .collect();
        for want in wanted {
            assert!(
                outcomes.iter().any(|o| o.contains(want)),
                "{target}: no seed reaches {want}; outcomes: {outcomes:?}. Regenerate the seeds (see this file)"
            );
        }
    }
}

/// Picks the shortest input per outcome from `HPP_SEED_SOURCE` into fuzz/seeds/<target>/.
#[test]
#[ignore = "writes fuzz/seeds; run by hand to regenerate the seed corpora"]
fn write_seeds() {
    let source = PathBuf::from(std::env::var("HPP_SEED_SOURCE").expect("HPP_SEED_SOURCE=<corpus dir>"));
    let target = source.file_name().and_then(|n| n.to_str()).expect("corpus dir named after its target").to_owned();
    let (_, classify, _) = targets()
        .into_iter()
        .find(|(t, _, _)| *t == target)
        .unwrap_or_else(|| panic!("{target} has no binary seeds (its seeds are written by hand)"));
    let mut best: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for data in read_dir_files(&source) {
        if let Some(key) = classify(&data) {
            let slot = best.entry(key).or_insert_with(|| data.clone());
            if data.len() < slot.len() {
                *slot = data;
            }
        }
    }
    let dir = seed_dir(&target);
    std::fs::create_dir_all(&dir).expect("create seed dir");
    for (key, data) in &best {
        let name: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        std::fs::write(dir.join(name), data).expect("write seed");
    }
    eprintln!("{target}: wrote {} seeds: {:?}", best.len(), best.keys().collect::<Vec<_>>());
}
