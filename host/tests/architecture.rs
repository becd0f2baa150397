//! The shape of `host/src`, checked: no import cycles between its files, no function over
//! ~100 lines and no file over ~600 lines of code (tests aside), except where a one-line reason
//! below says why a longer one reads better. `cargo test -p proxy-operator --test architecture`
//! prints what it measured. Also the figures the docs quote from the code (a test beside these
//! rather than a binary of its own, which would cost another link).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

const MAX_FUNCTION_LINES: usize = 100;
const MAX_FILE_CODE_LINES: usize = 600;

/// Functions allowed to be longer, each with the reason (file, function name, reason).
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// Files allowed to be longer, each with the reason.
const LONG_FILES: &[(&str, &str)] = &[];

/// One Rust source file of the library, as a module path (`plugins/load.rs` → `plugins::load`).
struct SourceFile {
    module: Vec<String>,
    relative: String,
    text: String,
}

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn library_files() -> Vec<SourceFile> {
    let root = source_root();
    let mut files = Vec::new();
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read host/src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            // main.rs and bin/ are binary crates: they see the library through `proxy_operator::`.
            if relative == "main.rs" || relative.starts_with("bin/") {
                continue;
            }
            let module = if relative == "lib.rs" {
                Vec::new()
            } else {
                relative
                    .trim_end_matches(".rs")
                    .split('/')
                    .map(str::to_string)
                    .collect()
            };
            let text = std::fs::read_to_string(&path).expect("read source file");
            files.push(SourceFile {
                module,
                relative,
                text,
            });
        }
    }
    files.sort_by(|a, b| a.relative.cmp(&b.relative));
    files
}

/// Every `crate::…` / `super::…` path a file names outside its `#[cfg(test)]` items, as absolute
/// module paths.
struct PathCollector<'m> {
    /// The module the visitor is in (the file's, plus inline modules).
    module: Vec<String>,
    /// Every file's module, to tell `hub::LibvirtHub` (a child module) from `std::…`.
    modules: &'m BTreeSet<Vec<String>>,
    found: Vec<Vec<String>>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl PathCollector<'_> {
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "super" | "self" => self.module.clone(),
            child
                if self
                    .modules
                    .contains(&[self.module.clone(), vec![child.into()]].concat()) =>
            {
                return Some([self.module.clone(), segments.to_vec()].concat());
            }
            _ => return None,
        };
        let mut rest = &segments[1..];
        if first == "super" {
            base.pop();
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.record_use(prefix, Some(n.ident.to_string())),
            syn::UseTree::Rename(r) => self.record_use(prefix, Some(r.ident.to_string())),
            syn::UseTree::Glob(_) => self.record_use(prefix, None),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    fn record_use(&mut self, prefix: &[String], last: Option<String>) {
        let mut segments = prefix.to_vec();
        if let Some(last) = last.filter(|l| l != "self") {
            segments.push(last);
        }
        if let Some(path) = self.absolute(&segments) {
            self.found.push(path);
        }
    }
}

impl<'ast> Visit<'ast> for PathCollector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    // `pub(super)` names a module to limit visibility, not a dependency.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(p) = self.absolute(&segments) {
            self.found.push(p);
        }
        syn::visit::visit_path(self, path);
    }
}

/// The names a file re-exports (`pub use load::LoadedPlugin;` in `plugins.rs`, or a private
/// alias its child modules name, `use since_v0_2_0 as latest;`), each with the absolute path it
/// stands for, so a use of `crate::plugins::LoadedPlugin` counts as a use of `plugins/load.rs`,
/// not of the module root that only re-exports it.
fn re_exports(
    source: &SourceFile,
    syntax: &syn::File,
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    fn walk(prefix: &mut Vec<String>, tree: &syn::UseTree, out: &mut Vec<(String, Vec<String>)>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(prefix, &p.tree, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                out.push((n.ident.to_string(), path));
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                out.push((r.rename.to_string(), path));
            }
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    walk(prefix, item, out);
                }
            }
            syn::UseTree::Glob(_) => {}
        }
    }
    let mut found = BTreeMap::new();
    for item in &syntax.items {
        let syn::Item::Use(u) = item else { continue };
        let mut out = Vec::new();
        walk(&mut Vec::new(), &u.tree, &mut out);
        for (name, path) in out {
            let absolute = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "self" => [source.module.clone(), path[1..].to_vec()].concat(),
                child
                    if modules.contains(&[source.module.clone(), vec![child.into()]].concat()) =>
                {
                    [source.module.clone(), path].concat()
                }
                _ => continue,
            };
            found.insert(name, absolute);
        }
    }
    found
}

