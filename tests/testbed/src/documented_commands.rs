//! The shell commands of the user docs (README.md and docs/*.md), which of them change an
//! install (install, upgrade, migrate, roll back, remove, or build and ship what is installed),
//! and the ledger (`tests/documented_commands.txt`) that says for each of those which test runs
//! it as written, or why none can here. docs/development.md, "Documented commands", states the
//! rule this module keeps.
//!
//! Extraction and classification are pure functions over text; only [`user_docs`],
//! [`documented_commands`], [`read_ledger`] and [`test_functions_under`] read files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Where the ledger lives, relative to the repository root.
pub const LEDGER_PATH: &str = "tests/documented_commands.txt";

/// Where a command was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A line of a fenced `sh`, `bash`, `shell` or `console` block.
    Block,
    /// Inline code (a table cell or running text) that starts with a known program.
    Inline,
}

/// One command as a user reads it in the docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentedCommand {
    /// The file, relative to the repository root (`docs/install.md`).
    pub file: String,
    /// The 1-based line the command starts on.
    pub line: usize,
    /// The text of the nearest heading above it (`3a. Helm`), empty before the first heading.
    pub section: String,
    pub origin: Origin,
    /// The command: continuation lines joined with one space, a trailing `# comment` and a
    /// console prompt removed. Running it in bash is running what the doc shows.
    pub text: String,
}

impl DocumentedCommand {
    /// `docs/install.md:74`, for messages.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Programs whose inline code counts as a command. Inline code starting with anything else
/// (`PV_DIR`, `--kubeconfig`, a file name) is not one.
const PROGRAMS: &[&str] = &[
    "bash",
    "cargo",
    "cd",
    "cp",
    "ctr",
    "docker",
    "git",
    "helm",
    "kubectl",
    "kustomize",
    "make",
    "oc",
    "podman",
    "skopeo",
    "systemctl",
];

/// Fence info strings whose lines are shell commands.
const SHELL_FENCES: &[&str] = &["sh", "bash", "shell", "console"];

/// Every command in one markdown file: the lines of its shell blocks, and its inline code that
/// starts with a known program and has at least one argument.
pub fn extract(file: &str, markdown: &str) -> Vec<DocumentedCommand> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut commands = Vec::new();
    let mut section = String::new();
    // Consecutive lines of running text (a paragraph, a table) and the line each starts on:
    // inline code may continue on the next line, never past a blank line.
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(fence) = Fence::open(line) {
            inline_commands(file, &section, &paragraph, &mut commands);
            paragraph.clear();
            let end = (i + 1..lines.len()).find(|&j| fence.closes(lines[j])).unwrap_or(lines.len());
            if fence.is_shell() {
                let body: Vec<(usize, &str)> = (i + 1..end).map(|j| (j + 1, fence.dedent(lines[j]))).collect();
                block_commands(file, &section, fence.is_console(), &body, &mut commands);
            }
            i = end + 1;
            continue;
        }
        if trimmed.is_empty() || heading(trimmed).is_some() {
            inline_commands(file, &section, &paragraph, &mut commands);
            paragraph.clear();
            if let Some(text) = heading(trimmed) {
                section = text.to_owned();
            }
        } else {
            paragraph.push((i + 1, line));
        }
        i += 1;
    }
    inline_commands(file, &section, &paragraph, &mut commands);
    commands
}

/// An ATX heading's text (`## 3a. Helm` gives `3a. Helm`).
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    let rest = &line[hashes..];
    ((1..=6).contains(&hashes) && (rest.is_empty() || rest.starts_with(' ')))
        .then(|| rest.trim().trim_end_matches('#').trim_end())
}

/// An opening code fence: its character, length, indentation and info string.
struct Fence {
    marker: char,
    length: usize,
    indent: usize,
    info: String,
}

