//! Arrays: items, prefix items, `contains` counting and length bounds, unrolled into one
//! automaton.

use std::rc::Rc;

use crate::schema::automata::{Dfa, Nfa};
use crate::schema::SchemaError;

use super::{Lowerer, Node, PStep, Sub};

impl<'a> Lowerer<'a> {
    pub(super) fn lower_array(&mut self, node: &Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
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
        // `contains` counting. With only a lower bound an item may be counted or not (some
        // choice reaches the bound: exact). With `maxContains` every item is counted exactly: it
        // is either a match (the item's schema ∧ `contains`) or not (the item's schema ∧
        // ¬`contains`, by the exact negation `not` uses; refused where that cannot be written).
        // Each branch only ever holds items of its kind, so no array with too many or too few
        // matches is accepted; an item in neither (past a generation bound) is not offered.
        let exact = node.contains.is_some() && node.max_contains.is_some();
        let contains: Option<(Rc<Dfa>, Vec<Rc<Dfa>>)> = match &node.contains {
            Some(c) if node.min_contains > 0 || exact => {
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
        let mut items = items;
        if exact {
            let neg: Vec<Sub<'a>> = node.contains.iter().flatten().map(|c| Sub { v: c.v, ptr: format!("¬{}", c.ptr).into(), base: c.base.clone() }).collect();
            let mut conj = neg.clone();
            conj.extend(node.items.iter().flatten().cloned());
            items = item_dfa(self, &conj)?;
            for (j, p) in node.prefix.iter().enumerate() {
                let mut conj = neg.clone();
                conj.extend(p.iter().cloned());
                prefix[j] = item_dfa(self, &conj)?;
            }
        }
        if node.unique {
            // Enforced at run time by the Matcher (items compared by canonical value).
            self.unique.push(self.path.clone());
        }
        const MAX_COUNT: u64 = 8;
        if contains.is_some() && node.min_contains > MAX_COUNT {
            return Err(SchemaError::Unsupported { keyword: "minContains".into(), pointer: ptr.to_string() });
        }
        if exact && node.max_contains.is_some_and(|m| m > MAX_COUNT) {
            return Err(SchemaError::Unsupported { keyword: "maxContains".into(), pointer: ptr.to_string() });
        }
        // Count states f: saturating at need_c (lower bound only), or exact up to max_c.
        let need_c = if contains.is_some() { node.min_contains as usize } else { 0 };
        let max_c = if exact { node.max_contains.unwrap_or(0) as usize } else { need_c };
        let next_count = |f: usize| -> Option<usize> {
            if exact {
                (f < max_c).then_some(f + 1)
            } else {
                Some((f + 1).min(need_c))
            }
        };
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
        // st[j][f]: j items written, f = number of `contains` matches.
        let width = max_c.max(need_c) + 1;
        let mut st: Vec<Vec<u32>> = vec![(0..width).map(|_| nfa.state()).collect()];
        nfa.eps(open, st[0][0]);
        let close = |nfa: &mut Nfa, j: u64, stj: &Vec<u32>| {
            let ok_len = j >= node.min_items && node.max_items.is_none_or(|mx| j <= mx);
            if ok_len {
                for &q in &stj[need_c..=max_c.max(need_c)] {
                    nfa.lit_to(q, b"]", end);
                }
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
                        if let Some(g) = next_count(f).filter(|_| !c.is_empty() && (need_c > 0 || exact)) {
                            self.place(&mut nfa, from, c, next[g]);
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
                    if let Some(g) = next_count(f).filter(|_| !ci.is_empty() && (need_c > 0 || exact)) {
                        self.place(&mut nfa, x, ci, st[last][g]);
                    }
                }
            }
        } else if node.max_items.is_none() {
            if let Some((ci, _)) = &contains {
                for f in 0..width {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[last][f], b",", x);
                    if let Some(g) = next_count(f).filter(|_| !ci.is_empty() && (need_c > 0 || exact)) {
                        self.place(&mut nfa, x, ci, st[last][g]);
                    }
                }
            }
        }
        self.determinize(&nfa, s, end, ptr)
    }
}
