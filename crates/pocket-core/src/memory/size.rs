//! Memory sizes as people write them (`200MiB`, `1.5GiB`, `300M`, `123456`) and the budget
//! a process may use (`auto`: what its cgroup and the machine allow).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

const UNITS: [(&str, u64); 10] = [
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    // Decimal units as written by people who mean them.
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    // Single letters: binary, as ps, free and systemd's MemoryMax= read them.
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
];

/// Bytes in `text`: a number (decimals allowed) with an optional unit — `B`, `KiB`, `MiB`,
/// `GiB`, `TiB`, `KB`, `MB`, `GB`, or `K`, `M`, `G` (binary, as systemd reads them); case is
/// ignored.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || {
        Error::invalid(format!(
            "{text:?} is not a memory size; write bytes or a number with a unit, like 200MiB, 1.5GiB or 300M"
        ))
    };
    let t = text.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let value: f64 = number.parse().map_err(|_| bad())?;
    let unit = if unit == "b" { "" } else { unit };
    let scale = if unit.is_empty() {
        1
    } else {
        UNITS.iter().find(|(name, _)| *name == unit).map(|&(_, s)| s).ok_or_else(bad)?
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// `bytes` for people: `200.0 MiB`, `1.50 GiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    const STEPS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in STEPS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if v >= 100.0 { format!("{v:.0} {name}") } else { format!("{v:.1} {name}") };
        }
    }
    format!("{bytes} B")
}

/// A memory budget as configured: a size, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSpec {
    /// This many bytes.
    Bytes(u64),
    /// The smaller of the cgroup's limit and the memory available at start, less a reserve
    /// (see [`BudgetSpec::resolve`]).
    Auto,
}

impl FromStr for BudgetSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(BudgetSpec::Auto)
        } else {
            parse_size(s).map(BudgetSpec::Bytes)
        }
    }
}

impl fmt::Display for BudgetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetSpec::Bytes(b) => f.write_str(&format_size(*b)),
            BudgetSpec::Auto => f.write_str("auto"),
        }
    }
}

impl BudgetSpec {
    /// The budget as written in a configuration file: `auto`, or the size with the largest
    /// unit that holds it exactly to two decimals (`1.5GiB`, `300MiB`), else in bytes.
    pub fn to_config_string(self) -> String {
        let BudgetSpec::Bytes(b) = self else { return "auto".into() };
        for (name, unit) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if b >= unit && (b as u128 * 100).is_multiple_of(unit as u128) {
                let text = format!("{:.2}", b as f64 / unit as f64);
                return format!("{}{name}", text.trim_end_matches('0').trim_end_matches('.'));
            }
        }
        b.to_string()
    }
}

impl Serialize for BudgetSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_config_string())
    }
}

impl<'de> Deserialize<'de> for BudgetSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e: Error| serde::de::Error::custom(format!("{e}, or auto")))
    }
}

/// What the machine says about memory, for resolving [`BudgetSpec::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryLimits {
    /// The cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), if it has one.
    pub cgroup_max: Option<u64>,
    /// Memory the kernel considers available for new allocations (`MemAvailable`).
    pub available: u64,
    /// What the process already has resident: the budget counts it, so a limit is not
    /// all headroom.
    pub resident: u64,
}

impl MemoryLimits {
    /// Read them from `/proc` and `/sys/fs/cgroup`; missing files read as "no limit" and 0.
    pub fn read() -> MemoryLimits {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        MemoryLimits {
            cgroup_max: cgroup_limit(&read("/proc/self/cgroup"), &|p| std::fs::read_to_string(p).ok()),
            available: proc_field(&read("/proc/meminfo"), "MemAvailable").unwrap_or(0),
            resident: proc_field(&read("/proc/self/status"), "VmRSS").unwrap_or(0),
        }
    }
}

/// The fraction of the memory an `auto` budget leaves to everything else on the machine,
/// and the least it leaves.
const AUTO_RESERVE_FRACTION: f64 = 0.10;
const AUTO_RESERVE_MIN: u64 = 64 << 20;

impl BudgetSpec {
    /// The budget in bytes. `auto` takes the smaller of the cgroup's limit and what is
    /// available now plus what this process already holds, and leaves a tenth of it (at least
    /// 64 MiB) to the rest of the machine: page cache for mapped weights, the allocator's
    /// slack, other processes.
    pub fn resolve(self, limits: &MemoryLimits) -> u64 {
        match self {
            BudgetSpec::Bytes(b) => b,
            BudgetSpec::Auto => {
                let machine = limits.available.saturating_add(limits.resident);
                let cap = limits.cgroup_max.map_or(machine, |c| c.min(machine));
                let reserve = ((cap as f64 * AUTO_RESERVE_FRACTION) as u64).max(AUTO_RESERVE_MIN);
                cap.saturating_sub(reserve)
            }
        }
    }
}

