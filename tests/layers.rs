//! Each crate's folders form one order, and a module uses only its own folder or folders before
//! it. The addon (`src`): util → {engine, egress} → config → sandbox → {images, gpu} →
//! {fleet, codemode} → provider → napi. The agent (`agent/src`): base → state →
//! {exec, files, egress} → codemode → serve. Folders of the same rank (engine and egress; images
//! and gpu; fleet and codemode; the agent's exec, files and egress) do not use each other. This
//! test reads every source file's `crate::…` paths and fails on an edge against the order, naming
//! the file, the line and the item. It also keeps functions under 100 lines.

use std::path::{Path, PathBuf};

/// Each folder of the addon with its rank; equal ranks are siblings that must not use each other.
const ORDER: [(&str, u32); 11] = [
  ("util", 0),
  ("engine", 1),
  ("egress", 1),
  ("config", 2),
  ("sandbox", 3),
  ("images", 4),
  ("gpu", 4),
  ("fleet", 5),
  ("codemode", 5),
  ("provider", 6),
  ("napi", 7),
];

/// The agent's folders, ranked the same way. What the server keeps across requests (`state`)
/// sits below the request handlers that fill it, so that the context they all get can name it.
const AGENT_ORDER: [(&str, u32); 7] = [
  ("base", 0),
  ("state", 1),
  ("exec", 2),
  ("files", 2),
  ("egress", 2),
  ("codemode", 3),
  ("serve", 4),
];

/// The longest function body allowed, in lines.
const MAX_FN_LINES: usize = 100;

fn rank(order: &[(&str, u32)], folder: &str) -> Option<u32> {
  order.iter().find(|(f, _)| *f == folder).map(|(_, r)| *r)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
  for entry in std::fs::read_dir(dir).expect("read src") {
    let path = entry.expect("entry").path();
    if path.is_dir() {
      sources(&path, out);
    } else if path.extension().is_some_and(|e| e == "rs") {
      out.push(path);
    }
  }
}

/// Every `crate::<folder>` a line names, with the item path that follows it.
fn crate_paths(line: &str) -> Vec<(String, String)> {
  let mut found = Vec::new();
  let mut rest = line;
  while let Some(at) = rest.find("crate::") {
    let after = &rest[at + "crate::".len()..];
    let end = after
      .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
      .unwrap_or(after.len());
    let path = after[..end].trim_end_matches(':');
    let folder = path.split("::").next().unwrap_or("").to_string();
    // `use crate::{a, b}` groups name several folders at once.
    if folder.is_empty() && after.starts_with('{') {
      let group = &after[1..after.find('}').unwrap_or(after.len())];
      for item in group.split(',') {
        let item = item.trim();
        let f = item.split("::").next().unwrap_or("").to_string();
        found.push((f, item.to_string()));
      }
    } else {
      found.push((folder, path.to_string()));
    }
    rest = &after[end..];
  }
  found
}

fn code_part(line: &str) -> &str {
  let t = line.trim_start();
  if t.starts_with("//") {
    return "";
  }
  // Good enough for this code base: no `//` inside the string literals that name paths.
  match line.find("// ") {
    Some(i) => &line[..i],
    None => line,
  }
}

#[test]
fn folders_are_used_in_one_direction() {
  let root = Path::new(env!("CARGO_MANIFEST_DIR"));
  let mut problems = Vec::new();
  // The crate root only declares the folders (and, in the agent, picks the program to run).
  for (krate, crate_root, order) in [
    ("src", "lib.rs", &ORDER[..]),
    ("agent/src", "main.rs", &AGENT_ORDER[..]),
  ] {
    problems.extend(edges_against_order(root, krate, crate_root, order));
  }
  assert!(
    problems.is_empty(),
    "edges against the layer order:\n{}",
    problems.join("\n")
  );
}

/// Each `crate::` path in the crate under `root/krate` that names a folder of the same or a
/// later rank than its own (or no folder in `order`), as `file:line: what`.
fn edges_against_order(
  root: &Path,
  krate: &str,
  crate_root: &str,
  order: &[(&str, u32)],
) -> Vec<String> {
  let src = root.join(krate);
  let mut files = Vec::new();
  sources(&src, &mut files);
  files.sort();
  let shown = |rel: &Path| format!("{krate}/{}", rel.display());
  let mut problems = Vec::new();
  for file in &files {
    let rel = file.strip_prefix(&src).expect("under src");
    let mut parts = rel.components();
    let first = parts
      .next()
      .expect("a path")
      .as_os_str()
      .to_string_lossy()
      .to_string();
    if parts.next().is_none() {
      assert_eq!(first, crate_root, "{} sits outside the folders", shown(rel));
      continue;
    }
    let own =
      rank(order, &first).unwrap_or_else(|| panic!("{} is in an unknown folder", shown(rel)));
    let text = std::fs::read_to_string(file).expect("read");
    for (n, line) in text.lines().enumerate() {
      for (folder, item) in crate_paths(code_part(line)) {
        let Some(r) = rank(order, &folder) else {
          problems.push(format!(
            "{}:{}: crate::{item} is outside the folders",
            shown(rel),
            n + 1
          ));
          continue;
        };
        if folder != first && r >= own {
          problems.push(format!(
            "{}:{}: {first} uses crate::{item}, but {folder} comes {} it",
            shown(rel),
            n + 1,
            if r == own { "beside" } else { "after" }
          ));
        }
      }
    }
  }
  problems
}