impl Fence {
    fn open(line: &str) -> Option<Fence> {
        let trimmed = line.trim_start_matches(' ');
        let indent = line.len() - trimmed.len();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
        let length = trimmed.len() - trimmed.trim_start_matches(marker).len();
        let info = trimmed[length..].trim();
        // A backtick fence's info string cannot hold a backtick (that is inline code).
        (length >= 3 && !(marker == '`' && info.contains('`'))).then(|| Fence {
            marker,
            length,
            indent,
            info: info.split_whitespace().next().unwrap_or_default().to_ascii_lowercase(),
        })
    }

    fn closes(&self, line: &str) -> bool {
        let trimmed = line.trim();
        let run = trimmed.len() - trimmed.trim_start_matches(self.marker).len();
        run >= self.length && trimmed[run..].is_empty()
    }

    fn is_shell(&self) -> bool {
        SHELL_FENCES.contains(&self.info.as_str())
    }

    fn is_console(&self) -> bool {
        self.info == "console"
    }

    /// The line without the fence's own indentation (a block inside a list item).
    fn dedent<'a>(&self, line: &'a str) -> &'a str {
        let spaces = line.len() - line.trim_start_matches(' ').len();
        &line[spaces.min(self.indent)..]
    }
}

/// The commands of a shell block: one per line, continuation lines joined, comment lines and
/// trailing comments dropped; in a console block only the lines after a `$ ` prompt.
fn block_commands(file: &str, section: &str, console: bool, body: &[(usize, &str)], out: &mut Vec<DocumentedCommand>) {
    let mut k = 0;
    while k < body.len() {
        let (line_number, raw) = body[k];
        k += 1;
        let mut text = raw.trim().to_owned();
        if console {
            match text.strip_prefix("$ ") {
                Some(command) => text = command.to_owned(),
                None => continue, // output
            }
        }
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        while let Some(head) = continued(&text) {
            let Some((_, next)) = body.get(k) else { break };
            text = format!("{} {}", head.trim_end(), next.trim());
            k += 1;
        }
        let text = strip_comment(&text).trim().to_owned();
        if !text.is_empty() {
            out.push(DocumentedCommand {
                file: file.to_owned(),
                line: line_number,
                section: section.to_owned(),
                origin: Origin::Block,
                text,
            });
        }
    }
}

/// The line without its continuation backslash, when it ends with one (an escaped backslash,
/// `\\`, is no continuation).
fn continued(text: &str) -> Option<&str> {
    let trailing = text.len() - text.trim_end_matches('\\').len();
    (trailing % 2 == 1).then(|| &text[..text.len() - 1])
}

/// The command without a trailing shell comment: a `#` that starts a word outside quotes.
fn strip_comment(text: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' && quote != Some('\'') {
            escaped = true;
        } else if let Some(q) = quote {
            if c == q {
                quote = None;
            }
        } else if c == '\'' || c == '"' {
            quote = Some(c);
        } else if c == '#' && previous.is_whitespace() {
            return &text[..index];
        }
        previous = c;
    }
    text
}

/// The inline code of a paragraph or table that is a command.
fn inline_commands(file: &str, section: &str, paragraph: &[(usize, &str)], out: &mut Vec<DocumentedCommand>) {
    for (line, code) in code_spans(paragraph) {
        if is_command(&code) {
            out.push(DocumentedCommand {
                file: file.to_owned(),
                line,
                section: section.to_owned(),
                origin: Origin::Inline,
                text: code,
            });
        }
    }
}

/// The code spans of consecutive lines (CommonMark: a run of n backticks up to the next run of
/// exactly n; line breaks inside become spaces), each with the line it starts on.
fn code_spans(paragraph: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut text = String::new();
    let mut starts = Vec::new(); // (byte offset in text, line number)
    for (number, line) in paragraph {
        if !text.is_empty() {
            text.push('\n');
        }
        starts.push((text.len(), *number));
        text.push_str(line);
    }
    let line_at = |offset: usize| starts.iter().rev().find(|(start, _)| *start <= offset).map_or(0, |(_, n)| *n);
    let bytes = text.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|b| **b == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2, // an escaped character, a backtick included, is literal
            b'`' => {
                let open = run_at(i);
                let content_start = i + open;
                let mut j = content_start;
                let mut close = None;
                while j < bytes.len() {
                    if bytes[j] == b'`' {
                        let run = run_at(j);
                        if run == open {
                            close = Some(j);
                            break;
                        }
                        j += run;
                    } else {
                        j += 1;
                    }
                }
                match close {
                    Some(end) => {
                        spans.push((line_at(i), span_text(&text[content_start..end])));
                        i = end + open;
                    }
                    None => i = content_start,
                }
            }
            _ => i += 1,
        }
    }
    spans
}

