//! JSON Schema → text-level DFA.
//!
//! Each schema position is a *conjunction* of raw sub-schemas (a schema plus whatever `allOf`,
//! `$ref` and distributed `anyOf`/`oneOf` branches add to it). A conjunction is flattened into a
//! [`Node`] (keywords merged: bounds tightened, property maps joined, enums intersected) and the
//! node is lowered type by type. `anyOf` / `oneOf` / `dependent*` are distributed over the rest of
//! the node (`S ∧ (A ∨ B) = (S ∧ A) ∨ (S ∧ B)`), `oneOf` only when its branches are provably
//! disjoint (then it equals `anyOf`). Recursion through `$ref` is expanded up to
//! `max_recursion` simultaneous expansions of one target; a deeper expansion is the empty
//! language (the automaton never opens it).

use super::automata::HashMap;
use std::rc::Rc;
use std::time::Instant;

use serde_json::{Map, Value};

use std::hash::{Hash, Hasher};

use super::automata::{self, Dfa, Nfa, Overflow, DEAD};
use super::numbers::{self, Bound, Dec};
use super::calls::CALL;
use super::strings;
use super::{CompileOptions, SchemaError, Whitespace};

const T_NULL: u8 = 1;
const T_BOOL: u8 = 2;
const T_INT: u8 = 4; // integers
const T_FRAC: u8 = 8; // non-integer numbers
const T_STR: u8 = 16;
const T_ARR: u8 = 32;
const T_OBJ: u8 = 64;
const T_ALL: u8 = 127;

/// Keywords that carry no assertion (annotations, containers of definitions).
const ANNOTATIONS: &[&str] = &[
    "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$comment", "$vocabulary",
    "title", "description", "default", "examples", "example", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "contentSchema", "definitions", "$defs",
];

/// Keywords of the standard vocabularies this compiler does not enforce.
const UNSUPPORTED: &[&str] = &["maxContains", "$dynamicRef"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Draft {
    Legacy, // draft 3/4/6/7: `$ref` siblings are ignored
    D2019,
    D2020,
}

/// A raw sub-schema and where it is (JSON pointer from the root; synthetic ones have none).
#[derive(Clone)]
pub(crate) struct Sub<'a> {
    v: &'a Value,
    ptr: Rc<str>,
    /// Pointer of the enclosing schema resource (for `#...` references).
    base: Rc<str>,
}

/// A step of a JSON path pattern (for run-time `uniqueItems`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum PStep {
    /// An object member with this key (canonical JSON text, quotes included).
    Key(Vec<u8>),
    /// Any object member.
    AnyKey,
    /// Any array element.
    AnyIndex,
}

/// One conjunct of a disjunction's alternative.
#[derive(Clone)]
enum Alt<'a> {
    Sub(Sub<'a>),
    /// The property must be absent.
    Forbid(String),
    /// The properties must be present.
    Require(Vec<String>),
    /// Restrict to these types.
    Types(u8),
    NotEnum(Vec<Value>),
    NotPattern(String, Rc<str>),
    Lo(Dec, bool),
    Hi(Dec, bool),
    MinLen(u64),
    MaxLen(u64),
    MinItems(u64),
    MaxItems(u64),
    MinProps(u64),
    MaxProps(u64),
    /// Some item satisfies the (negated) sub-schema.
    Contains(Sub<'a>),
    /// The property's value must satisfy the sub-schema.
    Prop(String, Sub<'a>),
    /// Some key outside these names is present (with a value satisfying the sub-schema, if
    /// given): the failure of `additionalProperties`.
    Undeclared(Vec<String>, Option<Sub<'a>>),
}

/// A disjunction to distribute: alternatives, and whether they are known to be disjoint.
#[derive(Clone)]
struct Disj<'a> {
    alts: Vec<Vec<Alt<'a>>>,
    keyword: &'static str,
    ptr: Rc<str>,
    exclusive: bool,
}

#[derive(Clone, Default)]
struct Node<'a> {
    never: bool,
    types: u8,
    enums: Option<Vec<Value>>,
    lo: Option<Bound>,
    hi: Option<Bound>,
    steps: Vec<Dec>,
    min_len: u64,
    max_len: Option<u64>,
    patterns: Vec<(String, Rc<str>)>,
    formats: Vec<String>,
    prefix: Vec<Vec<Sub<'a>>>,
    items: Option<Vec<Sub<'a>>>,
    min_items: u64,
    max_items: Option<u64>,
    contains: Option<Vec<Sub<'a>>>,
    min_contains: u64,
    props: Vec<(String, Vec<Sub<'a>>)>,
    required: Vec<String>,
    pattern_props: Vec<(String, Vec<Sub<'a>>, Rc<str>)>,
    additional: Option<Vec<Sub<'a>>>,
    unevaluated: Option<Vec<Sub<'a>>>,
    /// `unevaluatedItems`: items past every merged `prefixItems`, when no `items` applies.
    unevaluated_items: Option<Vec<Sub<'a>>>,
    prop_names: Vec<Sub<'a>>,
    min_props: u64,
    max_props: Option<u64>,
    disj: Vec<Disj<'a>>,
    /// `uniqueItems: true`.
    unique: bool,
    /// Values excluded (from `not: {enum/const}`).
    not_enums: Vec<Value>,
    /// Patterns strings must not match (from `not: {pattern}`).
    not_patterns: Vec<(String, Rc<str>)>,
    /// Objects must have a key outside each of these name sets (whose value satisfies the
    /// sub-schema, if given): from `not: {additionalProperties}`.
    undeclared: Vec<(Vec<String>, Option<Sub<'a>>)>,
}

pub(crate) struct Lowerer<'a> {
    root: &'a Value,
    opts: &'a CompileOptions,
    draft: Draft,
    cap: usize,
    start: Instant,
    stack: Vec<Rc<str>>,
    ids: Vec<(String, Rc<str>)>,
    anchors: HashMap<String, Rc<str>>,
    any_cache: HashMap<u32, Rc<Dfa>>,
    conj_cache: HashMap<(Vec<Rc<str>>, Vec<(Rc<str>, usize)>, u32), Rc<Dfa>>,
    /// Relative paths of `uniqueItems` arrays under each cached conjunction.
    conj_unique: HashMap<(Vec<Rc<str>>, Vec<(Rc<str>, usize)>, u32), Vec<Vec<PStep>>>,
    branch_budget: usize,
    /// JSON path of the value being lowered.
    path: Vec<PStep>,
    /// Paths of arrays whose (scalar) items must be unique, enforced at run time.
    pub unique: Vec<Vec<PStep>>,
    refs_under: HashMap<Rc<str>, Rc<Vec<Rc<str>>>>,
    /// Entries held in `refs_under` (bounded by [`MAX_REACH_ENTRIES`]).
    reach_entries: usize,
    pattern_cache: HashMap<String, Rc<Dfa>>,
    /// Memo of [`Lowerer::determinize`] and [`Lowerer::encode`]: whole automata to their
    /// determinised, minimal form (see [`Lowerer::memoised`]).
    det_memo: HashMap<Vec<u32>, Rc<Dfa>>,
    det_memo_words: usize,
    /// Sub-automata reached by call markers (see [`CALL`]): container values large enough to be
    /// kept once and called, instead of copied into every place they appear. A sub-automaton may
    /// call only earlier ones, so the calls form a DAG.
    pub subs: Vec<Dfa>,
    sub_ids: HashMap<u64, Vec<u32>>,
}


static FALSE: Value = Value::Bool(false);

/// How deep [`Lowerer::reach`] follows references (one stack frame each).
pub(crate) const MAX_REF_DEPTH: usize = 2048;
/// How many reachable-target entries [`Lowerer::reach`] may memoise in one compilation.
pub(crate) const MAX_REACH_ENTRIES: usize = 4_000_000;

/// How many disjunction branches one compilation may explore.
const BRANCH_BUDGET: usize = 20_000;

/// Process-wide cache of automata that depend only on options (unconstrained values, formats,
/// patterns): they are rebuilt for no schema. Bounded by entry count.
fn global_cache() -> &'static std::sync::Mutex<HashMap<String, std::sync::Arc<Dfa>>> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<HashMap<String, std::sync::Arc<Dfa>>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| std::sync::Mutex::new(HashMap::default()))
}

fn global_get(key: &str) -> Option<Dfa> {
    global_cache().lock().ok().and_then(|m| m.get(key).map(|d| (**d).clone()))
}

fn global_put(key: String, d: &Dfa) {
    if let Ok(mut m) = global_cache().lock() {
        if m.len() > 4096 {
            m.clear();
        }
        m.insert(key, std::sync::Arc::new(d.clone()));
    }
}

fn ptr_join(ptr: &str, key: &str) -> Rc<str> {
    let k = key.replace('~', "~0").replace('/', "~1");
    format!("{ptr}/{k}").into()
}

fn pointer_get<'v>(root: &'v Value, ptr: &str) -> Option<&'v Value> {
    if ptr.is_empty() {
        return Some(root);
    }
    root.pointer(ptr)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64)),
        _ => None,
    }
}

fn dec_of(v: &Value) -> Option<Dec> {
    match v {
        Value::Number(n) => Dec::parse(&n.to_string()),
        _ => None,
    }
}

fn dec_cmp(a: &Dec, b: &Dec) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (a.neg, b.neg) {
        (false, true) => return Greater,
        (true, false) => return Less,
        _ => {}
    }
    let mag = (a.int.len().cmp(&b.int.len())).then_with(|| a.int.cmp(&b.int)).then_with(|| a.frac.cmp(&b.frac));
    if a.neg {
        mag.reverse()
    } else {
        mag
    }
}

/// JSON value equality as JSON Schema defines it (numbers by value).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (dec_of(a), dec_of(b)) {
            (Some(p), Some(q)) => p == q,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn type_bits(v: &Value) -> u8 {
    match v {
        Value::Null => T_NULL,
        Value::Bool(_) => T_BOOL,
        Value::Number(_) => {
            if dec_of(v).is_some_and(|d| d.is_integer()) {
                T_INT
            } else {
                T_FRAC
            }
        }
        Value::String(_) => T_STR,
        Value::Array(_) => T_ARR,
        Value::Object(_) => T_OBJ,
    }
}

fn type_name_bits(s: &str) -> Option<u8> {
    Some(match s {
        "null" => T_NULL,
        "boolean" => T_BOOL,
        "integer" => T_INT,
        "number" => T_INT | T_FRAC,
        "string" => T_STR,
        "array" => T_ARR,
        "object" => T_OBJ,
        "any" => T_ALL,
        _ => return None,
    })
}

impl<'a> Lowerer<'a> {
    pub fn new(root: &'a Value, opts: &'a CompileOptions) -> Self {
        let draft = match root.get("$schema").and_then(|s| s.as_str()) {
            Some(s) if s.contains("draft-0") || s.contains("draft-03") => Draft::Legacy,
            Some(s) if s.contains("2019-09") => Draft::D2019,
            _ => Draft::D2020,
        };
        let mut l = Lowerer {
            root,
            opts,
            draft,
            cap: opts.max_states,
            start: Instant::now(),
            stack: Vec::new(),
            ids: Vec::new(),
            anchors: HashMap::default(),
            any_cache: HashMap::default(),
            conj_cache: HashMap::default(),
            conj_unique: HashMap::default(),
            branch_budget: BRANCH_BUDGET,
            path: Vec::new(),
            unique: Vec::new(),
            refs_under: HashMap::default(),
            reach_entries: 0,
            pattern_cache: HashMap::default(),
            det_memo: HashMap::default(),
            det_memo_words: 0,
            subs: Vec::new(),
            sub_ids: HashMap::default(),
        };
        l.index(root, "".into());
        l
    }