/// The lines of each `fn` body, found by indentation (rustfmt puts a body's closing brace at
/// the indentation of its `fn` line).
fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
  let lines: Vec<&str> = text.lines().collect();
  let mut out = Vec::new();
  for (i, line) in lines.iter().enumerate() {
    let t = line.trim_start();
    let is_fn = [
      "fn ",
      "pub fn ",
      "async fn ",
      "pub async fn ",
      "pub(crate) fn ",
      "pub(crate) async fn ",
    ]
    .iter()
    .any(|p| t.starts_with(p));
    if !is_fn || t.ends_with(';') {
      continue;
    }
    let indent = line.len() - t.len();
    let close = format!("{}}}", " ".repeat(indent));
    let Some(end) = lines[i + 1..].iter().position(|l| l.starts_with(&close)) else {
      continue;
    };
    let name = t.split('(').next().unwrap_or(t).to_string();
    out.push((i + 1, name, end + 1));
  }
  out
}

#[test]
fn no_function_is_over_a_hundred_lines() {
  let root = Path::new(env!("CARGO_MANIFEST_DIR"));
  let mut long = Vec::new();
  for krate in ["src", "agent/src", "agent-proto/src"] {
    let src = root.join(krate);
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in &files {
      let text = std::fs::read_to_string(file).expect("read");
      for (line, name, len) in long_functions(&text) {
        if len > MAX_FN_LINES {
          long.push(format!(
            "{}:{line}: {name} is {len} lines",
            file.strip_prefix(root).unwrap().display()
          ));
        }
      }
    }
  }
  assert!(
    long.is_empty(),
    "functions over {MAX_FN_LINES} lines:\n{}",
    long.join("\n")
  );
}

#[test]
fn the_scanner_sees_paths_and_groups() {
  assert_eq!(
    crate_paths("use crate::engine::{self, Engine};"),
    vec![("engine".to_string(), "engine".to_string())]
  );
  assert_eq!(
    crate_paths("let x = crate::gpu::held(e); crate::util::ids::holder()"),
    vec![
      ("gpu".to_string(), "gpu::held".to_string()),
      ("util".to_string(), "util::ids::holder".to_string())
    ]
  );
  assert_eq!(
    crate_paths("use crate::{config::Gpus, engine::Engine};").len(),
    2
  );
  assert!(code_part("  // crate::napi::x").is_empty());
  let text = "fn a() {\n  x;\n}\n  pub async fn b(\n    y: u8,\n  ) {\n  }\n";
  assert_eq!(
    long_functions(text),
    vec![
      (1, "fn a".to_string(), 2),
      (4, "pub async fn b".to_string(), 3)
    ]
  );
}

/// The module a source file is: `codemode/session.rs` is `codemode::session`, `sandbox/agent/mod.rs`
/// is `sandbox::agent`, `lib.rs` and `main.rs` are the crate root (empty).
fn module_of(rel: &Path) -> String {
  let mut parts: Vec<String> = rel
    .components()
    .map(|c| c.as_os_str().to_string_lossy().to_string())
    .collect();
  let last = parts.pop().unwrap_or_default();
  let stem = last.trim_end_matches(".rs");
  if !matches!(stem, "mod" | "lib" | "main") {
    parts.push(stem.to_string());
  }
  parts.join("::")
}

