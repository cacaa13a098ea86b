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

use serde_json::Value;

use super::automata::{Dfa, Nfa, Overflow};
use super::numbers::{self, Bound, Dec};
use super::strings;
use super::{CompileOptions, SchemaError, Whitespace};

mod arrays;
mod assemble;
mod disjoint;
mod distribute;
mod literals;
mod merge;
mod negate;
mod objects;
mod patterns;
mod refs;
pub(crate) use refs::resolve_uri;

use assemble::{global_get, global_put};
use literals::value_texts;
use patterns::StringKey;

const T_NULL: u8 = 1;
const T_BOOL: u8 = 2;
const T_INT: u8 = 4; // integers
const T_FRAC: u8 = 8; // non-integer numbers
const T_STR: u8 = 16;
const T_ARR: u8 = 32;
const T_OBJ: u8 = 64;
const T_ALL: u8 = 127;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Draft {
    Legacy, // draft 3/4/6/7: `$ref` siblings are ignored
    D2019,
    D2020,
}

impl Draft {
    /// The draft a `$schema` names (2020-12 for any other dialect).
    fn of(schema: Option<&str>) -> Draft {
        match schema {
            Some(s) if s.contains("draft-0") || s.contains("draft-03") => Draft::Legacy,
            Some(s) if s.contains("2019-09") => Draft::D2019,
            _ => Draft::D2020,
        }
    }
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
    /// Item i (when present) satisfies the sub-schema: the failure of a `prefixItems` entry.
    PrefixItem(usize, Sub<'a>),
    /// Every item satisfies the sub-schema: the failure of `contains`.
    AllItems(Sub<'a>),
    /// The property's value must satisfy the sub-schema.
    Prop(String, Sub<'a>),
    /// Some key of the set is present (with a value satisfying the sub-schema, if given): the
    /// failure of `additionalProperties` or of one `patternProperties` rule.
    Undeclared(KeySet, Option<Sub<'a>>),
}

/// A set of object keys: those outside `names` that match one of `inside` (any key when it is
/// empty) and none of `outside` (patterns with their pointers).
#[derive(Clone, Default)]
struct KeySet {
    names: Vec<String>,
    inside: Vec<(String, Rc<str>)>,
    outside: Vec<(String, Rc<str>)>,
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
    /// `maxContains` beside `contains`: items are then counted exactly (see `lower_array`).
    max_contains: Option<u64>,
    props: Vec<(String, Vec<Sub<'a>>)>,
    required: Vec<String>,
    pattern_props: Vec<(String, Vec<Sub<'a>>, Rc<str>)>,
    additional: Option<Vec<Sub<'a>>>,
    unevaluated: Option<Vec<Sub<'a>>>,
    /// `unevaluatedProperties` of members other than the conjunction's root, merged as
    /// `additional` rules: each rule's pointer and the keys its own schema object evaluates
    /// (statically: its `properties` and those of its `allOf` / `$ref` sub-schemas), to which
    /// it does not apply.
    eval_sets: Vec<(Rc<str>, Vec<String>)>,
    /// `unevaluatedItems` of members other than the root, merged as `items` rules: each
    /// rule's pointer and how many leading items its own object evaluates (statically).
    item_rules: Vec<(Rc<str>, usize)>,
    /// `unevaluatedItems`: items past every merged `prefixItems`, when no `items` applies.
    unevaluated_items: Option<Vec<Sub<'a>>>,
    /// The longest prefix a positive `prefixItems` (or array `items`) evaluates: `prefix` may
    /// be longer, by item rules from negations, which evaluate nothing.
    pos_prefix: usize,
    /// A positive rule evaluates every item past the prefix (`items`, `additionalItems`, a
    /// member's `unevaluatedItems`).
    items_eval: bool,
    /// Keys declared only by a negation (`not`, `¬if`, `oneOf`'s `¬A_j`): a failed sub-schema
    /// evaluates nothing, so `unevaluatedProperties` still applies to them.
    neg_keys: Vec<String>,
    /// A negation contributed a rule whose evaluation effect is not tracked (a double
    /// negation, a positive sub-schema inside a negation, "some item"):
    /// `unevaluatedProperties` / `unevaluatedItems` beside it are refused.
    neg_untracked: bool,
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
    /// Objects must have a key of each of these sets (whose value satisfies the sub-schema, if
    /// given): from `not: {additionalProperties}` and `not: {patternProperties}`.
    undeclared: Vec<(KeySet, Option<Sub<'a>>)>,
    /// The one such requirement an open object meets by a witness key (see `lower_object`).
    witness: Option<(KeySet, Option<Sub<'a>>)>,
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
    /// Resources by absolute URI (each `$id` resolved against its parent's), the URI of each
    /// resource's pointer and of the document, anchors per resource URI, and the schemas with
    /// `$recursiveAnchor: true`.
    uris: Vec<(String, Rc<str>)>,
    res_uri: HashMap<Rc<str>, String>,
    root_uri: String,
    anchors_at: HashMap<(String, String), Rc<str>>,
    recursive_anchors: Vec<Rc<str>>,
    /// Resources (by pointer) whose `$schema` names another draft than the root's (documents
    /// embedded by `resources::bundle`).
    res_draft: HashMap<Rc<str>, Draft>,
    /// [`Lowerer::entry_resource`]'s answers, per anchor.
    entry_memo: std::cell::RefCell<HashMap<String, Option<Rc<str>>>>,
    /// `$dynamicAnchor`s: (resource URI, name, pointer).
    dyn_anchors: Vec<(String, String, Rc<str>)>,
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
    /// Entries held in `refs_under` (bounded by [`refs::MAX_REACH_ENTRIES`]).
    reach_entries: usize,
    pattern_cache: HashMap<String, Rc<Dfa>>,
    /// [`Lowerer::string_text`]'s automata by the string constraints they were built from
    /// (counted in `det_memo_words`).
    string_memo: HashMap<StringKey, Rc<Dfa>>,
    /// Memo of [`Lowerer::determinize`] and [`Lowerer::encode`]: whole automata to their
    /// determinised, minimal form (see [`Lowerer::memoised`]).
    det_memo: HashMap<Vec<u32>, Rc<Dfa>>,
    det_memo_words: usize,
    /// Sub-automata reached by call markers (see [`CALL`]): container values large enough to be
    /// kept once and called, instead of copied into every place they appear. A sub-automaton may
    /// call only earlier ones, so the calls form a DAG.
    pub subs: Vec<Dfa>,
    sub_ids: HashMap<u64, Vec<u32>>,
    /// The undeclared keys of an object without `propertyNames`, by its declared key texts
    /// (any string but those): the same object is lowered again in every stack context.
    base_keys: HashMap<Vec<Vec<u8>>, Rc<Dfa>>,
    /// Declared keys' automata, by key text.
    key_lits: HashMap<Vec<u8>, Rc<Dfa>>,
    /// Words held by `base_keys` and `key_lits` (both are dropped past 16 MiB).
    key_memo_words: usize,
    /// The schema object whose `unevaluatedProperties` / `unevaluatedItems` the conjunction
    /// being merged may carry: the sole member of the conjunction (or the target of a bare
    /// `$ref` there). Everything merged into its node is then one of its in-place sub-schemas;
    /// the keyword anywhere else (an `allOf` member, a branch, a `$ref` target beside other
    /// keywords, a property declared twice) would see its siblings' properties: refused.
    eval_root: Option<Rc<str>>,
    /// Inside `node_of` (a widened node for disjointness checks): `unevaluated*` is ignored.
    checking: u32,
}

static FALSE: Value = Value::Bool(false);

/// How many disjunction branches one compilation may explore.
const BRANCH_BUDGET: usize = 20_000;

fn ptr_join(ptr: &str, key: &str) -> Rc<str> {
    let k = key.replace('~', "~0").replace('/', "~1");
    format!("{ptr}/{k}").into()
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
        let draft = Draft::of(root.get("$schema").and_then(|s| s.as_str()));
        let mut l = Lowerer {
            root,
            opts,
            draft,
            cap: opts.max_states,
            start: Instant::now(),
            stack: Vec::new(),
            ids: Vec::new(),
            anchors: HashMap::default(),
            uris: Vec::new(),
            res_uri: HashMap::default(),
            root_uri: String::new(),
            anchors_at: HashMap::default(),
            recursive_anchors: Vec::new(),
            res_draft: HashMap::default(),
            entry_memo: Default::default(),
            dyn_anchors: Vec::new(),
            any_cache: HashMap::default(),
            conj_cache: HashMap::default(),
            conj_unique: HashMap::default(),
            branch_budget: BRANCH_BUDGET,
            path: Vec::new(),
            unique: Vec::new(),
            refs_under: HashMap::default(),
            reach_entries: 0,
            pattern_cache: HashMap::default(),
            string_memo: HashMap::default(),
            det_memo: HashMap::default(),
            det_memo_words: 0,
            subs: Vec::new(),
            sub_ids: HashMap::default(),
            base_keys: HashMap::default(),
            key_lits: HashMap::default(),
            key_memo_words: 0,
            eval_root: None,
            checking: 0,
        };
        l.index(root, "".into(), "", draft);
        l.root_uri = l.res_uri.get("").cloned().unwrap_or_default();
        l
    }

    /// Whether the resource at `base` (a pointer) is read under draft 7 or earlier, where
    /// `$ref` makes its siblings ignored.
    fn legacy(&self, base: &str) -> bool {
        self.res_draft.get(base).copied().unwrap_or(self.draft) == Draft::Legacy
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
                for rel in self.conj_unique.get(&key).into_iter().flatten() {
                    let mut p = self.path.clone();
                    p.extend(rel.iter().cloned());
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
            let mut rel: Vec<Vec<PStep>> = self.unique[u0..].iter().map(|p| p[plen.min(p.len())..].to_vec()).collect();
            // (Repeats within one computation's log add nothing: the list is a set.)
            rel.sort_unstable();
            rel.dedup();
            self.conj_unique.insert(k.clone(), rel);
            self.conj_cache.insert(k, d.clone());
        }
        Ok(d)
    }

    fn lower_conj_inner(&mut self, members: Vec<Sub<'a>>, any_depth: u32) -> Result<Dfa, SchemaError> {
        let root = (members.len() == 1).then(|| members[0].ptr.clone());
        let saved = std::mem::replace(&mut self.eval_root, root);
        let res = self.lower_conj_merged(members, any_depth);
        self.eval_root = saved;
        res
    }

    fn lower_conj_merged(&mut self, members: Vec<Sub<'a>>, any_depth: u32) -> Result<Dfa, SchemaError> {
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

    fn lower_node(&mut self, mut node: Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        if node.never {
            return Ok(Dfa::empty());
        }
        // `unevaluatedProperties` of the conjunction's root (the only place `apply` lets it in):
        // every key the node declares was evaluated by a passing in-place sub-schema, except
        // keys only a negation declared, which it constrains as well.
        if let Some(u) = node.unevaluated.take() {
            if node.additional.is_none() {
                if node.neg_untracked {
                    return Err(SchemaError::Unsupported { keyword: "unevaluatedProperties".into(), pointer: ptr.to_string() });
                }
                for (k, c) in node.props.iter_mut() {
                    if node.neg_keys.contains(k) {
                        c.extend(u.iter().cloned());
                    }
                }
                node.additional = Some(u);
            }
        }
        // `unevaluatedItems` over the merged node (allOf / $ref merged, anyOf / oneOf / if
        // distributed into branches): the items no `prefixItems` or `items` evaluated. Exact
        // per branch — the passing branch with the longest prefix decides — except beside
        // `contains`, which evaluates the items it matches.
        if let Some(u) = node.unevaluated_items.take() {
            if !node.items_eval {
                if node.contains.is_some() || node.neg_untracked {
                    return Err(SchemaError::Unsupported { keyword: "unevaluatedItems".into(), pointer: ptr.to_string() });
                }
                // (Positions a negation's item rule added to the prefix were not evaluated.)
                let at = node.pos_prefix;
                for p in node.prefix.iter_mut().skip(at) {
                    p.extend(u.iter().cloned());
                }
                node.items.get_or_insert_with(Vec::new).extend(u);
            }
        }
        // `unevaluatedProperties` of other members (see `eval_sets`): exact where no pattern
        // rule or untracked negation could evaluate a key the static sets do not list.
        if let Some((rule, _)) = node.eval_sets.first() {
            if node.neg_untracked || !node.pattern_props.is_empty() {
                let obj = rule.strip_suffix("/unevaluatedProperties").unwrap_or(rule);
                return Err(SchemaError::Unsupported { keyword: "unevaluatedProperties".into(), pointer: obj.to_string() });
            }
        }
        if !node.undeclared.is_empty() {
            return self.lower_undeclared(node, ptr, any_depth);
        }
        let declared = effective_types(&node);
        let mut types = declared;
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
            parts.push(self.string_text(&node, ptr)?);
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
                    if in_range && multiple && declared & T_FRAC == 0 {
                        // Under `type: integer` only the integer spelling: the text policy offers
                        // no `3.0` for an integer, and draft 4 counts it as no integer at all.
                        num_texts.push(canon);
                    } else if in_range && multiple {
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
