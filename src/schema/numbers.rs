//! Number languages, exact in decimal arithmetic: bounds (inclusive / exclusive), `multipleOf`
//! with integer or decimal steps, integers vs numbers.
//!
//! Texts: integers are `-?(0|[1-9][0-9]*)`; numbers add an optional `\.[0-9]+` fraction and, only
//! when the number has no bound and no `multipleOf`, an optional exponent. `-0` is never written.

use super::automata::{Dfa, Nfa, Overflow};

/// An exact decimal: `(-1)^neg × int.frac`, `int` without leading zeros ("0" for zero), `frac`
/// without trailing zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dec {
    pub neg: bool,
    pub int: Vec<u8>,
    pub frac: Vec<u8>,
}

impl Dec {
    /// Parses a JSON number text; `None` if malformed or the exponent is beyond ±400.
    pub fn parse(text: &str) -> Option<Dec> {
        let b = text.as_bytes();
        let mut i = 0;
        let neg = b.first() == Some(&b'-');
        if neg {
            i += 1;
        }
        let mut digits = Vec::new();
        let mut point: i64 = -1;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            if b[i] == b'.' {
                if point >= 0 {
                    return None;
                }
                point = digits.len() as i64;
            } else {
                digits.push(b[i]);
            }
            i += 1;
        }
        if digits.is_empty() {
            return None;
        }
        if point < 0 {
            point = digits.len() as i64;
        }
        if i < b.len() {
            if b[i] != b'e' && b[i] != b'E' {
                return None;
            }
            let e: i64 = text[i + 1..].parse().ok()?;
            if e.abs() > 400 {
                return None;
            }
            point += e;
        }
        // Place the point.
        let (int, frac): (Vec<u8>, Vec<u8>) = if point <= 0 {
            let mut f = vec![b'0'; (-point) as usize];
            f.extend_from_slice(&digits);
            (Vec::new(), f)
        } else if point as usize >= digits.len() {
            let mut d = digits.clone();
            d.extend(std::iter::repeat(b'0').take(point as usize - digits.len()));
            (d, Vec::new())
        } else {
            (digits[..point as usize].to_vec(), digits[point as usize..].to_vec())
        };
        let mut int: Vec<u8> = int.into_iter().skip_while(|&c| c == b'0').collect();
        if int.is_empty() {
            int.push(b'0');
        }
        let mut frac = frac;
        while frac.last() == Some(&b'0') {
            frac.pop();
        }
        let zero = int == b"0" && frac.is_empty();
        Some(Dec { neg: neg && !zero, int, frac })
    }

    pub fn is_zero(&self) -> bool {
        self.int == b"0" && self.frac.is_empty()
    }

    pub fn abs(&self) -> Dec {
        Dec { neg: false, ..self.clone() }
    }

    pub fn is_integer(&self) -> bool {
        self.frac.is_empty()
    }
}

/// Which outcomes of comparing a magnitude `m` with a constant are accepted.
#[derive(Clone, Copy)]
pub(crate) struct Cmp {
    pub lt: bool,
    pub eq: bool,
    pub gt: bool,
}

const GE: Cmp = Cmp { lt: false, eq: true, gt: true };
const GT: Cmp = Cmp { lt: false, eq: false, gt: true };
const LE: Cmp = Cmp { lt: true, eq: true, gt: false };
const LT: Cmp = Cmp { lt: true, eq: false, gt: false };

