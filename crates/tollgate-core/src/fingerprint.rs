//! A counter key's 128-bit fingerprint: keyed SipHash-1-3 with 128-bit output, the function the
//! memory store names its counters by (see `memory.rs` for why a keyed 128-bit PRF); and its
//! 64-bit output, which spreads the short binary keys the store identifies exactly.
//!
//! SipHash-1-3 (one compression round per word, three finalization rounds) is already the
//! cheaper variant of SipHash-2-4, the one std's `HashMap` uses against chosen-key flooding;
//! nothing cheaper in std is keyed. What made the layer's keys cheaper is hashing less: a short
//! binary key is its own identity, so it needs the 64-bit output only (three rounds fewer).
//!
//! Written out here instead of calling `siphasher` because this hash is about 40 % of a
//! single-key check's instructions, and keys are short strings of varying length: `siphasher`
//! assembles the last partial word with a branch per 4-, 2- and 1-byte piece, which mispredicts
//! when consecutive keys differ in length. Here the tail is one or two overlapping loads whose
//! only branches depend on `len >= 8` (true for nearly every real key). Same function bit for
//! bit: a test checks it against `siphasher` for every length up to 80 and random keys.

/// One SipRound.
#[inline(always)]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[inline(always)]
fn u64_at(m: &[u8], i: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&m[i..i + 8]);
    u64::from_le_bytes(w)
}

#[inline(always)]
fn u32_at(m: &[u8], i: usize) -> u64 {
    let mut w = [0; 4];
    w.copy_from_slice(&m[i..i + 4]);
    u64::from(u32::from_le_bytes(w))
}

/// The last `len % 8` bytes of `m` as a little-endian word (the SipHash tail, without the length
/// byte): all of `m` when it is shorter than 8 bytes.
#[inline(always)]
pub(crate) fn tail(m: &[u8]) -> u64 {
    let len = m.len();
    let left = (len % 8) as u32;
    if len >= 8 {
        // The last 8 bytes end with the tail: shift the full-word bytes out (none when left = 0).
        u64_at(m, len - 8).checked_shr(64 - 8 * left).unwrap_or(0)
    } else if len >= 4 {
        // Two overlapping 4-byte loads; shared bytes land on the same bits.
        u32_at(m, 0) | u32_at(m, len - 4) << (8 * (len - 4))
    } else if len > 0 {
        let (a, b, c) = (m[0], m[len / 2], m[len - 1]);
        u64::from(a) | u64::from(b) << (8 * (len / 2)) | u64::from(c) << (8 * (len - 1))
    } else {
        0
    }
}

/// The state after absorbing `m` (one compression round per word, the last word carrying the
/// length): what both output widths share. `v1` is the variant's constant for `k1`.
#[inline(always)]
fn absorb(k0: u64, k1: u64, v1: u64, m: &[u8]) -> [u64; 4] {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ v1,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let full = m.len() - m.len() % 8;
    let mut i = 0;
    while i < full {
        let w = u64_at(m, i);
        v[3] ^= w;
        round(&mut v);
        v[0] ^= w;
        i += 8;
    }
    let b = (m.len() as u64) << 56 | tail(m);
    v[3] ^= b;
    round(&mut v);
    v[0] ^= b;
    v
}

/// SipHash-1-3 of `m` under the key `(k0, k1)`, 128-bit output (`h1 | h2 << 64`, as
/// `siphasher::sip128::Hash128::as_u128`).
#[inline]
pub(crate) fn sip13_128(k0: u64, k1: u64, m: &[u8]) -> u128 {
    // 0x...83: the 128-bit variant's constant (the 64-bit one's 0x...6d with 0xee XORed in).
    let mut v = absorb(k0, k1, 0x646f_7261_6e64_6f83, m);
    v[2] ^= 0xee;
    round(&mut v);
    round(&mut v);
    round(&mut v);
    let h1 = v[0] ^ v[1] ^ v[2] ^ v[3];
    v[1] ^= 0xdd;
    round(&mut v);
    round(&mut v);
    round(&mut v);
    let h2 = v[0] ^ v[1] ^ v[2] ^ v[3];
    u128::from(h1) | u128::from(h2) << 64
}

/// SipHash-1-3 of `m` under the key `(k0, k1)`, 64-bit output: the function (and strength)
/// std's `HashMap` uses against hash flooding. For spreading keys whose identity is exact.
#[inline(always)]
pub(crate) fn sip13_64(k0: u64, k1: u64, m: &[u8]) -> u64 {
    let mut v = absorb(k0, k1, 0x646f_7261_6e64_6f6d, m);
    v[2] ^= 0xff;
    round(&mut v);
    round(&mut v);
    round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::{sip13_128, sip13_64};
    use siphasher::sip128::SipHasher13;

    fn reference(k0: u64, k1: u64, m: &[u8]) -> u128 {
        SipHasher13::new_with_keys(k0, k1).hash(m).as_u128()
    }

    fn reference_64(k0: u64, k1: u64, m: &[u8]) -> u64 {
        use std::hash::Hasher as _;
        let mut h = siphasher::sip::SipHasher13::new_with_keys(k0, k1);
        h.write(m);
        h.finish()
    }

    #[test]
    fn matches_siphasher_for_every_length_and_alignment() {
        let bytes: Vec<u8> = (0..200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (k0, k1) in [(0, 0), (1, 2), (u64::MAX, 0x0123_4567_89ab_cdef)] {
            for start in 0..8 {
                for len in 0..=80 {
                    let m = &bytes[start..start + len];
                    assert_eq!(
                        sip13_128(k0, k1, m),
                        reference(k0, k1, m),
                        "len {len} at {start}"
                    );
                    assert_eq!(
                        sip13_64(k0, k1, m),
                        reference_64(k0, k1, m),
                        "64-bit, len {len} at {start}"
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn matches_siphasher_on_random_input(k0: u64, k1: u64, m: Vec<u8>) {
            proptest::prop_assert_eq!(sip13_128(k0, k1, &m), reference(k0, k1, &m));
            proptest::prop_assert_eq!(sip13_64(k0, k1, &m), reference_64(k0, k1, &m));
        }
    }
}