/// Each module of the crate under `src` (test files left out: `tests.rs` and `tests/`), with the
/// modules of the crate it names through `crate::` paths.
fn module_edges(src: &Path) -> Vec<(String, Vec<(String, usize)>)> {
  let mut files = Vec::new();
  sources(src, &mut files);
  files.sort();
  let is_test = |p: &Path| {
    p.components()
      .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs")
  };
  let files: Vec<PathBuf> = files
    .into_iter()
    .filter(|f| !is_test(f.strip_prefix(src).expect("under src")))
    .collect();
  let modules: Vec<String> = files
    .iter()
    .map(|f| module_of(f.strip_prefix(src).expect("under src")))
    .collect();
  let mut out = Vec::new();
  for (file, module) in files.iter().zip(&modules) {
    let text = std::fs::read_to_string(file).expect("read");
    // A file's own unit tests may use anything; they are not part of its dependencies.
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    let code: String = code.lines().map(code_part).collect::<Vec<_>>().join("\n");
    let mut paths = module_paths(&code, module);
    paths.extend(child_paths(&code, module));
    let mut used = Vec::new();
    for (item, line) in paths {
      let item = item.trim_end_matches("::self");
      // The longest module that the path starts with.
      let target = modules
        .iter()
        .filter(|m| !m.is_empty())
        .filter(|m| item == m.as_str() || item.starts_with(&format!("{m}::")))
        .max_by_key(|m| m.len());
      if let Some(t) = target {
        // A module declaring others may re-export them (`pub use`, its front for the folders
        // after it) without depending on them; anything else it takes from them counts.
        let own_child = module.is_empty() || t.starts_with(&format!("{module}::"));
        let reexport = code
          .lines()
          .nth(line - 1)
          .is_some_and(|l| l.trim_start().starts_with("pub use "));
        if t != module
          && !(own_child && reexport)
          && !used.iter().any(|(u, _): &(String, usize)| u == t)
        {
          used.push((t.clone(), line));
        }
      }
    }
    out.push((module.clone(), used));
  }
  out
}

/// Every path `code` names into the crate, from the crate root, with the line it starts on:
/// `crate::a::{b, c::D}` gives `a::b` and `a::c::D` (a group may span lines); `super::x` in
/// module `m::n` gives `m::x`.
fn module_paths(code: &str, module: &str) -> Vec<(String, usize)> {
  let mut out = Vec::new();
  let sup = module
    .rsplit_once("::")
    .map_or(String::new(), |(p, _)| p.to_string());
  let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
  for (prefix, base) in [("crate::", String::new()), ("super::", sup)] {
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix).map(|i| i + from) {
      from = at + prefix.len();
      // Not the tail of a longer path (`x::crate::`, `super::super::`) or of a name.
      if code[..at].ends_with(|c: char| c == ':' || c.is_alphanumeric() || c == '_') {
        continue;
      }
      let after = &code[from..];
      let join = |p: &str| match (base.is_empty(), p.is_empty()) {
        (true, _) => p.to_string(),
        (false, true) => base.clone(),
        (false, false) => format!("{base}::{p}"),
      };
      let end = after
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(after.len());
      let head = after[..end].trim_end_matches(':');
      if after[end..].starts_with('{') {
        let close = after[end..].find('}').map_or(after.len(), |i| end + i);
        for item in after[end + 1..close].split(',').map(str::trim) {
          let item = item
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_start_matches('{');
          if item.is_empty() {
            continue;
          }
          let full = if head.is_empty() {
            item.to_string()
          } else {
            format!("{head}::{item}")
          };
          out.push((join(&full), line_of(at)));
        }
      } else if !head.is_empty() {
        out.push((join(head), line_of(at)));
      }
    }
  }
  out
}

/// The paths `code` names through the modules it declares (`mod x;`, then `x::y` or
/// `use x::{…}`), from the crate root.
fn child_paths(code: &str, module: &str) -> Vec<(String, usize)> {
  let children: Vec<&str> = code
    .lines()
    .filter_map(|l| {
      let t = l.trim_start();
      let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
      t.strip_prefix("mod ")?.strip_suffix(';')
    })
    .collect();
  let mut out = Vec::new();
  for child in children {
    let prefix = format!("{child}::");
    // As if it were written `crate::<module>::<child>::…`.
    let text = code.replace(
      &prefix,
      &format!(
        "crate::{module}{}{prefix}",
        if module.is_empty() { "" } else { "::" }
      ),
    );
    for (p, line) in module_paths(&text, module) {
      if p.starts_with(&format!(
        "{module}{}{child}",
        if module.is_empty() { "" } else { "::" }
      )) {
        out.push((p, line));
      }
    }
  }
  out
}

