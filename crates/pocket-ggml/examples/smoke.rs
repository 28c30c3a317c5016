fn main() {
    let path = std::env::args().nth(1).unwrap();
    let kv: Vec<pocket_core::KvType> = std::env::args().skip(2).map(|s| s.parse().unwrap()).collect();
    let opts = pocket_ggml::parity::ParityOptions { prompt: "The quick brown fox".into(), n_tokens: 32, threads: 2, kv_types: kv };
    let t = std::time::Instant::now();
    let r = pocket_ggml::parity::parity(path.as_ref(), &opts).unwrap();
    for p in &r.positions { println!("{:?}", p); }
    for k in &r.kv { println!("{:?}", k); }
    println!("{:?}", t.elapsed());
}