/// A code span's content as CommonMark reads it: line breaks (and the next line's indentation)
/// become one space, and one space on each side is dropped when both are there.
fn span_text(raw: &str) -> String {
    let mut lines = raw.split('\n');
    let first = lines.next().unwrap_or_default();
    let joined = std::iter::once(first).chain(lines.map(str::trim_start)).collect::<Vec<_>>().join(" ");
    match joined.strip_prefix(' ').and_then(|s| s.strip_suffix(' ')) {
        Some(inner) if !inner.trim().is_empty() => inner.to_owned(),
        _ => joined,
    }
}

/// Inline code that starts with a known program and gives it at least one argument.
fn is_command(code: &str) -> bool {
    let words = shell_words(code);
    let command = skip_prefixes(&words);
    command.len() >= 2 && PROGRAMS.contains(&program_name(&command[0]))
}

/// Shell words, quotes removed; operators (`&&`, `||`, `;`, `|`, `>`) are words of their own.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '&' | '|' | ';' | '>' | '<') => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                let mut operator = c.to_string();
                if let Some(&next) = chars.peek()
                    && (next == c || (c == '>' && next == '>'))
                {
                    operator.push(next);
                    chars.next();
                }
                words.push(operator);
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn is_operator(word: &str) -> bool {
    matches!(word, "&&" | "||" | ";" | "|" | "&")
}

/// The words after leading variable assignments (`IMAGE_PLATFORMS=x make image`) and `sudo`.
fn skip_prefixes(words: &[String]) -> &[String] {
    let skip = words
        .iter()
        .take_while(|w| w.as_str() == "sudo" || w.split_once('=').is_some_and(|(name, _)| is_variable_name(name)))
        .count();
    &words[skip..]
}

fn is_variable_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// `kubectl` for `kubectl` and `/usr/local/bin/kubectl`.
fn program_name(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// Global flags that take the next word as their value, per program: they come before the
/// subcommand (`kubectl -n ns rollout status ...`, `ctr -n k8s.io images import`).
fn flags_with_values(program: &str) -> &'static [&'static str] {
    match program {
        "kubectl" | "oc" => {
            &["-n", "--namespace", "--kubeconfig", "--context", "--cluster", "--user", "-s", "--server", "--cache-dir"]
        }
        "helm" => &["-n", "--namespace", "--kubeconfig", "--kube-context", "--registry-config"],
        "ctr" => &["-n", "--namespace", "-a", "--address"],
        "docker" | "podman" => &["-H", "--host", "-c", "--context", "--config"],
        _ => &[],
    }
}

/// The arguments of one simple command that are not flags or flag values: the subcommands,
/// then the operands (`["rollout", "status", "daemonset/x"]`).
fn operands<'a>(program: &str, arguments: &'a [String]) -> Vec<&'a str> {
    let with_values = flags_with_values(program);
    let mut operands = Vec::new();
    let mut skip_next = false;
    for word in arguments {
        if skip_next {
            skip_next = false;
        } else if with_values.contains(&word.as_str()) {
            skip_next = true;
        } else if !word.starts_with('-') {
            operands.push(word.as_str());
        }
    }
    operands
}

/// The make targets users run that build or render what is installed.
const INSTALL_MAKE_TARGETS: &[&str] = &["image", "manifests"];

