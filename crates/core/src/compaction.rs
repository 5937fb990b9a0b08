//! Small-file compaction: keep the number of live SSTs bounded by the state, not by the
//! number of checkpoints.
//!
//! Every checkpoint flushes the memtables. When keys arrive in increasing order (time-keyed
//! state), each flush makes a small SST whose key range overlaps nothing, so RocksDB moves
//! it down the levels without ever merging it: thousands of kilobyte files pile up, and
//! every checkpoint links, hashes by name and records all of them (Flink: FLINK-26050).
//! The plan below picks runs of adjacent small files whose key range no large file
//! touches, so merging them rewrites only the small files themselves: the cost (and the
//! next checkpoint's upload) is their size.

/// What the planner needs to know of one live SST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SstInfo {
    /// The file's name as RocksDB's list of live files gives it.
    pub name: String,
    /// Its length in bytes.
    pub size: u64,
    /// The LSM level it is in (0 is the level flushes write to).
    pub level: i32,
    /// Its smallest key.
    pub start: Vec<u8>,
    /// Its largest key.
    pub end: Vec<u8>,
}

/// When and how much to merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmallFilePolicy {
    /// Files below this size are small.
    pub small_below: u64,
    /// Compact only once a backend has at least this many small files.
    pub min_small_files: usize,
    /// Most bytes one compacted range may hold (bounds one compaction's cost).
    pub max_range_bytes: u64,
}

impl Default for SmallFilePolicy {
    fn default() -> Self {
        SmallFilePolicy {
            small_below: 1 << 20,
            min_small_files: 64,
            max_range_bytes: 64 << 20,
        }
    }
}

/// A key range to compact (both ends inclusive) and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePlan {
    /// The range's first key.
    pub start: Vec<u8>,
    /// The range's last key.
    pub end: Vec<u8>,
    /// The live files the range overlaps, at any level.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

fn overlaps(a_start: &[u8], a_end: &[u8], b_start: &[u8], b_end: &[u8]) -> bool {
    a_start <= b_end && b_start <= a_end
}

/// The ranges worth compacting: maximal runs (in key order) of at least two small files
/// whose covering range touches no large file and holds at most `max_range_bytes`, each
/// closed over every live file it overlaps at any level (RocksDB's range compaction takes
/// all of them, and the next level's files under their span): a run whose closure reaches
/// a large file is dropped, and ranges never overlap each other. Empty when the backend has
/// fewer than `min_small_files` small files.
pub fn plan(files: &[SstInfo], policy: &SmallFilePolicy) -> Vec<RangePlan> {
    let mut closed: Vec<RangePlan> = Vec::new();
    for run in runs(files, policy) {
        let Some(range) = close_over(&run, files, policy.small_below) else {
            continue;
        };
        let after_previous = closed.last().is_none_or(|p| p.end < range.start);
        if range.files >= 2 && after_previous {
            closed.push(range);
        }
    }
    closed
}

/// Grow `run` until every live file overlapping it lies inside it; `None` if a large file
/// would have to join.
fn close_over(run: &RangePlan, files: &[SstInfo], small_below: u64) -> Option<RangePlan> {
    let (mut start, mut end) = (run.start.clone(), run.end.clone());
    loop {
        let mut grown = false;
        for f in files {
            if !overlaps(&start, &end, &f.start, &f.end) {
                continue;
            }
            if f.size >= small_below {
                return None;
            }
            if f.start < start {
                start = f.start.clone();
                grown = true;
            }
            if f.end > end {
                end = f.end.clone();
                grown = true;
            }
        }
        if !grown {
            break;
        }
    }
    let inside: Vec<&SstInfo> = files
        .iter()
        .filter(|f| overlaps(&start, &end, &f.start, &f.end))
        .collect();
    Some(RangePlan {
        files: inside.len(),
        bytes: inside.iter().map(|f| f.size).sum(),
        start,
        end,
    })
}