/// The circles among modules: each as the modules in it, in the order the edges run.
fn circles(edges: &[(String, Vec<(String, usize)>)]) -> Vec<Vec<String>> {
  // Tarjan's strongly connected components.
  struct St<'a> {
    edges: &'a [(String, Vec<(String, usize)>)],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    out: Vec<Vec<String>>,
  }
  fn find(edges: &[(String, Vec<(String, usize)>)], name: &str) -> Option<usize> {
    edges.iter().position(|(m, _)| m == name)
  }
  fn visit(st: &mut St, v: usize) {
    st.index[v] = Some(st.next);
    st.low[v] = st.next;
    st.next += 1;
    st.stack.push(v);
    st.on[v] = true;
    let targets: Vec<usize> = st.edges[v]
      .1
      .iter()
      .filter_map(|(t, _)| find(st.edges, t))
      .collect();
    for w in targets {
      match st.index[w] {
        None => {
          visit(st, w);
          st.low[v] = st.low[v].min(st.low[w]);
        }
        Some(i) if st.on[w] => st.low[v] = st.low[v].min(i),
        Some(_) => {}
      }
    }
    if Some(st.low[v]) == st.index[v] {
      let mut component = Vec::new();
      while let Some(w) = st.stack.pop() {
        st.on[w] = false;
        component.push(st.edges[w].0.clone());
        if w == v {
          break;
        }
      }
      if component.len() > 1 {
        component.sort();
        st.out.push(component);
      }
    }
  }
  let n = edges.len();
  let mut st = St {
    edges,
    index: vec![None; n],
    low: vec![0; n],
    on: vec![false; n],
    stack: Vec::new(),
    next: 0,
    out: Vec::new(),
  };
  for v in 0..n {
    if st.index[v].is_none() {
      visit(&mut st, v);
    }
  }
  st.out
}

/// Where each module of a circle names the next ones: `file:line` per edge inside it.
fn describe(edges: &[(String, Vec<(String, usize)>)], circle: &[String]) -> String {
  let mut lines = Vec::new();
  for (m, used) in edges.iter().filter(|(m, _)| circle.contains(m)) {
    for (t, line) in used.iter().filter(|(t, _)| circle.contains(t)) {
      lines.push(format!("  {m} uses {t} (line {line})"));
    }
  }
  format!("{}:\n{}", circle.join(", "), lines.join("\n"))
}

/// Circles still to break, each exactly as found; any other circle fails. None is left: a new
/// circle is broken where it appears, not listed here.
const KNOWN_CIRCLES: [(&str, &str); 0] = [];

/// No module, in the addon, the agent or the protocol crate, depends on itself through others:
/// what two modules share sits in a third both can see. A module may re-export the modules it
/// declares (`pub use`) without that counting as a use of them.
#[test]
fn no_circles_between_modules() {
  let root = Path::new(env!("CARGO_MANIFEST_DIR"));
  let mut problems = Vec::new();
  let mut known_seen = Vec::new();
  for krate in ["src", "agent/src", "agent-proto/src"] {
    let edges = module_edges(&root.join(krate));
    for circle in circles(&edges) {
      if KNOWN_CIRCLES.contains(&(krate, &circle.join(", ") as &str)) {
        known_seen.push(circle.join(", "));
        continue;
      }
      problems.push(format!("{krate}: {}", describe(&edges, &circle)));
    }
  }
  // A known circle broken (or changed) comes off the list.
  for (krate, known) in KNOWN_CIRCLES {
    if !known_seen.iter().any(|k| k == known) {
      problems.push(format!(
        "{krate}: {known} is no longer a circle: take it off KNOWN_CIRCLES"
      ));
    }
  }
  assert!(
    problems.is_empty(),
    "circles between modules:\n{}",
    problems.join("\n")
  );
}

#[test]
fn the_circle_finder_finds_circles() {
  let e = |m: &str, used: &[&str]| {
    (
      m.to_string(),
      used.iter().map(|u| (u.to_string(), 1)).collect::<Vec<_>>(),
    )
  };
  let edges = vec![
    e("a", &["b"]),
    e("b", &["c"]),
    e("c", &["a"]),
    e("d", &["a"]),
  ];
  assert_eq!(circles(&edges), vec![vec!["a", "b", "c"]]);
  assert!(circles(&[e("a", &["b"]), e("b", &[])]).is_empty());
  assert_eq!(
    module_of(Path::new("codemode/session.rs")),
    "codemode::session"
  );
  assert_eq!(
    module_of(Path::new("sandbox/agent/mod.rs")),
    "sandbox::agent"
  );
  assert_eq!(module_of(Path::new("lib.rs")), "");
  let paths = module_paths(
    "use crate::sandbox::agent::{ops, conn::Conn};\nuse super::addr::{\n  canonical,\n  Cidr,\n};\nlet x = super::name::f();",
    "egress::rule",
  );
  assert_eq!(
    paths,
    vec![
      ("sandbox::agent::ops".to_string(), 1),
      ("sandbox::agent::conn::Conn".to_string(), 1),
      ("egress::addr::canonical".to_string(), 2),
      ("egress::addr::Cidr".to_string(), 2),
      ("egress::name::f".to_string(), 6),
    ]
  );
}