/// Whether one simple command (program and arguments) changes an install or builds or ships
/// what is installed.
fn simple_command_changes_an_install(words: &[String]) -> bool {
    let words = skip_prefixes(words);
    let Some((program, arguments)) = words.split_first() else { return false };
    let program = program_name(program);
    let operands = operands(program, arguments);
    let verb = operands.first().copied().unwrap_or_default();
    match program {
        "helm" => {
            matches!(verb, "install" | "upgrade" | "rollback" | "uninstall" | "delete" | "test" | "package" | "push")
        }
        "kubectl" | "oc" => matches!(
            verb,
            "apply"
                | "create"
                | "replace"
                | "delete"
                | "patch"
                | "label"
                | "annotate"
                | "scale"
                | "rollout"
                | "set"
                | "edit"
                | "kustomize"
                | "taint"
                | "cordon"
                | "uncordon"
                | "drain"
        ),
        "kustomize" => true,
        "docker" => matches!(verb, "build" | "buildx" | "push" | "load" | "import"),
        "podman" => matches!(verb, "build" | "push" | "load"),
        "ctr" => operands.contains(&"import"),
        "skopeo" => verb == "copy",
        "make" => operands.iter().any(|target| !target.contains('=') && INSTALL_MAKE_TARGETS.contains(target)),
        "systemctl" => {
            matches!(verb, "enable" | "disable" | "start" | "restart" | "stop" | "daemon-reload" | "mask" | "unmask")
        }
        // Copying a file into place installs it (the systemd unit).
        "cp" => true,
        _ => false,
    }
}

/// Whether a command installs, upgrades, migrates, rolls back or removes something, or builds
/// or ships what is installed: then the ledger must say which test runs it, or why none can.
/// Commands that only read (`kubectl get`, `describe`, `logs`) or run the project's own
/// development targets (`make test`, `make demo`) are not.
pub fn changes_an_install(command: &str) -> bool {
    let words = shell_words(command);
    words.split(|w| is_operator(w)).any(|simple| {
        // Redirections name files, not arguments.
        let end = simple.iter().position(|w| w.starts_with('>') || w.starts_with('<')).unwrap_or(simple.len());
        simple_command_changes_an_install(&simple[..end])
    })
}

/// README.md and every docs/*.md, by path relative to the repository root, in name order.
pub fn user_docs(repo: &Path) -> Result<Vec<(String, String)>> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo.join("docs"))
        .context("reading docs/")?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(repo.join(&name)).with_context(|| format!("reading {name}"))?;
            Ok((name, text))
        })
        .collect()
}

/// Every command of the user docs, in file and line order.
pub fn documented_commands(repo: &Path) -> Result<Vec<DocumentedCommand>> {
    Ok(user_docs(repo)?.iter().flat_map(|(name, text)| extract(name, text)).collect())
}

/// What the ledger says about one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Tests (function names) that read the command from the doc and run it.
    RunBy(Vec<String>),
    /// Why no test here can run it.
    Untestable(String),
}

/// One ledger entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub command: String,
    /// The ledger line of its `command:`.
    pub line: usize,
    pub coverage: Coverage,
}

/// The ledger: every classified command of the docs, once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub entries: Vec<LedgerEntry>,
}

impl Ledger {
    /// The commands the ledger says `test` runs.
    pub fn run_by(&self, test: &str) -> BTreeSet<&str> {
        self.entries
            .iter()
            .filter(|e| matches!(&e.coverage, Coverage::RunBy(tests) if tests.iter().any(|t| t == test)))
            .map(|e| e.command.as_str())
            .collect()
    }

    pub fn entry(&self, command: &str) -> Option<&LedgerEntry> {
        self.entries.iter().find(|e| e.command == command)
    }
}

