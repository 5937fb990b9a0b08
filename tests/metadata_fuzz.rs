//! The Flink `_metadata` parser against damaged input: the real fixture's bytes flipped,
//! cut, overwritten with large lengths and counts, and with bytes inserted. A `_metadata` is
//! written by whoever can write the job's checkpoint directory and read by a daemon that
//! runs as root: whatever it holds, parsing must return (no panic), refuse with an error or
//! give a result, and allocate no more than a small multiple of the input's size.
//!
//! A separate test binary: its counting allocator sees only this file's tests. Bounded: a
//! fixed number of cases (`FUZZ_CASES`, 3000 by default), a few seconds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ckptfs_core::flink::metadata;
use proptest::prelude::*;

/// Counts the bytes this thread holds allocated, and the most it held since [`reset`].
struct Counting;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    let _ = HELD.try_with(|held| {
        let now = held.get() + by;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(by: usize) {
    let _ = HELD.try_with(|held| held.set(held.get().saturating_sub(by)));
}

// SAFETY: every call is passed to the system allocator unchanged; only counters change.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        shrank(layout.size());
        grew(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated at most while `f` ran, beyond what was held before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let out = f();
    let peak = PEAK.with(Cell::get) - before;
    (out, peak)
}

fn fixture(n: u32) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/flink/job1/chk-{n}/_metadata",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).expect("the fixture")
}

/// One way of damaging the bytes.
#[derive(Debug, Clone)]
enum Damage {
    Flip {
        at: usize,
        bit: u8,
    },
    Cut {
        at: usize,
    },
    /// Four bytes at `at` overwritten with a big-endian i32: a length or a count.
    Length {
        at: usize,
        value: i32,
    },
    /// Two bytes at `at`: a string's length.
    Short {
        at: usize,
        value: u16,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
}

fn damage() -> impl Strategy<Value = Damage> {
    let at = 0usize..8192;
    prop_oneof![
        (at.clone(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        at.clone().prop_map(|at| Damage::Cut { at }),
        (
            at.clone(),
            prop_oneof![
                Just(i32::MAX),
                Just(i32::MIN),
                Just(-1),
                Just(0x0100_0000),
                any::<i32>()
            ]
        )
            .prop_map(|(at, value)| Damage::Length { at, value }),
        (at.clone(), any::<u16>()).prop_map(|(at, value)| Damage::Short { at, value }),
        (at, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Damage::Insert { at, bytes }),
    ]
}

fn apply(mut bytes: Vec<u8>, damages: &[Damage]) -> Vec<u8> {
    for d in damages {
        let len = bytes.len().max(1);
        match d {
            Damage::Flip { at, bit } => {
                if let Some(b) = bytes.get_mut(at % len) {
                    *b ^= 1 << bit;
                }
            }
            Damage::Cut { at } => bytes.truncate(at % len),
            Damage::Length { at, value } => {
                let at = at % len;
                for (i, b) in value.to_be_bytes().into_iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            Damage::Short { at, value } => {
                let at = at % len;
                for (i, b) in value.to_be_bytes().into_iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            Damage::Insert { at, bytes: extra } => {
                let at = (at % len).min(bytes.len());
                bytes.splice(at..at, extra.iter().copied());
            }
        }
    }
    bytes
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn damaged_metadata_is_parsed_or_refused_within_its_size(
        which in 4u32..7,
        damages in proptest::collection::vec(damage(), 1..4),
    ) {
        let bytes = apply(fixture(which), &damages);
        let (parsed, peak) = peak_of(|| {
            let parsed = metadata::parse(&bytes);
            // What an import does next with a parsed checkpoint.
            if let Ok(m) = &parsed {
                let _ = ckptfs_core::flink::import::layout(m);
            }
            parsed.map(drop)
        });
        // The parsed structure holds the paths and inline bytes it read, with its own
        // bookkeeping: a few times the input at most, never what a count declares.
        let bound = 8 * bytes.len() + (64 << 10);
        prop_assert!(peak <= bound, "{peak} bytes allocated parsing {} bytes", bytes.len());
        if let Err(e) = parsed {
            prop_assert!(e.to_string().starts_with("Flink checkpoint metadata"), "{e}");
        }
    }
}

/// The counter works: a count that declared a huge allocation would be seen.
#[test]
fn the_allocation_counter_sees_allocations() {
    let (v, peak) = peak_of(|| vec![0u8; 1 << 20]);
    assert!(peak >= 1 << 20, "{peak}");
    drop(v);
}

/// Each real checkpoint of the fixture parses, and parses within the bound too.
#[test]
fn the_fixture_parses_within_its_size() {
    for n in 4..7 {
        let bytes = fixture(n);
        let (parsed, peak) = peak_of(|| metadata::parse(&bytes).map(drop));
        parsed.unwrap();
        assert!(peak <= 8 * bytes.len() + (64 << 10), "{peak}");
    }
}

/// A count larger than the bytes left is refused before it is looped over.
#[test]
fn a_count_beyond_the_bytes_left_is_refused() {
    let mut bytes = fixture(6);
    // The number of master states follows magic, version and checkpoint id.
    bytes[16..20].copy_from_slice(&i32::MAX.to_be_bytes());
    let e = metadata::parse(&bytes).unwrap_err().to_string();
    assert!(e.contains("more than the"), "{e}");
}
