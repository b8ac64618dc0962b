//! The Docker build context: the files `docker build .` sends, `.dockerignore` applied. `make
//! image` compiles from a copy of exactly these files, so the images the tests run and the image
//! users build with the Dockerfile come from the same sources, and a file the build reads that the
//! context leaves out fails `make test` (it once left out `deploy/`, which the binary embeds).
//!
//! `.dockerignore` rules, as Docker applies them (moby's patternmatcher): one pattern per line,
//! `#` starts a comment, a leading `!` re-includes, paths are relative to the context root with
//! any leading `/` dropped and cleaned, `*` and `?` stay within one path element, `**` spans any
//! number of them, a pattern that matches a directory matches everything below it, and the last
//! pattern that matches a path decides. The glob itself is globset's.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use globset::{GlobBuilder, GlobMatcher};

/// One `.dockerignore` line.
struct Rule {
    matcher: GlobMatcher,
    /// `!pattern`: matching paths are sent after all.
    include: bool,
}

/// The rules of one `.dockerignore`.
pub struct DockerIgnore {
    rules: Vec<Rule>,
}

impl DockerIgnore {
    /// Whether an excluded directory may still hold a file that is sent (a `!` rule exists).
    fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|rule| rule.include)
    }
}

impl DockerIgnore {
    pub fn parse(text: &str) -> Result<DockerIgnore> {
        let mut rules = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (include, pattern) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let pattern = clean(pattern);
            if pattern.is_empty() {
                bail!(".dockerignore line {}: {line:?} names no path", number + 1);
            }
            let matcher = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .with_context(|| format!(".dockerignore line {}: {line:?}", number + 1))?
                .compile_matcher();
            rules.push(Rule { matcher, include });
        }
        Ok(DockerIgnore { rules })
    }

    /// Whether `relative` (a path inside the context, `/`-separated) is sent to the builder.
    pub fn sends(&self, relative: &str) -> bool {
        let relative = clean(relative);
        // A path is left out when the last rule matching it or one of its parent directories
        // leaves it out.
        let mut sent = true;
        for rule in &self.rules {
            if ancestors_and_self(&relative).any(|path| rule.matcher.is_match(path)) {
                sent = rule.include;
            }
        }
        sent
    }
}

/// `a/b/c`, `a/b`, `a`.
fn ancestors_and_self(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |path| path.rfind('/').map(|slash| &path[..slash]))
}

/// Docker's cleaning of a pattern or path: no leading `/` or `./`, no trailing `/`, no empty or
/// `.` elements (`..` is kept: it never matches a path inside the context).
fn clean(path: &str) -> String {
    path.split('/').filter(|part| !part.is_empty() && *part != ".").collect::<Vec<_>>().join("/")
}

/// The files of `root` that `docker build root` sends, as paths relative to it, sorted.
pub fn context_files(root: &Path) -> Result<Vec<PathBuf>> {
    let ignore_file = root.join(".dockerignore");
    let rules = match std::fs::read_to_string(&ignore_file) {
        Ok(text) => DockerIgnore::parse(&text)?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => DockerIgnore::parse("")?,
        Err(err) => return Err(err).with_context(|| format!("reading {}", ignore_file.display())),
    };
    let mut files = Vec::new();
    walk(root, Path::new(""), &rules, &mut files)?;
    files.sort();
    Ok(files)
}

fn walk(root: &Path, relative: &Path, rules: &DockerIgnore, files: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(relative);
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let path = relative.join(entry.file_name());
        let Some(name) = path.to_str() else {
            bail!("{} is not UTF-8: the context copy handles UTF-8 names only", path.display());
        };
        let kind = entry.file_type()?;
        if kind.is_dir() {
            // Docker descends into an excluded directory too, for exceptions below it; without
            // exceptions nothing below it is sent (target/ alone holds a million files).
            if rules.sends(name) || rules.has_exceptions() {
                walk(root, &path, rules, files)?;
            }
        } else if rules.sends(name) {
            files.push(path);
        }
    }
    Ok(())
}

/// Makes `into` hold exactly the context of `root`: files copied with their modification times
/// (Cargo decides what to rebuild by them, so an unchanged source is not rebuilt), files that
/// left the context removed. Returns `into`.
pub fn sync_context(root: &Path, into: &Path) -> Result<PathBuf> {
    let files = context_files(root)?;
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    for relative in &files {
        let (source, target) = (root.join(relative), into.join(relative));
        let source_meta = std::fs::metadata(&source)?;
        let modified = source_meta.modified()?;
        if is_copy_of(&target, source_meta.len(), modified) {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&source, &target).with_context(|| format!("copying {}", source.display()))?;
        std::fs::File::options().write(true).open(&target)?.set_modified(modified)?;
    }
    remove_others(into, Path::new(""), &files)?;
    Ok(into.to_path_buf())
}

fn is_copy_of(target: &Path, len: u64, modified: SystemTime) -> bool {
    std::fs::metadata(target)
        .is_ok_and(|meta| meta.is_file() && meta.len() == len && meta.modified().ok() == Some(modified))
}

