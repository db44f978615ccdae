//! Output shared by the subcommands: an aligned text table and the JSON file.

use serde_json::Value;
use std::path::Path;

/// Prints `rows` under `headers`, each column as wide as its widest cell (right-aligned).
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..headers.len()).map(|c| rows.iter().map(|r| r[c].len()).chain([headers[c].len()]).max().unwrap_or(0)).collect();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    for row in [&header, &rule].into_iter().chain(rows) {
        let padded: Vec<String> = row.iter().zip(&widths).map(|(s, w)| format!("{s:>w$}")).collect();
        println!("{}", padded.join("  "));
    }
}

/// Writes `value` as pretty JSON, creating the parent directory when needed.
pub fn write_json(path: &str, value: &Value) -> Result<(), String> {
    if let Some(dir) = Path::new(path).parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(value).expect("JSON values always serialize");
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {path}: {e}"))?;
    println!("wrote {path}");
    Ok(())
}

/// Facts about the machine that every result file carries.
pub fn host_info() -> Value {
    serde_json::json!({
        "arch": std::env::consts::ARCH,
        "os": std::env::consts::OS,
        "available_parallelism": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "rsgl_version": env!("CARGO_PKG_VERSION"),
    })
}
