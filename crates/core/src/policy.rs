//! Retention policies: which retained checkpoints a store keeps, by count and by time, with
//! restic's `forget` semantics.
//!
//! A policy is a union of rules. `last N` keeps the newest N. Each calendar rule (`hourly N`,
//! `daily N`, `weekly N`, `monthly N`, `yearly N`) walks the checkpoints newest first and
//! keeps the first one it meets in each of the newest N hours (days, ISO weeks, months,
//! years) that hold a checkpoint: each bucket keeps its newest. `within D` keeps every
//! checkpoint less than D older than the newest one. A pinned checkpoint is kept whatever
//! the rules say (and still counts for them, as a tagged snapshot does for restic's).
//!
//! Times are each checkpoint's own ([`Manifest::time_ms`](crate::catalog::Manifest::time_ms): Flink's checkpoint time for an
//! imported one) in UTC, so every host that reads a store decides the same. "Newest" is the
//! order of those times (the id breaks ties). Pure code: the clock is the checkpoints'
//! times, never the machine's, so a decision can be tested and shown in advance
//! (`ckptfs forget --dry-run`).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The calendar and age rules of a policy (all but `last`, which is the store's `retain`):
/// stored in the store's metadata, each left out when zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByTime {
    /// The newest checkpoint of each of the newest N hours that hold one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hourly: u32,
    /// The same by day.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub daily: u32,
    /// The same by ISO week (Monday to Sunday).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub weekly: u32,
    /// The same by month.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub monthly: u32,
    /// The same by year.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub yearly: u32,
    /// Every checkpoint less than this many milliseconds older than the newest.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub within_ms: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_ms(n: &u64) -> bool {
    *n == 0
}

impl ByTime {
    /// True when no time rule is set.
    pub fn is_empty(&self) -> bool {
        *self == ByTime::default()
    }
}

/// A whole retention policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The newest N checkpoints (at least 1: the newest is always kept).
    pub last: u32,
    /// The calendar and age rules.
    #[serde(flatten)]
    pub by_time: ByTime,
}

impl Policy {
    /// Keep the newest `n` (what `--retain N` always meant).
    pub fn last(n: u32) -> Policy {
        Policy {
            last: n,
            by_time: ByTime::default(),
        }
    }

    /// Refuse a policy that keeps nothing.
    pub fn validate(self) -> Result<Policy> {
        if self.last == 0 {
            return Err(Error::Invalid(
                "keep-last must be at least 1 (the newest checkpoint is always kept)".into(),
            ));
        }
        Ok(self)
    }
}

impl Policy {
    /// Read a policy from control-line rules: `last=N`, `hourly=N`, `daily=N`, `weekly=N`,
    /// `monthly=N`, `yearly=N`, `within=DURATION` (`90m`, `2d`). A rule not given is off;
    /// `last` defaults to 1 (the newest is always kept).
    pub fn from_rules<'a>(rules: impl IntoIterator<Item = &'a str>) -> Result<Policy> {
        let mut policy = Policy::last(1);
        let mut seen = Vec::new();
        for rule in rules {
            let (name, value) = rule.split_once('=').ok_or_else(|| {
                Error::Invalid(format!(
                    "{rule:?} is no rule: expected NAME=VALUE, e.g. daily=7"
                ))
            })?;
            if seen.contains(&name) {
                return Err(Error::Invalid(format!("rule {name} given twice")));
            }
            seen.push(name);
            let count = || -> Result<u32> {
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Error::Invalid(format!(
                        "{name}={value}: not a non-negative integer"
                    )));
                }
                value
                    .parse()
                    .map_err(|_| Error::Invalid(format!("{name}={value}: too large")))
            };
            let t = &mut policy.by_time;
            match name {
                "last" => policy.last = count()?,
                "hourly" => t.hourly = count()?,
                "daily" => t.daily = count()?,
                "weekly" => t.weekly = count()?,
                "monthly" => t.monthly = count()?,
                "yearly" => t.yearly = count()?,
                "within" => {
                    let d = humantime::parse_duration(value).map_err(|e| {
                        Error::Invalid(format!("within={value}: {e} (e.g. 90m, 2d)"))
                    })?;
                    t.within_ms = u64::try_from(d.as_millis())
                        .map_err(|_| Error::Invalid(format!("within={value}: too long")))?;
                }
                other => {
                    return Err(Error::Invalid(format!(
                        "unknown rule {other:?}: last, hourly, daily, weekly, monthly, yearly \
                         or within"
                    )))
                }
            }
        }
        policy.validate()
    }

    /// The calendar rules that are on, by name: `[("daily", 7)]`.
    fn calendar_rules(&self) -> impl Iterator<Item = (&'static str, u32)> {
        let t = &self.by_time;
        [
            ("hourly", t.hourly),
            ("daily", t.daily),
            ("weekly", t.weekly),
            ("monthly", t.monthly),
            ("yearly", t.yearly),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
    }

    /// The rules [`Policy::from_rules`] reads back as this policy (those that are on).
    pub fn to_rules(&self) -> Vec<String> {
        let t = &self.by_time;
        let mut out = vec![format!("last={}", self.last)];
        for (name, n) in self.calendar_rules() {
            out.push(format!("{name}={n}"));
        }
        if t.within_ms > 0 {
            let within = humantime::format_duration(Duration::from_millis(t.within_ms));
            out.push(format!("within={}", within.to_string().replace(' ', "")));
        }
        out
    }
}