fn remove_others(into: &Path, relative: &Path, keep: &[PathBuf]) -> Result<()> {
    for entry in std::fs::read_dir(into.join(relative))? {
        let entry = entry?;
        let path = relative.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            remove_others(into, &path, keep)?;
            // Left empty: gone from the context too (a non-empty one stays).
            let _ = std::fs::remove_dir(into.join(&path));
        } else if keep.binary_search(&path).is_err() {
            std::fs::remove_file(into.join(&path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn rules_follow_dockers_order_anchoring_and_directories() {
        let rules =
            DockerIgnore::parse("# comment\n/target/\n**/*.swp\ndocs\n!docs/keep.md\nsrc/*.tmp\n./hack/./old/\n")
                .unwrap();
        // Anchored at the root: `target/` is the root's only.
        assert!(!rules.sends("target/debug/x"));
        assert!(rules.sends("tests/target/x"));
        // `**` spans elements, `*` stays within one.
        assert!(!rules.sends("a/b/c.swp"));
        assert!(!rules.sends("src/a.tmp"));
        assert!(rules.sends("src/deep/a.tmp"));
        // A directory takes its contents with it; the last matching rule decides.
        assert!(!rules.sends("docs/install.md"));
        assert!(rules.sends("docs/keep.md"));
        assert!(!rules.sends("hack/old/x.sh"));
        assert!(rules.sends("hack/build-static.sh"));
        assert!(rules.sends("Cargo.toml"));
    }

    #[test]
    fn a_pattern_naming_no_path_is_refused() {
        assert!(DockerIgnore::parse("!\n").is_err());
        assert!(DockerIgnore::parse("/\n").is_err());
    }

    /// Every file the provisioner's sources embed (`include_str!`, `include_bytes!`) is in the
    /// context: the `docker build` that once failed on the operator's embedded manifests.
    #[test]
    fn every_file_the_provisioner_embeds_is_in_the_docker_context() {
        let repo = repo().canonicalize().unwrap();
        let sent: std::collections::BTreeSet<PathBuf> = context_files(&repo).unwrap().into_iter().collect();
        let mut embedded = Vec::new();
        for source in sent.iter().filter(|path| path.starts_with("src") && path.extension().is_some_and(|e| e == "rs"))
        {
            let text = std::fs::read_to_string(repo.join(source)).unwrap();
            let after = |macro_call: &'static str| text.split(macro_call).skip(1);
            for quoted in after("include_str!(\"").chain(after("include_bytes!(\"")) {
                let Some(end) = quoted.find('"') else { continue };
                let target = repo.join(source).parent().unwrap().join(&quoted[..end]);
                embedded.push(target.canonicalize().unwrap().strip_prefix(&repo).unwrap().to_path_buf());
            }
        }
        assert!(embedded.iter().any(|path| path.starts_with("deploy")), "the operator embeds deploy/: {embedded:?}");
        for path in &embedded {
            assert!(
                sent.contains(path),
                "{} is embedded by the binary but .dockerignore leaves it out",
                path.display()
            );
        }
        for needed in ["Cargo.toml", "Cargo.lock", "build.rs", "hack/build-static.sh", "tests/testbed/Cargo.toml"] {
            assert!(sent.contains(Path::new(needed)), "{needed} is not in the context");
        }
        assert!(!sent.iter().any(|path| path.starts_with("target") || path.starts_with(".git")));
    }

    /// The Dockerfile compiles the whole context with the script `make image` runs, for a glibc
    /// target: the image users build and the one the tests run link the same libc.
    #[test]
    fn the_dockerfile_builds_the_context_with_make_images_script() {
        let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
        let instructions: Vec<&str> =
            dockerfile.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')).collect();
        assert!(instructions.contains(&"COPY . ."), "the build stage copies the whole context");
        // Instructions with their continuation lines joined.
        let joined = dockerfile.replace("\\\n", " ");
        let build = joined
            .lines()
            .find(|line| line.starts_with("RUN ") && line.contains("hack/build-static.sh"))
            .expect("a RUN instruction builds with hack/build-static.sh");
        // The build stage's own target, rustc's host triple: the Rust name on every platform
        // buildx builds (`uname -m` says ppc64le where Rust says powerpc64le).
        assert!(
            build.contains("\"$(rustc -vV | sed -n 's/^host: //p')\" release /src/target"),
            "rustc's host target, release profile: {build}"
        );
        assert!(!build.contains("uname -m"), "{build}");
        let script = std::fs::read_to_string(repo().join("hack/build-static.sh")).unwrap();
        assert!(script.contains("+crt-static"), "the script links the C library in");
        assert!(script.contains("*-unknown-linux-gnu) ;;"), "the script accepts glibc targets only");
        assert!(!dockerfile.contains("musl"), "no musl build beside make image's glibc one");
    }

    #[test]
    fn a_synced_copy_holds_exactly_the_context_and_keeps_modification_times() {
        let root = tempfile::tempdir().unwrap();
        let into = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(".dockerignore"), "skip/\n").unwrap();
        std::fs::create_dir_all(root.path().join("src")).unwrap();
        std::fs::create_dir_all(root.path().join("skip")).unwrap();
        std::fs::write(root.path().join("src/a.rs"), "a").unwrap();
        std::fs::write(root.path().join("skip/b"), "b").unwrap();
        std::fs::create_dir_all(into.path().join("old")).unwrap();
        std::fs::write(into.path().join("old/stale"), "gone").unwrap();
        sync_context(root.path(), into.path()).unwrap();
        assert_eq!(std::fs::read_to_string(into.path().join("src/a.rs")).unwrap(), "a");
        assert!(!into.path().join("skip").exists());
        assert!(!into.path().join("old").exists(), "files that left the context are removed");
        let times = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
        assert_eq!(times(&root.path().join("src/a.rs")), times(&into.path().join("src/a.rs")));
    }
}