    /// Records `$id`s and anchors with their pointers.
    fn index(&mut self, v: &Value, ptr: Rc<str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(id)) = m.get("$id").or_else(|| m.get("id").filter(|x| x.is_string())) {
                    if let Some(a) = id.strip_prefix('#') {
                        self.anchors.entry(a.to_string()).or_insert(ptr.clone());
                    } else {
                        let idn = id.split('#').next().unwrap_or("").trim_end_matches('/').to_string();
                        self.ids.push((idn, ptr.clone()));
                    }
                }
                for key in ["$anchor", "$dynamicAnchor"] {
                    if let Some(Value::String(a)) = m.get(key) {
                        self.anchors.entry(a.clone()).or_insert(ptr.clone());
                    }
                }
                for (k, c) in m {
                    if matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                        continue;
                    }
                    self.index(c, ptr_join(&ptr, k));
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    self.index(c, ptr_join(&ptr, &i.to_string()));
                }
            }
            _ => {}
        }
    }

    fn check_time(&self, ptr: &str) -> Result<(), SchemaError> {
        if self.start.elapsed() > self.opts.max_compile_time {
            return Err(SchemaError::TooLarge {
                pointer: ptr.to_string(),
                what: "compile time in ms".into(),
                limit: self.opts.max_compile_time.as_millis() as usize,
            });
        }
        Ok(())
    }

    fn overflow(&self, ptr: &str) -> impl Fn(Overflow) -> SchemaError + '_ {
        let p = ptr.to_string();
        move |o: Overflow| SchemaError::TooLarge { pointer: p.clone(), what: format!("automaton ({} states)", o.states), limit: self.cap }
    }

    fn ws(&self) -> &'static [&'static [u8]] {
        match self.opts.whitespace {
            Whitespace::Compact => &[b""],
            Whitespace::Flexible => &[b"", b" "],
        }
    }

    /// Adds `sep` followed by the optional whitespace from `from` to `to`.
    fn sep(&self, nfa: &mut Nfa, from: u32, sep: &[u8], to: u32) {
        let m = nfa.lit(from, sep);
        for w in self.ws() {
            nfa.lit_to(m, w, to);
        }
    }

    /// Resolves a reference relative to the resource at `base`.
    fn resolve(&self, r: &str, base: &str, ptr: &str) -> Result<(&'a Value, Rc<str>, Rc<str>), SchemaError> {
        let (uri, frag) = match r.find('#') {
            Some(i) => (&r[..i], &r[i + 1..]),
            None => (r, ""),
        };
        let uri = uri.trim_end_matches('/');
        let mut res_ptr: Rc<str> = base.into();
        if !uri.is_empty() {
            let found = self
                .ids
                .iter()
                .find(|(id, _)| id == uri)
                .or_else(|| {
                    self.ids.iter().find(|(id, _)| {
                        id.ends_with(&format!("/{uri}")) || uri.ends_with(&format!("/{id}")) || id.rsplit('/').next() == uri.rsplit('/').next() && !id.is_empty()
                    })
                })
                .map(|(_, p)| p.clone());
            match found {
                Some(p) => res_ptr = p,
                None => {
                    return Err(SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() });
                }
            }
        }
        let target: Rc<str> = if frag.is_empty() {
            res_ptr.clone()
        } else if frag.starts_with('/') {
            format!("{}{}", res_ptr, percent_decode(frag)).into()
        } else {
            match self.anchors.get(frag) {
                Some(p) => p.clone(),
                None => return Err(SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() }),
            }
        };
        let v = pointer_get(self.root, &target)
            .or_else(|| if frag.starts_with('/') { pointer_get(self.root, &percent_decode(frag)) } else { None })
            .ok_or_else(|| SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() })?;
        let tptr: Rc<str> = if pointer_get(self.root, &target).is_some() { target } else { percent_decode(frag).into() };
        // The new base is the nearest resource root at or above the target.
        let nb = self
            .ids
            .iter()
            .filter(|(_, p)| tptr.starts_with(&**p) && (tptr.len() == p.len() || tptr.as_bytes()[p.len()] == b'/'))
            .max_by_key(|(_, p)| p.len())
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| "".into());
        Ok((v, tptr, nb))
    }

    /// Every reference target (as pointer) reachable from the sub-schema at `ptr`.
    ///
    /// Bounded: the recursion (one level per reference followed) stops at [`MAX_REF_DEPTH`] and
    /// the memoised sets at [`MAX_REACH_ENTRIES`] entries in all, both refused as too large, and
    /// the compile deadline is checked on every call. A chain of `$ref`s (`d0 → d1 → … → dN`)
    /// costs N levels and N²/2 entries, so a long chain is refused in milliseconds instead of
    /// lowering for minutes (or overflowing the stack).
    fn reach(&mut self, sub: &Sub<'a>, depth: usize) -> Result<Rc<Vec<Rc<str>>>, SchemaError> {
        if let Some(r) = self.refs_under.get(&sub.ptr) {
            return Ok(r.clone());
        }
        self.check_time(&sub.ptr)?;
        if depth >= MAX_REF_DEPTH {
            return Err(SchemaError::TooLarge { pointer: sub.ptr.to_string(), what: "`$ref` chain depth".into(), limit: MAX_REF_DEPTH });
        }
        // Placeholder against cycles.
        self.refs_under.insert(sub.ptr.clone(), Rc::new(Vec::new()));
        let mut direct: Vec<(String, Rc<str>)> = Vec::new();
        collect_refs(sub.v, &sub.base, &mut direct);
        let mut out: Vec<Rc<str>> = Vec::new();
        let mut seen: std::collections::HashSet<Rc<str>> = std::collections::HashSet::new();
        for (r, base) in direct {
            if let Ok((v, t, nb)) = self.resolve(&r, &base, &sub.ptr) {
                if seen.insert(t.clone()) {
                    out.push(t.clone());
                }
                let inner = self.reach(&Sub { v, ptr: t, base: nb }, depth + 1)?;
                for x in inner.iter() {
                    if seen.insert(x.clone()) {
                        out.push(x.clone());
                    }
                }
            }
        }
        self.reach_entries += out.len();
        if self.reach_entries > MAX_REACH_ENTRIES {
            return Err(SchemaError::TooLarge { pointer: sub.ptr.to_string(), what: "`$ref` reachability sets".into(), limit: MAX_REACH_ENTRIES });
        }
        let out = Rc::new(out);
        self.refs_under.insert(sub.ptr.clone(), out.clone());
        Ok(out)
    }

    pub fn lower_root(&mut self) -> Result<Dfa, SchemaError> {
        let root = Sub { v: self.root, ptr: "".into(), base: "".into() };
        let d = self.lower_conj(vec![root], self.opts.max_any_depth)?;
        Ok((*d).clone())
    }

    /// Lowers a conjunction of sub-schemas.
    fn lower_conj(&mut self, members: Vec<Sub<'a>>, any_depth: u32) -> Result<Rc<Dfa>, SchemaError> {
        let ptr = members.first().map(|m| m.ptr.clone()).unwrap_or_else(|| "".into());
        self.check_time(&ptr)?;
        if members.is_empty() {
            return Ok(self.any(any_depth)?);
        }
        // Cache key: member pointers + the stack counts of every target reachable from them.
        let cacheable = members.iter().all(|m| !m.ptr.starts_with('!'));
        let key = if cacheable {
            let mut reach: Vec<Rc<str>> = Vec::new();
            let mut seen: std::collections::HashSet<Rc<str>> = std::collections::HashSet::new();
            for m in &members {
                for r in self.reach(m, 0)?.iter() {
                    if seen.insert(r.clone()) {
                        reach.push(r.clone());
                    }
                }
            }
            let mut sig: Vec<(Rc<str>, usize)> = reach
                .iter()
                .map(|r| (r.clone(), self.stack.iter().filter(|s| *s == r).count()))
                .filter(|(_, c)| *c > 0)
                .collect();
            sig.sort();
            let mut ptrs: Vec<Rc<str>> = members.iter().map(|m| m.ptr.clone()).collect();
            ptrs.sort();
            let key = (ptrs, sig, any_depth);
            if let Some(d) = self.conj_cache.get(&key) {
                let d = d.clone();
                // (Duplicates are kept while lowering, so every computation's own log is
                // complete; they are removed at the end.)
                for rel in self.conj_unique.get(&key).cloned().unwrap_or_default() {
                    let mut p = self.path.clone();
                    p.extend(rel);
                    self.unique.push(p);
                }
                return Ok(d);
            }
            Some(key)
        } else {
            None
        };
        let depth0 = self.stack.len();
        let u0 = self.unique.len();
        let res = self.lower_conj_inner(members, any_depth);
        self.stack.truncate(depth0);
        let d = Rc::new(res?);
        if let Some(k) = key {
            let plen = self.path.len();
            let rel: Vec<Vec<PStep>> = self.unique[u0..].iter().map(|p| p[plen.min(p.len())..].to_vec()).collect();
            self.conj_unique.insert(k.clone(), rel);
            self.conj_cache.insert(k, d.clone());
        }
        Ok(d)
    }

    fn lower_conj_inner(&mut self, members: Vec<Sub<'a>>, any_depth: u32) -> Result<Dfa, SchemaError> {
        let ptr = members[0].ptr.clone();
        let mut node = Node { types: T_ALL, ..Default::default() };
        if !self.merge_into(&mut node, members.clone(), "schema")? || node.never {
            return Ok(Dfa::empty());
        }
        if !node.disj.is_empty() {
            return self.distribute(node, members, any_depth);
        }
        self.lower_node(node, &ptr, any_depth)
    }

    /// Distributes the first disjunction of `node` over the rest of the conjunction.
    fn distribute(&mut self, mut node: Node<'a>, conj: Vec<Sub<'a>>, any_depth: u32) -> Result<Dfa, SchemaError> {
        let d = node.disj.remove(0);
        // Each branch: the merged node and the `$ref` targets its expansion pushed.
        let mut branches: Vec<(Node<'a>, Vec<Rc<str>>)> = Vec::new();
        for alt in &d.alts {
            // Distribution multiplies branches: bound the work.
            self.check_time(&d.ptr)?;
            self.branch_budget = self.branch_budget.saturating_sub(1);
            if self.branch_budget == 0 {
                return Err(SchemaError::TooLarge { pointer: d.ptr.to_string(), what: format!("{} branches", d.keyword), limit: BRANCH_BUDGET });
            }
            let mut n = node.clone();
            let mut q: Vec<Sub<'a>> = Vec::new();
            for item in alt {
                self.apply_alt(&mut n, item, &mut q)?;
            }
            let depth0 = self.stack.len();
            let ok = self.merge_into(&mut n, q, d.keyword)?;
            let pushed: Vec<Rc<str>> = self.stack[depth0..].to_vec();
            self.stack.truncate(depth0);
            if ok && !n.never {
                branches.push((n, pushed));
            }
        }
        if d.keyword == "oneOf" && !d.exclusive {
            let mut all_disjoint = true;
            'pairs: for i in 0..branches.len() {
                for j in i + 1..branches.len() {
                    if !self.disjoint(&branches[i].0, &branches[j].0, 2)? {
                        all_disjoint = false;
                        break 'pairs;
                    }
                }
            }
            if !all_disjoint {
                match self.one_of_by_type(branches, &d, &conj, any_depth) {
                    Err(SchemaError::Unsupported { keyword, .. }) if keyword == "oneOf" => {
                        // Exactly one: A_i ∧ ¬A_j for every j ≠ i (disjoint by construction).
                        let subs: Option<Vec<Sub<'a>>> = d
                            .alts
                            .iter()
                            .map(|a| match a.as_slice() {
                                [Alt::Sub(s)] => Some(s.clone()),
                                _ => None,
                            })
                            .collect();
                        let Some(subs) = subs else {
                            return Err(SchemaError::Unsupported { keyword: "oneOf".into(), pointer: d.ptr.to_string() });
                        };
                        let alts: Vec<Vec<Alt<'a>>> = (0..subs.len())
                            .map(|i| {
                                let mut alt = vec![Alt::Sub(subs[i].clone())];
                                for (j, sj) in subs.iter().enumerate() {
                                    if j != i {
                                        alt.push(Alt::Sub(Sub { v: sj.v, ptr: format!("¬{}", sj.ptr).into(), base: sj.base.clone() }));
                                    }
                                }
                                alt
                            })
                            .collect();
                        node.disj.insert(0, Disj { alts, keyword: "anyOf", ptr: d.ptr.clone(), exclusive: true });
                        return self.distribute(node, conj, any_depth).map_err(|e| match e {
                            SchemaError::Unsupported { keyword, .. } if keyword.starts_with("not") => {
                                SchemaError::Unsupported { keyword: "oneOf".into(), pointer: d.ptr.to_string() }
                            }
                            other => other,
                        });
                    }
                    other => return other,
                }
            }
        }
        let mut dfas = Vec::new();
        for (b, pushed) in branches {
            let depth0 = self.stack.len();
            self.stack.extend(pushed);
            let dfa = if b.disj.is_empty() {
                self.lower_node(b, &d.ptr, any_depth)
            } else {
                self.distribute(b, conj.clone(), any_depth)
            };
            self.stack.truncate(depth0);
            let dfa = dfa?;
            if !dfa.is_empty() {
                dfas.push(dfa);
            }
        }
        self.union_calls(&dfas, &d.ptr)
    }

    /// Applies one conjunct of an alternative to `n` (sub-schemas go to the queue `q`).
    fn apply_alt(&mut self, n: &mut Node<'a>, item: &Alt<'a>, q: &mut Vec<Sub<'a>>) -> Result<(), SchemaError> {
        let tighten = |slot: &mut Option<Bound>, d: &Dec, excl: bool, is_min: bool| {
            let tighter = match slot {
                None => true,
                Some((p, pe)) => {
                    let c = dec_cmp(d, p);
                    if is_min {
                        c.is_gt() || (c.is_eq() && excl && !*pe)
                    } else {
                        c.is_lt() || (c.is_eq() && excl && !*pe)
                    }
                }
            };
            if tighter {
                *slot = Some((d.clone(), excl));
            }
        };
        match item {
            Alt::Sub(s) => q.push(s.clone()),
            Alt::Forbid(name) => self.add_prop(n, name, Sub { v: &FALSE, ptr: "!".into(), base: "".into() })?,
            Alt::Require(names) => {
                for r in names {
                    if !n.required.contains(r) {
                        n.required.push(r.clone());
                    }
                }
            }
            Alt::Types(t) => n.types &= *t,
            Alt::NotEnum(v) => n.not_enums.extend(v.iter().cloned()),
            Alt::NotPattern(p, pp) => n.not_patterns.push((p.clone(), pp.clone())),
            Alt::Lo(d, e) => tighten(&mut n.lo, d, *e, true),
            Alt::Hi(d, e) => tighten(&mut n.hi, d, *e, false),
            Alt::MinLen(x) => n.min_len = n.min_len.max(*x),
            Alt::MaxLen(x) => n.max_len = Some(n.max_len.map_or(*x, |p| p.min(*x))),
            Alt::MinItems(x) => n.min_items = n.min_items.max(*x),
            Alt::MaxItems(x) => n.max_items = Some(n.max_items.map_or(*x, |p| p.min(*x))),
            Alt::MinProps(x) => n.min_props = n.min_props.max(*x),
            Alt::MaxProps(x) => n.max_props = Some(n.max_props.map_or(*x, |p| p.min(*x))),
            Alt::Contains(sub) => {
                if n.contains.is_some() {
                    return Err(SchemaError::Unsupported { keyword: "not".into(), pointer: sub.ptr.to_string() });
                }
                n.contains = Some(vec![sub.clone()]);
                n.min_contains = n.min_contains.max(1);
            }
            Alt::Prop(name, sub) => self.add_prop(n, name, sub.clone())?,
            Alt::Undeclared(names, sub) => n.undeclared.push((names.clone(), sub.clone())),
        }
        Ok(())
    }

    /// Adds a value constraint for property `name`; a key new to the node also gets the node's
    /// additional-property rule.
    fn add_prop(&mut self, n: &mut Node<'a>, name: &str, sub: Sub<'a>) -> Result<(), SchemaError> {
        match n.props.iter_mut().find(|(k, _)| k == name) {
            Some((_, c)) => c.push(sub),
            None => {
                let mut c = Vec::new();
                // A forbidden key needs no other rule (and merges with any).
                if sub.v == &Value::Bool(false) {
                    n.props.push((name.to_string(), vec![sub]));
                    return Ok(());
                }
                if let Some(a) = &n.additional {
                    if !n.pattern_props.is_empty() {
                        return Err(SchemaError::Unsupported { keyword: "allOf".into(), pointer: sub.ptr.to_string() });
                    }
                    c.extend(a.iter().cloned());
                }
                c.push(sub);
                n.props.push((name.to_string(), c));
            }
        }
        Ok(())
    }

    /// The values failing schema `v` as a disjunction of alternatives (each a conjunction).
    /// Exact: every keyword's failure set is expressed positively; keywords whose failure
    /// cannot be expressed are refused.
    fn negate(&mut self, v: &'a Value, ptr: &Rc<str>, base: &Rc<str>) -> Result<Vec<Vec<Alt<'a>>>, SchemaError> {
        let uns = |k: &str| SchemaError::Unsupported { keyword: format!("not ({k})"), pointer: ptr.to_string() };
        let map = match v {
            Value::Bool(true) => return Ok(vec![]),
            Value::Bool(false) => return Ok(vec![vec![]]),
            Value::Object(m) => m,
            _ => return Err(SchemaError::Invalid { keyword: "not".into(), pointer: ptr.to_string(), reason: "schema must be an object or a boolean".into() }),
        };
        let neg_sub = |v: &'a Value, p: Rc<str>, b: Rc<str>| Sub { v, ptr: format!("¬{p}").into(), base: b };
        let mut out: Vec<Vec<Alt<'a>>> = Vec::new();
        if let Some(r) = map.get("$ref") {
            let rs = r.as_str().ok_or_else(|| uns("$ref"))?;
            let (tv, t, nb) = self.resolve(rs, base, ptr)?;
            out.push(vec![Alt::Sub(neg_sub(tv, t, nb))]);
            if self.draft == Draft::Legacy {
                return Ok(out);
            }
        }
        let num = T_INT | T_FRAC;
        let excl_flag = |k: &str| map.get(k) == Some(&Value::Bool(true));
        for (k, kv) in map {
            let k = k.as_str();
            let bad = || SchemaError::Invalid { keyword: k.to_string(), pointer: ptr.to_string(), reason: "malformed".into() };
            match k {
                "$ref" => {}
                "type" => {
                    let mut bits = 0u8;
                    match kv {
                        Value::String(t) => bits = type_name_bits(t).ok_or_else(bad)?,
                        Value::Array(a) => {
                            for t in a {
                                bits |= t.as_str().and_then(type_name_bits).ok_or_else(bad)?;
                            }
                        }
                        _ => return Err(bad()),
                    }
                    if map.get("nullable") == Some(&Value::Bool(true)) {
                        bits |= T_NULL;
                    }
                    let c = T_ALL & !bits;
                    if c != 0 {
                        out.push(vec![Alt::Types(c)]);
                    }
                }
                "enum" | "const" => {
                    let vals: Vec<Value> = if k == "const" { vec![kv.clone()] } else { kv.as_array().ok_or_else(bad)?.clone() };
                    out.push(vec![Alt::NotEnum(vals)]);
                }
                "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" => {
                    if kv.is_boolean() {
                        continue;
                    }
                    let d = dec_of(kv).ok_or_else(bad)?;
                    let excl = k.starts_with("exclusive") || (k == "minimum" && excl_flag("exclusiveMinimum")) || (k == "maximum" && excl_flag("exclusiveMaximum"));
                    let alt = if k.ends_with("inimum") { Alt::Hi(d, !excl) } else { Alt::Lo(d, !excl) };
                    out.push(vec![Alt::Types(num), alt]);
                }
                "minLength" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_STR), Alt::MaxLen(x - 1)]);
                    }
                }
                "maxLength" => out.push(vec![Alt::Types(T_STR), Alt::MinLen(as_u64(kv).ok_or_else(bad)? + 1)]),
                "pattern" => out.push(vec![Alt::Types(T_STR), Alt::NotPattern(kv.as_str().ok_or_else(bad)?.to_string(), ptr_join(ptr, k))]),
                "minItems" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_ARR), Alt::MaxItems(x - 1)]);
                    }
                }
                "maxItems" => out.push(vec![Alt::Types(T_ARR), Alt::MinItems(as_u64(kv).ok_or_else(bad)? + 1)]),
                "minProperties" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_OBJ), Alt::MaxProps(x - 1)]);
                    }
                }
                "maxProperties" => out.push(vec![Alt::Types(T_OBJ), Alt::MinProps(as_u64(kv).ok_or_else(bad)? + 1)]),
                "required" => {
                    for r in kv.as_array().ok_or_else(bad)? {
                        out.push(vec![Alt::Types(T_OBJ), Alt::Forbid(r.as_str().ok_or_else(bad)?.to_string())]);
                    }
                }
                "properties" => {
                    let pp = ptr_join(ptr, k);
                    for (name, sv) in kv.as_object().ok_or_else(bad)? {
                        if sv == &Value::Bool(true) {
                            continue;
                        }
                        out.push(vec![
                            Alt::Types(T_OBJ),
                            Alt::Require(vec![name.clone()]),
                            Alt::Prop(name.clone(), neg_sub(sv, ptr_join(&pp, name), base.clone())),
                        ]);
                    }
                }
                "items" if !kv.is_array() => {
                    if kv != &Value::Bool(true) {
                        out.push(vec![Alt::Types(T_ARR), Alt::Contains(neg_sub(kv, ptr_join(ptr, k), base.clone()))]);
                    }
                }
                "anyOf" => {
                    let pp = ptr_join(ptr, k);
                    let all: Vec<Alt<'a>> = kv
                        .as_array()
                        .ok_or_else(bad)?
                        .iter()
                        .enumerate()
                        .map(|(i, sv)| Alt::Sub(neg_sub(sv, ptr_join(&pp, &i.to_string()), base.clone())))
                        .collect();
                    out.push(all);
                }
                "allOf" => {
                    let pp = ptr_join(ptr, k);
                    for (i, sv) in kv.as_array().ok_or_else(bad)?.iter().enumerate() {
                        out.push(vec![Alt::Sub(neg_sub(sv, ptr_join(&pp, &i.to_string()), base.clone()))]);
                    }
                }
                "not" => out.push(vec![Alt::Sub(Sub { v: kv, ptr: ptr_join(ptr, k), base: base.clone() })]),
                "format" => {
                    if kv.as_str().is_some_and(|f| strings::format_regex(f).is_some()) && self.opts.enforce_formats {
                        return Err(uns(k));
                    }
                }
                "uniqueItems" if kv == &Value::Bool(false) => {}
                "additionalProperties" if !map.contains_key("patternProperties") => {
                    if kv == &Value::Bool(true) {
                        continue;
                    }
                    let declared: Vec<String> = map.get("properties").and_then(|p| p.as_object()).map(|o| o.keys().cloned().collect()).unwrap_or_default();
                    let fails = if kv == &Value::Bool(false) { None } else { Some(neg_sub(kv, ptr_join(ptr, k), base.clone())) };
                    out.push(vec![Alt::Types(T_OBJ), Alt::Undeclared(declared, fails)]);
                }
                "multipleOf" | "uniqueItems" | "contains" | "minContains" | "maxContains" | "prefixItems" | "items" | "additionalItems"
                | "additionalProperties" | "patternProperties" | "propertyNames" | "dependentRequired" | "dependentSchemas"
                | "dependencies" | "unevaluatedProperties" | "unevaluatedItems" | "oneOf" | "if" | "$dynamicRef" | "$recursiveRef" => {
                    return Err(uns(k));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Merges the sub-schemas `q` (and what their `$ref`s / `allOf`s pull in) into `n`; pushes
    /// expanded `$ref` targets on the stack. `false` when a member is the `false` schema or a
    /// reference is past the recursion bound.
    fn merge_into(&mut self, n: &mut Node<'a>, mut q: Vec<Sub<'a>>, keyword: &str) -> Result<bool, SchemaError> {
        let mut qi = 0;
        while qi < q.len() {
            let m = q[qi].clone();
            qi += 1;
            if qi % 64 == 0 {
                self.check_time(&m.ptr)?;
            }
            if q.len() > 10_000 {
                return Err(SchemaError::TooLarge { pointer: m.ptr.to_string(), what: "allOf/$ref expansion".into(), limit: 10_000 });
            }
            // Double negations cancel.
            let m = if m.ptr.starts_with("¬¬") {
                let p: Rc<str> = m.ptr.trim_start_matches('¬').into();
                let k = m.ptr.chars().take_while(|&c| c == '¬').count();
                Sub { v: m.v, ptr: if k % 2 == 0 { p } else { format!("¬{p}").into() }, base: m.base.clone() }
            } else {
                m
            };
            match m.v {
                _ if m.ptr.starts_with('¬') => {
                    // A negated sub-schema: its failure alternatives. Bounded like a `$ref`
                    // (a truncated negation would be unsound, so past the bound it is refused).
                    let count = self.stack.iter().filter(|s| **s == m.ptr).count();
                    if count >= self.opts.max_recursion as usize {
                        return Err(SchemaError::Unsupported { keyword: "not".into(), pointer: m.ptr.trim_start_matches('¬').to_string() });
                    }
                    self.stack.push(m.ptr.clone());
                    let inner: Rc<str> = m.ptr.trim_start_matches('¬').into();
                    let alts = self.negate(m.v, &inner, &m.base)?;
                    match alts.len() {
                        0 => return Ok(false),
                        1 => {
                            for item in &alts[0] {
                                self.apply_alt(n, item, &mut q)?;
                            }
                        }
                        _ => n.disj.push(Disj { alts, keyword: "anyOf", ptr: inner, exclusive: false }),
                    }
                }
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(false),
                Value::Object(map) => {
                    let mut base = m.base.clone();
                    if let Some(Value::String(id)) = map.get("$id") {
                        if !id.starts_with('#') {
                            base = m.ptr.clone();
                        }
                    }
                    if let Some(r) = map.get("$ref").or_else(|| map.get("$recursiveRef")) {
                        let rs = if map.contains_key("$ref") {
                            r.as_str()
                                .ok_or_else(|| SchemaError::Invalid { keyword: "$ref".into(), pointer: m.ptr.to_string(), reason: "not a string".into() })?
                                .to_string()
                        } else {
                            "#".into()
                        };
                        let rbase: &str = if map.contains_key("$ref") { &base } else { "" };
                        let (v, t, nb) = self.resolve(&rs, rbase, &m.ptr)?;
                        let count = self.stack.iter().filter(|s| **s == t).count();
                        if count >= self.opts.max_recursion as usize {
                            return Ok(false);
                        }
                        self.stack.push(t.clone());
                        q.push(Sub { v, ptr: t, base: nb });
                        if self.draft == Draft::Legacy {
                            continue;
                        }
                    }
                    self.apply(n, map, &m.ptr, &base, &mut q)?;
                }
                _ => {
                    return Err(SchemaError::Invalid { keyword: keyword.into(), pointer: m.ptr.to_string(), reason: "schema must be an object or a boolean".into() });
                }
            }
        }
        Ok(true)
    }

    /// `oneOf` over overlapping branches, one JSON type at a time: for types whose texts are
    /// canonical (null, booleans, strings, and numbers when every branch admitting numbers is
    /// integer-only) each branch keeps exactly what no other branch accepts; objects are narrowed
    /// apart (see [`Self::narrow_apart`]: sound, and exact but for objects carrying a key
    /// another branch requires with a value that fails it); other types must be admitted by one
    /// branch only or be provably disjoint.
    fn one_of_by_type(&mut self, branches: Vec<(Node<'a>, Vec<Rc<str>>)>, d: &Disj<'a>, conj: &[Sub<'a>], any_depth: u32) -> Result<Dfa, SchemaError> {
        let unsupported = || SchemaError::Unsupported { keyword: "oneOf".into(), pointer: d.ptr.to_string() };
        // Disjunctions left in a branch (the rest of the node, distributed below) only shrink
        // it: the disjointness checks and narrowings below ignore them (sound), the lowering
        // distributes them (exact).
        let mut tys: Vec<u8> = Vec::new();
        for (b, _) in &branches {
            tys.push(self.node_types(b, 2)?);
        }
        let mut parts: Vec<Dfa> = Vec::new();
        for g in [T_NULL, T_BOOL, T_INT | T_FRAC, T_STR, T_ARR, T_OBJ] {
            let s: Vec<usize> = (0..branches.len()).filter(|&i| tys[i] & g != 0).collect();
            let closed = g & (T_NULL | T_BOOL | T_STR) != 0 || (g == T_INT | T_FRAC && s.iter().all(|&i| tys[i] & T_FRAC == 0));
            let mut nodes: Vec<Node<'a>> = s
                .iter()
                .map(|&i| {
                    let mut n = branches[i].0.clone();
                    n.types &= g;
                    n
                })
                .collect();
            if s.len() > 1 && !closed {
                if g == T_OBJ {
                    // Each branch keeps the objects no other branch accepts (narrowed apart from
                    // every other branch as written).
                    for x in 0..nodes.len() {
                        for y in 0..nodes.len() {
                            if x != y {
                                let mut other = branches[s[y]].0.clone();
                                other.types &= g;
                                if !self.narrow_apart(&mut nodes[x], &other)? {
                                    return Err(unsupported());
                                }
                            }
                        }
                    }
                } else {
                    for x in 0..nodes.len() {
                        for y in x + 1..nodes.len() {
                            if !self.disjoint(&nodes[x], &nodes[y], 2)? {
                                return Err(unsupported());
                            }
                        }
                    }
                }
            }
            let mut langs: Vec<Dfa> = Vec::new();
            for (x, &i) in s.iter().enumerate() {
                let depth0 = self.stack.len();
                self.stack.extend(branches[i].1.iter().cloned());
                let n = nodes[x].clone();
                let l = if n.disj.is_empty() { self.lower_node(n, &d.ptr, any_depth) } else { self.distribute(n, conj.to_vec(), any_depth) };
                self.stack.truncate(depth0);
                langs.push(l?);
            }
            if s.len() > 1 && closed {
                for x in 0..langs.len() {
                    let others: Vec<Dfa> = langs.iter().enumerate().filter(|(y, _)| *y != x).map(|(_, l)| l.clone()).collect();
                    let o = self.union(&others, &d.ptr)?;
                    parts.push(Dfa::minus(&langs[x], &o, self.cap).map_err(self.overflow(&d.ptr))?);
                }
            } else {
                parts.extend(langs);
            }
        }
        parts.retain(|p| !p.is_empty());
        self.union(&parts, &d.ptr)
    }

    /// The sub-automaton id of `d` if it is worth calling: a container-valued language (objects,
    /// arrays or calls of them) of at least `call_min_states` states. Equal automata share an id.
    fn call_id(&mut self, d: &Dfa) -> Option<u32> {
        let min = self.opts.call_min_states;
        if min == 0 || d.n_states() < min || d.is_empty() || self.subs.len() >= 1 << 16 {
            return None;
        }
        let row = d.row(d.start);
        if (0..256).any(|b| row[d.classes[b] as usize] != DEAD && !matches!(b as u8, b'{' | b'[' | CALL)) {
            return None;
        }
        let mut h = automata::FxHasher::default();
        d.hash(&mut h);
        let key = h.finish();
        if let Some(ids) = self.sub_ids.get(&key) {
            if let Some(&id) = ids.iter().find(|&&id| self.subs[id as usize] == *d) {
                return Some(id);
            }
        }
        let id = self.subs.len() as u32;
        self.subs.push(d.clone());
        self.sub_ids.entry(key).or_default().push(id);
        Some(id)
    }

    /// Puts one value of `d` between `from` and `to`: a call marker for large containers, else a
    /// copy of the automaton.
    fn place(&mut self, nfa: &mut Nfa, from: u32, d: &Dfa, to: u32) {
        match self.call_id(d) {
            Some(id) => nfa.lit_to(from, &[CALL, (id >> 8) as u8, id as u8], to),
            None => nfa.embed_to(from, d, to),
        }
    }

    /// `d` with every call marker replaced by a copy of its sub-automaton (for the operations
    /// that need the plain language: intersections with literal values, membership tests).
    fn inline(&self, d: &Dfa, ptr: &str) -> Result<Dfa, SchemaError> {
        if d.is_empty() || !super::calls::has_markers(d) {
            return Ok(d.clone());
        }
        let mut nfa = Nfa::new();
        let n = d.n_states();
        let base = nfa.len() as u32;
        for _ in 0..n {
            nfa.state();
        }
        let fin = nfa.state();
        let mut inlined: HashMap<u32, Dfa> = HashMap::default();
        for q in 1..n as u32 {
            if d.accept[q as usize] {
                nfa.eps(base + q, fin);
            }
            for b in 0..=255u8 {
                let t = d.next(q, b);
                if t == DEAD {
                    continue;
                }
                if b != CALL {
                    nfa.byte(base + q, b, base + t);
                }
            }
            for (id, r) in super::calls::markers(d, q) {
                if id as usize >= self.subs.len() {
                    continue;
                }
                if !inlined.contains_key(&id) {
                    let sub = self.subs[id as usize].clone();
                    inlined.insert(id, self.inline(&sub, ptr)?);
                }
                nfa.embed_to(base + q, &inlined[&id], base + r);
            }
        }
        nfa.determinize(base + d.start, fin, self.cap).map_err(self.overflow(ptr))
    }

    /// [`Nfa::determinize`] at the size cap, memoised: the same object or array built again in
    /// another place (another `$ref` path, another branch) is not determinised and minimised
    /// again. Keys are the whole automata (exact).
    fn determinize(&mut self, nfa: &Nfa, s: u32, e: u32, ptr: &str) -> Result<Dfa, SchemaError> {
        let mut key = vec![0];
        key.extend(nfa.fingerprint(s, e));
        self.memoised(key, |lw| nfa.determinize(s, e, lw.cap).map_err(lw.overflow(ptr)))
    }

    /// [`strings::encode`], memoised by the exact decoded automaton (the same string schema
    /// in many places, and every object's key automaton, encode once).
    fn encode(&mut self, dec: &Dfa, ptr: &str) -> Result<Dfa, SchemaError> {
        let mut key = vec![1];
        key.extend(dec.key());
        self.memoised(key, |lw| strings::encode(dec, lw.cap).map_err(lw.overflow(ptr)))
    }

    /// The memo behind [`Lowerer::determinize`] and [`Lowerer::encode`] (keys tagged by which):
    /// keys and results together stay within 64 MiB.
    fn memoised(&mut self, key: Vec<u32>, make: impl FnOnce(&Self) -> Result<Dfa, SchemaError>) -> Result<Dfa, SchemaError> {
        const MEMO_WORDS: usize = 16 << 20; // 64 MiB of 4-byte words
        if let Some(d) = self.det_memo.get(&key) {
            return Ok((**d).clone());
        }
        let d = make(self)?;
        let cost = key.len() + d.trans.len() + d.accept.len() / 4 + 64;
        if self.det_memo_words + cost <= MEMO_WORDS {
            self.det_memo_words += cost;
            self.det_memo.insert(key, Rc::new(d.clone()));
        }
        Ok(d)
    }

    /// Any string, as text.
    fn any_string(&mut self, ptr: &str) -> Result<Dfa, SchemaError> {
        let dec = strings::length_dfa(0, None, self.cap).map_err(self.overflow(ptr))?;
        self.encode(&dec, ptr)
    }

    /// Like [`Lowerer::union`], with large container branches called.
    fn union_calls(&mut self, dfas: &[Dfa], ptr: &str) -> Result<Dfa, SchemaError> {
        if dfas.len() < 2 {
            return self.union(dfas, ptr);
        }
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        for d in dfas {
            self.place(&mut nfa, s, d, e);
        }
        self.determinize(&nfa, s, e, ptr)
    }

    fn union(&self, dfas: &[Dfa], ptr: &str) -> Result<Dfa, SchemaError> {
        match dfas.len() {
            0 => return Ok(Dfa::empty()),
            1 => return Ok(dfas[0].clone()),
            _ => {}
        }
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        for d in dfas {
            nfa.embed_to(s, d, e);
        }
        nfa.determinize(s, e, self.cap).map_err(self.overflow(ptr))
    }

    /// Merges the keywords of one schema object into `node`.
    fn apply(&mut self, node: &mut Node<'a>, map: &'a Map<String, Value>, ptr: &Rc<str>, base: &Rc<str>, queue: &mut Vec<Sub<'a>>) -> Result<(), SchemaError> {
        let sub = |k: &str, v: &'a Value| Sub { v, ptr: ptr_join(ptr, k), base: base.clone() };
        let bad = |k: &str, why: &str| SchemaError::Invalid { keyword: k.to_string(), pointer: ptr.to_string(), reason: why.to_string() };
        let legacy = self.draft == Draft::Legacy;
        for (k, v) in map {
            let k = k.as_str();
            if ANNOTATIONS.contains(&k) || k == "$ref" || k == "$recursiveRef" {
                continue;
            }
            if UNSUPPORTED.contains(&k) {
                // uniqueItems: false and trivial forms are no-ops.
                let trivial = match k {
                    "uniqueItems" => v == &Value::Bool(false) || map.get("maxItems").and_then(as_u64).is_some_and(|m| m <= 1),
                    _ => false,
                };
                if !trivial {
                    return Err(SchemaError::Unsupported { keyword: k.to_string(), pointer: ptr.to_string() });
                }
                continue;
            }
            match k {
                "type" => {
                    let bits = match v {
                        Value::String(s) => type_name_bits(s).ok_or_else(|| bad(k, "unknown type"))?,
                        Value::Array(a) => {
                            let mut b = 0;
                            for t in a {
                                b |= match t {
                                    Value::String(s) => type_name_bits(s).ok_or_else(|| bad(k, "unknown type"))?,
                                    _ => return Err(SchemaError::Unsupported { keyword: "type".into(), pointer: ptr.to_string() }),
                                };
                            }
                            b
                        }
                        _ => return Err(bad(k, "expected a string or an array")),
                    };
                    let bits = if map.get("nullable") == Some(&Value::Bool(true)) { bits | T_NULL } else { bits };
                    node.types &= bits;
                }
                "nullable" => {}
                "enum" | "const" => {
                    let vals: Vec<Value> = if k == "const" {
                        vec![v.clone()]
                    } else {
                        v.as_array().ok_or_else(|| bad(k, "expected an array"))?.clone()
                    };
                    node.enums = Some(match node.enums.take() {
                        None => vals,
                        Some(prev) => prev.into_iter().filter(|p| vals.iter().any(|q| json_eq(p, q))).collect(),
                    });
                }
                "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" => {
                    if let Value::Bool(b) = v {
                        // Draft 4 boolean form modifies its sibling.
                        let _ = b;
                        continue;
                    }
                    let d = dec_of(v).ok_or_else(|| bad(k, "expected a number"))?;
                    let is_min = k.ends_with("inimum");
                    let excl = k.starts_with("exclusive")
                        || (is_min && map.get("exclusiveMinimum") == Some(&Value::Bool(true)))
                        || (!is_min && map.get("exclusiveMaximum") == Some(&Value::Bool(true)));
                    let slot = if is_min { &mut node.lo } else { &mut node.hi };
                    let tighter = match slot {
                        None => true,
                        Some((p, pe)) => {
                            let c = dec_cmp(&d, p);
                            if is_min {
                                c.is_gt() || (c.is_eq() && excl && !*pe)
                            } else {
                                c.is_lt() || (c.is_eq() && excl && !*pe)
                            }
                        }
                    };
                    if tighter {
                        *slot = Some((d, excl));
                    }
                }
                "multipleOf" => {
                    let d = dec_of(v).filter(|d| !d.neg && !d.is_zero()).ok_or_else(|| bad(k, "expected a positive number"))?;
                    node.steps.push(d);
                }
                "minLength" => node.min_len = node.min_len.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxLength" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_len = Some(node.max_len.map_or(m, |p| p.min(m)));
                }
                "pattern" => node.patterns.push((v.as_str().ok_or_else(|| bad(k, "expected a string"))?.to_string(), ptr_join(ptr, k))),
                "format" => {
                    let f = v.as_str().ok_or_else(|| bad(k, "expected a string"))?;
                    if strings::format_regex(f).is_some() {
                        if self.opts.enforce_formats {
                            node.formats.push(f.to_string());
                        }
                    } else if self.opts.unknown_formats_are_errors {
                        return Err(SchemaError::Unsupported { keyword: format!("format: {f}"), pointer: ptr.to_string() });
                    }
                }
                "items" => match v {
                    Value::Array(a) => {
                        for (i, s) in a.iter().enumerate() {
                            let sp = Sub { v: s, ptr: ptr_join(&ptr_join(ptr, k), &i.to_string()), base: base.clone() };
                            if i < node.prefix.len() {
                                node.prefix[i].push(sp);
                            } else {
                                let mut c = node.items.clone().unwrap_or_default();
                                c.push(sp);
                                node.prefix.push(c);
                            }
                        }
                        if let Some(ai) = map.get("additionalItems") {
                            node.items.get_or_insert_with(Vec::new).push(sub("additionalItems", ai));
                        }
                    }
                    _ => {
                        if legacy || !map.contains_key("prefixItems") {
                            // Items apply after the prefix (2020) or to all (no prefix).
                        }
                        let s = sub(k, v);
                        for p in node.prefix.iter_mut().skip(map.get("prefixItems").and_then(|p| p.as_array()).map_or(0, |a| a.len())) {
                            p.push(s.clone());
                        }
                        node.items.get_or_insert_with(Vec::new).push(s);
                    }
                },
                "additionalItems" => {}
                "prefixItems" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    for (i, s) in a.iter().enumerate() {
                        let sp = Sub { v: s, ptr: ptr_join(&ptr_join(ptr, k), &i.to_string()), base: base.clone() };
                        if i < node.prefix.len() {
                            node.prefix[i].push(sp);
                        } else {
                            let mut c = node.items.clone().unwrap_or_default();
                            // `items` of this same object applies only after the prefix.
                            if let Some(it) = map.get("items").filter(|x| !x.is_array()) {
                                c.retain(|x| !std::ptr::eq(x.v, it));
                            }
                            c.push(sp);
                            node.prefix.push(c);
                        }
                    }
                }
                "uniqueItems" => {
                    let trivial = v == &Value::Bool(false) || map.get("maxItems").and_then(as_u64).is_some_and(|m| m <= 1);
                    if !trivial {
                        node.unique = true;
                    }
                }
                "minItems" => node.min_items = node.min_items.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxItems" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_items = Some(node.max_items.map_or(m, |p| p.min(m)));
                }
                "contains" => {
                    if node.contains.is_some() {
                        return Err(SchemaError::Unsupported { keyword: "contains".into(), pointer: ptr.to_string() });
                    }
                    node.contains = Some(vec![sub(k, v)]);
                    node.min_contains = node.min_contains.max(1);
                }
                "minContains" => {
                    node.min_contains = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                }
                "properties" => {
                    let pm = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    for (name, s) in pm {
                        let sp = Sub { v: s, ptr: ptr_join(&pp, name), base: base.clone() };
                        match node.props.iter_mut().find(|(n, _)| n == name) {
                            Some((_, c)) => c.push(sp),
                            None => {
                                // A key new to the node is also constrained by the node's existing
                                // additional / pattern rules (merging under allOf).
                                let mut c = Vec::new();
                                // (Rules of this same object do not apply to its own properties.)
                                // Another object's additionalProperties applies unless one of
                                // that object's own patterns matches the key.
                                let own_add = ptr_join(ptr, "additionalProperties");
                                let foreign: Vec<Sub<'a>> = node.additional.iter().flatten().filter(|a| a.ptr != own_add).cloned().collect();
                                for a in foreign {
                                    let obj = a.ptr.strip_suffix("/additionalProperties").unwrap_or("");
                                    let their_pp = ptr_join(obj, "patternProperties");
                                    let pats: Vec<(String, Rc<str>)> = node.pattern_props.iter().filter(|(_, _, pp)| *pp == their_pp).map(|(p, _, pp)| (p.clone(), pp.clone())).collect();
                                    let mut matched = false;
                                    for (p, pp) in pats {
                                        if self.pattern(&p, &pp)?.matches(name.as_bytes()) {
                                            matched = true;
                                            break;
                                        }
                                    }
                                    if !matched {
                                        c.push(a);
                                    }
                                }
                                c.push(sp);
                                node.props.push((name.clone(), c));
                            }
                        }
                    }
                }
                "patternProperties" => {
                    let pm = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    if node.additional.is_some() && !node.props.is_empty() && node.pattern_props.is_empty() {
                        // Keys declared earlier already carry the additional rule; fine.
                    }
                    for (pat, s) in pm {
                        let sp = Sub { v: s, ptr: ptr_join(&pp, pat), base: base.clone() };
                        match node.pattern_props.iter_mut().find(|(n, _, _)| n == pat) {
                            Some((_, c, _)) => c.push(sp),
                            None => node.pattern_props.push((pat.clone(), vec![sp], pp.clone())),
                        }
                    }
                }
                "additionalProperties" => {
                    let s = sub(k, v);
                    // Keys declared by other members of the conjunction but not by this object
                    // fall under this object's additionalProperties (or its patterns).
                    let own_props = map.get("properties").and_then(|p| p.as_object());
                    let own_pats = map.get("patternProperties").and_then(|p| p.as_object());
                    // A key another member declared falls under this object's patterns when one
                    // matches it (their rules reach declared keys at lowering), else under its
                    // additionalProperties.
                    let mut own_pat_dfas = Vec::new();
                    for pat in own_pats.into_iter().flat_map(|p| p.keys()) {
                        own_pat_dfas.push(self.pattern(pat, &ptr_join(&ptr_join(ptr, "patternProperties"), pat))?);
                    }
                    for (n, c) in node.props.iter_mut() {
                        if !own_props.is_some_and(|o| o.contains_key(n)) && !own_pat_dfas.iter().any(|d| d.matches(n.as_bytes())) {
                            c.push(s.clone());
                        }
                    }
                    node.additional.get_or_insert_with(Vec::new).push(s);
                }
                "unevaluatedProperties" => node.unevaluated.get_or_insert_with(Vec::new).push(sub(k, v)),
                "unevaluatedItems" => node.unevaluated_items.get_or_insert_with(Vec::new).push(sub(k, v)),
                "required" => {
                    for r in v.as_array().ok_or_else(|| bad(k, "expected an array"))? {
                        let r = r.as_str().ok_or_else(|| bad(k, "expected strings"))?;
                        if !node.required.iter().any(|x| x == r) {
                            node.required.push(r.to_string());
                        }
                    }
                }
                "propertyNames" => node.prop_names.push(sub(k, v)),
                "minProperties" => node.min_props = node.min_props.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxProperties" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_props = Some(node.max_props.map_or(m, |p| p.min(m)));
                }
                "allOf" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    let pp = ptr_join(ptr, k);
                    for (i, s) in a.iter().enumerate() {
                        queue.push(Sub { v: s, ptr: ptr_join(&pp, &i.to_string()), base: base.clone() });
                    }
                }
                "anyOf" | "oneOf" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    let pp = ptr_join(ptr, k);
                    let alts = a
                        .iter()
                        .enumerate()
                        .map(|(i, s)| vec![Alt::Sub(Sub { v: s, ptr: ptr_join(&pp, &i.to_string()), base: base.clone() })])
                        .collect();
                    node.disj.push(Disj { alts, keyword: if k == "anyOf" { "anyOf" } else { "oneOf" }, ptr: pp, exclusive: false });
                }
                "dependentRequired" | "dependencies" | "dependentSchemas" => {
                    let m = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    for (name, dep) in m {
                        // (name absent) ∨ (name present ∧ dependency): disjoint by construction.
                        let mut present = vec![Alt::Require(vec![name.clone()])];
                        match dep {
                            Value::Array(names) => present.push(Alt::Require(names.iter().filter_map(|x| x.as_str().map(String::from)).collect())),
                            _ => present.push(Alt::Sub(Sub { v: dep, ptr: ptr_join(&pp, name), base: base.clone() })),
                        }
                        let alts = vec![vec![Alt::Forbid(name.clone())], present];
                        node.disj.push(Disj { alts, keyword: "anyOf", ptr: pp.clone(), exclusive: true });
                    }
                }
                "not" => queue.push(Sub { v, ptr: format!("¬{}", ptr_join(ptr, k)).into(), base: base.clone() }),
                "then" | "else" => {}
                "if" => {
                    let then_ = map.get("then");
                    let else_ = map.get("else");
                    if then_.is_none() && else_.is_none() {
                        continue;
                    }
                    // (if ∧ then) ∨ (¬if ∧ else): disjoint branches.
                    let mut yes = vec![Alt::Sub(sub("if", v))];
                    if let Some(t) = then_ {
                        yes.push(Alt::Sub(sub("then", t)));
                    }
                    let mut no = vec![Alt::Sub(Sub { v, ptr: format!("¬{}", ptr_join(ptr, "if")).into(), base: base.clone() })];
                    if let Some(e) = else_ {
                        no.push(Alt::Sub(sub("else", e)));
                    }
                    node.disj.push(Disj { alts: vec![yes, no], keyword: "anyOf", ptr: ptr_join(ptr, "if"), exclusive: true });
                }
                _ => {
                    // Unknown keywords are annotations (JSON Schema 2020-12 §4.3.1).
                }
            }
        }
        Ok(())
    }

    /// Conservative test that no value satisfies both nodes.
    fn disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if self.disjoint_direct(a, b, depth)? {
            return Ok(true);
        }
        if depth == 0 {
            return Ok(false);
        }
        // A disjunction left in one node: disjoint if every alternative is (alternatives made
        // of sub-schemas only; the node's own keywords are ignored, which only widens it).
        for (x, y) in [(a, b), (b, a)] {
            for dj in &y.disj {
                let mut all = true;
                for alt in &dj.alts {
                    let subs: Option<Vec<Sub<'a>>> = alt.iter().map(|i| if let Alt::Sub(s) = i { Some(s.clone()) } else { None }).collect();
                    let apart = match subs {
                        None => false,
                        Some(subs) => match self.node_of(subs)? {
                            None => true,
                            Some(n) => self.disjoint(x, &n, depth - 1)?,
                        },
                    };
                    if !apart {
                        all = false;
                        break;
                    }
                }
                if all {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The JSON types a node admits, its disjunctions included (alternatives looked into
    /// `depth` levels deep; deeper ones count as admitting every type).
    fn node_types(&mut self, n: &Node<'a>, depth: u32) -> Result<u8, SchemaError> {
        let mut t = effective_types(n);
        if let Some(e) = &n.enums {
            t &= e.iter().fold(0, |acc, v| acc | type_bits(v));
        }
        if depth == 0 {
            return Ok(t);
        }
        for dj in &n.disj {
            let mut u = 0;
            for alt in &dj.alts {
                let mut at = T_ALL;
                for item in alt {
                    match item {
                        Alt::Types(x) => at &= x,
                        Alt::Sub(s) if !s.ptr.starts_with('¬') => {
                            at &= match self.node_of(vec![s.clone()])? {
                                None => 0,
                                Some(m) => self.node_types(&m, depth - 1)?,
                            };
                        }
                        _ => {}
                    }
                }
                u |= at;
            }
            t &= u;
        }
        Ok(t)
    }

    fn disjoint_direct(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        let ta = self.node_types(a, depth)?;
        let tb = self.node_types(b, depth)?;
        let common = ta & tb;
        if common == 0 {
            return Ok(true);
        }
        // Enumerations: compare values.
        if let (Some(ea), Some(eb)) = (&a.enums, &b.enums) {
            if !ea.iter().any(|x| eb.iter().any(|y| json_eq(x, y))) {
                return Ok(true);
            }
        }
        for (en, other) in [(&a.enums, b), (&b.enums, a)] {
            if let Some(e) = en {
                let other_dfa = self.lower_node(other.clone(), "!", 1)?;
                let other_dfa = self.inline(&other_dfa, "!")?;
                if e.iter().all(|v| !value_texts(v, self.opts).iter().any(|t| other_dfa.matches(t))) {
                    return Ok(true);
                }
            }
        }
        let mut rest = common;
        // Scalars with closed texts: check by automaton.
        if rest & (T_NULL | T_BOOL | T_STR) != 0 {
            let mask = rest & (T_NULL | T_BOOL | T_STR);
            let mut na = a.clone();
            na.types = mask & ta;
            na.disj.clear();
            let mut nb = b.clone();
            nb.types = mask & tb;
            nb.disj.clear();
            let da = self.lower_node(na, "!", 0)?;
            let db = self.lower_node(nb, "!", 0)?;
            if Dfa::intersects(&da, &db, self.cap).map_err(self.overflow("!"))? {
                return Ok(false);
            }
            rest &= !mask;
        }
        if rest & (T_INT | T_FRAC) != 0 {
            // Disjoint numeric intervals.
            let sep = |lo: &Option<Bound>, hi: &Option<Bound>| match (lo, hi) {
                (Some((l, le)), Some((h, he))) => {
                    let c = dec_cmp(l, h);
                    c.is_gt() || (c.is_eq() && (*le || *he))
                }
                _ => false,
            };
            if !(sep(&a.lo, &b.hi) || sep(&b.lo, &a.hi)) {
                return Ok(false);
            }
            rest &= !(T_INT | T_FRAC);
        }
        if rest & T_ARR != 0 {
            let sep = |x: &Node, y: &Node| y.max_items.is_some_and(|m| m < x.min_items);
            if !(sep(a, b) || sep(b, a) || self.first_items_disjoint(a, b, depth)?) {
                return Ok(false);
            }
            rest &= !T_ARR;
        }
        if rest & T_OBJ != 0 {
            if !self.objects_disjoint(a, b, depth)? {
                return Ok(false);
            }
            rest &= !T_OBJ;
        }
        Ok(rest == 0)
    }

    /// Arrays of which one has at least one item, when the first items' rules are disjoint.
    fn first_items_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if depth == 0 || (a.min_items == 0 && b.min_items == 0) {
            return Ok(false);
        }
        let first = |n: &Node<'a>| n.prefix.first().or(n.items.as_ref()).cloned();
        let (Some(fa), Some(fb)) = (first(a), first(b)) else { return Ok(false) };
        match (self.node_of(fa)?, self.node_of(fb)?) {
            (Some(na), Some(nb)) => self.disjoint(&na, &nb, depth - 1),
            _ => Ok(true),
        }
    }

    fn objects_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if a.max_props.is_some_and(|m| m < b.min_props) || b.max_props.is_some_and(|m| m < a.min_props) {
            return Ok(true);
        }
        // A key required by one and forbidden by the other.
        for (x, y) in [(a, b), (b, a)] {
            for r in &x.required {
                let declared = y.props.iter().find(|(n, _)| n == r);
                let forbidden = match declared {
                    Some((_, c)) => c.iter().any(|s| s.v == &Value::Bool(false)),
                    None => {
                        y.pattern_props.is_empty()
                            && y.additional.as_ref().is_some_and(|c| c.iter().any(|s| s.v == &Value::Bool(false)))
                    }
                };
                if forbidden {
                    return Ok(true);
                }
            }
        }
        // Closed objects whose key languages do not meet share at most `{}`.
        if (a.min_props > 0 || !a.required.is_empty() || b.min_props > 0 || !b.required.is_empty()) && self.keys_disjoint(a, b)? {
            return Ok(true);
        }
        if depth == 0 {
            return Ok(false);
        }
        // A property required by one and declared by both with disjoint values: an object of the
        // first has the key, and an object of the second with that key must satisfy its rule.
        for (name, ca) in &a.props {
            let Some((_, cb)) = b.props.iter().find(|(n, _)| n == name) else { continue };
            if !(a.required.contains(name) || b.required.contains(name)) {
                continue;
            }
            let na = self.node_of(ca.clone())?;
            let nb = self.node_of(cb.clone())?;
            if let (Some(na), Some(nb)) = (na, nb) {
                if self.disjoint(&na, &nb, depth - 1)? {
                    return Ok(true);
                }
            } else {
                return Ok(true); // one side unsatisfiable
            }
        }
        Ok(false)
    }

    /// Whether no key can be present in both a closed object of `a` and one of `b` (both with
    /// `additionalProperties: false`; names declared `false` do not count). Then the only object
    /// both accept is `{}`.
    fn keys_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>) -> Result<bool, SchemaError> {
        let closed = |n: &Node| n.additional.as_ref().is_some_and(|c| c.iter().any(|s| s.v == &Value::Bool(false)));
        if !closed(a) || !closed(b) {
            return Ok(false);
        }
        let names = |n: &Node<'a>| -> Vec<String> {
            n.props.iter().filter(|(_, c)| !c.iter().any(|s| s.v == &Value::Bool(false))).map(|(k, _)| k.clone()).collect()
        };
        let (na, nb) = (names(a), names(b));
        let mut pa = Vec::new();
        for (p, _, pp) in &a.pattern_props {
            pa.push(self.pattern(p, pp)?);
        }
        let mut pb = Vec::new();
        for (p, _, pp) in &b.pattern_props {
            pb.push(self.pattern(p, pp)?);
        }
        for (xs, ys, yp) in [(&na, &nb, &pb), (&nb, &na, &pa)] {
            if xs.iter().any(|x| ys.contains(x) || yp.iter().any(|d| d.matches(x.as_bytes()))) {
                return Ok(false);
            }
        }
        for x in &pa {
            for y in &pb {
                if Dfa::intersects(x, y, self.cap).map_err(self.overflow("!"))? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Narrows the object branch `x` of an overlapping `oneOf` until no object of it satisfies
    /// `y`: a key `y` requires is forbidden in `x`, or (closed objects with disjoint keys) `{}`
    /// is left out. Every object removed either satisfies `y` too (so no branch alone) or has a
    /// key whose value fails `y`'s rule for it — the second kind is the (documented) narrowing.
    fn narrow_apart(&mut self, x: &mut Node<'a>, y: &Node<'a>) -> Result<bool, SchemaError> {
        if self.disjoint(x, y, 2)? {
            return Ok(true);
        }
        if self.keys_disjoint(x, y)? {
            x.min_props = x.min_props.max(1);
            if self.disjoint(x, y, 2)? {
                return Ok(true);
            }
        }
        let Some(r) = y.required.iter().find(|r| !x.required.contains(r)).cloned() else { return Ok(false) };
        self.add_prop(x, &r, Sub { v: &FALSE, ptr: "!".into(), base: "".into() })?;
        self.disjoint(x, y, 2)
    }

    /// Flattens a conjunction into a node without lowering (refs expanded one level deep only
    /// for the check); `None` if unsatisfiable.
    fn node_of(&mut self, members: Vec<Sub<'a>>) -> Result<Option<Node<'a>>, SchemaError> {
        let mut node = Node { types: T_ALL, ..Default::default() };
        let mut q = members;
        let mut qi = 0;
        while qi < q.len() {
            let m = q[qi].clone();
            qi += 1;
            if qi > 1000 {
                break;
            }
            if m.ptr.starts_with('¬') {
                // Ignoring a conjunct only widens the node: conservative for disjointness.
                continue;
            }
            match m.v {
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(None),
                Value::Object(map) => {
                    if let Some(Value::String(r)) = map.get("$ref") {
                        let (v, t, nb) = self.resolve(r, &m.base, &m.ptr)?;
                        q.push(Sub { v, ptr: t, base: nb });
                        if self.draft == Draft::Legacy {
                            continue;
                        }
                    }
                    let base = m.base.clone();
                    self.apply(&mut node, map, &m.ptr, &base, &mut q)?;
                }
                _ => return Ok(None),
            }
        }
        Ok(if node.never { None } else { Some(node) })
    }

    fn pattern(&mut self, p: &str, ptr: &str) -> Result<Rc<Dfa>, SchemaError> {
        if let Some(d) = self.pattern_cache.get(p) {
            return Ok(d.clone());
        }
        let gkey = format!("pattern:{}:{p}", self.cap);
        if let Some(d) = global_get(&gkey) {
            let d = Rc::new(d);
            self.pattern_cache.insert(p.to_string(), d.clone());
            return Ok(d);
        }
        let d = strings::pattern_dfa(p, self.cap).map_err(|e| match e {
            strings::RegexIssue::Syntax(why) => SchemaError::UnsupportedPattern { pattern: p.to_string(), pointer: ptr.to_string(), reason: why },
            strings::RegexIssue::TooLarge => SchemaError::TooLarge { pointer: ptr.to_string(), what: "pattern automaton".into(), limit: self.cap },
        })?;
        global_put(gkey, &d);
        let d = Rc::new(d);
        self.pattern_cache.insert(p.to_string(), d.clone());
        Ok(d)
    }

    /// Decoded-level string automaton of a node's string constraints.
    fn string_decoded(&mut self, node: &Node<'a>, ptr: &str) -> Result<Dfa, SchemaError> {
        // Length counters cost one automaton state per character: a `maxLength` above the
        // bound is generated up to the bound (a subset: sound); a `minLength` above it is refused.
        let bound = self.opts.max_length_bound;
        if node.min_len > bound {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: format!("minLength {}", node.min_len), limit: bound as usize });
        }
        // Generate long-bounded strings up to `max_length_generated` characters (at least
        // minLength): a subset of the valid strings.
        let gen = self.opts.max_length_generated.max(node.min_len);
        let max_len = node.max_len.map(|m| m.min(bound).min(gen));
        let mut d = strings::length_dfa(node.min_len, max_len, self.cap).map_err(self.overflow(ptr))?;
        for (p, pp) in node.patterns.clone() {
            let pd = self.pattern(&p, &pp)?;
            d = Dfa::intersect(&d, &pd, self.cap).map_err(self.overflow(ptr))?;
        }
        for (p, pp) in node.not_patterns.clone() {
            let pd = self.pattern(&p, &pp)?;
            d = Dfa::minus(&d, &pd, self.cap).map_err(self.overflow(ptr))?;
        }
        for f in &node.formats {
            let re = strings::format_regex(f).unwrap_or_default();
            let key = format!("\u{0}format:{f}");
            let fd = match self.pattern_cache.get(&key) {
                Some(x) => x.clone(),
                None => {
                    let gkey = format!("{key}:{}", self.cap);
                    let x = match global_get(&gkey) {
                        Some(d) => d,
                        None => {
                            let d = strings::full_match_dfa(&re, self.cap).map_err(|_| SchemaError::TooLarge { pointer: ptr.to_string(), what: "format automaton".into(), limit: self.cap })?;
                            global_put(gkey, &d);
                            d
                        }
                    };
                    let x = Rc::new(x);
                    self.pattern_cache.insert(key, x.clone());
                    x
                }
            };
            d = Dfa::intersect(&d, &fd, self.cap).map_err(self.overflow(ptr))?;
        }
        Ok(d)
    }

    fn lower_node(&mut self, mut node: Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        if node.never {
            return Ok(Dfa::empty());
        }
        if node.additional.is_none() {
            node.additional = node.unevaluated.take();
        }
        // `unevaluatedItems` over the merged node (allOf / $ref merged, anyOf / oneOf / if
        // distributed into branches): the items no `prefixItems` or `items` evaluated. Exact
        // per branch — the passing branch with the longest prefix decides — except beside
        // `contains`, which evaluates the items it matches.
        if let Some(u) = node.unevaluated_items.take() {
            if node.items.is_none() {
                if node.contains.is_some() {
                    return Err(SchemaError::Unsupported { keyword: "unevaluatedItems".into(), pointer: ptr.to_string() });
                }
                node.items = Some(u);
            }
        }
        if !node.undeclared.is_empty() {
            return self.lower_undeclared(node, ptr, any_depth);
        }
        let mut types = effective_types(&node);
        if let Some(e) = &node.enums {
            let mut tb = 0;
            for v in e {
                tb |= type_bits(v);
            }
            types &= tb;
        }
        let mut parts: Vec<Dfa> = Vec::new();
        let cap = self.cap;
        if types & T_NULL != 0 {
            parts.push(Dfa::literals([&b"null"[..]], cap).map_err(self.overflow(ptr))?);
        }
        if types & T_BOOL != 0 {
            parts.push(Dfa::literals([&b"true"[..], b"false"], cap).map_err(self.overflow(ptr))?);
        }
        if types & (T_INT | T_FRAC) != 0 && node.enums.is_none() {
            let int_only = types & T_FRAC == 0;
            let mut steps = node.steps.iter();
            let first = steps.next();
            // Exponents only where every text's value is plain to compare (see docs).
            let frac_only = types & T_INT == 0;
            let num_excluded = node.not_enums.iter().any(|v| v.is_number());
            let allow_exp = !frac_only && !num_excluded;
            let mut d = numbers::number_dfa(int_only, node.lo.as_ref(), node.hi.as_ref(), first, allow_exp, cap).map_err(|e| match e {
                numbers::NumIssue::Overflow(o) => (self.overflow(ptr))(o),
                numbers::NumIssue::Step => SchemaError::Unsupported { keyword: "multipleOf".into(), pointer: ptr.to_string() },
            })?;
            for s in steps {
                let e = numbers::number_dfa(int_only, None, None, Some(s), true, cap).map_err(|_| SchemaError::Unsupported { keyword: "multipleOf".into(), pointer: ptr.to_string() })?;
                d = Dfa::intersect(&d, &e, cap).map_err(self.overflow(ptr))?;
            }
            if frac_only {
                let nf = numbers::non_integer_dfa(cap).map_err(self.overflow(ptr))?;
                d = Dfa::intersect(&d, &nf, cap).map_err(self.overflow(ptr))?;
            }
            for v in node.not_enums.iter().filter(|v| v.is_number()) {
                if let Some(dv) = dec_of(v) {
                    let vt = numbers::value_texts_dfa(&dv, cap).map_err(self.overflow(ptr))?;
                    d = Dfa::minus(&d, &vt, cap).map_err(self.overflow(ptr))?;
                }
            }
            parts.push(d);
        }
        if types & T_STR != 0 {
            let dec = self.string_decoded(&node, ptr)?;
            parts.push(self.encode(&dec, ptr)?);
        }
        if types & T_ARR != 0 {
            parts.push(self.lower_array(&node, ptr, any_depth)?);
        }
        if types & T_OBJ != 0 {
            parts.push(self.lower_object(&node, ptr, any_depth)?);
        }
        let excluded: Vec<Vec<u8>> = node.not_enums.iter().filter(|v| !v.is_number()).flat_map(|v| value_texts(v, self.opts)).collect();
        if !excluded.is_empty() {
            if node.not_enums.iter().any(|v| v.is_array() || v.is_object()) {
                return Err(SchemaError::Unsupported { keyword: "not".into(), pointer: ptr.to_string() });
            }
            let ex = Dfa::literals(excluded.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?;
            for p in parts.iter_mut() {
                *p = Dfa::minus(p, &ex, cap).map_err(self.overflow(ptr))?;
            }
        }
        if let Some(e) = &node.enums {
            // Numbers are checked by value (their texts are not unique: 1 = 1.0); the rest by text.
            let num_dfa = if types & (T_INT | T_FRAC) != 0 {
                Some(numbers::number_dfa(false, node.lo.as_ref(), node.hi.as_ref(), None, true, cap).map_err(|_| SchemaError::TooLarge { pointer: ptr.to_string(), what: "number".into(), limit: cap })?)
            } else {
                None
            };
            let mut num_texts: Vec<Vec<u8>> = Vec::new();
            let mut texts: Vec<Vec<u8>> = Vec::new();
            for v in e {
                let tb = type_bits(v);
                if tb & (T_INT | T_FRAC) != 0 {
                    if tb & types == 0 {
                        continue;
                    }
                    let Some(d) = dec_of(v) else { continue };
                    let canon = value_texts(v, self.opts).into_iter().next().unwrap_or_default();
                    let in_range = num_dfa.as_ref().is_some_and(|n| n.matches(&canon));
                    let multiple = node.steps.iter().all(|st| {
                        numbers::number_dfa(false, None, None, Some(st), true, cap).is_ok_and(|m| m.matches(&canon))
                    });
                    let _ = d;
                    if in_range && multiple {
                        num_texts.extend(value_texts(v, self.opts));
                    }
                } else {
                    texts.extend(value_texts(v, self.opts));
                }
            }
            parts.retain(|p| !p.is_empty());
            let non_num: Vec<Dfa> = parts;
            let mut out = Vec::new();
            if !texts.is_empty() {
                let all = self.union(&non_num, ptr)?;
                let all = self.inline(&all, ptr)?;
                let ed = Dfa::literals(texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?;
                out.push(Dfa::intersect(&ed, &all, cap).map_err(self.overflow(ptr))?);
            }
            if !num_texts.is_empty() {
                out.push(Dfa::literals(num_texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?);
            }
            return self.union(&out, ptr);
        }
        self.union(&parts, ptr)
    }

    /// An object with some key outside a name set (the negation of `additionalProperties`), for
    /// objects whose own keys are closed: the union, over the node's declared keys outside the
    /// set, of the node with that key required (and its value failing the negated schema).
    fn lower_undeclared(&mut self, mut node: Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let (names, fails) = node.undeclared.remove(0);
        let closed = node.pattern_props.is_empty()
            && match &node.additional {
                Some(a) => a.iter().any(|s| s.v == &Value::Bool(false)),
                None => !self.opts.allow_undeclared_properties,
            };
        if !closed {
            return Err(SchemaError::Unsupported { keyword: "not (additionalProperties)".into(), pointer: ptr.to_string() });
        }
        node.types &= T_OBJ;
        let keys: Vec<String> = node.props.iter().map(|(k, _)| k.clone()).filter(|k| !names.contains(k)).collect();
        let mut parts = Vec::new();
        for k in keys {
            let mut v = node.clone();
            if !v.required.contains(&k) {
                v.required.push(k.clone());
            }
            if let Some(f) = &fails {
                self.add_prop(&mut v, &k, f.clone())?;
            }
            let d = self.lower_node(v, ptr, any_depth)?;
            if !d.is_empty() {
                parts.push(d);
            }
        }
        self.union(&parts, ptr)
    }

    /// Any JSON value nested at most `depth` levels.
    fn any(&mut self, depth: u32) -> Result<Rc<Dfa>, SchemaError> {
        if let Some(d) = self.any_cache.get(&depth) {
            return Ok(d.clone());
        }
        let gkey = format!("any:{depth}:{:?}:{}", self.opts.whitespace, self.cap);
        if let Some(d) = global_get(&gkey) {
            let d = Rc::new(d);
            self.any_cache.insert(depth, d.clone());
            return Ok(d);
        }
        let cap = self.cap;
        let ov = |o: Overflow| SchemaError::TooLarge { pointer: "".into(), what: format!("any-value automaton ({} states)", o.states), limit: cap };
        let mut parts = vec![
            Dfa::literals([&b"null"[..], b"true", b"false"], cap).map_err(ov)?,
            numbers::number_dfa(false, None, None, None, true, cap).map_err(|_| ov(Overflow { states: cap }))?,
        ];
        let strd = strings::encode(&strings::length_dfa(0, None, cap).map_err(ov)?, cap).map_err(ov)?;
        parts.push(strd.clone());
        if depth > 0 {
            let inner = self.any(depth - 1)?;
            // array
            let mut nfa = Nfa::new();
            let s = nfa.state();
            let open = nfa.lit(s, b"[");
            let e = nfa.state();
            nfa.lit_to(open, b"]", e);
            let after = nfa.embed(open, &inner);
            nfa.lit_to(after, b"]", e);
            let sep = nfa.state();
            self.sep(&mut nfa, after, b",", sep);
            nfa.embed_to(sep, &inner, after);
            parts.push(nfa.determinize(s, e, cap).map_err(ov)?);
            // object
            let mut nfa = Nfa::new();
            let s = nfa.state();
            let open = nfa.lit(s, b"{");
            let e = nfa.state();
            nfa.lit_to(open, b"}", e);
            let k = nfa.embed(open, &strd);
            let colon = nfa.state();
            self.sep(&mut nfa, k, b":", colon);
            let after = nfa.embed(colon, &inner);
            nfa.lit_to(after, b"}", e);
            let sep = nfa.state();
            self.sep(&mut nfa, after, b",", sep);
            nfa.embed_to(sep, &strd, k);
            parts.push(nfa.determinize(s, e, cap).map_err(ov)?);
        }
        let d = Rc::new(self.union(&parts, "")?);
        global_put(gkey, &d);
        self.any_cache.insert(depth, d.clone());
        Ok(d)
    }

    fn lower_array(&mut self, node: &Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let inner_depth = any_depth.saturating_sub(1);
        let item_dfa = |this: &mut Self, c: &Vec<Sub<'a>>| -> Result<Rc<Dfa>, SchemaError> {
            if c.is_empty() {
                this.any(inner_depth)
            } else {
                this.path.push(PStep::AnyIndex);
                let r = this.lower_conj(c.clone(), inner_depth);
                this.path.pop();
                r
            }
        };
        let items: Rc<Dfa> = match &node.items {
            None => {
                if any_depth == 0 {
                    Rc::new(Dfa::empty())
                } else {
                    self.any(inner_depth)?
                }
            }
            Some(c) => item_dfa(self, c)?,
        };
        let mut prefix: Vec<Rc<Dfa>> = Vec::new();
        for p in &node.prefix {
            prefix.push(item_dfa(self, p)?);
        }
        let contains: Option<(Rc<Dfa>, Vec<Rc<Dfa>>)> = match &node.contains {
            Some(c) if node.min_contains > 0 => {
                let mut conj = c.clone();
                if let Some(i) = &node.items {
                    conj.extend(i.iter().cloned());
                }
                let ci = item_dfa(self, &conj)?;
                let mut pc = Vec::new();
                for p in &node.prefix {
                    let mut conj = c.clone();
                    conj.extend(p.iter().cloned());
                    pc.push(item_dfa(self, &conj)?);
                }
                Some((ci, pc))
            }
            _ => None,
        };
        if node.unique {
            // Enforced at run time by the Matcher (items compared by canonical value).
            self.unique.push(self.path.clone());
        }
        let need_c = if contains.is_some() { node.min_contains.min(8) as usize } else { 0 };
        if contains.is_some() && node.min_contains > 8 {
            return Err(SchemaError::Unsupported { keyword: "minContains".into(), pointer: ptr.to_string() });
        }
        let m = prefix.len() as u64;
        // Arrays bounded above by many items are generated with at most `max_items_generated`
        // items (at least minItems and the prefix): a subset of the valid arrays.
        let mut node_max = node.max_items;
        if let Some(mx) = node_max {
            let gen = self.opts.max_items_generated.max(node.min_items).max(m);
            if mx > gen {
                node_max = Some(gen);
            }
        }
        let node = &Node { max_items: node_max, ..node.clone() };
        let unroll = match node.max_items {
            Some(mx) => mx,
            // At least one unrolled position: the tail loop writes a separator first.
            None => m.max(node.min_items).max(1),
        };
        if unroll > 4096 {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: "array length unrolling".into(), limit: 4096 });
        }
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let end = nfa.state();
        let open = nfa.lit(s, b"[");
        // st[j][f]: j items written, f = number of `contains` matches (saturating at need_c).
        let width = need_c + 1;
        let mut st: Vec<Vec<u32>> = vec![(0..width).map(|_| nfa.state()).collect()];
        nfa.eps(open, st[0][0]);
        let close = |nfa: &mut Nfa, j: u64, stj: &Vec<u32>| {
            let ok_len = j >= node.min_items && node.max_items.is_none_or(|mx| j <= mx);
            if ok_len {
                nfa.lit_to(stj[need_c], b"]", end);
            }
        };
        for j in 0..unroll {
            let jd = j as usize;
            let next: Vec<u32> = (0..width).map(|_| nfa.state()).collect();
            close(&mut nfa, j, &st[jd]);
            let item: Rc<Dfa> = if jd < prefix.len() { prefix[jd].clone() } else { items.clone() };
            let citem: Option<Rc<Dfa>> = contains.as_ref().map(|(ci, pc)| if jd < pc.len() { pc[jd].clone() } else { ci.clone() });
            if !item.is_empty() || citem.as_ref().is_some_and(|c| !c.is_empty()) {
                for f in 0..width {
                    let from = if j == 0 {
                        st[jd][f]
                    } else {
                        let x = nfa.state();
                        self.sep(&mut nfa, st[jd][f], b",", x);
                        x
                    };
                    if !item.is_empty() {
                        self.place(&mut nfa, from, &item, next[f]);
                    }
                    if let Some(c) = &citem {
                        if !c.is_empty() && need_c > 0 {
                            self.place(&mut nfa, from, c, next[(f + 1).min(need_c)]);
                        }
                    }
                }
            }
            st.push(next);
        }
        let last = unroll as usize;
        close(&mut nfa, unroll, &st[last]);
        if node.max_items.is_none() && !items.is_empty() {
            // Unbounded tail: loop.
            for f in 0..width {
                let x = nfa.state();
                self.sep(&mut nfa, st[last][f], b",", x);
                self.place(&mut nfa, x, &items, st[last][f]);
                if let Some((ci, _)) = &contains {
                    if need_c > 0 && !ci.is_empty() {
                        self.place(&mut nfa, x, ci, st[last][(f + 1).min(need_c)]);
                    }
                }
            }
        } else if node.max_items.is_none() {
            if let Some((ci, _)) = &contains {
                for f in 0..width {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[last][f], b",", x);
                    if need_c > 0 && !ci.is_empty() {
                        self.place(&mut nfa, x, ci, st[last][(f + 1).min(need_c)]);
                    }
                }
            }
        }
        self.determinize(&nfa, s, end, ptr)
    }

    fn lower_object(&mut self, node: &Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let cap = self.cap;
        let inner_depth = any_depth.saturating_sub(1);
        // Key texts must satisfy propertyNames.
        let names: Option<Dfa> = if node.prop_names.is_empty() {
            None
        } else {
            let conj = node.prop_names.clone();
            let d = self.lower_conj(conj, 0)?;
            let strs = self.any_string(ptr)?;
            Some(Dfa::intersect(&d, &strs, cap).map_err(self.overflow(ptr))?)
        };
        let mut pats: Vec<(Rc<Dfa>, Vec<Sub<'a>>)> = Vec::new();
        for (p, c, pp) in &node.pattern_props {
            let d = self.pattern(p, pp)?;
            pats.push((d, c.clone()));
        }
        // Declared properties.
        let mut decl: Vec<(Vec<u8>, Rc<Dfa>, bool)> = Vec::new();
        for (name, c) in &node.props {
            let text = strings::encode_literal(name);
            let allowed_name = names.as_ref().is_none_or(|n| n.matches(&text));
            let mut conj = c.clone();
            for (pd, pc) in &pats {
                if pd.matches(name.as_bytes()) {
                    conj.extend(pc.iter().cloned());
                }
            }
            self.path.push(PStep::Key(text.clone()));
            let v = if allowed_name { self.lower_conj(conj, inner_depth) } else { Ok(Rc::new(Dfa::empty())) };
            self.path.pop();
            let v = v?;
            let required = node.required.contains(name);
            if v.is_empty() && required {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, required));
        }
        // Required keys that are not declared: they come from additional / pattern rules.
        let mut req_extra: Vec<String> = node.required.iter().filter(|r| !node.props.iter().any(|(n, _)| n == *r)).cloned().collect();
        // Such keys are emitted as declared properties (after the declared ones, in order).
        for r in req_extra.drain(..) {
            let text = strings::encode_literal(&r);
            if names.as_ref().is_some_and(|n| !n.matches(&text)) {
                return Ok(Dfa::empty());
            }
            let mut conj: Vec<Sub<'a>> = Vec::new();
            let mut matched = false;
            for (pd, pc) in &pats {
                if pd.matches(r.as_bytes()) {
                    conj.extend(pc.iter().cloned());
                    matched = true;
                }
            }
            self.path.push(PStep::Key(text.clone()));
            let v = if !matched {
                match &node.additional {
                    Some(a) => self.lower_conj(a.clone(), inner_depth),
                    None => self.any(inner_depth),
                }
            } else {
                self.lower_conj(conj, inner_depth)
            };
            self.path.pop();
            let v = v?;
            if v.is_empty() {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, true));
        }
        // Extra keys: classes by which patterns match.
        let declared_texts: Vec<Vec<u8>> = decl.iter().map(|d| d.0.clone()).collect();
        let mut extras: Vec<(Dfa, Rc<Dfa>)> = Vec::new();
        let additional_forbidden = node.additional.as_ref().is_some_and(|a| a.iter().any(|s| s.v == &Value::Bool(false)));
        let allow_any = node.additional.is_none() && self.opts.allow_undeclared_properties && any_depth > 0;
        let any_key = self.any_string(ptr)?;
        let mut base_key = Dfa::minus(&any_key, &Dfa::literals(declared_texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?, cap).map_err(self.overflow(ptr))?;
        if let Some(n) = &names {
            base_key = Dfa::intersect(&base_key, n, cap).map_err(self.overflow(ptr))?;
        }
        if pats.len() > 4 {
            if !pats.is_empty() {
                return Err(SchemaError::Unsupported { keyword: "patternProperties".into(), pointer: ptr.to_string() });
            }
        }
        let np = pats.len();
        let mut enc_pats: Vec<Dfa> = Vec::with_capacity(pats.len());
        for (d, _) in &pats {
            enc_pats.push(self.encode(d, ptr)?);
        }
        for mask in 0..(1usize << np) {
            let mut key = base_key.clone();
            let mut conj: Vec<Sub<'a>> = Vec::new();
            for (i, ep) in enc_pats.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    key = Dfa::intersect(&key, ep, cap).map_err(self.overflow(ptr))?;
                    conj.extend(pats[i].1.iter().cloned());
                } else {
                    key = Dfa::minus(&key, ep, cap).map_err(self.overflow(ptr))?;
                }
                if key.is_empty() {
                    break;
                }
            }
            if key.is_empty() {
                continue;
            }
            let v = if mask != 0 {
                self.path.push(PStep::AnyKey);
                let r = self.lower_conj(conj, inner_depth);
                self.path.pop();
                r?
            } else if additional_forbidden {
                continue;
            } else if let Some(a) = &node.additional {
                self.path.push(PStep::AnyKey);
                let r = self.lower_conj(a.clone(), inner_depth);
                self.path.pop();
                r?
            } else if allow_any {
                self.any(inner_depth)?
            } else {
                continue;
            };
            if !v.is_empty() {
                extras.push((key, v));
            }
        }
        // Assemble: states (i, count).
        let counting = node.min_props > 0 || node.max_props.is_some();
        let cmax: u64 = if counting { node.max_props.map_or(node.min_props, |m| m.max(node.min_props)) } else { 1 };
        if cmax > 256 {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: "property count tracking".into(), limit: 256 });
        }
        let width = cmax as usize + 1;
        let n = decl.len();
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let end = nfa.state();
        let open = nfa.lit(s, b"{");
        let st: Vec<Vec<u32>> = (0..=n).map(|_| (0..width).map(|_| nfa.state()).collect()).collect();
        nfa.eps(open, st[0][0]);
        let max_ok = |c: usize| node.max_props.is_none_or(|m| (c as u64) < m);
        let bump = |c: usize| if counting { (c + 1).min(width - 1) } else { 1 };
        for (i, (text, v, required)) in decl.iter().enumerate() {
            if !*required {
                for c in 0..width {
                    nfa.eps(st[i][c], st[i + 1][c]);
                }
            }
            if v.is_empty() {
                continue;
            }
            // One embedding of the value per target count.
            let mut entry: HashMap<usize, u32> = HashMap::default();
            for c in 0..width {
                if !max_ok(c) {
                    continue;
                }
                let tgt = bump(c);
                let e = match entry.get(&tgt) {
                    Some(&e) => e,
                    None => {
                        let e = nfa.state();
                        self.place(&mut nfa, e, v, st[i + 1][tgt]);
                        entry.insert(tgt, e);
                        e
                    }
                };
                let k = if c == 0 {
                    nfa.lit(st[i][c], text)
                } else {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[i][c], b",", x);
                    nfa.lit(x, text)
                };
                self.sep(&mut nfa, k, b":", e);
            }
        }
        for (key, v) in &extras {
            let mut entry: HashMap<usize, u32> = HashMap::default();
            for c in 0..width {
                if !max_ok(c) {
                    continue;
                }
                let tgt = bump(c);
                let e = match entry.get(&tgt) {
                    Some(&e) => e,
                    None => {
                        let e = nfa.state();
                        self.place(&mut nfa, e, v, st[n][tgt]);
                        entry.insert(tgt, e);
                        e
                    }
                };
                let kstart = if c == 0 {
                    st[n][c]
                } else {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[n][c], b",", x);
                    x
                };
                let k = nfa.embed(kstart, key);
                self.sep(&mut nfa, k, b":", e);
            }
        }
        for c in 0..width {
            let ok = if counting { (c as u64) >= node.min_props } else { true };
            if ok {
                nfa.lit_to(st[n][c], b"}", end);
            }
        }
        self.determinize(&nfa, s, end, ptr)
    }
}

