//! Any text as a memory size or budget, as configuration files and flags give them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = pocket_core::memory::parse_size(text);
    if let Ok(b) = text.parse::<pocket_core::memory::BudgetSpec>() {
        assert_eq!(b.to_config_string().parse::<pocket_core::memory::BudgetSpec>().ok(), Some(b));
    }
});