/// Parses the ledger: entries separated by blank lines, each a `command:` line followed by one
/// or more `run by:` lines or one `untestable:` line; lines starting with `#` are comments.
pub fn parse_ledger(text: &str) -> Result<Ledger> {
    let mut entries: Vec<LedgerEntry> = Vec::new();
    let mut open: Option<(usize, String, Vec<String>, Option<String>)> = None;
    let close = |open: &mut Option<(usize, String, Vec<String>, Option<String>)>, entries: &mut Vec<LedgerEntry>| {
        let Some((line, command, tests, why)) = open.take() else { return Ok(()) };
        let coverage = match (tests.is_empty(), why) {
            (false, None) => Coverage::RunBy(tests),
            (true, Some(why)) => Coverage::Untestable(why),
            (true, None) => bail!("line {line}: `{command}` has neither `run by:` nor `untestable:`"),
            (false, Some(_)) => bail!("line {line}: `{command}` has both `run by:` and `untestable:`"),
        };
        if let Some(first) = entries.iter().find(|e| e.command == command) {
            bail!("line {line}: `{command}` is listed twice (first on line {})", first.line);
        }
        entries.push(LedgerEntry { command, line, coverage });
        Ok(())
    };
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim_end();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            close(&mut open, &mut entries)?;
            continue;
        }
        let Some((key, value)) = line.split_once(": ") else {
            bail!("line {number}: expected `command: `, `run by: ` or `untestable: `, found {line:?}")
        };
        let value = value.trim().to_owned();
        if value.is_empty() {
            bail!("line {number}: `{key}:` without a value");
        }
        match (key, open.as_mut()) {
            ("command", None) => open = Some((number, value, Vec::new(), None)),
            ("command", Some(_)) => bail!("line {number}: a new `command:` needs a blank line before it"),
            ("run by", Some((_, _, tests, _))) => tests.push(value),
            ("untestable", Some((_, _, _, why @ None))) => *why = Some(value),
            ("untestable", Some(_)) => bail!("line {number}: a second `untestable:`"),
            (_, None) => bail!("line {number}: `{key}:` before any `command:`"),
            (other, Some(_)) => bail!("line {number}: unknown key {other:?}"),
        }
    }
    close(&mut open, &mut entries)?;
    Ok(Ledger { entries })
}

/// Reads and parses the repository's ledger.
pub fn read_ledger(repo: &Path) -> Result<Ledger> {
    let text = std::fs::read_to_string(repo.join(LEDGER_PATH)).with_context(|| format!("reading {LEDGER_PATH}"))?;
    parse_ledger(&text).with_context(|| format!("in {LEDGER_PATH}"))
}

/// Names of the functions declared in Rust source (`fn name`), as a grep would find them.
pub fn function_names(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find("fn ") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + 3..];
        if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
        rest = after;
    }
    names
}

/// The function names of every `.rs` file under `dir` (the tests and the harness).
pub fn test_functions_under(dir: &Path) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                names.extend(function_names(&source));
            }
        }
    }
    Ok(names)
}

/// What is wrong between the docs' classified commands and the ledger: a classified command
/// missing from the ledger, a ledger command no classified command of the docs has, a test
/// named that does not exist. Empty when they agree.
pub fn ledger_problems(
    commands: &[DocumentedCommand],
    ledger: &Ledger,
    test_functions: &BTreeSet<String>,
) -> Vec<String> {
    let mut classified: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for command in commands.iter().filter(|c| changes_an_install(&c.text)) {
        classified.entry(command.text.as_str()).or_default().push(command.location());
    }
    let mut problems = Vec::new();
    for (command, places) in &classified {
        if ledger.entry(command).is_none() {
            problems.push(format!(
                "`{command}` ({}) is not in {LEDGER_PATH}: add it with the test that runs it, or `untestable:` and why",
                places.join(", ")
            ));
        }
    }
    for entry in &ledger.entries {
        if !classified.contains_key(entry.command.as_str()) {
            let documented = commands.iter().find(|c| c.text == entry.command);
            problems.push(match documented {
                Some(c) => format!(
                    "{LEDGER_PATH}:{}: `{}` ({}) does not change an install: remove it",
                    entry.line,
                    entry.command,
                    c.location()
                ),
                None => format!(
                    "{LEDGER_PATH}:{}: `{}` is no longer in the docs: remove it (or fix it to the docs' text)",
                    entry.line, entry.command
                ),
            });
        }
        if let Coverage::RunBy(tests) = &entry.coverage {
            for test in tests.iter().filter(|t| !test_functions.contains(t.as_str())) {
                problems.push(format!(
                    "{LEDGER_PATH}:{}: `{}` names the test `{test}`, which no file under tests/ declares",
                    entry.line, entry.command
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests;