fn effective_types(n: &Node) -> u8 {
    let mut t = n.types;
    if t & T_INT != 0 && !n.steps.is_empty() {
        // still integers/numbers
    }
    if n.never {
        t = 0;
    }
    t
}

fn collect_refs(v: &Value, base: &Rc<str>, out: &mut Vec<(String, Rc<str>)>) {
    let mut seen: std::collections::HashSet<String> = out.iter().map(|(r, _)| r.clone()).collect();
    collect_refs_into(v, base, out, &mut seen);
}

fn collect_refs_into(v: &Value, base: &Rc<str>, out: &mut Vec<(String, Rc<str>)>, seen: &mut std::collections::HashSet<String>) {
    match v {
        Value::Object(m) => {
            for key in ["$ref", "$recursiveRef"] {
                if let Some(Value::String(r)) = m.get(key) {
                    let r = if key == "$ref" { r.clone() } else { "#".to_string() };
                    if seen.insert(r.clone()) {
                        out.push((r, base.clone()));
                    }
                }
            }
            for (k, c) in m {
                if matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                    continue;
                }
                collect_refs_into(c, base, out, seen);
            }
        }
        Value::Array(a) => {
            for c in a {
                collect_refs_into(c, base, out, seen);
            }
        }
        _ => {}
    }
}

