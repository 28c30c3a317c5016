//! Helpers shared by the integration tests: fake wheels, fake models, a tiny HTTP server.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Deterministic pseudo-random bytes (incompressible enough to exercise deflate).
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Writes a wheel (a zip) at `dir/file_name` holding `members`.
pub fn wheel(dir: &Path, file_name: &str, members: &[(&str, &[u8])]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(file_name);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for (name, data) in members {
        zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    let dist = file_name.split('-').take(2).collect::<Vec<_>>().join("-");
    zip.start_file(format!("{dist}.dist-info/METADATA"), zip::write::SimpleFileOptions::default()).unwrap();
    zip.write_all(b"Metadata-Version: 2.1\n").unwrap();
    zip.finish().unwrap();
    path
}

/// A fake model split over `n` wheels of package `fake-model-partN==1.0.0`, member
/// `fake_model_partN/data/partN.bin`. Returns the whole model's bytes and the `parts` TOML.
pub fn split_model(wheel_dir: &Path, len: usize, n: usize) -> (Vec<u8>, String) {
    let data = bytes(len, 7);
    let chunk = len.div_ceil(n);
    let mut parts = String::from("[");
    for (i, piece) in data.chunks(chunk).enumerate() {
        let k = i + 1;
        let member = format!("fake_model_part{k}/data/part{k}.bin");
        wheel(wheel_dir, &format!("fake_model_part{k}-1.0.0-py3-none-any.whl"), &[(&member, piece)]);
        parts +=
            &format!("{{ package = \"fake-model-part{k}\", version = \"1.0.0\", path = \"{member}\" }}, ");
    }
    parts += "]";
    (data, parts)
}

/// A one-file manifest with the given sources (TOML `[[files.sources]]` tables).
pub fn manifest_toml(name: &str, file: &str, sha256: &str, size: usize, sources: &str) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"test model\"\nformat = \"gguf\"\n\n\
         [[files]]\nname = \"{file}\"\nsha256 = \"{sha256}\"\nsize = {size}\n{sources}"
    )
}

pub fn pip_source(parts: &str) -> String {
    format!("\n[[files.sources]]\nkind = \"pip\"\nparts = {parts}\n")
}

/// Entries of `dir`, sorted, as file names.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Serves `routes` (path → body) over HTTP/1.1 on 127.0.0.1 until the test ends; other
/// paths get 404. Returns the base URL.
pub fn serve(routes: HashMap<String, Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let (status, body) = match routes.get(&path) {
                Some(body) => ("200 OK", body.clone()),
                None => ("404 Not Found", b"not found".to_vec()),
            };
            let head =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    base
}

/// The error's whole message with its causes, as the CLI prints it.
pub fn message(err: &pocket_models::Error) -> String {
    let mut out = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        out += &format!(": {cause}");
        source = cause.source();
    }
    out
}