/// A `Name:   123 kB` field of /proc/meminfo or /proc/self/status's `text`, in bytes.
pub fn proc_field(text: &str, name: &str) -> Option<u64> {
    let value = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
    let kb: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The memory limit of this process's cgroup, from `/proc/self/cgroup`'s text and a reader
/// of files under `/sys/fs/cgroup`: v2 (`0::/path` → `path/memory.max`, "max" for none),
/// else v1's memory controller (`N:memory:/path` → `memory.limit_in_bytes`, where a huge
/// value means none).
fn cgroup_limit(proc_cgroup: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        let value = read(&file)?;
        let value = value.trim();
        return match value.parse::<u64>() {
            Ok(v) if v < 1 << 60 => Some(v),
            _ => None, // "max", or v1's "unlimited" (a page-rounded i64::MAX)
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_print_as_written_and_read_back() {
        for (text, printed) in [
            ("1.5GiB", "1.5GiB"),
            ("300M", "300MiB"),
            ("auto", "auto"),
            ("1234567", "1234567"),
            ("64k", "64KiB"),
        ] {
            let b: BudgetSpec = text.parse().unwrap();
            assert_eq!(b.to_config_string(), printed);
            assert_eq!(printed.parse::<BudgetSpec>().unwrap(), b);
        }
    }

    #[test]
    fn sizes_parse_in_every_written_form() {
        assert_eq!(parse_size("200MiB").unwrap(), 200 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("300M").unwrap(), 300 << 20);
        assert_eq!(parse_size(" 160 mib ").unwrap(), 160 << 20);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        for bad in ["", "MiB", "12 parsecs", "-5M", "1.2.3G", "nan"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("200MiB"), "{bad}: {e}");
        }
    }

    #[test]
    fn sizes_format_readably() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(200 << 20), "200 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn budgets_parse_and_auto_takes_the_tighter_limit_less_a_reserve() {
        assert_eq!("auto".parse::<BudgetSpec>().unwrap(), BudgetSpec::Auto);
        assert_eq!("200MiB".parse::<BudgetSpec>().unwrap(), BudgetSpec::Bytes(200 << 20));
        assert_eq!(BudgetSpec::Bytes(5).resolve(&MemoryLimits::default()), 5);
        let gib = 1u64 << 30;
        let free = MemoryLimits { cgroup_max: None, available: 4 * gib, resident: 0 };
        assert_eq!(BudgetSpec::Auto.resolve(&free), 4 * gib - (4 * gib) / 10);
        let limited = MemoryLimits { cgroup_max: Some(gib), ..free };
        assert_eq!(BudgetSpec::Auto.resolve(&limited), gib - gib / 10);
        let tiny = MemoryLimits { cgroup_max: Some(100 << 20), ..free };
        assert_eq!(BudgetSpec::Auto.resolve(&tiny), 36 << 20);
    }

    #[test]
    fn cgroup_limits_are_read_for_v2_and_v1() {
        let files = |p: &str| match p {
            "/sys/fs/cgroup/system.slice/pocketd.service/memory.max" => Some("536870912\n".to_owned()),
            "/sys/fs/cgroup/user.slice/memory.max" => Some("max\n".to_owned()),
            "/sys/fs/cgroup/memory/box/memory.limit_in_bytes" => Some("1073741824\n".to_owned()),
            "/sys/fs/cgroup/memory/free/memory.limit_in_bytes" => Some("9223372036854771712\n".to_owned()),
            _ => None,
        };
        assert_eq!(cgroup_limit("0::/system.slice/pocketd.service\n", &files), Some(512 << 20));
        assert_eq!(cgroup_limit("0::/user.slice\n", &files), None);
        assert_eq!(cgroup_limit("12:cpu,cpuacct:/box\n11:memory:/box\n", &files), Some(1 << 30));
        assert_eq!(cgroup_limit("11:memory:/free\n", &files), None);
        assert_eq!(cgroup_limit("", &files), None);
        assert_eq!(proc_field("MemTotal: 100 kB\nMemAvailable:   2048 kB\n", "MemAvailable"), Some(2 << 20));
    }

    proptest::proptest! {
        /// Whatever is written in a config file or a flag: an answer, never a panic.
        #[test]
        fn any_text_is_a_size_or_an_error_that_shows_the_forms(text in ".{0,24}") {
            if let Err(e) = parse_size(&text) {
                proptest::prop_assert!(e.to_string().contains("200MiB"));
            }
        }

        /// Plain bytes and every binary unit read back exactly.
        #[test]
        fn whole_numbers_read_exactly_in_every_unit(n in 0u64..(1 << 40), unit in 0usize..4) {
            let (name, scale) = [("", 1u64), ("KiB", 1 << 10), ("M", 1 << 20), ("gib", 1 << 30)][unit];
            let n = n >> (10 * unit as u32); // stays exact in an f64 once scaled
            proptest::prop_assert_eq!(parse_size(&format!("{n}{name}")).unwrap(), n * scale);
        }

        /// What `--print-config` writes for a budget reads back as the same budget.
        #[test]
        fn budgets_read_back_as_printed(n in 0u64..(1 << 52)) {
            let b = BudgetSpec::Bytes(n);
            proptest::prop_assert_eq!(b.to_config_string().parse::<BudgetSpec>().unwrap(), b);
        }
    }
}