/// The file a module path lives in: the longest prefix that is a file, following re-exports.
fn file_of(
    path: &[String],
    files: &BTreeMap<Vec<String>, String>,
    exports: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
) -> Option<String> {
    let n = (0..=path.len())
        .rev()
        .find(|n| files.contains_key(&path[..*n]))?;
    let file = files[&path[..n]].clone();
    if let Some(target) = path.get(n).and_then(|name| exports[&file].get(name))
        && target.as_slice() != path
    {
        return file_of(target, files, exports);
    }
    Some(file)
}

/// file → files it names (self excluded).
fn import_graph(sources: &[SourceFile]) -> BTreeMap<String, BTreeSet<String>> {
    let files: BTreeMap<Vec<String>, String> = sources
        .iter()
        .map(|s| (s.module.clone(), s.relative.clone()))
        .collect();
    let modules: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    let parsed: Vec<syn::File> = sources
        .iter()
        .map(|s| {
            syn::parse_file(&s.text)
                .unwrap_or_else(|e| panic!("{}: does not parse: {e}", s.relative))
        })
        .collect();
    let exports: BTreeMap<String, BTreeMap<String, Vec<String>>> = sources
        .iter()
        .zip(&parsed)
        .map(|(s, syntax)| (s.relative.clone(), re_exports(s, syntax, &modules)))
        .collect();
    let mut graph = BTreeMap::new();
    for (source, syntax) in sources.iter().zip(&parsed) {
        let mut collector = PathCollector {
            module: source.module.clone(),
            modules: &modules,
            found: Vec::new(),
        };
        collector.visit_file(syntax);
        let targets: BTreeSet<String> = collector
            .found
            .iter()
            .filter_map(|p| file_of(p, &files, &exports))
            .filter(|t| t != &source.relative)
            .collect();
        graph.insert(source.relative.clone(), targets);
    }
    graph
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn connect(&mut self, v: &'g str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.connect(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v.as_str()) {
            tarjan.connect(v);
        }
    }
    tarjan.found
}

#[test]
fn no_import_cycles_between_files() {
    let sources = library_files();
    let mut graph = import_graph(&sources);
    graph
        .values_mut()
        .for_each(|targets| targets.retain(|t| t != "lib.rs"));
    let found = cycles(&graph);
    let report: Vec<String> = found
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| c.contains(b))
                        .map(move |b| format!("{a} → {b}"))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(
        report.is_empty(),
        "import cycles in host/src:\n  {}",
        report.join("\n  ")
    );
}

/// The tiers of `host/src`, lowest first (docs/architecture.md, "Tiers"): a file may name files of
/// its own tier and of the tiers below it, never above.
const TIERS: &[&str] = &[
    "support",
    "api",
    "provider",
    "leasing",
    "lifecycle",
    "faces",
];

/// The tier a library file belongs to (`provider/plugins/load.rs` → `provider`), by its folder.
fn tier_of(relative: &str) -> Option<usize> {
    let first = relative.split('/').next().unwrap_or(relative);
    let first = first.strip_suffix(".rs").unwrap_or(first);
    TIERS.iter().position(|t| *t == first)
}

/// Every edge of the file graph that goes up a tier, as `from (tier) → to (tier)`, and every
/// file outside a tier but the crate root.
fn tier_violations(files: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for (file, targets) in files {
        if file == "lib.rs" {
            continue;
        }
        let Some(from) = tier_of(file) else {
            found.push(format!(
                "{file} is in no tier (folders: {})",
                TIERS.join(", ")
            ));
            continue;
        };
        for target in targets {
            match tier_of(target) {
                Some(to) if to > from => found.push(format!(
                    "{file} ({}) → {target} ({})",
                    TIERS[from], TIERS[to]
                )),
                _ => {}
            }
        }
    }
    found
}