impl fmt::Display for Policy {
    /// The policy as `mount`'s options spell it: `--keep-last 3 --keep-daily 7`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--keep-last {}", self.last)?;
        let t = &self.by_time;
        for (name, n) in self.calendar_rules() {
            write!(f, " --keep-{name} {n}")?;
        }
        if t.within_ms > 0 {
            let within = humantime::format_duration(Duration::from_millis(t.within_ms));
            write!(f, " --keep-within {within}")?;
        }
        Ok(())
    }
}

/// One retained checkpoint as a policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its id.
    pub id: u64,
    /// Its time ([`Manifest::time_ms`](crate::catalog::Manifest::time_ms)).
    pub time_ms: u64,
    /// Names of the pins on it.
    pub pins: Vec<String>,
    /// It is the target of an unfinished restore.
    pub restore: bool,
}

/// Why a checkpoint is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "lowercase")]
pub enum Reason {
    /// One of the newest `last`: the `n`th newest.
    Last {
        /// Its rank, 1 for the newest.
        n: u32,
    },
    /// The newest of its hour.
    Hourly {
        /// The hour, `2026-12-02T15`.
        bucket: String,
    },
    /// The newest of its day.
    Daily {
        /// The day, `2026-12-02`.
        bucket: String,
    },
    /// The newest of its ISO week.
    Weekly {
        /// The week, `2026-W49`.
        bucket: String,
    },
    /// The newest of its month.
    Monthly {
        /// The month, `2026-12`.
        bucket: String,
    },
    /// The newest of its year.
    Yearly {
        /// The year, `2026`.
        bucket: String,
    },
    /// Younger than `within` before the newest.
    Within,
    /// Pinned under this name.
    Pinned {
        /// The pin's name.
        name: String,
    },
    /// The target of an unfinished restore (kept until a restart finishes it).
    Restore,
    /// The newest committed checkpoint (the highest id), which every policy keeps, whatever
    /// the times say (a clock set back, a source's time in the future).
    Newest,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Last { n } => write!(f, "last {n}"),
            Reason::Hourly { bucket } => write!(f, "hourly {bucket}"),
            Reason::Daily { bucket } => write!(f, "daily {bucket}"),
            Reason::Weekly { bucket } => write!(f, "weekly {bucket}"),
            Reason::Monthly { bucket } => write!(f, "monthly {bucket}"),
            Reason::Yearly { bucket } => write!(f, "yearly {bucket}"),
            Reason::Within => write!(f, "within"),
            Reason::Pinned { name } => write!(f, "pinned {name}"),
            Reason::Restore => write!(f, "restore"),
            Reason::Newest => write!(f, "newest"),
        }
    }
}

