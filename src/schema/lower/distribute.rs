//! Disjunctions (`anyOf`, `oneOf`, `if`, `dependent*`, negations) distributed over the rest
//! of the conjunction; an overlapping `oneOf` resolved one JSON type at a time.

use std::rc::Rc;

use serde_json::Value;

use crate::schema::automata::Dfa;
use crate::schema::SchemaError;

use super::disjoint::{accepts_empty_array, denies, universal};
use super::{json_eq, Alt, Disj, Lowerer, Node, Sub, BRANCH_BUDGET, T_ARR, T_BOOL, T_FRAC, T_INT, T_NULL, T_OBJ, T_STR};

impl<'a> Lowerer<'a> {
    /// Distributes the first disjunction of `node` over the rest of the conjunction.
    pub(super) fn distribute(&mut self, mut node: Node<'a>, conj: Vec<Sub<'a>>, any_depth: u32) -> Result<Dfa, SchemaError> {
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
            if ok && !n.never && !surely_empty(&n) {
                branches.push((n, pushed));
            }
        }
        if d.keyword == "oneOf" && !d.exclusive {
            let mut all_disjoint = true;
            'pairs: for i in 0..branches.len() {
                for j in i + 1..branches.len() {
                    if !self.apart(&branches[i].0, &branches[j].0)? {
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
            if s.len() > 1 && !closed && g != T_OBJ && s.iter().filter(|&&i| universal(&branches[i].0, g)).count() >= 2 {
                // Two branches admit every value of the type: none satisfies exactly one.
                continue;
            }
            if s.len() > 1 && g == T_ARR && nodes.iter().filter(|n| accepts_empty_array(n)).count() >= 2 {
                // `[]` satisfies two branches: no branch keeps it.
                for n in &mut nodes {
                    n.min_items = n.min_items.max(1);
                }
            }
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
                            if !self.apart(&nodes[x], &nodes[y])? {
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
}

/// Whether no value satisfies the node, seen cheaply: no type left, or (objects only) a key it
/// requires forbidden, or with two rules of `const` / `enum` that share no value. Prunes the
/// branches of `if` chains on one discriminator (`if: {properties: {kind: {const: …}}}` twenty
/// times, 2^20 branches as written): a failed `if` requires the key or forbids it, and two
/// passed ones then clash.
fn surely_empty<'a>(n: &Node<'a>) -> bool {
    if n.types == 0 {
        return true;
    }
    if n.types & !T_OBJ != 0 {
        return false; // other values satisfy the node whatever its objects
    }
    let values = |s: &Sub<'a>| -> Option<Vec<&'a Value>> {
        if s.ptr.starts_with('¬') {
            return None;
        }
        let m = s.v.as_object()?;
        match (m.get("const"), m.get("enum")) {
            (Some(c), _) => Some(vec![c]),
            (None, Some(Value::Array(a))) => Some(a.iter().collect()),
            _ => None,
        }
    };
    n.required.iter().any(|r| {
        let Some((_, rules)) = n.props.iter().find(|(k, _)| k == r) else { return false };
        if rules.iter().any(denies) {
            return true;
        }
        let sets: Vec<Vec<&'a Value>> = rules.iter().filter_map(values).collect();
        sets.iter().enumerate().any(|(i, a)| sets[i + 1..].iter().any(|b| !a.iter().any(|x| b.iter().any(|y| json_eq(x, y)))))
    })
}