#[test]
fn each_tier_imports_only_the_tiers_below_it() {
    let files = import_graph(&library_files());
    let violations = tier_violations(&files);
    assert!(
        violations.is_empty(),
        "host/src's tiers, lowest first, are {TIERS:?}; these files name a higher tier (move \
         the shared part down, or the file up):\n    {}",
        violations.join("\n    ")
    );
}

/// The module a library file belongs to: within a tier, the tier's module (`provider/plugins/
/// load.rs` → `provider/plugins`); elsewhere the top-level module (`a/inner.rs` → `a`).
fn top_module(relative: &str) -> String {
    let mut parts = relative.split('/');
    let first = parts.next().unwrap_or(relative);
    let first = first.strip_suffix(".rs").unwrap_or(first);
    match parts.next() {
        Some(second) if tier_of(first).is_some() => {
            format!("{first}/{}", second.strip_suffix(".rs").unwrap_or(second))
        }
        _ => first.to_string(),
    }
}

/// The file graph contracted to modules (`top_module`): `a → b` when a file of `a` names one of `b`.
fn module_graph(files: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, targets) in files {
        let from = top_module(file);
        let edges = graph.entry(from.clone()).or_default();
        edges.extend(
            targets
                .iter()
                .map(|t| top_module(t))
                .filter(|to| *to != from && to != "lib" && !TIERS.contains(&to.as_str())),
        );
    }
    graph
}

#[test]
fn no_import_cycles_between_top_level_modules() {
    let files = import_graph(&library_files());
    let modules = module_graph(&files);
    let report: Vec<String> = cycles(&modules)
        .iter()
        .map(|c| {
            // Each edge of the cycle with the files that make it, so the fix is plain.
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    modules[a]
                        .iter()
                        .filter(|b| c.contains(b))
                        .map(move |b| (a, b))
                })
                .map(|(a, b)| {
                    let through: Vec<String> = files
                        .iter()
                        .filter(|(f, _)| top_module(f) == *a)
                        .flat_map(|(f, ts)| {
                            ts.iter()
                                .filter(|t| top_module(t) == *b)
                                .map(move |t| format!("{f} → {t}"))
                        })
                        .collect();
                    format!("{a} → {b} ({})", through.join(", "))
                })
                .collect();
            edges.join("\n    ")
        })
        .collect();
    assert!(
        report.is_empty(),
        "import cycles between host/src's top-level modules:\n    {}",
        report.join("\n  ")
    );
}

/// The lines of a file before its test module (`#[cfg(test)]` then `mod tests {` or
/// `mod tests;`). Only there: another `#[cfg(test)]` item (a test-only `use` near the top) must
/// not end the reading, or the code after it goes unmeasured.
fn before_tests(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let is_test_module = |at: usize| {
        lines[at + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.starts_with("#["))
            .is_some_and(|l| l == "mod tests {" || l == "mod tests;")
    };
    let end = (0..lines.len())
        .find(|&at| lines[at].trim() == "#[cfg(test)]" && is_test_module(at))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Lines of code of a file before its test module, without blank and comment lines.
fn code_lines(text: &str) -> usize {
    before_tests(text)
        .iter()
        .filter(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with("//")
        })
        .count()
}

/// (name, line count) of every function, measured from its `fn` line to the closing brace at
/// the same indentation (the code is rustfmt-formatted), before the file's test module.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines = before_tests(text);
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let signature = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        let Some(rest) = signature.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A trait method without a body ends with `;` before any `{`.
        let Some(open) = lines[i..]
            .iter()
            .position(|l| l.ends_with('{') || l.ends_with(';') || l.ends_with('}'))
        else {
            continue;
        };
        if lines[i + open].ends_with(';') {
            continue;
        }
        if lines[i + open].ends_with('}') && open == 0 {
            found.push((name, 1));
            continue;
        }
        let closing = " ".repeat(indent) + "}";
        if let Some(end) = lines[i..].iter().position(|l| l.trim_end() == closing) {
            found.push((name, end + 1));
        }
    }
    found
}