/// Candidate runs of adjacent small files, before closure.
fn runs(files: &[SstInfo], policy: &SmallFilePolicy) -> Vec<RangePlan> {
    let (mut small, large): (Vec<&SstInfo>, Vec<&SstInfo>) =
        files.iter().partition(|f| f.size < policy.small_below);
    if small.len() < policy.min_small_files {
        return Vec::new();
    }
    small.sort_by(|a, b| a.start.cmp(&b.start).then(a.end.cmp(&b.end)));
    let touches_large =
        |start: &[u8], end: &[u8]| large.iter().any(|l| overlaps(start, end, &l.start, &l.end));
    let mut plans = Vec::new();
    let mut run: Option<RangePlan> = None;
    for file in small {
        if let Some(current) = run.as_mut() {
            let end = current.end.clone().max(file.end.clone());
            if current.bytes + file.size <= policy.max_range_bytes
                && !touches_large(&current.start, &end)
            {
                current.end = end;
                current.files += 1;
                current.bytes += file.size;
                continue;
            }
            plans.extend(run.take().filter(|r| r.files >= 2));
        }
        if !touches_large(&file.start, &file.end) {
            run = Some(RangePlan {
                start: file.start.clone(),
                end: file.end.clone(),
                files: 1,
                bytes: file.size,
            });
        }
    }
    plans.extend(run.filter(|r| r.files >= 2));
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sst(name: &str, size: u64, start: &str, end: &str) -> SstInfo {
        SstInfo {
            name: name.into(),
            size,
            level: 6,
            start: start.as_bytes().to_vec(),
            end: end.as_bytes().to_vec(),
        }
    }

    fn policy(min: usize) -> SmallFilePolicy {
        SmallFilePolicy {
            small_below: 100,
            min_small_files: min,
            max_range_bytes: 1000,
        }
    }

    /// Time-ordered keys: one big old file, then many small adjacent ones: one range with
    /// all the small files, the big one untouched.
    #[test]
    fn adjacent_small_files_form_one_range_beside_a_large_file() {
        let mut files = vec![sst("big", 10_000, "a000", "a999")];
        for i in 0..10 {
            files.push(sst(
                &format!("s{i}"),
                10,
                &format!("b{i}0"),
                &format!("b{i}9"),
            ));
        }
        let plans = plan(&files, &policy(5));
        assert_eq!(
            plans,
            vec![RangePlan {
                start: b"b00".to_vec(),
                end: b"b99".to_vec(),
                files: 10,
                bytes: 100
            }]
        );
    }

    #[test]
    fn below_the_threshold_nothing_is_planned() {
        let files: Vec<_> = (0..4)
            .map(|i| sst(&format!("s{i}"), 10, &format!("b{i}"), &format!("b{i}")))
            .collect();
        assert!(plan(&files, &policy(5)).is_empty());
        assert_eq!(plan(&files, &policy(4)).len(), 1);
    }

    /// A large file between small ones splits the run; small files inside a large file's
    /// range are never planned (merging them would rewrite the large one).
    #[test]
    fn large_files_split_runs_and_are_never_rewritten() {
        let files = vec![
            sst("s1", 10, "a1", "a1"),
            sst("s2", 10, "a2", "a2"),
            sst("big", 10_000, "b0", "b9"),
            sst("inside", 10, "b5", "b5"),
            sst("s3", 10, "c1", "c1"),
            sst("s4", 10, "c2", "c2"),
            sst("s5", 10, "c3", "c3"),
        ];
        let plans = plan(&files, &policy(3));
        let ranges: Vec<_> = plans
            .iter()
            .map(|p| (p.start.clone(), p.end.clone(), p.files))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (b"a1".to_vec(), b"a2".to_vec(), 2),
                (b"c1".to_vec(), b"c3".to_vec(), 3)
            ]
        );
        for p in &plans {
            assert!(!overlaps(&p.start, &p.end, b"b0", b"b9"));
        }
    }

    /// A small L0 file that spans into a large file's range keeps the run it overlaps from
    /// being compacted (RocksDB would pull the large file in).
    #[test]
    fn a_run_overlapped_by_a_file_reaching_a_large_one_is_not_planned() {
        let mut files = vec![
            sst("big-user", 10_000, "user:000", "user:999"),
            sst("ts1", 10, "ts:001", "ts:001"),
            sst("ts2", 10, "ts:002", "ts:002"),
            sst("ts3", 10, "ts:003", "ts:003"),
        ];
        files.push(SstInfo {
            level: 0,
            ..sst("l0", 10, "ts:0015", "user:500")
        });
        assert!(plan(&files, &policy(3)).is_empty());
        // Without that file, the run is planned.
        files.pop();
        assert_eq!(plan(&files, &policy(3)).len(), 1);
    }

    /// Planned ranges never overlap each other, even when the byte limit splits a run
    /// that a wide file spans.
    #[test]
    fn planned_ranges_are_disjoint() {
        let files = vec![
            sst("wide", 50, "a", "m"),
            sst("d", 50, "d", "d"),
            sst("e", 50, "e", "e"),
            sst("f", 50, "f", "f"),
            sst("g", 50, "g", "g"),
        ];
        let plans = plan(
            &files,
            &SmallFilePolicy {
                small_below: 100,
                min_small_files: 2,
                max_range_bytes: 120,
            },
        );
        for pair in plans.windows(2) {
            assert!(pair[0].end < pair[1].start, "{plans:?}");
        }
        assert!(!plans.is_empty());
    }

    #[test]
    fn ranges_are_bounded_in_bytes() {
        let files: Vec<_> = (0..30)
            .map(|i| {
                sst(
                    &format!("s{i:02}"),
                    90,
                    &format!("k{i:02}"),
                    &format!("k{i:02}"),
                )
            })
            .collect();
        let plans = plan(&files, &policy(5));
        assert!(plans.iter().all(|p| p.bytes <= 1000));
        assert_eq!(plans.iter().map(|p| p.files).sum::<usize>(), 30);
    }
}
