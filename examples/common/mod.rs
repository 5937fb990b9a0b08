//! What the benchmark examples share: a deterministic workload of incompressible values,
//! and a few measurements.
#![allow(dead_code)]

use std::path::Path;

pub const VALUE_SIZE: usize = 1024;
pub const KEY_SIZE: usize = 16;

/// A bijective 64-bit mixer (the SplitMix64 finalizer): key `i` lands at a uniformly spread,
/// unpredictable point of the key space, so writing `0..n` in order is random-order writing.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub fn key(i: u64) -> Vec<u8> {
    let k = format!("{:016x}", mix(i)).into_bytes();
    debug_assert_eq!(k.len(), KEY_SIZE);
    k
}

/// VALUE_SIZE pseudo-random bytes (xorshift64*), which snappy cannot compress.
pub fn value(backend: u32, i: u64, round: u64) -> Vec<u8> {
    let mut state = mix(i ^ (u64::from(backend) << 40) ^ (round << 56)) | 1;
    let mut out = Vec::with_capacity(VALUE_SIZE);
    while out.len() < VALUE_SIZE {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let take = (VALUE_SIZE - out.len()).min(8);
        out.extend_from_slice(&word.to_le_bytes()[..take]);
    }
    out
}

/// Bytes of every regular file under `dir`.
pub fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Nearest-rank percentile of `sorted` (ascending), `p` in 0..=100.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
