//! `pocketd`'s configuration as an operator sees it: the file, flags over it, and
//! `--print-config`.

use std::process::Command;

fn pocketd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pocketd"))
        .args(args)
        .env_remove("POCKET_MODELS_DIR")
        .output()
        .expect("the pocketd binary runs")
}

#[test]
fn print_config_shows_the_file_with_flags_over_it_as_toml() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pocketd.toml");
    std::fs::write(&file, "memory_budget = \"1.5GiB\"\nqueue = 4\nmodels_dir = \"/srv/models\"\n").unwrap();
    let o = pocketd(&["--config", file.to_str().unwrap(), "--print-config", "--bus", "session"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed: toml::Table = toml::from_str(&String::from_utf8(o.stdout).unwrap()).unwrap();
    assert_eq!(printed["memory_budget"].as_str(), Some("1.5GiB"));
    assert_eq!(printed["queue"].as_integer(), Some(4));
    assert_eq!(printed["models_dir"].as_str(), Some("/srv/models"));
    assert_eq!(printed["bus"].as_str(), Some("session"), "the flag wins over the file's default");
}

#[test]
fn a_bad_configuration_is_refused_naming_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pocketd.toml");
    std::fs::write(&file, "queue = \"many\"\n").unwrap();
    let o = pocketd(&["--config", file.to_str().unwrap(), "--print-config"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("pocketd.toml") && e.contains("queue") && !e.contains("panicked"), "{e}");
    let o = pocketd(&["--config", "/nonexistent/pocketd.toml", "--print-config"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/pocketd.toml"));
}
