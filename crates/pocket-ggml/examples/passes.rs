use pocket_core::{LayerPlan, Model, Rows, Session, SessionConfig};
use pocket_ggml::{GgmlModel, LoadOptions, WeightFormat};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let weights: WeightFormat = args[2].parse().unwrap();
    let threads: usize = args.get(3).map_or(2, |t| t.parse().unwrap());
    let m = GgmlModel::load(path.as_ref(), &LoadOptions { weights, ..Default::default() }).unwrap();
    let cfg = SessionConfig { n_ctx: 512, n_batch: 256, threads, ..SessionConfig::default() };
    let mut s = m.new_session(&cfg).unwrap();
    let full = LayerPlan::full(m.info().n_layers).unwrap();
    let toks: Vec<u32> = (0..128).map(|i| 100 + (i * 37) % 5000).collect();
    s.decode(&toks, &full, Rows::None).unwrap();
    for rows_all in [true, false] {
        let mut line = String::new();
        let only: Option<usize> = std::env::var("ONLY").ok().map(|v| v.parse().unwrap());
        for n in [1usize, 2, 3, 4, 6, 8, 12, 16].into_iter().filter(|n| only.is_none_or(|o| o == *n)) {
            let extra: Vec<u32> = (0..n as u32).map(|i| 200 + i * 13).collect();
            let mut times = Vec::new();
            for rep in 0..(if only.is_some() { 300 } else { 25 }) {
                let t = Instant::now();
                let rows = if rows_all { Rows::Tail(n) } else { Rows::Last };
                s.decode(&extra, &full, rows).unwrap();
                if rep >= 3 {
                    times.push(t.elapsed().as_secs_f64());
                }
                s.truncate(128).unwrap();
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            line += &format!(" n={n}:{:.2}ms", times[times.len() / 2] * 1e3);
        }
        println!("{weights} all_rows={rows_all}:{line}");
    }
}