/// Magnitude texts `(0|[1-9][0-9]*)(\.[0-9]+)?` (no fraction when `int_only`) whose value compares
/// with `c` (non-negative) as `cmp` allows.
pub(crate) fn mag_cmp(c: &Dec, cmp: Cmp, int_only: bool, cap: usize) -> Result<Dfa, Overflow> {
    let mut nfa = Nfa::new();
    let s = nfa.state();
    let acc = nfa.state();
    let lt_i = nfa.state();
    let eq_i = nfa.state();
    let gt_i = nfa.state();
    let ci = &c.int;
    if ci.as_slice() == b"0" {
        nfa.byte(s, b'0', eq_i);
        let g = nfa.state();
        nfa.range(s, b'1', b'9', g);
        nfa.range(g, b'0', b'9', g);
        nfa.eps(g, gt_i);
    } else {
        let n = ci.len();
        nfa.byte(s, b'0', lt_i);
        // Free chain: a_k = k digits read (leading non-zero).
        let mut prev = s;
        for k in 1..=n + 1 {
            let a = nfa.state();
            nfa.range(prev, if k == 1 { b'1' } else { b'0' }, b'9', a);
            if k < n {
                nfa.eps(a, lt_i);
            }
            if k == n + 1 {
                nfa.range(a, b'0', b'9', a);
                nfa.eps(a, gt_i);
            }
            prev = a;
        }
        // Chains: cl[k] / cg[k] = k more digits, then LT / GT.
        let mut cl = vec![lt_i];
        let mut cg = vec![gt_i];
        for k in 1..n {
            let a = nfa.state();
            nfa.range(a, b'0', b'9', cl[k - 1]);
            cl.push(a);
            let g = nfa.state();
            nfa.range(g, b'0', b'9', cg[k - 1]);
            cg.push(g);
        }
        let mut e = s;
        for (i, &d) in ci.iter().enumerate() {
            let lo = if i == 0 { b'1' } else { b'0' };
            let rest = n - 1 - i;
            if d > lo {
                nfa.range(e, lo, d - 1, cl[rest]);
            }
            if d < b'9' {
                nfa.range(e, d + 1, b'9', cg[rest]);
            }
            let ne = nfa.state();
            nfa.byte(e, d, ne);
            e = ne;
        }
        nfa.eps(e, eq_i);
    }
    // Free fraction after a strict integer-part outcome.
    let free_frac = |nfa: &mut Nfa, from: u32| {
        nfa.eps(from, acc);
        if !int_only {
            let d1 = nfa.state();
            let d2 = nfa.state();
            nfa.byte(from, b'.', d1);
            nfa.range(d1, b'0', b'9', d2);
            nfa.range(d2, b'0', b'9', d2);
            nfa.eps(d2, acc);
        }
    };
    if cmp.lt {
        free_frac(&mut nfa, lt_i);
    }
    if cmp.gt {
        free_frac(&mut nfa, gt_i);
    }
    // Fraction comparison after an equal integer part.
    let cf = &c.frac;
    let loop_acc = |nfa: &mut Nfa, ok: bool| {
        let st = nfa.state();
        nfa.range(st, b'0', b'9', st);
        if ok {
            nfa.eps(st, acc);
        }
        st
    };
    if cf.is_empty() {
        if cmp.eq {
            nfa.eps(eq_i, acc);
        }
        if !int_only {
            let z0 = nfa.state();
            let z = nfa.state();
            nfa.byte(eq_i, b'.', z0);
            nfa.byte(z0, b'0', z);
            nfa.byte(z, b'0', z);
            if cmp.eq {
                nfa.eps(z, acc);
            }
            let g = loop_acc(&mut nfa, cmp.gt);
            nfa.range(z0, b'1', b'9', g);
            nfa.range(z, b'1', b'9', g);
        }
    } else {
        if cmp.lt {
            nfa.eps(eq_i, acc);
        }
        if !int_only {
            let ltf = loop_acc(&mut nfa, cmp.lt);
            let gtf = loop_acc(&mut nfa, cmp.gt);
            let mut p = nfa.state();
            nfa.byte(eq_i, b'.', p);
            for (j, &d) in cf.iter().enumerate() {
                if j > 0 && cmp.lt {
                    nfa.eps(p, acc);
                }
                if d > b'0' {
                    nfa.range(p, b'0', d - 1, ltf);
                }
                if d < b'9' {
                    nfa.range(p, d + 1, b'9', gtf);
                }
                let np = nfa.state();
                nfa.byte(p, d, np);
                p = np;
            }
            if cmp.eq {
                nfa.eps(p, acc);
            }
            let zz = nfa.state();
            nfa.byte(p, b'0', zz);
            nfa.byte(zz, b'0', zz);
            if cmp.eq {
                nfa.eps(zz, acc);
            }
            nfa.range(p, b'1', b'9', gtf);
            nfa.range(zz, b'1', b'9', gtf);
        }
    }
    nfa.determinize(s, acc, cap)
}