/// What a policy decides for one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The checkpoint.
    pub id: u64,
    /// Its time ([`Manifest::time_ms`](crate::catalog::Manifest::time_ms)).
    pub time_ms: u64,
    /// Every rule that keeps it; empty: it is dropped.
    pub kept_by: Vec<Reason>,
}

impl Decision {
    /// True when some rule keeps it.
    pub fn kept(&self) -> bool {
        !self.kept_by.is_empty()
    }
}

/// The name of a time's bucket under one calendar rule (`2026-12-02`), for people.
type BucketOf = fn(&DateTime<Utc>) -> String;

/// The number of a time's bucket under one calendar rule: one per hour, day, week, month
/// or year, so that comparing buckets allocates nothing (a policy is applied after every
/// checkpoint, over every retained one).
type KeyOf = fn(i64, &DateTime<Utc>) -> i64;

/// A calendar rule: how many buckets it keeps, its bucket of a time (number and name), and
/// its reason.
type Calendar = (u32, KeyOf, BucketOf, fn(String) -> Reason);

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

fn hour_key(ms: i64, _: &DateTime<Utc>) -> i64 {
    ms.div_euclid(HOUR_MS)
}

fn day_key(ms: i64, _: &DateTime<Utc>) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// ISO weeks begin on Monday; 1970-01-01 was a Thursday, so day 0 is in the week whose
/// Monday is day -3.
fn week_key(ms: i64, _: &DateTime<Utc>) -> i64 {
    (ms.div_euclid(DAY_MS) + 3).div_euclid(7)
}

fn month_key(_: i64, t: &DateTime<Utc>) -> i64 {
    i64::from(t.year()) * 12 + i64::from(t.month0())
}

fn year_key(_: i64, t: &DateTime<Utc>) -> i64 {
    i64::from(t.year())
}

fn hour(t: &DateTime<Utc>) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour()
    )
}

fn day(t: &DateTime<Utc>) -> String {
    format!("{:04}-{:02}-{:02}", t.year(), t.month(), t.day())
}

fn week(t: &DateTime<Utc>) -> String {
    let w = t.iso_week();
    format!("{:04}-W{:02}", w.year(), w.week())
}

fn month(t: &DateTime<Utc>) -> String {
    format!("{:04}-{:02}", t.year(), t.month())
}

fn year(t: &DateTime<Utc>) -> String {
    format!("{:04}", t.year())
}

