// common.wgsl: helpers prepended to every other shader of the wgpu backend (WGSL has no include).
//
// f16 conversions are done in integer arithmetic, not with pack2x16float, so that every driver
// rounds exactly like the CPU backend (`half::f16::from_f32`: round to nearest, ties to even).

// f32 -> f16 bits, round to nearest even; overflow to inf, NaN kept NaN.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = i32((b >> 23u) & 0xffu);
    let m = b & 0x7fffffu;
    if (e == 255) {
        if (m != 0u) {
            return sign | 0x7e00u;
        }
        return sign | 0x7c00u;
    }
    let he = e - 112; // e - 127 + 15
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        if (he < -10) {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - he);
        var r = mm >> shift;
        let rem = mm & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u) == 1u)) {
            r = r + 1u;
        }
        return sign | r;
    }
    var r = (u32(he) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) {
        r = r + 1u; // a carry into the exponent is the correct rounding (up to inf)
    }
    return sign | r;
}

// f16 bits (low 16 bits of h) -> f32, exact.
fn f16_to_f32(h: u32) -> f32 {
    return unpack2x16float(h & 0xffffu).x;
}

// Round to the nearest f16 value, kept as f32.
fn round_f16(x: f32) -> f32 {
    return f16_to_f32(f16_bits(x));
}

// Byte `i` (0..3) of `w` as a signed int8.
fn i8_at(w: u32, i: u32) -> i32 {
    return extractBits(bitcast<i32>(w), i * 8u, 8u);
}

// Linear workgroup index of a dispatch that may be split over x and y (x ≤ 65535).
fn wg_linear(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}