/// The texts (under the whitespace policy, without the optional spaces) of a JSON value, plus
/// the spaced variants where the policy allows them. Numbers also in their `.0`-suffixed forms.
pub(crate) fn value_texts(v: &Value, opts: &CompileOptions) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = vec![Vec::new()];
    write_texts(v, opts, &mut out);
    out
}

fn append_all(out: &mut Vec<Vec<u8>>, alts: &[&[u8]]) {
    if alts.len() == 1 {
        for o in out.iter_mut() {
            o.extend_from_slice(alts[0]);
        }
        return;
    }
    let mut next = Vec::with_capacity(out.len() * alts.len());
    for o in out.iter() {
        for a in alts {
            let mut x = o.clone();
            x.extend_from_slice(a);
            next.push(x);
        }
    }
    *out = next;
}

fn write_texts(v: &Value, opts: &CompileOptions, out: &mut Vec<Vec<u8>>) {
    let ws: Vec<&[u8]> = match opts.whitespace {
        Whitespace::Compact => vec![b""],
        Whitespace::Flexible => vec![b"", b" "],
    };
    if out.len() > 4096 {
        // Avoid blow-up on large literal values: keep compact spelling only.
        let c = serde_json::to_vec(v).unwrap_or_default();
        append_all(out, &[&c]);
        return;
    }
    match v {
        Value::Null => append_all(out, &[b"null"]),
        Value::Bool(true) => append_all(out, &[b"true"]),
        Value::Bool(false) => append_all(out, &[b"false"]),
        Value::Number(_) => {
            let d = dec_of(v);
            match d {
                Some(d) => {
                    let mut t = Vec::new();
                    if d.neg {
                        t.push(b'-');
                    }
                    t.extend_from_slice(&d.int);
                    if !d.frac.is_empty() {
                        t.push(b'.');
                        t.extend_from_slice(&d.frac);
                    }
                    let mut alts = vec![t.clone()];
                    let mut z = t.clone();
                    if d.frac.is_empty() {
                        z.extend_from_slice(b".0");
                    } else {
                        z.push(b'0');
                    }
                    alts.push(z);
                    let refs: Vec<&[u8]> = alts.iter().map(|a| a.as_slice()).collect();
                    append_all(out, &refs);
                }
                None => {
                    let t = v.to_string().into_bytes();
                    append_all(out, &[&t]);
                }
            }
        }
        Value::String(s) => {
            let t = strings::encode_literal(s);
            append_all(out, &[&t]);
        }
        Value::Array(a) => {
            append_all(out, &[b"["]);
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    append_all(out, &[b","]);
                    append_all(out, &ws);
                }
                write_texts(x, opts, out);
            }
            append_all(out, &[b"]"]);
        }
        Value::Object(m) => {
            append_all(out, &[b"{"]);
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    append_all(out, &[b","]);
                    append_all(out, &ws);
                }
                let kt = strings::encode_literal(k);
                append_all(out, &[&kt]);
                append_all(out, &[b":"]);
                append_all(out, &ws);
                write_texts(x, opts, out);
            }
            append_all(out, &[b"}"]);
        }
    }
}
