//! The bounded little-endian reader and writer of the token-mask members: every read checks the
//! remaining input first, so a count or length from hostile bytes can never make a reader
//! allocate or index past what the input holds.

use std::fmt;

/// Why bytes could not be decoded: a fixed phrase naming the field or rule that failed (the
/// member's own error type adds which member it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for WireError {}

/// A cursor over untrusted bytes.
pub struct Reader<'b> {
    b: &'b [u8],
    pos: usize,
}

impl<'b> Reader<'b> {
    pub fn new(b: &'b [u8]) -> Reader<'b> {
        Reader { b, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Result<&'b [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError("truncated input"));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, WireError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, WireError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    /// Fails unless `count` items of `size` bytes each can still be read (checked before a
    /// reader allocates for them).
    pub fn expect(&self, count: usize, size: usize, what: &'static str) -> Result<(), WireError> {
        match count.checked_mul(size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(WireError(what)),
        }
    }

    /// A bitmap of `n` bits (`ceil(n/8)` bytes, bit i = bit `i % 8` of byte `i / 8`) whose
    /// padding bits past `n` are zero: one encoding per value.
    pub fn bitmap(&mut self, n: usize, what: &'static str) -> Result<Vec<bool>, WireError> {
        let bytes = self.take(n.div_ceil(8))?;
        if n % 8 != 0 && bytes.last().is_some_and(|&last| last >> (n % 8) != 0) {
            return Err(WireError(what));
        }
        Ok((0..n).map(|i| bytes[i / 8] & (1 << (i % 8)) != 0).collect())
    }

    /// Fails unless the input is used up.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.remaining() != 0 {
            return Err(WireError("trailing bytes"));
        }
        Ok(())
    }
}

pub fn put_u16(out: &mut Vec<u8>, x: u16) {
    out.extend_from_slice(&x.to_le_bytes());
}

pub fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

/// Writes `bits` as [`Reader::bitmap`] reads it.
pub fn put_bitmap(out: &mut Vec<u8>, bits: &[bool]) {
    let mut bytes = vec![0u8; bits.len().div_ceil(8)];
    for (i, _) in bits.iter().enumerate().filter(|(_, &b)| b) {
        bytes[i / 8] |= 1 << (i % 8);
    }
    out.extend_from_slice(&bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let mut r = Reader::new(&[1, 0, 2, 0, 0, 0, 9]);
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u32(), Ok(2));
        assert_eq!(r.u32(), Err(WireError("truncated input")));
        assert_eq!(r.u8(), Ok(9));
        assert!(r.finish().is_ok());
        assert!(r.expect(usize::MAX, 8, "x").is_err());
    }

    #[test]
    fn bitmaps_round_trip_and_reject_padding() {
        let bits = [true, false, false, true, true, false, false, false, false, true];
        let mut out = Vec::new();
        put_bitmap(&mut out, &bits);
        assert_eq!(out, [0b0001_1001, 0b10]);
        assert_eq!(Reader::new(&out).bitmap(10, "pad").unwrap(), bits);
        assert_eq!(Reader::new(&[0, 0b100]).bitmap(10, "pad"), Err(WireError("pad")));
    }
}