/// Magnitude texts (syntax only: accepts digits and '.') whose value is a multiple of `k` (> 0).
/// `None` when the step's modulus is too large to enumerate.
fn mag_multiple(k: &Dec, int_only: bool, cap: usize) -> Result<Option<Dfa>, Overflow> {
    // k = m × 10^-e
    let mut e = k.frac.len();
    let mut mdig = k.int.clone();
    mdig.extend_from_slice(&k.frac);
    let mstr: String = mdig.iter().map(|&c| c as char).collect();
    let mut m: u64 = match mstr.trim_start_matches('0').parse() {
        Ok(m) if m > 0 && m <= cap as u64 => m,
        _ => return Ok(None),
    };
    if int_only && e > 0 {
        // x integer, x·10^e ≡ 0 (mod m) ⇔ x ≡ 0 (mod m / gcd(m, 10^e)).
        let mut t = 1u64;
        for _ in 0..e.min(18) {
            t *= 10;
        }
        m /= gcd(m, t);
        e = 0;
    }
    let m = m as usize;
    if m.saturating_mul(e + 3) > cap {
        return Err(Overflow { states: m.saturating_mul(e + 3) });
    }
    let pow10 = |k: usize| -> usize {
        let mut p = 1usize % m;
        for _ in 0..k {
            p = p * 10 % m;
        }
        p
    };
    let mut nfa = Nfa::new();
    let acc = nfa.state();
    // levels[0][r]: integer part with remainder r; levels[j] (1 ≤ j ≤ e): j fraction digits;
    // levels[e+1]: further fraction digits (zeros only).
    let levels: Vec<Vec<u32>> = (0..=e + 1).map(|_| (0..m).map(|_| nfa.state()).collect()).collect();
    let dot: Vec<u32> = (0..m).map(|_| nfa.state()).collect();
    for r in 0..m {
        let st = levels[0][r];
        for d in 0..10usize {
            nfa.byte(st, b'0' + d as u8, levels[0][(r * 10 + d) % m]);
        }
        if r * pow10(e) % m == 0 {
            nfa.eps(st, acc);
        }
        if int_only {
            continue;
        }
        nfa.byte(st, b'.', dot[r]);
        if e == 0 {
            nfa.byte(dot[r], b'0', levels[1][r]);
        } else {
            for d in 0..10usize {
                nfa.byte(dot[r], b'0' + d as u8, levels[1][(r * 10 + d) % m]);
            }
        }
    }
    if !int_only {
        for j in 1..=e {
            for r in 0..m {
                let st = levels[j][r];
                if r * pow10(e - j) % m == 0 {
                    nfa.eps(st, acc);
                }
                if j < e {
                    for d in 0..10usize {
                        nfa.byte(st, b'0' + d as u8, levels[j + 1][(r * 10 + d) % m]);
                    }
                } else {
                    nfa.byte(st, b'0', levels[e + 1][r]);
                }
            }
        }
        let tail = &levels[e + 1];
        for r in 0..m {
            nfa.byte(tail[r], b'0', tail[r]);
            if r == 0 {
                nfa.eps(tail[r], acc);
            }
        }
    }
    nfa.determinize(levels[0][0], acc, cap).map(Some)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A bound: value and whether it is exclusive.
pub(crate) type Bound = (Dec, bool);

/// Why a number language could not be built.
#[derive(Debug)]
pub(crate) enum NumIssue {
    Overflow(Overflow),
    /// `multipleOf` step not representable (too large a modulus).
    Step,
}

impl From<Overflow> for NumIssue {
    fn from(o: Overflow) -> Self {
        NumIssue::Overflow(o)
    }
}

/// Text automaton of the numbers (`int_only`: integers) within the bounds and multiple of `step`.
pub(crate) fn number_dfa(
    int_only: bool,
    lo: Option<&Bound>,
    hi: Option<&Bound>,
    step: Option<&Dec>,
    allow_exp: bool,
    cap: usize,
) -> Result<Dfa, NumIssue> {
    let all = mag_cmp(&Dec { neg: false, int: b"0".to_vec(), frac: vec![] }, GE, int_only, cap)?;
    let positive_nonzero = mag_cmp(&Dec { neg: false, int: b"0".to_vec(), frac: vec![] }, GT, int_only, cap)?;
    let mult = match step {
        Some(k) => Some(mag_multiple(k, int_only, cap)?.ok_or(NumIssue::Step)?),
        None => None,
    };
    // Non-negative values m.
    let mut pos = all.clone();
    let mut neg = positive_nonzero;
    if let Some((b, excl)) = lo {
        if b.neg {
            // -m ≥ lo ⇔ m ≤ |lo|
            neg = Dfa::intersect(&neg, &mag_cmp(&b.abs(), if *excl { LT } else { LE }, int_only, cap)?, cap)?;
        } else {
            pos = Dfa::intersect(&pos, &mag_cmp(b, if *excl { GT } else { GE }, int_only, cap)?, cap)?;
            neg = Dfa::empty();
        }
    }
    if let Some((b, excl)) = hi {
        if b.neg {
            pos = Dfa::empty();
            neg = Dfa::intersect(&neg, &mag_cmp(&b.abs(), if *excl { GT } else { GE }, int_only, cap)?, cap)?;
        } else {
            pos = Dfa::intersect(&pos, &mag_cmp(b, if *excl { LT } else { LE }, int_only, cap)?, cap)?;
        }
    }
    if let Some(m) = &mult {
        pos = Dfa::intersect(&pos, m, cap)?;
        neg = Dfa::intersect(&neg, m, cap)?;
    }
    let exp = allow_exp && !int_only && lo.is_none() && hi.is_none() && step.is_none();
    let mut nfa = Nfa::new();
    let s = nfa.state();
    let body = nfa.state();
    nfa.embed_to(s, &pos, body);
    let minus = nfa.lit(s, b"-");
    nfa.embed_to(minus, &neg, body);
    let end = nfa.state();
    nfa.eps(body, end);
    if exp {
        let e1 = nfa.state();
        nfa.byte(body, b'e', e1);
        nfa.byte(body, b'E', e1);
        let e2 = nfa.state();
        nfa.eps(e1, e2);
        nfa.byte(e1, b'+', e2);
        nfa.byte(e1, b'-', e2);
        let e3 = nfa.state();
        nfa.range(e2, b'0', b'9', e3);
        nfa.range(e3, b'0', b'9', e3);
        nfa.eps(e3, end);
    }
    Ok(nfa.determinize(s, end, cap)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Dec {
        Dec::parse(s).unwrap()
    }

    #[test]
    fn parse_dec() {
        assert_eq!(d("1.50"), Dec { neg: false, int: b"1".to_vec(), frac: b"5".to_vec() });
        assert_eq!(d("-0.0"), Dec { neg: false, int: b"0".to_vec(), frac: vec![] });
        assert_eq!(d("1e3").int, b"1000".to_vec());
        assert_eq!(d("1.5e-2").frac, b"015".to_vec());
        assert_eq!(d("-12e-1"), Dec { neg: true, int: b"1".to_vec(), frac: b"2".to_vec() });
    }

    fn check(dfa: &Dfa, ok: &[&str], bad: &[&str]) {
        for s in ok {
            assert!(dfa.matches(s.as_bytes()), "should accept {s}");
        }
        for s in bad {
            assert!(!dfa.matches(s.as_bytes()), "should reject {s}");
        }
    }

    #[test]
    fn integer_ranges() {
        let r = number_dfa(true, Some(&(d("-5"), false)), Some(&(d("123"), false)), None, true, 10_000).unwrap();
        check(&r, &["-5", "-1", "0", "9", "10", "99", "100", "123"], &["-6", "-0", "124", "1000", "01", "1.0", "-10"]);
        let r = number_dfa(true, Some(&(d("0.5"), false)), None, None, true, 10_000).unwrap();
        check(&r, &["1", "12345678901234567890"], &["0", "-1"]);
        let r = number_dfa(true, None, Some(&(d("10"), true)), None, true, 10_000).unwrap();
        check(&r, &["9", "-100000", "0"], &["10", "11"]);
    }

    #[test]
    fn decimal_ranges() {
        let r = number_dfa(false, Some(&(d("0"), true)), Some(&(d("1.5"), false)), None, true, 10_000).unwrap();
        check(&r, &["0.1", "1", "1.5", "1.50", "0.0001", "1.4999"], &["0", "0.0", "1.51", "2", "-0.1", "1e0"]);
        let r = number_dfa(false, Some(&(d("-2.25"), false)), None, None, true, 10_000).unwrap();
        check(&r, &["-2.25", "-2.2", "-1", "0", "1000.5"], &["-2.26", "-3", "-2.250001"]);
        let r = number_dfa(false, None, None, None, true, 10_000).unwrap();
        check(&r, &["1e5", "-1.5E-3", "0", "12.0"], &["01", "1.", ".5", "-", "1e"]);
    }

    #[test]
    fn multiples() {
        let r = number_dfa(true, None, None, Some(&d("3")), true, 10_000).unwrap();
        check(&r, &["0", "3", "-9", "300"], &["1", "10", "-4"]);
        let r = number_dfa(false, None, None, Some(&d("0.01")), true, 10_000).unwrap();
        check(&r, &["0", "1.5", "1.25", "3.10", "-2.05"], &["1.001", "0.005"]);
        let r = number_dfa(false, None, None, Some(&d("2.5")), true, 10_000).unwrap();
        check(&r, &["0", "2.5", "5", "7.50", "-10"], &["1", "2.4", "3"]);
        let r = number_dfa(true, None, None, Some(&d("0.5")), true, 10_000).unwrap();
        check(&r, &["0", "1", "7"], &[]);
        let r = number_dfa(false, None, None, Some(&d("2")), true, 10_000).unwrap();
        check(&r, &["4", "4.0", "-2"], &["4.5", "3"]);
    }
}

/// Texts of non-integer numbers: a fraction with a non-zero digit, no exponent.
pub(crate) fn non_integer_dfa(cap: usize) -> Result<Dfa, Overflow> {
    let mut nfa = Nfa::new();
    let s = nfa.state();
    let i = nfa.state();
    nfa.byte(s, b'-', i);
    nfa.eps(s, i);
    let z = nfa.state();
    nfa.byte(i, b'0', z);
    let d = nfa.state();
    nfa.range(i, b'1', b'9', d);
    nfa.range(d, b'0', b'9', d);
    let dot = nfa.state();
    nfa.byte(z, b'.', dot);
    nfa.byte(d, b'.', dot);
    nfa.range(dot, b'0', b'9', dot);
    let nz = nfa.state();
    nfa.range(dot, b'1', b'9', nz);
    nfa.range(nz, b'0', b'9', nz);
    nfa.determinize(s, nz, cap)
}

/// Texts equal in value to `d` under the number policy without exponent (trailing zeros).
pub(crate) fn value_texts_dfa(d: &Dec, cap: usize) -> Result<Dfa, Overflow> {
    let mut t = Vec::new();
    if d.neg {
        t.push(b'-');
    }
    t.extend_from_slice(&d.int);
    let mut nfa = Nfa::new();
    let s = nfa.state();
    let a = nfa.lit(s, &t);
    let e = nfa.state();
    if d.frac.is_empty() {
        nfa.eps(a, e);
        let dot = nfa.lit(a, b".0");
        nfa.byte(dot, b'0', dot);
        nfa.eps(dot, e);
    } else {
        let mut f = vec![b'.'];
        f.extend_from_slice(&d.frac);
        let b = nfa.lit(a, &f);
        nfa.byte(b, b'0', b);
        nfa.eps(b, e);
    }
    nfa.determinize(s, e, cap)
}