#[test]
fn functions_and_files_stay_small() {
    let mut problems = Vec::new();
    for source in library_files() {
        let lines = code_lines(&source.text);
        if lines > MAX_FILE_CODE_LINES && !LONG_FILES.iter().any(|(f, _)| *f == source.relative) {
            problems.push(format!("{}: {lines} lines of code", source.relative));
        }
        for (name, length) in function_lengths(&source.text) {
            let allowed = LONG_FUNCTIONS
                .iter()
                .any(|(f, n, _)| *f == source.relative && *n == name);
            if length > MAX_FUNCTION_LINES && !allowed {
                problems.push(format!("{}: fn {name}: {length} lines", source.relative));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "over {MAX_FUNCTION_LINES} lines a function or {MAX_FILE_CODE_LINES} a file:\n  {}",
        problems.join("\n  ")
    );
}

/// The checks can fail: a planted cycle (through a re-export and a `super::` path) and a long
/// function are found, also after a test-only item.
#[test]
fn the_checker_finds_a_planted_cycle_and_a_long_function() {
    let file = |relative: &str, text: &str| SourceFile {
        module: relative
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_string)
            .collect(),
        relative: relative.to_string(),
        text: text.to_string(),
    };
    let sources = vec![
        file(
            "a.rs",
            "mod inner;\npub use inner::Thing;\nuse crate::b::Other;\n",
        ),
        file("a/inner.rs", "pub struct Thing;\n"),
        file(
            "b.rs",
            "pub struct Other;\nfn f() -> crate::a::Thing { todo!() }\n",
        ),
        file("c.rs", "mod d;\n"),
        file(
            "c/d.rs",
            "pub(super) struct D;\nuse super::super::b::Other;\n",
        ),
    ];
    let graph = import_graph(&sources);
    assert!(graph["b.rs"].contains("a/inner.rs"), "{graph:?}");
    assert!(
        !graph["b.rs"].contains("a.rs"),
        "re-exports are followed: {graph:?}"
    );
    assert!(graph["c/d.rs"].contains("b.rs"), "{graph:?}");
    let found = cycles(&graph);
    assert!(found.is_empty(), "{found:?}");
    // No file cycle, but modules `a` and `b` name each other (a.rs → b.rs, b.rs → a/inner.rs).
    assert_eq!(
        cycles(&module_graph(&graph)),
        [vec!["a".to_string(), "b".to_string()]]
    );
    let mut cyclic = graph.clone();
    cyclic.get_mut("a/inner.rs").unwrap().insert("b.rs".into());
    assert_eq!(
        cycles(&cyclic),
        [vec!["a/inner.rs".to_string(), "b.rs".to_string()]]
    );
    // A lower tier naming a higher one is found; the other way round is the rule.
    let tiered = vec![
        file("support.rs", "pub mod clock;\n"),
        file("support/clock.rs", "pub struct Clock;\n"),
        file("faces.rs", "pub mod page;\n"),
        file(
            "faces/page.rs",
            "pub struct Page;\nfn f(_: crate::support::clock::Clock) {}\n",
        ),
    ];
    assert!(tier_violations(&import_graph(&tiered)).is_empty());
    let mut planted = tiered;
    planted[1]
        .text
        .push_str("fn g(_: crate::faces::page::Page) {}\n");
    assert_eq!(
        tier_violations(&import_graph(&planted)),
        ["support/clock.rs (support) → faces/page.rs (faces)"]
    );
    let long = format!("fn long() {{\n{}}}\n", "    let _ = 1;\n".repeat(120));
    assert_eq!(function_lengths(&long), [("long".to_string(), 122)]);
    // A test-only item near the top does not hide the code after it; the test module does.
    let hidden = format!(
        "#[cfg(test)]\nuse a::b;\n{long}#[cfg(test)]\n#[allow(dead_code)]\nmod tests {{\n{}}}\n",
        "    fn t() {}\n".repeat(700)
    );
    assert_eq!(function_lengths(&hidden), [("long".to_string(), 122)]);
    assert_eq!(code_lines(&hidden), 2 + 122);
}

/// A duration as the docs write it: `30 s`, `5 min`.
fn as_docs_say(d: std::time::Duration) -> String {
    match d.as_secs() {
        s if s >= 60 && s.is_multiple_of(60) => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// A number as the docs write it: `10 000`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}

/// Figures the docs quote, read from the code's constants: changing one fails here until the
/// docs say the new figure (each phrase is looked for with its whitespace collapsed, so a
/// line break in the docs does not matter).
#[test]
fn the_docs_quote_the_figures_of_the_code() {
    use proxy_operator::api::MAX_POOL_REPLICAS;
    use proxy_operator::leasing::leases::store::{REPLICA_SILENCE, SHARED_HOLD};
    use proxy_operator::lifecycle::controller::decide::{
        POLL_PROVISIONING, RECHECK_OUTSIDE_SPEC, WAIT_FOR_PROVIDER,
    };
    use proxy_operator::provider::plugins::SUPPORTED_WIT_VERSIONS;

    let versions = SUPPORTED_WIT_VERSIONS.join(" and ");
    let each_with_patches: Vec<String> = SUPPORTED_WIT_VERSIONS
        .iter()
        .map(|v| {
            let major_minor = v.rsplit_once('.').expect("X.Y.Z").0;
            format!("{v} (and any later {major_minor}.x)")
        })
        .collect();
    let max_replicas = grouped(MAX_POOL_REPLICAS.unsigned_abs().into());
    let quoted = [
        (
            "docs/architecture.md",
            format!(
                "looked at again at every providers-config or plugin swap, and every {}",
                as_docs_say(WAIT_FOR_PROVIDER)
            ),
        ),
        (
            "docs/architecture.md",
            format!(
                "get(providerID) every {} until running",
                as_docs_say(POLL_PROVISIONING)
            ),
        ),
        (
            "docs/architecture.md",
            format!(
                "again every {} and at every providers-config or plugin swap",
                as_docs_say(RECHECK_OUTSIDE_SPEC)
            ),
        ),
        (
            "docs/architecture.md",
            format!(
                "returns to the free order {} after its last route",
                as_docs_say(SHARED_HOLD)
            ),
        ),
        (
            "docs/gateway.md",
            format!("it was not routed to for {}", as_docs_say(SHARED_HOLD)),
        ),
        (
            "docs/gateway.md",
            format!(
                "a replica silent for {} no longer counts",
                as_docs_say(REPLICA_SILENCE)
            ),
        ),
        (
            "docs/pools.md",
            format!("Proxies the pool keeps (0–{max_replicas})"),
        ),
        (
            "docs/pools.md",
            format!("`replicas` outside 0–{max_replicas}"),
        ),
        (
            "docs/architecture.md",
            format!("bindings per supported version ({versions})"),
        ),
        (
            "docs/plugin-authoring.md",
            format!("bindings for ({versions} today)"),
        ),
        (
            "wit/README.md",
            format!("served by the {versions} bindings"),
        ),
        (
            "wit/README.md",
            format!("supported versions: {}.", each_with_patches.join(", ")),
        ),
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let collapse = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut missing = Vec::new();
    for (doc, phrase) in &quoted {
        let text = std::fs::read_to_string(root.join(doc)).expect("read a doc");
        if !collapse(&text).contains(&collapse(phrase)) {
            missing.push(format!("{doc}: no `{phrase}`"));
        }
    }
    for version in SUPPORTED_WIT_VERSIONS {
        let frozen = format!("wit/since_v{version}");
        if !root.join(&frozen).is_dir() {
            missing.push(format!("{frozen}/: missing for a supported version"));
        }
    }
    assert!(
        missing.is_empty(),
        "the docs no longer say what the code does (fix the doc, or the phrase here if only \
         its wording changed):\n  {}",
        missing.join("\n  ")
    );
}