/// Decide for every candidate, newest first.
pub fn apply(policy: &Policy, candidates: &[Candidate]) -> Vec<Decision> {
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by_key(|c| std::cmp::Reverse((c.time_ms, c.id)));
    let newest = order.first().map_or(0, |c| c.time_ms);
    let t = &policy.by_time;
    let calendar: [Calendar; 5] = [
        (t.hourly, hour_key, hour, |bucket| Reason::Hourly { bucket }),
        (t.daily, day_key, day, |bucket| Reason::Daily { bucket }),
        (t.weekly, week_key, week, |bucket| Reason::Weekly { bucket }),
        (t.monthly, month_key, month, |bucket| Reason::Monthly {
            bucket,
        }),
        (t.yearly, year_key, year, |bucket| Reason::Yearly { bucket }),
    ];
    // Per calendar rule: buckets still to fill, and the last bucket it kept.
    let mut left: Vec<u32> = calendar.iter().map(|(n, ..)| *n).collect();
    let mut last_bucket: Vec<Option<i64>> = vec![None; calendar.len()];
    let mut out = Vec::with_capacity(order.len());
    for (rank, c) in order.iter().enumerate() {
        let mut kept_by = Vec::new();
        if (rank as u64) < u64::from(policy.last) {
            kept_by.push(Reason::Last { n: rank as u32 + 1 });
        }
        let ms = i64::try_from(c.time_ms).unwrap_or(i64::MAX);
        let when = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default();
        for (i, (_, key_of, bucket_of, reason)) in calendar.iter().enumerate() {
            if left[i] == 0 {
                continue;
            }
            let key = key_of(ms, &when);
            if last_bucket[i] != Some(key) {
                left[i] -= 1;
                last_bucket[i] = Some(key);
                kept_by.push(reason(bucket_of(&when)));
            }
        }
        if t.within_ms > 0 && newest.saturating_sub(c.time_ms) < t.within_ms {
            kept_by.push(Reason::Within);
        }
        kept_by.extend(
            c.pins
                .iter()
                .map(|name| Reason::Pinned { name: name.clone() }),
        );
        if c.restore {
            kept_by.push(Reason::Restore);
        }
        out.push(Decision {
            id: c.id,
            time_ms: c.time_ms,
            kept_by,
        });
    }
    // The last committed checkpoint stays, whatever its time: a checkpoint's own commit
    // never drops it.
    if let Some(newest) = out.iter_mut().max_by_key(|d| d.id) {
        if newest.kept_by.is_empty() {
            newest.kept_by.push(Reason::Newest);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;
    /// 2026-01-05T00:00:00Z, a Monday.
    const MONDAY: u64 = 1_767_571_200_000;

    fn candidates(times: &[u64]) -> Vec<Candidate> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                id: i as u64 + 1,
                time_ms: *t,
                pins: Vec::new(),
                restore: false,
            })
            .collect()
    }

    fn kept(policy: &Policy, c: &[Candidate]) -> Vec<u64> {
        let mut ids: Vec<u64> = apply(policy, c)
            .into_iter()
            .filter(Decision::kept)
            .map(|d| d.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn rules_read_back_as_written_and_bad_ones_are_refused() {
        let p = Policy::from_rules(["daily=7", "last=3", "within=1day 2h"]).unwrap();
        assert_eq!(p.last, 3);
        assert_eq!(p.by_time.daily, 7);
        assert_eq!(p.by_time.within_ms, 26 * HOUR);
        let rules = p.to_rules();
        assert_eq!(
            Policy::from_rules(rules.iter().map(String::as_str)).unwrap(),
            p
        );
        assert_eq!(Policy::from_rules(["weekly=2"]).unwrap().last, 1);
        for (bad, says) in [
            ("last=0", "at least 1"),
            ("daily", "NAME=VALUE"),
            ("daily=-1", "non-negative"),
            ("hourly=99999999999", "too large"),
            ("within=soon", "within=soon"),
            ("secondly=3", "unknown rule"),
        ] {
            let e = Policy::from_rules([bad]).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = Policy::from_rules(["daily=1", "daily=2"]).unwrap_err();
        assert!(e.to_string().contains("twice"));
    }

    #[test]
    fn the_last_committed_is_kept_whatever_its_time() {
        // A clock set back: checkpoint 3 began "before" 1 and 2.
        let c = candidates(&[50, 60, 10]);
        let d = apply(&Policy::last(1), &c);
        assert_eq!(kept(&Policy::last(1), &c), vec![2, 3]);
        assert_eq!(
            d.iter().find(|d| d.id == 3).unwrap().kept_by,
            [Reason::Newest]
        );
        // Kept by a rule already: no second reason.
        let c = candidates(&[10, 20]);
        assert_eq!(
            apply(&Policy::last(1), &c)[0].kept_by,
            [Reason::Last { n: 1 }]
        );
    }

    #[test]
    fn last_keeps_the_newest_by_time() {
        let c = candidates(&[10, 20, 30, 40, 50]);
        assert_eq!(kept(&Policy::last(2), &c), vec![4, 5]);
        assert_eq!(kept(&Policy::last(9), &c), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn each_day_keeps_its_newest() {
        // Three a day over four days; daily 3 keeps the last of each of the newest 3 days.
        let times: Vec<u64> = (0..4)
            .flat_map(|d| [1, 2, 3].map(|h| MONDAY + d * DAY + h * HOUR))
            .collect();
        let c = candidates(&times);
        let policy = Policy {
            last: 1,
            by_time: ByTime {
                daily: 3,
                ..ByTime::default()
            },
        };
        assert_eq!(kept(&policy, &c), vec![6, 9, 12]);
        let d = apply(&policy, &c);
        assert_eq!(
            d[0].kept_by,
            vec![
                Reason::Last { n: 1 },
                Reason::Daily {
                    bucket: "2026-01-08".into()
                }
            ]
        );
    }

    #[test]
    fn weeks_are_iso_weeks_in_utc() {
        // Sunday 23:30 and Monday 00:30 are in two weeks; a year's first days may be in
        // the last week of the year before.
        let sunday = MONDAY + 6 * DAY + 23 * HOUR + HOUR / 2;
        let next_monday = sunday + HOUR;
        let c = candidates(&[sunday, next_monday]);
        let policy = Policy {
            last: 1,
            by_time: ByTime {
                weekly: 5,
                ..ByTime::default()
            },
        };
        let d = apply(&policy, &c);
        assert_eq!(
            d[1].kept_by,
            vec![Reason::Weekly {
                bucket: "2026-W02".into()
            }]
        );
        assert!(d[0].kept_by.contains(&Reason::Weekly {
            bucket: "2026-W03".into()
        }));
        // 2027-01-01 is a Friday: ISO week 53 of 2026.
        let c = candidates(&[1_798_761_600_000]);
        assert_eq!(
            apply(&policy, &c)[0].kept_by[1],
            Reason::Weekly {
                bucket: "2026-W53".into()
            }
        );
    }

    #[test]
    fn within_counts_from_the_newest_not_from_now() {
        let c = candidates(&[0, 5 * DAY, 9 * DAY, 10 * DAY]);
        let policy = Policy {
            last: 1,
            by_time: ByTime {
                within_ms: 2 * DAY,
                ..ByTime::default()
            },
        };
        assert_eq!(kept(&policy, &c), vec![3, 4]);
    }

    #[test]
    fn pins_and_a_restore_keep_what_no_rule_does() {
        let mut c = candidates(&[10, 20, 30]);
        c[0].pins.push("before-deploy".into());
        c[1].restore = true;
        let d = apply(&Policy::last(1), &c);
        assert_eq!(
            d[2].kept_by,
            vec![Reason::Pinned {
                name: "before-deploy".into()
            }]
        );
        assert_eq!(d[1].kept_by, vec![Reason::Restore]);
        assert_eq!(kept(&Policy::last(1), &c), vec![1, 2, 3]);
    }

    /// Every rule against a direct reading of its definition, over random histories.
    #[test]
    fn the_union_of_rules_is_what_each_rule_keeps() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let n = (next() % 60) as usize + 1;
            let mut t = MONDAY;
            let times: Vec<u64> = (0..n)
                .map(|_| {
                    t += next() % (3 * DAY);
                    t
                })
                .collect();
            let c = candidates(&times);
            let policy = Policy {
                last: (next() % 4) as u32 + 1,
                by_time: ByTime {
                    hourly: (next() % 3) as u32,
                    daily: (next() % 5) as u32,
                    weekly: (next() % 3) as u32,
                    monthly: (next() % 3) as u32,
                    yearly: (next() % 2) as u32,
                    within_ms: next() % 3 * DAY,
                },
            };
            // Newest first; for a bucket rule, the newest of each of the newest N buckets.
            let newest_first: Vec<&Candidate> = c.iter().rev().collect();
            let mut expected = std::collections::BTreeSet::new();
            for c in newest_first.iter().take(policy.last as usize) {
                expected.insert(c.id);
            }
            let by = &policy.by_time;
            for (n, f) in [
                (by.hourly, hour as BucketOf),
                (by.daily, day),
                (by.weekly, week),
                (by.monthly, month),
                (by.yearly, year),
            ] {
                let mut buckets: Vec<String> = Vec::new();
                for c in &newest_first {
                    let b = f(&DateTime::from_timestamp_millis(c.time_ms as i64).unwrap());
                    if !buckets.contains(&b) {
                        buckets.push(b);
                        if buckets.len() <= n as usize {
                            expected.insert(c.id);
                        }
                    }
                }
            }
            let newest = *times.last().unwrap();
            for c in &c {
                if newest - c.time_ms < by.within_ms {
                    expected.insert(c.id);
                }
            }
            assert_eq!(
                kept(&policy, &c),
                expected.into_iter().collect::<Vec<_>>(),
                "{policy} over {times:?}"
            );
        }
    }
}
